"""Shared fixtures: a tiny SBN with exact answers by enumeration, and Hydra config composition."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from models import build_model  # noqa: E402
from estimators.exact import enumerate_states, split_layers  # noqa: E402

CONFIG_DIR = ROOT / "configs"


def make_cfg(config_name: str = "train", overrides: list[str] = ()):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name, overrides=list(overrides))


def tiny_model(n_visible: int = 6, layers=(4, 3), seed: int = 0, scale: float = 1.0, q_scale: float = 0.3,
               name: str = "sbn", autoregressive_q: bool = False):
    """An SBN (weights ~ N(0, scale^2)) and an inference network (N(0, q_scale^2)), untrained.

    ``name="fdarn"`` gives one autoregressive layer of sum(layers) units. The small q_scale keeps q close to uniform over the 2^7 states, a proposal that covers the
    posterior, so importance sampling converges at moderate K.
    """
    torch.manual_seed(seed)
    spec = {"name": name, "layers": list(layers), "n_latent": int(sum(layers)),
            "inference": {"autoregressive": autoregressive_q}}
    model, inference = build_model(OmegaConf.create(spec), n_visible)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, scale)
        for p in inference.parameters():
            p.normal_(0.0, q_scale)
    return model, inference


def enumerated_elbo(model, inference, x: torch.Tensor) -> torch.Tensor:
    """Exact ELBO(x) = sum_h q(h | x) [log p(x, h) - log q(h | x)], differentiable in both networks."""
    h = enumerate_states(model.n_latent, 0, 2**model.n_latent, dtype=x.dtype)
    hs = [t.unsqueeze(1) for t in split_layers(h, model.layers)]
    log_p = model.log_joint(x.unsqueeze(0), hs)
    log_q = inference.log_prob(hs, x.unsqueeze(0))
    return (log_q.exp() * (log_p - log_q)).sum(0)


SYNTHETIC = ["data=synthetic", "trainer.device=cpu", "trainer.progress=false", "trainer.tensorboard=false",
             "print_config=false", "trainer.log_every=10", "trainer.val_every=20", "trainer.ckpt_every=20",
             "trainer.sample_every=1000", "trainer.val_num_examples=100", "model.layers=[4,3]",
             "final_eval.enabled=false"]


@pytest.fixture
def synthetic_overrides():
    return list(SYNTHETIC)


def assert_same_step(fast, slow, x: torch.Tensor, param_atol: float = 1e-12) -> None:
    """One logging step of two learners that should take the same update (a fast path and the autograd path): the
    same metrics, gradients and parameters after it, to float64 rounding (``param_atol``: Adam divides a gradient
    entry that is zero up to rounding, ~1e-17, by sqrt(v) + eps = 1e-8, so its step can differ by lr 1e-9)."""
    metrics_fast, metrics_slow = fast.step(x, diagnostics=True), slow.step(x, diagnostics=True)
    assert metrics_fast.keys() == metrics_slow.keys()
    for k in metrics_fast:
        torch.testing.assert_close(metrics_fast[k], metrics_slow[k], rtol=1e-10, atol=1e-10, msg=k)
    for (name, p), q in zip(fast.named_parameters(), slow.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=f"gradient of {name}")
        torch.testing.assert_close(p, q, rtol=1e-10, atol=param_atol, msg=f"{name} after the update")


def assert_same_parameters(fast, slow, msg: str = "", atol: float = 1e-12) -> None:
    for (name, p), q in zip(fast.named_parameters(), slow.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=atol, msg=f"{name} {msg}")


def chi_square(samples: torch.Tensor, log_probs: torch.Tensor) -> tuple[float, int]:
    """Pearson chi-square of binary samples [n, k] against the exact probabilities of all 2^k states.

    Returns (statistic, degrees of freedom)."""
    k = samples.shape[1]
    codes = (samples * (2 ** torch.arange(k - 1, -1, -1, dtype=torch.float32))).sum(1).long()
    observed = torch.bincount(codes, minlength=2**k).double()
    expected = samples.shape[0] * log_probs.double().exp()
    return ((observed - expected) ** 2 / expected).sum().item(), 2**k - 1


# chi-square quantiles at p = 0.001 (a fixed-seed test then fails only when the sampler is wrong)
CHI2_999 = {15: 37.70, 63: 103.44}


@pytest.fixture
def native_kernels():
    """Skips a test of the C kernels (``nvil.native``) where they do not build (no C compiler)."""
    from nvil import native
    try:
        native.library()
    except native.NativeUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tests use small tensors, for which a second torch thread costs more than it gives (and
    on a busy 2-core machine, 20-100x more)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
