"""Evaluate a checkpoint with one estimator; print one JSON line and append it beside the checkpoint.

    python evaluate.py checkpoint=outputs/run1/checkpoints/best.pt estimator=iwae estimator.num_samples=5000
    python evaluate.py checkpoint=PATH estimator=elbo estimator.num_samples=10 data.split=test eval.num_examples=1000
    python evaluate.py checkpoint=PATH estimator=exact        # models with at most 20 latent units
    torchrun --nproc_per_node=4 evaluate.py checkpoint=PATH estimator=ais   # the examples shared by 4 ranks
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf

from estimators.base import Result
from nvil.cli import guarded, run_task
from nvil.errors import ConfigError
from nvil.evaluation import EvalSpec, evaluate_checkpoint


def evaluate(cfg: DictConfig) -> Result:
    if not cfg.get("checkpoint"):
        raise ConfigError("evaluate.py needs checkpoint=PATH")
    overrides = {k: v for k, v in OmegaConf.to_container(cfg.data, resolve=True).items() if k != "split"}
    return evaluate_checkpoint(cfg.checkpoint, cfg.estimator, EvalSpec(
        split=cfg.data.split, num_examples=cfg.eval.num_examples, seed=cfg.seed, device=cfg.eval.device,
        progress=cfg.eval.progress, data_overrides=overrides, output=cfg.eval.output, shard=cfg.eval.get("shard"),
        num_shards=cfg.eval.get("num_shards"), per_class=cfg.eval.get("per_class"),
        strict=bool(cfg.estimator.get("strict", False)), flush_denormal=cfg.eval.get("flush_denormal", True)))


@hydra.main(config_path="configs", config_name="evaluate", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    guarded(evaluate, cfg)


if __name__ == "__main__":
    run_task(evaluate, _hydra_main, config_name="evaluate")
