"""Maximum-likelihood learners for Boltzmann machines. They differ only in the negative phase.

All of them follow the gradient of the average log-likelihood,
    d/dtheta mean log p(x) = -mean_data dF(x)/dtheta + E_model[dF(x)/dtheta],
with F the free energy (h summed out analytically), through the surrogate mean F(data) - mean F(negatives).

- ``sap``: the stochastic approximation procedure (Younes 1989; Tieleman 2008's persistent CD;
  Salakhutdinov 2009, Algorithm 1). M persistent particles, each moved by k block-Gibbs sweeps per update.
- ``trans_sap``: SAP whose particles also take one tempered-transitions run every ``tt.every`` updates
  from ``tt.start_step`` on (Salakhutdinov 2009, Sec. 3; parameters are not updated during the run).
- ``pt_sap``: the particles are the beta = 1 replicas of parallel-tempering chains.
- ``cd``: contrastive divergence, CD-k: chains restart at the minibatch and take k sweeps.
- ``exact_ml``: the exact gradient, E_model by enumeration through log Z (models with <= 20 units to sum).

The learning rate is fixed for ``schedule.t0`` updates, then a / (b + t) (the paper's schedule).
"""

from __future__ import annotations

import torch
from torch import nn

from models.rbm import BoltzmannMachine, State
from nvil.config import positive_float, positive_int
from nvil.errors import ConfigError
from nvil import distributed
from nvil.learners.base import DataParallel, grad_norms
from nvil.mcmc import BlockGibbs, ParallelTempering, TemperedTransitions, uniform_betas
from nvil.mcmc.parallel_tempering import SwapRates


def paper_schedule(lr: float, t0: int | None, a: float | None, b: float | None):
    """LambdaLR factor: lr for t < t0, then a / (b + t) (Salakhutdinov 2009, Sec. 4)."""
    if t0 is None:
        return lambda t: 1.0
    if a is None or b is None or a <= 0 or b < 0:
        raise ConfigError("learner.schedule needs a > 0 and b >= 0 when t0 is set")
    return lambda t: 1.0 if t < t0 else (a / (b + t)) / lr


def filter_grid(w: torch.Tensor, n: int = 64) -> torch.Tensor:
    """The first n receptive fields, each rescaled to [0, 1] for an image grid."""
    w = w[:n]
    lo, hi = w.min(1, keepdim=True).values, w.max(1, keepdim=True).values
    return (w - lo) / (hi - lo).clamp(min=1e-8)


