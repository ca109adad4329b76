"""Bridges between this project's models and the peer libraries of the side-by-side benchmarks (not a script).

    python bench/peer_pyro.py --help       # NVIL vs Pyro's TraceGraph_ELBO, SBN-200 on binarised MNIST
    python bench/peer_sklearn.py --help    # SAP vs scikit-learn's BernoulliRBM, RBM 784-500

- ``PyroSBN``: a Pyro model and guide written over *our* ``nvil.models.sbn.SBN`` and ``nvil.models.inference.LayeredInference``
  modules (registered with ``pyro.module``, so Pyro trains our very ``nn.Parameter`` objects and our estimators
  can score the result), with an NVIL-style neural baseline per latent site.
- a fitted scikit-learn ``BernoulliRBM`` loads as our RBM with the package's ``nvil.models.importers.rbm_from_sklearn``.
- ``limit_threads``, ``machine_line``: the same thread count for torch and for numpy's BLAS, and the
  header line every peer table prints; ``accelerate_ours`` and ``warm_up``: our side's ``nvil.backend.accel`` mode and
  untimed warm-up steps whose effects are undone before the timed run;
- ``plain_from_ours`` / ``plain_to_ours``: the plain eager-PyTorch NVIL script (``bench/plain_nvil.py``) started
  from copies of our model, and its result written back into our modules for our estimators.

Pyro and scikit-learn are optional (``pip install -e '.[bench]'``) and imported only inside the functions that
need them, so ``tests/test_peers.py`` can skip cleanly without them.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common import cpu_name, sync  # noqa: E402  (bench/common.py, beside this file)
from plain_nvil import Generative, Recognition  # noqa: E402  (bench/plain_nvil.py)

CONFIG_DIR = ROOT / "configs"


# ---- machine, threads, devices ----------------------------------------------------------------------

def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def limit_threads(threads: int | None):
    """Give torch and numpy / scikit-learn (through threadpoolctl) the same number of threads, default all
    cores. Returns the threadpoolctl limiter (keep a reference; ``None`` when threadpoolctl is absent)."""
    n = threads or available_cores()
    torch.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=n)


def machine_line(device: torch.device, extra: str = "") -> str:
    """``<device name>, <threads> threads (<cores> cores), torch <version>[, extra]``."""
    if device.type == "cuda":
        where = f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    else:
        where = cpu_name()
    line = (f"{where}, {torch.get_num_threads()} torch threads of {available_cores()} cores, "
            f"torch {torch.__version__}")
    return f"{line}, {extra}" if extra else line


def compose_train(overrides: list[str]):
    """``configs/train.yaml`` composed with Hydra overrides, as ``train.py`` would see it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


# ---- Pyro ------------------------------------------------------------------------------------------------

