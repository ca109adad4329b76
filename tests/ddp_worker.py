"""Run under ``torchrun --nproc_per_node=2`` by tests/test_distributed.py: checks that need several ranks at once.

Each check gathers what every rank holds and rank 0 compares; a failed check raises, torchrun exits non-zero
and the test shows the message. On success rank 0 writes ``ok`` to the path given as the first argument.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from omegaconf import OmegaConf  # noqa: E402

from nvil.models import build_model  # noqa: E402
from nvil.core import distributed  # noqa: E402
from nvil.learners import build_learner  # noqa: E402


def same_on_every_rank(tensors: dict[str, torch.Tensor], what: str) -> None:
    every = distributed.gather_objects(tensors)
    for k in tensors:
        for r, other in enumerate(every[1:], 1):
            if not torch.equal(every[0][k], other[k]):
                raise AssertionError(f"{what}: {k} differs between rank 0 and rank {r}")


def check_global_statistics(d: distributed.Dist) -> None:
    """global_mean_var and gather_rows against the statistics of the concatenation."""
    g = torch.Generator().manual_seed(100 + d.rank)
    x = torch.randn(7, generator=g) * (d.rank + 1) + 3 * d.rank
    mean, var = distributed.global_mean_var(x)
    whole = distributed.gather_rows(x)
    assert whole.shape == (7 * d.world_size,)
    assert torch.allclose(mean, whole.mean(), atol=1e-5), (mean, whole.mean())
    assert torch.allclose(var, whole.var(unbiased=False), atol=1e-4), (var, whole.var(unbiased=False))
    avg = distributed.average_metrics({"a": float(d.rank), **({"only_rank1": 5.0} if d.rank == 1 else {})})
    assert avg == {"a": (d.world_size - 1) / 2, "only_rank1": 5.0}, avg


def nvil_learner(d: distributed.Dist):
    torch.manual_seed(0)  # the same initial model on every rank, as the loop builds it
    cfg = OmegaConf.load(ROOT / "configs" / "learner" / "nvil.yaml")
    model, inference = build_model(OmegaConf.create({"name": "sbn", "layers": [5, 3], "inference": {}}), 8)
    learner = build_learner(cfg, model, inference, torch.device("cpu"), distributed.rank_seed(0, d))
    learner.distribute(d, torch.device("cpu"))
    return learner


def check_nvil(d: distributed.Dist) -> None:
    """After one data-parallel step c and v are the mean and variance of every rank's centred signals together
    (the first update sets them), and after several steps parameters, baselines and moments agree on all ranks
    while the sampled latents (rank-local generators) differ."""
    learner = nvil_learner(d)
    g = torch.Generator().manual_seed(7)
    batch = (torch.rand(20, 8, generator=g) < 0.4).float()  # the global minibatch
    x = batch[distributed.local_rows(20, d, "batch")]
    metrics = learner.step(x, diagnostics=True)
    local = {k: metrics[f"nvil/layer{j}/signal_{s}"].double() for j in (1, 2) for s, k in
             (("mean", f"mean{j}"), ("var", f"var{j}"))}
    every = distributed.gather_objects(local)
    for j, moments in zip((1, 2), learner.moments):
        means = torch.stack([e[f"mean{j}"] for e in every])
        vars_ = torch.stack([e[f"var{j}"] for e in every])
        # equal shares: the pooled mean, and the within- plus between-rank variance
        pooled_var = vars_.mean() + means.var(unbiased=False)
        assert torch.allclose(moments.mean.double(), means.mean(), atol=1e-4), (j, moments.mean, means.mean())
        assert torch.allclose(moments.var.double(), pooled_var, rtol=1e-4, atol=1e-4), (j, moments.var, pooled_var)
    for step in range(5):
        learner.step(batch[distributed.local_rows(20, d, "batch")], diagnostics=step == 4)
    same_on_every_rank({k: v for k, v in learner.state_dict().items()}, "NVIL after 6 data-parallel steps")
    gens = distributed.gather_objects(learner.rank_state()["generator"])
    assert not torch.equal(gens[0], gens[1]), "the ranks share one random stream"


def check_mcem(d: distributed.Dist) -> None:
    """MCEM's chain table (and its step-size adaptation) is the same on every rank after each iteration."""
    torch.manual_seed(0)
    model_cfg = OmegaConf.create({"name": "gbn", "layers": [3, 2], "visible": "bernoulli", "form": "centred"})
    model, _ = build_model(model_cfg, 6)
    cfg = OmegaConf.load(ROOT / "configs" / "learner" / "mcem_hmc.yaml")
    cfg.adapt = "dual_averaging"
    learner = build_learner(cfg, model, None, torch.device("cpu"), distributed.rank_seed(0, d))
    train = (torch.rand(40, 6, generator=torch.Generator().manual_seed(3)) < 0.5).float()
    learner.bind_data(train)
    learner.distribute(d, torch.device("cpu"))
    same_on_every_rank({"chains": learner.chains}, "MCEM chains at the start")
    before = learner.chains.clone()
    for step in range(3):
        idx = torch.arange(step * 8, step * 8 + 8)[distributed.local_rows(8, d, "batch")]
        learner.step(train[idx], indices=idx)
    same_on_every_rank({"chains": learner.chains, **learner.adaptation._asdict(),
                        **{k: v for k, v in model.state_dict().items()}}, "MCEM after 3 iterations")
    moved = (learner.chains != before).any(1)
    assert moved[:24].all() and not moved[24:].any(), "exactly the visited rows moved"


def main() -> None:
    d = distributed.setup()
    assert d.world_size == 2, d
    check_global_statistics(d)
    check_nvil(d)
    check_mcem(d)
    if d.is_main:
        Path(sys.argv[1]).write_text("ok")
    torch.distributed.barrier()  # both ranks done before the group goes: rank 0 tearing it down early aborted gloo once
    distributed.cleanup()


if __name__ == "__main__":
    main()