class SAP(DataParallel, nn.Module):
    MODES = ("sap", "trans_sap", "pt_sap", "cd", "exact_ml")

    def __init__(self, model, inference, cfg, device: torch.device, seed: int) -> None:
        super().__init__()
        if not isinstance(model, BoltzmannMachine):
            raise ConfigError(f"learner={cfg.name} trains Boltzmann machines (model=rbm or srbm), not this model")
        self.model, self.cfg, self.mode = model, cfg, cfg.name
        lr = positive_float(cfg.get("lr"), "learner.lr")
        self.optimizer = torch.optim.SGD([{"params": list(model.parameters()), "name": "model"}], lr=lr, momentum=float(cfg.get("momentum", 0.0)),
                                         weight_decay=float(cfg.get("weight_decay", 0.0)))
        sched = cfg.get("schedule") or {}
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, paper_schedule(lr, sched.get("t0"), sched.get("a"), sched.get("b")))
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.gibbs = BlockGibbs(model)
        self.k = positive_int(cfg.get("k", 1), "learner.k")
        self.k_final = positive_int(cfg.get("k_final"), "learner.k_final", allow_none=True)
        self.k_ramp = positive_int(cfg.get("k_ramp", 1), "learner.k_ramp")
        self.num_particles = positive_int(cfg.get("num_particles", 100), "learner.num_particles")
        self.tt = self.pt = None
        if self.mode == "trans_sap":
            tt = cfg.tt
            self.tt = TemperedTransitions(model, uniform_betas(tt.num_betas, tt.beta_min))
            self.tt_every = positive_int(tt.every, "learner.tt.every")
            self.tt_start = int(tt.get("start_step", 0))
        if self.mode == "pt_sap":
            self.pt = ParallelTempering(model, uniform_betas(cfg.pt.num_temps, cfg.pt.beta_min).float())
            self.swap_rates = SwapRates(self.pt.num_temps - 1)  # every pair's rate over the steps between logs
        if self.mode == "exact_ml":
            model.log_z_exact()  # refuse models too large to enumerate now, not at the first step
        self.particles: State | None = None
        self.updates = 0  # parameter updates so far (the schedule's t and the TT clock)
        self.gibbs_sweeps = 0
        self.last_tt_run: tuple[torch.Tensor, torch.Tensor] | None = None
        self.last_tt_accept: torch.Tensor | None = None  # reported at every log step after a run

    def sweeps_now(self) -> int:
        """k at this update: fixed, or rising linearly from ``k`` to ``k_final`` over ``k_ramp`` updates
        (Salakhutdinov & Murray 2008 raised CD's k gradually from 1 to 25)."""
        if self.k_final is None:
            return self.k
        frac = min(1.0, self.updates / self.k_ramp)
        return self.k + int(frac * (self.k_final - self.k))

    # ---- the negative phase ------------------------------------------------------------------------
    def _init_particles(self, x: torch.Tensor) -> State:
        idx = torch.randint(0, x.shape[0], (self.num_particles,), generator=self.generator, device=x.device)
        start = x[idx]
        return self.pt.init(start, self.generator) if self.pt else self.model.init_chains(start, self.generator)

    @torch.no_grad()
    def negatives(self, x: torch.Tensor, metrics: dict) -> torch.Tensor | None:
        """Advance the chains and return the negative-phase x (None for exact ML). PT's swap rates go to
        ``self.swap_rates``, reported by ``step`` at log steps, so ``metrics`` is not written here."""
        if self.mode == "exact_ml":
            return None
        if self.mode == "cd":
            state = self.model.init_chains(x, self.generator)
            k = self.sweeps_now()
            for _ in range(k):
                state, _ = self.gibbs.step(state, 1.0, self.generator)
            self.gibbs_sweeps += k
            return state.x
        if self.particles is None:
            self.particles = self._init_particles(x)
        if self.tt is not None and self.updates >= self.tt_start and self.updates % self.tt_every == 0:
            before = self.particles.x
            self.particles, info = self.tt.step(self.particles, generator=self.generator)
            self.last_tt_run = (before, self.particles.x)
            self.last_tt_accept = info["accept_rate"]
            self.gibbs_sweeps += 2 * (len(self.tt.betas) - 1)
        for _ in range(self.sweeps_now()):
            if self.pt is not None:
                self.particles, info = self.pt.step(self.particles, generator=self.generator, parity=self.gibbs_sweeps)
                self.swap_rates.add(info["swap_rate"])
            else:
                self.particles, _ = self.gibbs.step(self.particles, 1.0, self.generator)
            self.gibbs_sweeps += 1
        return self.pt.target(self.particles).x if self.pt else self.particles.x

    # ---- data parallelism ------------------------------------------------------------------------------
    def distribute(self, d: distributed.Dist, device: torch.device) -> None:
        """Each rank keeps its own share of the ``num_particles`` persistent particles (and of PT's replicas)."""
        self.num_particles = distributed.per_rank(self.num_particles, d, "learner.num_particles")
        super().distribute(d, device)

    def rank_state(self) -> dict:
        state = super().rank_state()
        if self.particles is not None:
            state.update(particles_x=self.particles.x, particles_h=self.particles.h)
        return state

    def load_rank_state(self, state: dict) -> None:
        super().load_rank_state(state)
        if state.get("particles_x") is not None:  # as load_learner_state: the checkpoint is mapped to the device
            self.particles = State(state["particles_x"], state["particles_h"])

    # ---- one update ----------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, neg: torch.Tensor | None) -> torch.Tensor:
        """The surrogate mean F(data) - mean F(negatives), or mean F(data) + log Z for exact ML: its gradient is
        minus the log-likelihood gradient (one rank's share of it under data parallelism)."""
        f_data = self.model.free_energy(x).mean()
        if neg is None:
            return f_data + self.model.log_z_exact()
        return f_data - self.model.free_energy(neg).mean()

    def step(self, x: torch.Tensor, diagnostics: bool = False) -> dict[str, torch.Tensor]:
        metrics: dict = {}
        neg = self.negatives(x, metrics)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_module()(x, neg)
        # -loss is log p of the batch for exact ML, and the free-energy gap F(negatives) - F(data) otherwise.
        metrics["train/log_p_exact_batch" if neg is None else "train/free_energy_gap"] = -loss.detach()
        loss.backward()
        if diagnostics:
            metrics.update(grad_norms(self.optimizer))
            with torch.no_grad():
                recon = self.model.sample_x_given_h(self.model.h_given_x(x), 1.0, self.generator, x=x)
                metrics["train/reconstruction_error"] = ((recon - x) ** 2).sum(-1).mean()
            metrics["train/lr"] = torch.tensor(self.scheduler.get_last_lr()[0])
            metrics["mcmc/gibbs_sweeps"] = torch.tensor(float(self.gibbs_sweeps))
            metrics["mcmc/k"] = torch.tensor(float(self.sweeps_now()))
            if self.last_tt_accept is not None:
                metrics["mcmc/tt_accept_rate"] = self.last_tt_accept
            if self.pt is not None:  # each pair's rate since the last log: both parities, not the last step's half
                metrics.update({f"mcmc/pt_swap_rate/{pair}": rate for pair, rate in self.swap_rates.report().items()})
        self.optimizer.step()
        self.scheduler.step()
        self.updates += 1
        return metrics

    # ---- TensorBoard images --------------------------------------------------------------------------
    def image_grids(self) -> dict[str, torch.Tensor]:
        """Persistent particles, the last tempered-transitions run (before / after, the paper's Fig. 2),
        and the weight filters, each [n, pixels] in [0, 1]."""
        n_pix = self.model.n_pixels
        out = {}
        if self.particles is not None:
            parts = self.pt.target(self.particles).x if self.pt else self.particles.x
            out["mcmc/particles"] = parts[:64, :n_pix]
        if self.last_tt_run is not None:
            out["mcmc/tt_before"] = self.last_tt_run[0][:64, :n_pix]
            out["mcmc/tt_after"] = self.last_tt_run[1][:64, :n_pix]
        out["model/filters"] = filter_grid(self.model.filters())
        return out

    # ---- state for resume ----------------------------------------------------------------------------
    def learner_state(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "generator": self.generator.get_state(), "updates": self.updates, "gibbs_sweeps": self.gibbs_sweeps,
            "particles_x": None if self.particles is None else self.particles.x,
            "particles_h": None if self.particles is None else self.particles.h,
        }

    def load_learner_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"].cpu())
        self.updates, self.gibbs_sweeps = int(state["updates"]), int(state["gibbs_sweeps"])
        if state.get("particles_x") is not None:
            self.particles = State(state["particles_x"], state["particles_h"])
