"""What every learner is to the training loop (``Learner``: one update, resumable state, and hooks with
defaults, so the loop never probes a learner for what it has), and what gradient learners share: data
parallelism, one update from a surrogate loss, the optimiser."""

from __future__ import annotations

import torch
from torch import nn

from nvil.backend.accel import accelerate, accelerate_sampling, check_mode, compiled
from nvil.core import distributed
from nvil.core.config import positive_float
from nvil.core.errors import ConfigError


class Learner(nn.Module):
    """A training algorithm: one update, resumable state, and hooks with defaults for what the loop may ask.

    Each learner defines ``step`` and ``learner_state`` / ``load_learner_state``; the other hooks have defaults that
    say "this learner needs nothing special", so the training loop never probes a learner for what it has:

    - ``supports_data_parallel`` / ``distribute(d, device)``: run as one rank of several (``DataParallel``);
    - ``per_example_state`` / ``bind_data(train)``: state per training example (MCEM's chains), so ``step``
      also takes the minibatch's row ``indices=``;
    - ``has_own_validation`` / ``validate(valid, train_subset)``: the learner scores itself and has no single
      validation score to keep the best of (greedy DBN training);
    - ``image_grids(seed, device)``: TensorBoard image grids (default: the model's ancestral samples);
    - ``accelerate(mode, device)``: apply ``trainer.accel`` (``nvil.backend.accel``) to the learner's hot loops.

    Each learner defines its own constructor, ``Learner(model, inference, *, device=..., seed=..., **settings)``.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import RBM
    >>> from nvil.learners import SAP
    >>> from nvil.learners.base import Learner
    >>> learner = SAP(RBM(6, 4), None, num_particles=10)
    >>> isinstance(learner, Learner)
    True
    >>> learner.supports_data_parallel, learner.per_example_state, learner.has_own_validation
    (True, False, False)
    >>> learner.gradient_diagnostics(torch.zeros(2, 6), repeats=2, seed=0)
    {}
    >>> learner.accelerate("none") is learner
    True
    """

    model: nn.Module
    supports_data_parallel: bool = False
    per_example_state: bool = False
    has_own_validation: bool = False

    def step(self, x: torch.Tensor, diagnostics: bool = False, **kw) -> dict[str, torch.Tensor]:
        """One update on the minibatch ``x``; the metrics stay on the device.

        Parameters
        ----------
        x : torch.Tensor
            ``(batch, n_visible)`` training rows.
        diagnostics : bool, default False
            True on a logging step: the learner may then add the metrics only a log reads (gradient norms, ...).
        **kw : Any
            What a learner with per-example state takes besides (``indices=``, the minibatch's training-row
            indices, where ``per_example_state`` is set).

        Returns
        -------
        dict of str to torch.Tensor
            ``{tag: scalar tensor}`` metrics of this update, on the device (no host sync).

        Raises
        ------
        NotImplementedError
            Always, here: each learner defines its own.
        """
        raise NotImplementedError

    def learner_state(self) -> dict:
        """Everything a resumed run needs beyond the model (optimiser, RNG, persistent chains, ...).

        Returns
        -------
        dict
            The state ``load_learner_state`` restores; it travels in the checkpoint.

        Raises
        ------
        NotImplementedError
            Always, here: each learner defines its own.
        """
        raise NotImplementedError

    def load_learner_state(self, state: dict) -> None:
        """Restore what ``learner_state`` returned, so the run resumes exactly.

        Parameters
        ----------
        state : dict
            A ``learner_state()`` dictionary (from a checkpoint, mapped to the learner's device).

        Raises
        ------
        NotImplementedError
            Always, here: each learner defines its own.
        """
        raise NotImplementedError

    def distribute(self, d: distributed.Dist, device: torch.device) -> None:
        """Make the learner one rank of a data-parallel run (learners with ``supports_data_parallel`` only).

        Parameters
        ----------
        d : nvil.core.distributed.Dist
            This process's rank and the world size.
        device : torch.device
            This rank's device.

        Raises
        ------
        NotImplementedError
            Always, here: a learner that does not derive from ``DataParallel`` does not run data-parallel.
        """
        raise NotImplementedError(f"{type(self).__name__} does not run data-parallel")

    def bind_data(self, train: torch.Tensor) -> None:
        """Size the per-example state to the training set (called before a resume restores it).

        Does nothing here: only learners with ``per_example_state`` keep state per training example.

        Parameters
        ----------
        train : torch.Tensor
            ``(num_train, n_visible)``: the whole training set, in the row order ``step``'s ``indices`` refer to.
        """

    def validate(self, valid: torch.Tensor, train_subset: torch.Tensor) -> dict[str, float]:
        """The learner's own validation scores (learners with ``has_own_validation`` only).

        Parameters
        ----------
        valid : torch.Tensor
            ``(n, n_visible)`` validation rows.
        train_subset : torch.Tensor
            ``(m, n_visible)`` training rows, for what a score needs from the training data (an AIS base rate).

        Returns
        -------
        dict of str to float
            ``{tag: value}`` scores (``val/...``).

        Raises
        ------
        NotImplementedError
            Always, here: the loop validates the other learners itself.
        """
        raise NotImplementedError(f"{type(self).__name__} has no validation of its own")

    @torch.no_grad()
    def image_grids(self, seed: int, device) -> dict[str, torch.Tensor]:
        """A grid of 64 ancestral samples of the (directed) model, for TensorBoard.

        The samples are drawn with ``seed`` so every grid of a run shows the same draws.

        Parameters
        ----------
        seed : int
            Seed of the generator the samples are drawn with.
        device : torch.device or str
            Device of that generator (the model's).

        Returns
        -------
        dict of str to torch.Tensor
            ``{tag: (n, pixels) in [0, 1]}``: here ``{"samples/model": p(x | h) of 64 ancestral samples}``.
        """
        g = torch.Generator(device=device).manual_seed(seed)
        _, hs = self.model.sample(64, generator=g)
        return {"samples/model": self.model.visible_probs(hs)}

    def gradient_diagnostics(self, x: torch.Tensor, repeats: int, seed: int) -> dict[str, torch.Tensor]:
        """The variance and SNR of the learner's gradient estimate on the fixed minibatch ``x``.

        See ``nvil.learners.diagnostics``; learners that do not estimate a gradient by sampling q report nothing.

        Parameters
        ----------
        x : torch.Tensor
            ``(batch, n_visible)``: the fixed minibatch the estimate is repeated on.
        repeats : int
            Independent gradient estimates the variance is taken over.
        seed : int
            Seed of the generator the repeated estimates draw with (the learner's own stream is left as it is).

        Returns
        -------
        dict of str to torch.Tensor
            ``{tag: scalar tensor}``; empty here.
        """
        return {}

    def accelerate(self, mode: str, device=None, steps: int | None = None) -> "Learner":
        """Apply ``trainer.accel`` in place; the random stream is the same in every mode, and ``none`` changes nothing.

        Call it once, after building the learner; it keeps no state, so before or after restoring a checkpoint.
        Here it only checks ``mode``: the learner has no loop to accelerate.

        Parameters
        ----------
        mode : str
            ``trainer.accel``: none | compile | cudagraphs | native | auto (``nvil.backend.accel``).
        device : torch.device or str or None, default None
            The run's device, checked against ``mode`` (None: wherever CUDA is available).
        steps : int or None, default None
            The run's length where known (``nvil.app.build``), which ``auto`` may weigh against a compilation's
            cost (``FusedPath.auto_compiles``).

        Returns
        -------
        Learner
            The learner itself.

        Raises
        ------
        nvil.core.errors.ConfigError
            If ``mode`` is unknown or impossible on ``device`` (``cudagraphs`` without CUDA, ``native`` off the CPU).
        """
        check_mode(mode, device, "trainer.accel")
        return self


