"""The negative phase of the Boltzmann-machine learners (``nvil.learners.sap``): where the samples from the
model that stand in for E_model[dF(x)/dtheta] come from. One class per ``learner.name``, chosen by ``PHASES``; each
is built as ``Phase(model, generator, num_particles=..., reuse_hidden=...)``, with ``tt=TTSettings(...)`` for
trans_sap and ``pt=PTSettings(...)`` for pt_sap:

- ``Persistent`` (``sap``): the stochastic approximation procedure (Younes 1989; Tieleman 2008's persistent
  CD; Salakhutdinov 2009, Algorithm 1). M persistent particles, each moved by k block-Gibbs sweeps per update.
- ``TemperedPersistent`` (``trans_sap``): SAP whose particles also take one tempered-transitions run every
  ``tt.every`` updates from ``tt.start_step`` on (Salakhutdinov 2009, Sec. 3; the parameters are not updated
  during the run).
- ``ParallelTemperingPhase`` (``pt_sap``): the particles are the beta = 1 replicas of parallel-tempering chains.
- ``ContrastiveDivergence`` (``cd``): CD-k, chains restart at the minibatch and take k sweeps.
- ``ExactGradient`` (``exact_ml``): no samples; the learner differentiates log Z by enumeration.

A phase draws with the learner's generator and keeps what it carries between updates: the persistent chains
(``chains``, checkpointed as ``particles_x`` / ``particles_h``) and the count of block-Gibbs sweeps.

Sweep order (``learner.reuse_hidden``). By default a sweep is h ~ p(h | x), then x ~ p(x | h), and the learner
computes p(h | x_neg) of the new negatives afresh for their statistics. With ``reuse_hidden`` a sweep is the
reverse order, x ~ p(x | h), then h ~ p(h | x) (``BlockGibbs(reverse=True)``; equally a block-Gibbs kernel that
leaves p(x, h) invariant): it ends by computing a(x_neg) = c + x_neg'W at the update's parameters, the very
input the negative statistics need, so the phase hands it on as ``hidden_input`` and the learner saves one
matrix product per update (for CD: the h drawn when the chains restart at the minibatch is used, not drawn
again). Every sweep of an update still runs at that update's parameters; only the sub-step that comes first
differs, as in scikit-learn's BernoulliRBM, whose persistent state is h. The random stream, hence the particles,
differ from the default order's. PT's replicas move by their own kernel and leave nothing to reuse.
"""

from __future__ import annotations

import torch

from nvil.core.config import positive_int
from nvil.learners.settings import PTSettings, TTSettings
from nvil.mcmc import BlockGibbs, ParallelTempering, TemperedTransitions, uniform_betas
from nvil.mcmc.parallel_tempering import SwapRates
from nvil.models.rbm import State


