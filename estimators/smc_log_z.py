"""``estimator=smc``: a Boltzmann machine's log Z by adaptive tempered SMC (``nvil.estimators.smc``) with the
certificate of ``estimator=ais``, and the per-example log p(v) = -F(v) - log Z (an RBM or semi-RBM; a DBM's
mean-field bound less the log Z of its top machine).

``num_runs`` independent SMC runs of ``num_particles`` particles each, batched, walk the ladder a pilot run of
``pilot_runs`` x ``num_particles`` particles of its own chose (each next beta at the conditional ESS share ``cess``),
resampling a run whose ESS falls below ``resample_ess`` of its particles and moving every particle by
``num_moves`` block-Gibbs sweeps per beta. Each run's Z_r is unbiased for Z; the estimate is their mean, its
standard error from their spread (the delta method on Z_hat = mean_r Z_r), its ESS over the runs. The certificate
(``nvil.estimators.certify``): the hard lower bound from probe states, reverse AIS from each reverse source on the
SMC ladder at ``reverse_fraction`` of the forward cost (``SMCSampler.reverse``), the ESS over runs, and the
forward-reverse gap.
"""

from __future__ import annotations

from nvil.core.config import positive_float
from nvil.estimators.ais import AIS
from nvil.estimators.ais_rbm import base_rate
from nvil.estimators.certify import certified_log_z
from nvil.estimators.smc import SMCSampler


