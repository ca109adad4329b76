"""Where the reverse AIS chains of a certified log Z start (``nvil.estimators.certify``), and which run the
certificate keeps.

Reverse AIS (Grosse, Ghahramani & Adams 2015; Burda, Grosse & Salakhutdinov 2015) runs the AIS path from beta = 1
back to the base rate. From exact samples of the model exp(log w) is unbiased for Z_0 / Z, so its log Z
over-estimates in expectation and [forward, reverse] is a stochastic sandwich. A trained RBM offers no exact samples,
so the chains start from approximations of the model (``reverse_starts``), each source in the same run
(``reverse_log_zs``):

- ``forward``: the forward run's end states resampled by their importance weights, then a few block-Gibbs sweeps:
  the approximate-sample start that Grosse, Ghahramani & Adams 2015 and Grosse, Ancha & Roy 2016 caution about
  for bidirectional Monte Carlo on real data;
- ``particles``: the persistent particles a checkpoint stores (the learner's chains, lagging its parameters);
- ``data``: block-Gibbs runs from training rows.

From such starts the reverse estimate is not an upper bound, even in expectation: with states drawn from q
rather than the model, 1 / Z_hat estimates E[q(x) / p(x)] / Z over the forward chains' end-state law, so the
reverse side is a diagnostic with power, not a proof. It parts from the forward estimate on a ladder too coarse
and inverts the sandwich for a number that is not what the runs gave; forward-resampled starts share the forward
run's blind spots (they hold only what its chains reached: a mode no chain found is missed by both sides), which
is what the hard lower bound and the other sources are for. ``choose_reverse`` keeps the run its own evidence
favours: consistent with the hard lower bound (a run below it provably missed mass), then the highest ESS.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from nvil.core.errors import ConfigError
from nvil.estimators.ais_rbm import ForwardRun, RBMPath
from nvil.estimators.annealing import LogZ, ais
from nvil.estimators.hard_bound import HardBound, binary_states
from nvil.mcmc.gibbs import BlockGibbs
from nvil.models.rbm import BoltzmannMachine, State

SOURCES = ("forward", "particles", "data")  # where reverse chains may start: ``reverse_starts``


def tolerance(log_z: float) -> float:
    """Rounding allowance for comparing a float32 AIS estimate with a float64 bound."""
    return 1e-3 + 1e-5 * abs(log_z)


@torch.no_grad()
def gibbs_run(model: BoltzmannMachine, x: torch.Tensor, sweeps: int, generator=None) -> torch.Tensor:
    """``sweeps`` block-Gibbs sweeps at beta = 1 from every row of x at once."""
    gibbs, state = BlockGibbs(model), State(x, None)  # each sweep draws h afresh from x
    for _ in range(sweeps):
        state, _ = gibbs.step(state, 1.0, generator)
    return state.x


def check_sources(sources, what: str = "estimator.reverse_sources") -> tuple[str, ...]:
    """``sources`` as a tuple of distinct names from ``SOURCES``; a one-line ``ConfigError`` otherwise."""
    names = (sources,) if isinstance(sources, str) else tuple(sources)
    if not names or any(n not in SOURCES for n in names) or len(set(names)) != len(names):
        raise ConfigError(f"{what} must be a list of distinct names from {', '.join(SOURCES)}, got {list(names)}")
    return names


@torch.no_grad()
def resampled_end_states(x: torch.Tensor, log_w: torch.Tensor, n: int, generator=None) -> torch.Tensor:
    """n rows drawn with replacement from the forward run's end states ``x`` with probabilities w / sum w
    (multinomial resampling on the final log-weights): the weighted end states approximate the model, and so do
    the draws, as far as the forward chains reached it."""
    p = torch.softmax(log_w.double(), 0)
    return x[torch.multinomial(p, n, replacement=True, generator=generator)]


def _particle_start(model: BoltzmannMachine, n: int, particles: torch.Tensor, sweeps: int, generator=None):
    idx = torch.randperm(len(particles), generator=torch.Generator().manual_seed(0))[:n]
    x = particles[idx.to(particles.device)].to(model.W.device, model.W.dtype)
    how = f"{len(x)} persistent particles stored in the checkpoint"
    if sweeps:
        return gibbs_run(model, x, sweeps, generator), f"{how}, then {sweeps} block-Gibbs sweeps"
    return x, how


def _data_start(model: BoltzmannMachine, n: int, rows: torch.Tensor, sweeps: int, generator=None):
    idx = torch.randint(0, len(rows), (n,), generator=torch.Generator().manual_seed(0))
    x = rows[idx.to(rows.device)].to(model.W.device, model.W.dtype)
    x = x.to_dense() if x.is_sparse else x
    x = binary_states(model, x) if model.visible_layer.discrete else x
    return gibbs_run(model, x, sweeps, generator), f"{sweeps} block-Gibbs sweeps from {n} training rows"


def _forward_start(model: BoltzmannMachine, n: int, forward: ForwardRun, sweeps: int, generator=None):
    x = resampled_end_states(forward.end.x, forward.log_w, n, generator)
    how = (f"{n} forward AIS end states resampled by their weights (ESS {forward.estimate.ess:.1f}), then {sweeps} "
           "block-Gibbs sweeps")
    return gibbs_run(model, x, sweeps, generator), how


def reverse_starts(model: BoltzmannMachine, num_chains: int, sources=SOURCES, *, forward: ForwardRun | None = None,
                   particles: torch.Tensor | None = None, rows: torch.Tensor | None = None, num_betas: int = 100,
                   burn_in: int | None = None, generator=None) -> list[tuple[str, torch.Tensor, str]]:
    """(source, x at beta = 1 for its reverse chains, how they were drawn) for each of ``sources`` that has states:

    - ``forward``: ``num_chains`` of the forward run's end states resampled by their weights
      (``resampled_end_states``), then ``burn_in`` block-Gibbs sweeps (None: num_betas / 100, at least 1), which
      part the copies that resampling makes;
    - ``particles``: the persistent particles a checkpoint stores (the learner's own chains, which may lag the final
      parameters or sit in a few modes), then ``burn_in`` sweeps (None: none);
    - ``data``: ``burn_in`` sweeps (None: num_betas / 4) from training rows.

    ``ConfigError`` when none of them has states."""
    sources = check_sources(sources)
    out = []
    if "forward" in sources and forward is not None and bool(torch.isfinite(forward.log_w).any()):
        sweeps = burn_in if burn_in is not None else max(1, num_betas // 100)
        out.append(("forward", *_forward_start(model, num_chains, forward, sweeps, generator)))
    if ("particles" in sources and particles is not None and len(particles)
            and particles.shape[1] == model.n_visible):
        out.append(("particles", *_particle_start(model, num_chains, particles, burn_in or 0, generator)))
    if "data" in sources and rows is not None and len(rows):
        sweeps = burn_in if burn_in is not None else max(1, num_betas // 4)
        out.append(("data", *_data_start(model, num_chains, rows, sweeps, generator)))
    if not out:
        raise ConfigError(f"reverse AIS has no start states from the sources {', '.join(sources)}: it needs the "
                          "forward run, persistent particles or training rows")
    return out


@dataclass
class ReverseRun:
    """Reverse AIS from one source of start states (``reverse_starts``): the ``source``, how its chains were drawn
    (``init``) and its ``estimate``."""

    source: str
    init: str
    estimate: LogZ


def _below_bound(r: ReverseRun, bound: HardBound | None) -> float:
    """How far log Z_hat + 3 SE of ``r`` lies below the hard lower bound (<= 0: consistent with it)."""
    if bound is None:
        return -math.inf
    return bound.value - tolerance(bound.value) - (r.estimate.log_z + 3 * r.estimate.stderr)


def _ess_share(r: ReverseRun) -> float:
    return r.estimate.ess / max(r.estimate.num_chains, 1)


def choose_reverse(runs: list[ReverseRun], bound: HardBound | None) -> tuple[ReverseRun, str]:
    """(the reverse run the certificate uses, why): among the runs consistent with the hard lower bound
    (log Z_hat + 3 SE >= the bound: a run below it provably missed mass), the one with the highest ESS as a share
    of its chains, (sum w)^2 / sum w^2 / n, ties to the smaller log-weight SD; where none is consistent, the one
    least far below the bound (the certificate then fails on it). The choice never looks at the forward estimate,
    so it cannot pick the run that agrees with it."""
    ok = [r for r in runs if _below_bound(r, bound) <= 0]
    if ok:
        best = max(ok, key=lambda r: (_ess_share(r), -r.estimate.log_w_sd))
        why = ("consistent with the hard lower bound, with the highest reverse ESS" if bound is not None
               else "the highest reverse ESS")
    else:
        best = min(runs, key=lambda r: _below_bound(r, bound))
        why = "no source is consistent with the hard lower bound; this one is the least far below it"
    others = [f"{r.source}: ESS {_ess_share(r):.2f} of its chains" + (
              f", {_below_bound(r, bound):.2f} nats below the hard lower bound" if _below_bound(r, bound) > 0 else "")
              for r in runs if r is not best]
    why = f"{best.source} ({why}, {_ess_share(best):.2f} of its chains)"
    return best, why + (f"; {'; '.join(others)}" if others else "")


def reverse_log_zs(path: RBMPath, x_inits: list[torch.Tensor], betas: torch.Tensor, generator=None,
                   progress: bool = False) -> list[LogZ]:
    """Reverse AIS (``nvil.estimators.ais_rbm.reverse_log_z``) from several sets of start states in one run, their
    chains side by side: one estimate per set from its own chains' log-weights (the run's time shared by chains)."""
    t0 = time.perf_counter()
    sizes = [len(x) for x in x_inits]
    log_w, _ = ais(path, path.state(torch.cat(x_inits)), betas.flip(0), generator, progress, "reverse AIS log Z")
    seconds = time.perf_counter() - t0
    return [LogZ.from_log_w(w, path.log_z0(), "reverse", len(betas) - 1, seconds * len(w) / len(log_w))
            for w in log_w.split(sizes)]


def stored_particles(payload: dict | None, n_visible: int) -> torch.Tensor | None:
    """The persistent particles a checkpoint's learner stored (SAP and its kin; a greedy DBN run's current layer),
    when they fit a model with ``n_visible`` units."""
    learner = (payload or {}).get("learner") or {}
    for state in (learner, learner.get("inner") or {}):
        x = state.get("particles_x") if isinstance(state, dict) else None
        if torch.is_tensor(x) and x.dim() == 2 and x.shape[1] == n_visible and len(x):
            return x
    return None