class NegativePhase:
    """The interface, and block-Gibbs sweeps at beta = 1 (a sweep: h ~ p(h | x), then x ~ p(x | h)).

    ``sample(x, k, updates)`` gives the negatives of one update; ``init``, ``target`` and ``sweep`` are the
    chains' kernel; ``report`` and ``image_grids`` what a logging step shows; ``state_dict`` what a resumed run
    needs; ``accelerate(mode)`` applies ``trainer.accel``."""

    def __init__(self, model, generator: torch.Generator, *, num_particles: int = 100,
                 reuse_hidden: bool = False) -> None:
        self.model, self.generator = model, generator
        self.num_particles = positive_int(num_particles, "learner.num_particles")
        self.reuse_hidden = bool(reuse_hidden)
        self.gibbs = BlockGibbs(model, reverse=self.reuse_hidden)
        self.chains: State | None = None
        self.hidden_input: torch.Tensor | None = None  # a(x) of target(chains).x after a reverse sweep, else None
        self.sweeps = 0  # block-Gibbs sweeps so far (a tempered-transitions run counts its 2 (S - 1) sweeps)

    def init(self, start: torch.Tensor) -> State:
        """Chains at the rows ``start`` (h drawn from p(h | x))."""
        return self.gibbs.init(start, self.generator)

    def target(self, chains: State) -> State:
        """The chains' states at beta = 1: the negatives."""
        return chains

    def sweep(self, chains: State) -> State:
        chains, info = self.gibbs.step(chains, 1.0, self.generator)
        self.hidden_input = info.get("hidden_input")  # the reverse order's a(x) of the new x
        return chains

    def sample(self, x: torch.Tensor, k: int, updates: int) -> torch.Tensor | None:
        """The negatives' visible states for the update number ``updates`` on the minibatch ``x``, with k sweeps
        (None: the learner needs no samples)."""
        raise NotImplementedError

    def report(self) -> dict[str, torch.Tensor]:
        """What a logging step adds to the metrics (``mcmc/...``)."""
        return {}

    def image_grids(self, n_pixels: int) -> dict[str, torch.Tensor]:
        """The first 64 persistent particles (none without them), [n, pixels] in [0, 1]."""
        if self.chains is None:
            return {}
        return {"mcmc/particles": self.target(self.chains).x[:64, :n_pixels]}

    def accelerate(self, mode: str) -> None:
        """The block-Gibbs sweeps run on the fused kernels of ``BoltzmannMachine.gibbs_kernel`` (binary RBMs
        without labels or lateral weights); a semi-RBM's pixel sweep compiles its in-block updates
        (``nvil.models.visible.LateralBernoulli``); other Boltzmann machines stay eager."""
        self.gibbs = BlockGibbs(self.model, reverse=self.reuse_hidden, accel=mode)
        self.model.visible_layer.accelerate(mode, self.model.W.device)

    def state_dict(self) -> dict:
        return {"gibbs_sweeps": self.sweeps,
                "particles_x": None if self.chains is None else self.chains.x,
                "particles_h": None if self.chains is None else self.chains.h}

    def load_state_dict(self, state: dict) -> None:
        self.sweeps = int(state["gibbs_sweeps"])
        if state.get("particles_x") is not None:  # the checkpoint is mapped to the device when loaded
            self.chains = State(state["particles_x"], state["particles_h"])


class Persistent(NegativePhase):
    """SAP: ``num_particles`` chains, started at rows of the first minibatch drawn at random, each moved by k
    sweeps per update."""

    def start(self, x: torch.Tensor) -> None:
        if self.chains is None:
            idx = torch.randint(0, x.shape[0], (self.num_particles,), generator=self.generator, device=x.device)
            self.chains = self.init(x[idx])

    def sample(self, x: torch.Tensor, k: int, updates: int) -> torch.Tensor:
        self.start(x)
        for _ in range(k):
            self.chains = self.sweep(self.chains)
            self.sweeps += 1
        return self.target(self.chains).x


class ContrastiveDivergence(NegativePhase):
    """CD-k: no persistent chains; each update's chains start at the minibatch."""

    def sample(self, x: torch.Tensor, k: int, updates: int) -> torch.Tensor:
        chains = self.init(x)
        for _ in range(k):
            chains = self.sweep(chains)
        self.sweeps += k
        return chains.x