def grad_norms(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """``grad_norm/<group>``: the global gradient norm of each named parameter group."""
    out = {}
    for group in optimizer.param_groups:
        grads = [p.grad for p in group["params"] if p.grad is not None]
        if grads:
            out[f"grad_norm/{group['name']}"] = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    return out


def build_optimizer(params_groups: list[dict], optimizer: str = "adam", lr: float = 0.001, momentum: float = 0.0,
                    beta2: float = 0.999) -> torch.optim.Optimizer:
    """``optimizer``: adam | sgd. Adam runs fused (one kernel per parameter instead of a dozen; a C step over every
    parameter did not pay: docs/benchmarks.md, "Fast paths kept and removed"); ``beta2`` (``learner.beta2``) is its second-moment decay (the REBAR / RELAX authors' code:
    0.99999); ``momentum`` is SGD's. ``lr`` is the default of groups that set none."""
    if optimizer == "adam":
        beta2 = float(beta2)
        if not 0.0 <= beta2 < 1.0:
            raise ConfigError(f"learner.beta2 must be in [0, 1), got {beta2}")
        return torch.optim.Adam(params_groups, lr=lr, betas=(0.9, beta2), fused=True)
    if optimizer == "sgd":
        return torch.optim.SGD(params_groups, lr=lr, momentum=float(momentum))
    raise ConfigError(f"learner.optimizer must be 'adam' or 'sgd', got {optimizer!r}")


def directed_groups(model: nn.Module, inference: nn.Module, lr: float, inference_lr_scale: float
                    ) -> tuple[float, list[dict]]:
    """(lr, the optimiser's parameter groups) of a directed model and its inference network: the model at
    ``lr`` (``learner.lr``), the inference network at ``lr * inference_lr_scale`` (the paper always makes it five
    times smaller than the model's)."""
    lr = positive_float(lr, "learner.lr")
    return lr, [{"params": list(model.parameters()), "lr": lr, "name": "model"},
                {"params": list(inference.parameters()), "lr": lr * float(inference_lr_scale), "name": "inference"}]


class DataParallel(Learner):
    """What a learner does to run as one rank of several (``nvil.core.distributed``): its ``forward`` computes the
    loss through ``DistributedDataParallel``, which averages the gradients over ranks; ``rank_state`` is what
    differs between ranks and travels in the checkpoint once per rank."""

    supports_data_parallel = True
    generator: torch.Generator

    def distribute(self, d: distributed.Dist, device: torch.device) -> None:
        # Kept out of nn.Module's registry: the wrapper must not appear in state_dict or parameters().
        self.__dict__["_ddp"] = distributed.wrap(self, device)

    @property
    def data_parallel(self) -> bool:
        return "_ddp" in self.__dict__

    def loss_module(self) -> nn.Module:
        """The module whose call computes the loss: the DDP wrapper under torchrun, else the learner itself."""
        return self.__dict__.get("_ddp", self)

    def rank_state(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_rank_state(self, state: dict) -> None:
        self.generator.set_state(state["generator"].cpu())


class SurrogateLearner(DataParallel):
    """Subclasses set ``optimizer`` and ``generator`` and define ``surrogate(x) -> (loss, metrics)``,
    whose gradient is minus the update direction; extra resumable state goes in ``extra_state``.
    ``surrogate(x, diagnostics=False)`` may leave out the metrics only a logging step reads."""

    optimizer: torch.optim.Optimizer

    def forward(self, x: torch.Tensor, diagnostics: bool = True) -> tuple[torch.Tensor, dict]:
        return self.surrogate(x, diagnostics=diagnostics)

    def step(self, x: torch.Tensor, diagnostics: bool = False) -> dict[str, torch.Tensor]:
        """One update on the minibatch ``x``; metrics stay on the device (no host sync)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss, metrics = self.loss_module()(x, diagnostics)
        loss.backward()
        if diagnostics:
            metrics.update(grad_norms(self.optimizer))
        self.optimizer.step()
        return metrics

    def accelerate(self, mode: str, device=None, steps: int | None = None) -> "SurrogateLearner":
        """``surrogate`` replaced by its compiled version (an instance attribute). Dynamo splits it at each
        sampling call (torch.rand with the learner's generator, which it cannot trace) and compiles the pieces
        between them, forward and backward; the draws stay eager. ``step`` is unchanged."""
        if compiled(check_mode(mode, device, "trainer.accel")):
            self.surrogate = accelerate(self.surrogate, mode, device, "trainer.accel")
        accelerate_sampling(mode, self.model, self.inference)
        return self

    def extra_state(self) -> dict[str, nn.Module]:
        return {}

    def learner_state(self) -> dict:
        """Everything a resumed run needs beyond the model: optimiser, RNG, and ``extra_state``."""
        state = {"optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state()}
        state.update({name: module.state_dict() for name, module in self.extra_state().items()})
        return state

    def load_learner_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"].cpu())
        for name, module in self.extra_state().items():
            module.load_state_dict(state[name])
