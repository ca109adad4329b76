"""Train a latent-variable model.

    python train.py                                   # the default job: SBN-200, NVIL, binarised MNIST, then evaluate
    python train.py model=sbn model.layers=[200,200,200] learner=nvil data=mnist trainer.max_steps=100000 seed=1
    python train.py experiment=nvil_sbn200            # the NVIL paper's settings
    python train.py hydra.run.dir=outputs/run1 trainer.resume=true   # continue an interrupted run
    torchrun --nproc_per_node=2 train.py trainer.batch_size=100      # data-parallel: 50 examples per rank
    tensorboard --logdir outputs
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from nvil import distributed
from nvil.cli import guarded, run_task
from nvil.config import estimator_config
from nvil.evaluation import evaluate_checkpoint
from nvil.loop import fit


def train(cfg: DictConfig, run_dir: str | Path) -> dict:
    """Train, then (if ``final_eval.enabled``) evaluate the best checkpoint. Returns the metrics."""
    metrics = fit(cfg, Path(run_dir))
    if distributed.current().is_main:
        print(json.dumps({"train": metrics}), flush=True)
    fe = cfg.final_eval
    if fe.enabled:
        result = evaluate_checkpoint(
            metrics["checkpoint"], estimator_config(fe.estimator), split=fe.split, num_examples=fe.num_examples,
            seed=cfg.seed, device=cfg.trainer.device, progress=cfg.trainer.progress)
        metrics["final_eval"] = result.summary()
    return metrics


@hydra.main(config_path="configs", config_name="train", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    if cfg.get("print_config", True) and distributed.current().is_main:
        print(OmegaConf.to_yaml(cfg, resolve=True))
    guarded(train, cfg, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    run_task(train, _hydra_main, run_dir_root="outputs")