class TemperedPersistent(Persistent):
    """Persistent chains that take one tempered-transitions run (``tt.num_betas`` inverse temperatures from
    ``tt.beta_min`` to 1) before the update's sweeps, every ``tt.every`` updates from update ``tt.start_step``."""

    def __init__(self, model, generator: torch.Generator, *, num_particles: int = 100, reuse_hidden: bool = False,
                 tt: TTSettings = TTSettings()) -> None:
        super().__init__(model, generator, num_particles=num_particles, reuse_hidden=reuse_hidden)
        tt = TTSettings.of(tt)
        self.tt = TemperedTransitions(model, uniform_betas(tt.num_betas, tt.beta_min))
        self.every = tt.every
        self.start_step = tt.start_step
        self.last_run: tuple[torch.Tensor, torch.Tensor] | None = None  # x before and after (the paper's Fig. 2)
        self.last_accept: torch.Tensor | None = None  # the last run's acceptance rate
        self.runs = 0  # tempered-transitions runs so far
        self.accept_sum: torch.Tensor | float = 0.0  # the sum of their acceptance rates, on the chains' device

    def sample(self, x: torch.Tensor, k: int, updates: int) -> torch.Tensor:
        self.start(x)
        if updates >= self.start_step and updates % self.every == 0:
            before = self.chains.x
            self.chains, info = self.tt.step(self.chains, generator=self.generator)
            self.last_run = (before, self.chains.x)
            self.last_accept = info["accept_rate"]
            self.runs += 1
            self.accept_sum = self.accept_sum + self.last_accept
            self.sweeps += 2 * (len(self.tt.betas) - 1)
        return super().sample(x, k, updates)

    def report(self) -> dict[str, torch.Tensor]:
        """The last run's acceptance rate (``mcmc/tt_accept_rate``: the same value at every log step until the next
        run), the runs so far (``mcmc/tt_runs``) and their mean acceptance rate (``mcmc/tt_accept_mean``, the
        paper's figure: Salakhutdinov 2009 quotes ~0.8 on the toy RBM); nothing before the first run."""
        if self.last_accept is None:  # also after a resume, until the next run (so runs >= 1 below)
            return {}
        return {"mcmc/tt_accept_rate": self.last_accept, "mcmc/tt_runs": torch.tensor(float(self.runs)),
                "mcmc/tt_accept_mean": self.accept_sum / self.runs}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "tt_runs": self.runs, "tt_accept_sum": self.accept_sum}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint written before the counters existed restarts them at zero (the mean then covers the runs
        since the resume)."""
        super().load_state_dict(state)
        self.runs, self.accept_sum = int(state.get("tt_runs", 0)), state.get("tt_accept_sum", 0.0)

    def image_grids(self, n_pixels: int) -> dict[str, torch.Tensor]:
        out = super().image_grids(n_pixels)
        if self.last_run is not None:
            out["mcmc/tt_before"] = self.last_run[0][:64, :n_pixels]
            out["mcmc/tt_after"] = self.last_run[1][:64, :n_pixels]
        return out

    def accelerate(self, mode: str) -> None:
        """The sweeps and the tempered-transitions runs on the fused kernels."""
        super().accelerate(mode)
        self.tt = TemperedTransitions(self.model, self.tt.betas, accel=mode)


class ParallelTemperingPhase(Persistent):
    """Persistent parallel-tempering chains (``pt.num_temps`` replicas, betas from ``pt.beta_min`` to 1); each
    sweep is one PT step, which swaps the even or the odd pairs by the parity of the sweep count."""

    def __init__(self, model, generator: torch.Generator, *, num_particles: int = 100, reuse_hidden: bool = False,
                 pt: PTSettings = PTSettings()) -> None:
        super().__init__(model, generator, num_particles=num_particles, reuse_hidden=reuse_hidden)
        pt = PTSettings.of(pt)
        self.pt = ParallelTempering(model, uniform_betas(pt.num_temps, pt.beta_min).float())
        self.swap_rates = SwapRates(self.pt.num_temps - 1)  # every pair's rate over the steps between logs

    def init(self, start: torch.Tensor) -> State:
        return self.pt.init(start, self.generator)

    def target(self, chains: State) -> State:
        return self.pt.target(chains)

    def sweep(self, chains: State) -> State:
        chains, info = self.pt.step(chains, generator=self.generator, parity=self.sweeps)
        self.swap_rates.add(info["swap_rate"])
        return chains

    def report(self) -> dict[str, torch.Tensor]:
        """Each pair's rate since the last log: both parities, not the last step's half."""
        return {f"mcmc/pt_swap_rate/{pair}": rate for pair, rate in self.swap_rates.report().items()}

    def accelerate(self, mode: str) -> None:
        """The replicas' sweeps on the fused kernels."""
        super().accelerate(mode)
        self.pt.gibbs = BlockGibbs(self.model, accel=mode)


class ExactGradient(NegativePhase):
    """No negatives: E_model[dF/dtheta] is the gradient of log Z, summed exactly (models with <= 20 units to sum;
    others are refused here, not at the first step)."""

    def __init__(self, model, generator: torch.Generator, *, num_particles: int = 100,
                 reuse_hidden: bool = False) -> None:
        super().__init__(model, generator, num_particles=num_particles, reuse_hidden=reuse_hidden)
        model.log_z_exact()

    def sample(self, x: torch.Tensor, k: int, updates: int) -> None:
        return None


PHASES = {"sap": Persistent, "trans_sap": TemperedPersistent, "pt_sap": ParallelTemperingPhase,
          "cd": ContrastiveDivergence, "exact_ml": ExactGradient}