class PyroSBN:
    """Pyro's model p(x, h) and guide q(h | x) over our SBN and inference network (their parameters are shared,
    through ``pyro.module``, not copied).

    Sites ``h1`` .. ``hn`` (h1 next to the data) and the observed ``x``, each a factorial Bernoulli with
    ``to_event(1)`` inside a ``pyro.plate`` over the minibatch, exactly the factorisation of ``SBN.log_joint`` and
    ``LayeredInference.log_prob``. With ``baselines`` (one ``nn.Module`` per latent layer, input h_{i-1}, the centred
    x for layer 1) every latent site carries ``infer={"baseline": {"nn_baseline": ..., "nn_baseline_input": ...}}``,
    optionally with Pyro's decaying-average baseline (``baseline_beta`` = the weight of the old average).
    """

    def __init__(self, sbn, inference, baselines=None, decaying_avg: bool = True, baseline_beta: float = 0.8) -> None:
        if getattr(sbn, "prior_ar", None) is not None or sbn.visible != "bernoulli":
            raise ValueError("PyroSBN covers SBNs with a factorial prior and Bernoulli visibles")
        if getattr(inference, "within", None) is not None:
            raise ValueError("PyroSBN covers factorial (non-autoregressive) inference networks")
        self.sbn, self.inference = sbn, inference
        self.baselines = baselines
        self.decaying_avg, self.baseline_beta = bool(decaying_avg), float(baseline_beta)

    @property
    def n_layers(self) -> int:
        return len(self.sbn.layers)

    def model(self, x: torch.Tensor) -> None:
        import pyro
        import pyro.distributions as dist

        pyro.module("sbn", self.sbn)
        n = self.n_layers
        with pyro.plate("data", x.shape[0]):
            logits = self.sbn.prior_logits.expand(x.shape[0], -1)
            h = pyro.sample(f"h{n}", dist.Bernoulli(logits=logits).to_event(1))
            for i in reversed(range(1, n)):  # decoders[i] maps h_{i+1} to the logits of h_i
                h = pyro.sample(f"h{i}", dist.Bernoulli(logits=self.sbn.decoders[i](h)).to_event(1))
            pyro.sample("x", dist.Bernoulli(logits=self.sbn.decoders[0](h)).to_event(1), obs=x)

    def guide(self, x: torch.Tensor) -> None:
        import pyro
        import pyro.distributions as dist

        pyro.module("inference", self.inference)
        if self.baselines is not None:
            pyro.module("baselines", self.baselines)
        with pyro.plate("data", x.shape[0]):
            below = self.inference.centre(x)
            for i, enc in enumerate(self.inference.encoders):
                infer = {}
                if self.baselines is not None:
                    opts = {"nn_baseline": self.baselines[i], "nn_baseline_input": below}
                    if self.decaying_avg:
                        opts.update(use_decaying_avg_baseline=True, baseline_beta=self.baseline_beta)
                    infer = {"baseline": opts}
                below = pyro.sample(f"h{i + 1}", dist.Bernoulli(logits=enc(below)).to_event(1), infer=infer)

    def conditioned(self, hs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """``pyro.condition`` data for the latent sites, from our [h_1, ..., h_n]."""
        return {f"h{i + 1}": h for i, h in enumerate(hs)}


def pyro_param_groups(lr: float, inference_scale: float, baseline_scale: float, optimizer: str = "adam"):
    """A ``pyro.optim.Adam`` (or ``SGD``) whose per-parameter rate follows NVIL's groups: model ``lr``, inference
    network ``lr * inference_scale``, baselines ``lr * baseline_scale`` (by the ``pyro.module`` names of
    ``PyroSBN``)."""
    import pyro.optim

    def per_param(module_name: str, param_name: str) -> dict:
        if module_name == "inference":
            return {"lr": lr * inference_scale}
        if module_name == "baselines":
            return {"lr": lr * baseline_scale}
        return {"lr": lr}

    return pyro.optim.Adam(per_param) if optimizer == "adam" else pyro.optim.SGD(per_param)


# ---- the plain eager-PyTorch script (bench/plain_nvil.py) ---------------------------------------------------

def plain_from_ours(sbn, inference, baseline: torch.nn.Module, log_prob: str = "distributions"):
    """``plain_nvil``'s (Generative, Recognition, baseline) with the parameters of our one-layer ``SBN``, its
    ``LayeredInference`` and an ``InputDependentBaseline`` (copied; the baseline's MLP is deep-copied)."""
    (n_hidden,) = sbn.layers
    p, q = Generative(sbn.n_visible, n_hidden, log_prob), Recognition(sbn.n_visible, n_hidden, log_prob)
    with torch.no_grad():
        p.prior.copy_(sbn.prior_logits)
        p.decoder.load_state_dict(sbn.decoders[0].state_dict())
        q.encoder.load_state_dict(inference.encoders[0].state_dict())
        q.mean.copy_(inference.input_mean)
    return p.to(sbn.prior_logits.device), q.to(sbn.prior_logits.device), copy.deepcopy(baseline.net)


def plain_to_ours(p, q, sbn, inference) -> None:
    """Write the plain script's trained parameters into our ``SBN`` and ``LayeredInference`` (for our estimators)."""
    with torch.no_grad():
        sbn.prior_logits.copy_(p.prior)
        sbn.decoders[0].load_state_dict(p.decoder.state_dict())
        inference.encoders[0].load_state_dict(q.encoder.state_dict())


# ---- scikit-learn -------------------------------------------------------------------------------------

# ---- our side's acceleration and warm-up ------------------------------------------------------------------

def accelerate_ours(learner, mode: str, device: torch.device) -> None:
    """``nvil.backend.accel``'s ``mode`` (none | compile | cudagraphs) applied to our learner, as ``trainer.accel`` would."""
    learner.accelerate(mode, device)


def warm_up(learner, modules: list, batches: list[torch.Tensor], device: torch.device) -> None:
    """Take ``learner.step`` on ``batches`` (compilation, CUDA graphs, allocator warm-up), then put the modules'
    parameters and the learner's state (optimiser, generator, baselines, chains) back as they were, so the timed
    run starts from exactly the state it would have had without the warm-up."""
    if not batches:
        return
    saved_modules = [copy.deepcopy(m.state_dict()) for m in modules]
    saved_learner = copy.deepcopy(learner.learner_state())
    had_particles = getattr(learner, "particles", None) is not None
    for x in batches:
        learner.step(x)
    sync(device)
    with torch.no_grad():
        for m, state in zip(modules, saved_modules):
            m.load_state_dict(state)
    learner.load_learner_state(saved_learner)
    if hasattr(learner, "particles") and not had_particles:
        learner.particles = None  # SAP: the chains start at the first timed update, as without the warm-up