class SMC(AIS):
    """``estimator=smc``: a Boltzmann machine's log Z by adaptive tempered SMC, certified as by ``AIS``.

    log p(v) = -F(v) - log Z per example (an RBM or semi-RBM; a DBM's mean-field bound less the log Z of its top
    machine), by the method of the module docstring. From Python:
    ``SMC(num_particles=100, num_runs=10).estimate(rbm, x_test, train=x_train)``; ``estimate``, ``check`` and the
    log Z cache are ``AIS``'s, only the forward run is SMC's (``nvil.estimators.smc.SMCSampler``). The defaults are
    configs/estimator/smc.yaml's.

    Parameters
    ----------
    num_particles : int, default 100
        N, the particles of each SMC run (at least 2: resampling needs a choice).
    num_runs : int, default 10
        R, independent runs of ``num_particles`` each, batched; the estimate is the mean of their Z_r, its standard
        error from their spread (the delta method on Z_hat = mean_r Z_r), its ESS over the runs.
    cess : float, default 0.9
        Each next beta keeps the conditional ESS of the weight increment at this share of N (Zhou et al. 2016,
        Eq. 3.4), in the run that needs the smallest step; in (0, 1).
    resample_ess : float, default 0.5
        A run whose ESS falls below this share of its particles is resampled (systematic) and its weights reset to
        their mean; in (0, 1).
    num_moves : int, default 1
        Block-Gibbs sweeps per beta that move every particle (rejuvenation).
    max_betas : int, default 100000
        The most temperatures the pilot may choose; a ladder that needs more is refused (raise it, or lower
        ``cess``).
    pilot_runs : int, default 2
        The pilot run that chooses the ladder has ``pilot_runs`` x ``num_particles`` particles of its own, thrown
        away after.
    base_smoothing : float, default 0.05
        s of the base-rate marginals p = (mean + s) / (1 + 2 s) (Salakhutdinov & Murray 2008, Sec. 4.2).
    certify : bool, default True
        False gives the forward estimate alone (no probes, no reverse run, ``certified`` None).
    reverse_fraction : float, default 0.5
        The reverse AIS run costs this share of the forward runs (``SMCSampler.reverse``: 2 x ``num_runs`` chains
        on the SMC ladder's spacing); in (0, 1].
    reverse_sources : list of str, default ["forward", "particles"]
        Where the reverse chains start, as ``AIS``'s: ``forward`` (the forward end states resampled by their
        weights), ``particles`` (the checkpoint's persistent particles), ``data`` (Gibbs runs from training rows).
    reverse_burn_in : int or None, default None
        Block-Gibbs sweeps at beta = 1 before the reverse run, as ``AIS``'s (None: that class's defaults per source).
    max_gap : float, default 1.0
        Nats; a forward-reverse gap above it fails the certificate.
    min_ess_fraction : float, default 0.1
        An ESS over the runs below this share of ``num_runs`` fails the certificate.
    num_climb : int, default 256
        Random starts of the hill-climbed probe states of the hard lower bound.
    num_data_probes : int, default 1000
        Data rows used as probes (and as the ``data`` source's reverse-chain starts).
    batch_size : int, default 1000
        Examples per batch of free energies.
    accel : str, default "auto"
        The block-Gibbs draws, as ``AIS``'s (none | compile | cudagraphs | auto); the SMC step itself is eager.
    cache : bool, default True
        Keep the certified log Z in ``<checkpoint>.log_z.json`` when evaluating a checkpoint, keyed by the
        settings (the sampler's among them, ``cache_extra``), the seed and the parameters.

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If a setting is out of range (``SMCSampler``, ``AIS``), in one line naming
        ``estimator.KEY``.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import RBM
    >>> from nvil.estimators import SMC, Exact
    >>> rbm = RBM(6, 4)
    >>> x = (torch.rand(8, 6) < 0.5).float()
    >>> result = SMC(num_particles=16, num_runs=4, num_climb=8, num_data_probes=8).estimate(rbm, x)
    >>> result.log_p.shape, result.extras["schedule"], result.extras["log_z_schedule"]["num_runs"]
    (torch.Size([8]), 'smc', 4)
    >>> result.certified
    True
    >>> exact = Exact().estimate(rbm, x)
    >>> abs(result.extras["log_z"] - exact.extras["log_z"]) < 3 * result.extras["log_z_stderr"] + 0.05
    True
    """

    name = "smc"

    def __init__(self, *, num_particles: int = 100, num_runs: int = 10, cess: float = 0.9,
                 resample_ess: float = 0.5, num_moves: int = 1, max_betas: int = 100_000, pilot_runs: int = 2,
                 base_smoothing: float = 0.05, certify: bool = True, reverse_fraction: float = 0.5,
                 reverse_sources: list[str] = ["forward", "particles"],  # noqa: B006  (the yaml's list)
                 reverse_burn_in: int | None = None, max_gap: float = 1.0, min_ess_fraction: float = 0.1,
                 num_climb: int = 256, num_data_probes: int = 1000, batch_size: int = 1000, accel: str = "auto",
                 cache: bool = True) -> None:
        self.sampler = SMCSampler(num_particles, num_runs, cess, resample_ess, num_moves, max_betas, pilot_runs)
        super().__init__(num_chains=self.sampler.num_particles * self.sampler.num_runs, schedule="adaptive",
                         num_betas=max_betas, base_smoothing=base_smoothing, certify=certify,
                         reverse_fraction=positive_float(reverse_fraction, "estimator.reverse_fraction"),
                         reverse_sources=reverse_sources, reverse_burn_in=reverse_burn_in, max_gap=max_gap,
                         min_ess_fraction=min_ess_fraction, num_climb=num_climb, num_data_probes=num_data_probes,
                         batch_size=batch_size, accel=accel, cache=cache)

    def certified_log_z(self, model, train, rows, generator, progress, particles=None, phase=None):
        """The certified log Z of ``model``, its forward side by SMC (``SMCSampler.run``) in place of forward AIS.

        As ``AIS.certified_log_z``, with this estimator's sampler handed to
        ``nvil.estimators.certify.certified_log_z``: the pilot chooses the ladder, the SMC runs walk it, and the
        reverse AIS run of the certificate goes down the same ladder's spacing.

        Parameters
        ----------
        model : BoltzmannMachine
            The machine whose log Z is wanted (an RBM, a semi-RBM, or a DBM's bipartite top machine).
        train : torch.Tensor
            ``(rows, n_visible)`` rows whose marginals make the base-rate model f_0.
        rows : torch.Tensor
            ``(rows, n_visible)`` rows used as hard-bound probes and as the ``data`` reverse source's Gibbs starts.
        generator : torch.Generator or None
            Source of randomness for every run.
        progress : bool
            Show inner progress bars for the runs.
        particles : torch.Tensor or None, default None
            ``(chains, n_visible)`` persistent particles of the checkpoint (the ``particles`` reverse source).
        phase : callable or None, default None
            ``phase(text)`` is told each phase as it starts (``log Z (pilot SMC, 1/4)``).

        Returns
        -------
        CertifiedLogZ
            (``nvil.estimators.certify``) the forward SMC estimate with its certificate.
        """
        base = base_rate(model, train, self.settings.base_smoothing)
        return certified_log_z(model, base, self.settings, self.cert, generator, data_rows=rows, particles=particles,
                               progress=progress, accel=self.accel, phase=phase, sources=self.reverse_sources,
                               sampler=self.sampler)

    def cache_extra(self) -> dict:
        """What else the cached log Z depends on: the sampler and its settings (part of the cache key).

        Returns
        -------
        dict
            ``{"sampler": "smc", **SMCSampler.settings()}``.
        """
        return {"sampler": "smc", **self.sampler.settings()}

    def schedule_label(self) -> str:
        """The result's ``schedule``: ``"smc"``, the ladder being the SMC pilot's.

        Returns
        -------
        str
            ``"smc"``.
        """
        return "smc"

