"""``estimator=ais`` and ``estimator=raise``: a Boltzmann machine's log Z with its certificate, and the per-example
log p(v) = -F(v) - log Z (Salakhutdinov & Murray 2008, Sec. 4.2).

Both run forward AIS from the base-rate model on the ladder ``schedule`` (``adaptive`` by default: spaced from a
pilot run so each step adds about the same log-weight variance; ``paper`` is the paper's fixed ladder) and,
unless ``certify=false``, the certificate of ``nvil.estimators.certify``: a hard lower bound from probe states,
reverse AIS from each of ``reverse_sources`` (the forward end states resampled by their weights, the checkpoint's
persistent particles, Gibbs runs from training rows) with the run its own evidence favours kept, the ESS, and
``certified`` with the reasons when it fails. ``raise`` runs its reverse side on the whole ladder and reports the
reverse side (the reverse log Z: conservative in expectation where its chains start from exact model samples) as
``mean_log_p``.

Evaluated from a checkpoint, the certified log Z is kept beside it in ``<checkpoint>.log_z.json`` as a DBN's
top-RBM log Z is (``nvil.estimators.log_z``: signed entries keyed by the settings, the seed and the parameters'
digest, re-checked on every reading), so a second evaluation of the same checkpoint and settings reuses it
(``log_z_cached: true``); ``cache=false`` computes it every time.

Beside ``mean_log_p`` the line carries ``mean_log_p_band``, the per-example mean over the log Z band, and
``mean_log_p_hard_upper_bound`` = mean -F(v) - (hard lower bound on log Z), which no estimate can honestly exceed.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from nvil.backend.accel import check_mode
from nvil.core.config import positive_int
from nvil.core.errors import ConfigError
from nvil.estimators.ais_rbm import base_rate, check_boltzmann, free_energy_log_p
from nvil.estimators.annealing import LogZ
from nvil.estimators.base import Estimator, Result, check_rows, default_generator, phase_namer, shows_progress
from nvil.estimators.certify import CertifiedLogZ, certified_log_z, check_sources, log_p_extras
from nvil.estimators.reverse_starts import stored_particles
from nvil.estimators.log_z import cached_log_z, log_z_key
from nvil.estimators.settings import AISSettings, CertifySettings
from nvil.models.protocol import TOP_MACHINE, VARIATIONAL_BOUND, capable


def scores_top_bound(model) -> bool:
    """Whether ``estimator=ais`` scores ``model`` by its per-row variational bound on log p*(v) less the AIS log Z
    of its top machine (a DBM), rather than by -F(v) - log Z of the model itself (an RBM)."""
    return capable(model, TOP_MACHINE) and capable(model, VARIATIONAL_BOUND)


class AIS(Estimator):
    """``estimator=ais``: log Z of an RBM or semi-RBM by certified AIS, and log p(v) = -F(v) - log Z.

    From Python: ``AIS(num_chains=1000, num_betas=10_000).estimate(rbm, x_test, train=x_train)``. The keywords'
    defaults are those of configs/estimator/ais.yaml. Forward AIS runs from the base-rate model (Salakhutdinov &
    Murray 2008, Sec. 4.2) and, unless ``certify=false``, the certificate of ``nvil.estimators.certify`` (a hard
    lower bound from probe states, reverse AIS from each of ``reverse_sources``, the ESS). On a DBM the score is
    its per-row mean-field lower bound less the AIS log Z of its bipartite top machine.

    ``estimator.strict`` belongs to the evaluation driver (``nvil.app``), not to this class.

    Parameters
    ----------
    num_chains : int, default 100
        Forward (and reverse) AIS chains (M in the paper).
    schedule : str, default "adaptive"
        The ladder of betas: ``adaptive`` (a pilot run spaces the betas so each step adds the same log-weight
        variance) | ``paper`` (500 / 4,000 / 10,000 betas in [0, 0.5] / [0.5, 0.9] / [0.9, 1], scaled to
        num_betas) | ``linear`` | ``sigmoid``.
    num_betas : int, default 14500
        The ladder's steps (K, the number of intermediate distributions).
    pilot_fraction : float, default 0.05
        Adaptive only: the pilot's steps as a share of num_betas (at most 0.1).
    base_smoothing : float, default 0.05
        s in the base-rate marginals p = (mean + s) / (1 + 2 s) (Salakhutdinov & Murray 2008, Sec. 4.2).
    certify : bool, default True
        False gives the forward estimate alone (no probes, no reverse run, ``certified`` None).
    reverse_fraction : float, default 0.5
        Reverse AIS runs on this share of num_betas (same spacing), in (0, 1].
    reverse_sources : list of str, default ["forward", "particles"]
        Where reverse chains start, each source in the same run (``forward``: the forward end states resampled by
        their weights; ``particles``: the checkpoint's persistent particles; ``data``: Gibbs runs from training
        rows); the certificate keeps the run consistent with the hard lower bound with the highest ESS
        (``nvil.estimators.certify.choose_reverse``).
    reverse_burn_in : int or None, default None
        Block-Gibbs sweeps at beta = 1 before the reverse run, for every source (None: from resampled forward
        states num_betas / 100, from data rows num_betas / 4, from particles none).
    max_gap : float, default 1.0
        Nats; a forward-reverse gap above it fails the certificate.
    min_ess_fraction : float, default 0.1
        A forward ESS below this share of num_chains fails the certificate (in [0, 1]).
    num_climb : int, default 256
        Random starts of the hill-climbed probe states (for the hard lower bound on log Z).
    num_data_probes : int, default 1000
        Data rows used as probes (and as the ``data`` source's reverse-chain starts).
    batch_size : int, default 1000
        Examples per batch of free energies.
    accel : str, default "auto"
        none | compile (the fused AIS step compiled) | cudagraphs (CUDA only) | auto (on a CPU a binary RBM's
        draws in C, a semi-RBM's pixel sweep in C; on CUDA the pixel sweep in Triton).
    cache : bool, default True
        Keep the certified log Z in ``<checkpoint>.log_z.json`` when evaluating a checkpoint.

    Raises
    ------
    nvil.core.errors.ConfigError
        If a setting is out of range (a non-positive count, an unknown schedule, source or ``accel`` mode, a
        ``pilot_fraction`` above 0.1), in one line naming the key (``estimator.KEY``).

    Examples
    --------
    >>> import torch
    >>> from nvil.models import RBM
    >>> from nvil.estimators import AIS, Exact
    >>> rbm = RBM(6, 4)
    >>> x = torch.bernoulli(torch.full((8, 6), 0.5))
    >>> result = AIS(num_chains=16, num_betas=100, num_climb=4, num_data_probes=8).estimate(rbm, x, train=x)
    >>> result.log_p.shape
    torch.Size([8])
    >>> result.checks
    ['ess', 'hard_lower_bound', 'sandwich_order', 'sandwich_gap', 'reverse_hard_lower_bound']
    >>> abs(result.mean_log_p - Exact().estimate(rbm, x).mean_log_p) < 0.1  # 4 hidden units: log Z is exact
    True
    """

    name = "ais"
    reverse_fraction = None  # None: the constructor's ``reverse_fraction``

    def __init__(self, *, num_chains: int = 100, schedule: str = "adaptive", num_betas: int = 14500,
                 pilot_fraction: float = 0.05, base_smoothing: float = 0.05, certify: bool = True,
                 reverse_fraction: float = 0.5,
                 reverse_sources: list[str] = ["forward", "particles"],  # noqa: B006  (the yaml's list)
                 reverse_burn_in: int | None = None, max_gap: float = 1.0, min_ess_fraction: float = 0.1,
                 num_climb: int = 256, num_data_probes: int = 1000, batch_size: int = 1000, accel: str = "auto",
                 cache: bool = True) -> None:
        self.settings = AISSettings(num_chains, schedule, num_betas, base_smoothing)
        self.reverse_sources = check_sources(reverse_sources)
        self.cache = bool(cache)
        self.cert = CertifySettings(certify, pilot_fraction, reverse_fraction, reverse_burn_in, max_gap,
                                    min_ess_fraction, num_climb, num_data_probes)
        if self.reverse_fraction is not None:
            self.cert = replace(self.cert, reverse_fraction=self.reverse_fraction)
        self.batch_size = positive_int(batch_size, "estimator.batch_size")
        self.accel = check_mode(accel, what="estimator.accel")

    def check(self, model, inference=None) -> None:
        """Refuse, before any work starts, a model whose log Z this estimator cannot anneal to.

        An RBM or semi-RBM is taken (its free energy), and so is a DBM (its top machine and variational bound).

        Parameters
        ----------
        model : torch.nn.Module
            The model to be scored.
        inference : torch.nn.Module or None, default None
            Not used (every estimator is handed it).

        Raises
        ------
        nvil.core.errors.ConfigError
            If ``model`` has no free energy (it is not a Boltzmann machine), naming the estimators that take it.
        """
        if not scores_top_bound(model):
            check_boltzmann(model, self.name)

    def dataset_inputs(self, model, data, split, rows, checkpoint=None, payload=None, **_) -> dict:
        """The keywords ``estimate`` needs beyond the rows: the training split, the stored particles, the checkpoint.

        Parameters
        ----------
        model : torch.nn.Module
            The model being evaluated (a DBM's particles are matched to its top machine's width).
        data : nvil.data.Dataset
            The dataset, whose ``train`` split makes the base rate and the probes.
        split : str
            The split being evaluated (not used).
        rows : tuple of int
            ``(start, stop)`` of the rows evaluated (not used).
        checkpoint : str or path-like or None, default None
            The file the model came from, where log Z is cached.
        payload : dict or None, default None
            The loaded checkpoint, whose learner state may hold persistent particles.
        **_ : Any
            Other keywords of the hook, ignored.

        Returns
        -------
        dict
            ``train`` (the training rows), ``particles`` (the stored persistent particles, or None) and
            ``checkpoint``.
        """
        machine = model.top if scores_top_bound(model) else model
        return {"train": data.split("train"), "particles": stored_particles(payload, machine.n_visible),
                "checkpoint": checkpoint}

    def certified_log_z(self, model, train, rows, generator, progress, particles=None, phase=None) -> CertifiedLogZ:
        """The certified log Z of ``model``: base rate from ``train``; probes and the ``data`` source from ``rows``.

        Runs ``nvil.estimators.certify.certified_log_z`` with this estimator's settings, reverse sources and
        ``accel``.

        Parameters
        ----------
        model : torch.nn.Module
            The Boltzmann machine whose partition function Z is estimated.
        train : torch.Tensor
            ``[rows, n_visible]`` rows whose marginals make the base-rate model (smoothed by ``base_smoothing``).
        rows : torch.Tensor
            ``[rows, n_visible]`` rows for the probe states and the ``data`` reverse source's Gibbs starts.
        generator : torch.Generator
            Source of randomness of every AIS run.
        progress : bool
            Whether to draw inner progress bars for the AIS runs.
        particles : torch.Tensor or None, default None
            Persistent chains (a PCD learner's), the ``particles`` reverse source.
        phase : callable or None, default None
            ``phase(text)`` names each phase on the evaluation bar.

        Returns
        -------
        CertifiedLogZ
            The forward estimate, the kept reverse run, the hard lower bound and the certificate's checks.
        """
        base = base_rate(model, train, self.settings.base_smoothing)
        return certified_log_z(model, base, self.settings, self.cert, generator, data_rows=rows, particles=particles,
                               progress=progress, accel=self.accel, phase=phase, sources=self.reverse_sources)

    def log_z(self, model, train, rows, seed: int, generator, progress, particles=None, phase=None,
              checkpoint=None, rows_split: str = "train", owner=None) -> tuple[CertifiedLogZ, bool]:
        """The certified log Z, and whether it came from the cache beside ``checkpoint``.

        With a checkpoint (and ``cache``) the runs draw from a generator seeded by ``seed`` on the model's device, the
        seed being part of the cache key with the settings, the reverse sources, ``rows_split`` (the split of
        ``rows``) and the parameters' digest (``owner``'s too: the DBM whose bipartite form ``model`` is); a cached
        entry is re-checked (``nvil.estimators.log_z.cached_log_z``). Without one, ``certified_log_z`` runs with
        ``generator``.

        Parameters
        ----------
        model : torch.nn.Module
            The Boltzmann machine whose log Z is estimated.
        train : torch.Tensor
            ``[rows, n_visible]`` rows for the base rate.
        rows : torch.Tensor
            ``[rows, n_visible]`` rows for the probes and the ``data`` reverse source.
        seed : int
            Seed of the cached computation's generator, and part of the cache key.
        generator : torch.Generator
            Source of randomness when nothing is cached (no checkpoint, or ``cache=false``).
        progress : bool
            Whether to draw inner progress bars for the AIS runs.
        particles : torch.Tensor or None, default None
            Persistent chains, the ``particles`` reverse source.
        phase : callable or None, default None
            ``phase(text)`` names each phase on the evaluation bar.
        checkpoint : str or path-like or None, default None
            The file the model came from; log Z is cached in ``<checkpoint>.log_z.json``.
        rows_split : str, default "train"
            The split ``rows`` come from (part of the cache key).
        owner : torch.nn.Module or None, default None
            The DBM whose bipartite form ``model`` is, whose parameters' digest joins the key; None: ``model``.

        Returns
        -------
        tuple of (CertifiedLogZ, bool)
            The certified log Z and whether it was read from the cache.
        """
        if checkpoint is None or not self.cache:
            return self.certified_log_z(model, train, rows, generator, progress, particles, phase), False
        key = log_z_key(model, owner or model, self.settings, self.cert, seed, self.reverse_sources,
                        reverse_rows=rows_split, **self.cache_extra())
        fresh = torch.Generator(device=model.W.device).manual_seed(seed)
        return cached_log_z(checkpoint, key, model, rows, self.cert,
                            lambda: self.certified_log_z(model, train, rows, fresh, progress, particles, phase), phase)

    def cache_extra(self) -> dict:
        """What else the cached log Z depends on (a subclass's sampler settings).

        Returns
        -------
        dict
            Extra keywords of the cache key; empty here.
        """
        return {}

    def schedule_label(self) -> str:
        """The ladder's name as the result's ``schedule`` reports it.

        Returns
        -------
        str
            ``settings.schedule`` (adaptive | paper | linear | sigmoid).
        """
        return self.settings.schedule

    def side(self, c: CertifiedLogZ) -> LogZ:
        """The log Z that ``mean_log_p`` uses: the forward estimate.

        Parameters
        ----------
        c : CertifiedLogZ
            The certified log Z.

        Returns
        -------
        LogZ
            ``c.forward``, the forward AIS estimate (an under-estimate of log Z in expectation).
        """
        return c.forward

    def rows_split(self, init) -> str:
        """The split the probes and the ``data`` reverse source come from (part of the cache key).

        Parameters
        ----------
        init : torch.Tensor or None
            The rows given as ``estimate(..., init=)``, or None.

        Returns
        -------
        str
            ``"train"`` without ``init``, else ``"init"``.
        """
        return "train" if init is None else "init"

    @torch.no_grad()
    def estimate(self, model, data, *, train=None, seed: int = 0, generator=None, progress=None, particles=None,
                 init=None, inference=None, checkpoint=None) -> Result:
        """log p(v) = -F(v) - log Z for each row of ``data`` [examples, model.n_visible].

        Log Z is estimated once (or read from the cache beside ``checkpoint``), then the free energies are taken
        batch by batch. On a DBM each row's score is its mean-field lower bound -E(v, mu) + H(mu) - log Z. Beside
        ``mean_log_p`` the result carries ``mean_log_p_band`` (the per-example mean over the log Z band) and
        ``mean_log_p_hard_upper_bound``, and the log Z's certificate is carried into its own.

        Parameters
        ----------
        model : torch.nn.Module
            An RBM or semi-RBM (or a DBM, through its top machine).
        data : torch.Tensor
            ``[examples, model.n_visible]`` rows to score.
        train : torch.Tensor or None, default None
            Rows whose marginals make the base-rate model and which serve as probes and as the ``data`` reverse
            source's Gibbs starts; Salakhutdinov & Murray 2008 use the training set, as ``evaluate.py`` does. None:
            ``data`` itself; log Z does not depend on the base rate, only the variance of its estimate does (the
            result says ``base_rate_rows: data``).
        seed : int, default 0
            The result's seed and, without ``generator``, the seed of a generator on the model's device.
        generator : torch.Generator or None, default None
            Source of randomness; None: one seeded by ``seed``.
        progress : tqdm or None, default None
            A bar counting examples (the log Z phases are named on its description).
        particles : torch.Tensor or None, default None
            The model's persistent chains (a PCD learner's), the ``particles`` reverse source.
        init : torch.Tensor or None, default None
            Other rows for the probes and the ``data`` source's Gibbs starts (raise's ``init_split``).
        inference : torch.nn.Module or None, default None
            Not used (every estimator is handed it).
        checkpoint : str or path-like or None, default None
            The file the model came from; log Z is then cached beside it (``log_z``; ``log_z_cached`` in the result
            says whether this call reused it).

        Returns
        -------
        Result
            ``log_p`` [examples], ``shared_stderr`` the log Z's standard error, the log Z's diagnostics in
            ``extras`` (``log_z``, ``log_z_reverse``, ``log_z_band``, ...) and its certificate.

        Raises
        ------
        nvil.core.errors.ConfigError
            If the model is not a Boltzmann machine (``check``).
        ValueError
            If ``data``, ``train`` or ``init`` is not a 2-D tensor with ``model.n_visible`` columns, or ``seed`` is
            not an integer.
        nvil.core.errors.DataError
            If rows are not finite or not of the model's kind (the estimators' door, ``nvil.estimators.door``).
        """
        self.check(model, inference)
        check_rows(model, data)
        generator = default_generator(generator, seed, model, data)
        base_rows = "train" if train is not None else "data"
        train = data if train is None else train
        check_rows(model, train, "train")
        if init is not None:
            check_rows(model, init, "init")
        t0 = time.perf_counter()
        phase = phase_namer(progress, self.name)
        machine, owner = (model.top, model) if scores_top_bound(model) else (model, None)
        if owner is not None:  # a DBM: log Z of its bipartite form, from data rows [v, mean-field even layers]
            train, init = owner.top_data(train), None if init is None else owner.top_data(init)
        c, cached = self.log_z(machine, train, train if init is None else init, seed, generator,
                               shows_progress(progress), particles, phase, checkpoint, self.rows_split(init), owner)
        phase(None)
        if shows_progress(progress) and hasattr(progress, "reset"):
            progress.reset()  # the bar counts examples: -F(v) - log Z per batch, after the log Z phase
        side = self.side(c)
        log_p = free_energy_log_p(model, data, side.log_z, self.batch_size, progress,
                                  None if owner is None else owner.variational_bound)
        result = Result(self.name, log_p, time.perf_counter() - t0, seed,
                        {**c.extras(), "num_betas": c.forward.num_betas, "schedule": self.schedule_label()},
                        shared_stderr=side.stderr)
        if owner is not None:
            result.extras["lower_bound"] = "mean-field lower bound"
            result.extras["log_p_is"] = ("the mean-field lower bound per example, -E(v, mu) + H(mu) - log Z (the "
                                         "paper's number); estimator=chib or ais_posterior estimate log p(v) itself")
        if checkpoint is not None:
            result.extras["log_z_cached"] = cached
        if base_rows == "data":
            result.extras["base_rate_rows"] = base_rows
        result.extras.update(log_p_extras(result.mean, c, side.log_z))
        result.carry(c)
        return result


class RAISE(AIS):
    """``estimator=raise``: forward and reverse AIS for log Z on the whole ladder, both sides per example.

    ``mean_log_p`` is the side from the reverse log Z (conservative in expectation when the reverse chains start
    from exact model samples); ``mean_log_p_ais`` the forward one, and ``log_z_gap`` the reverse log Z less the
    forward one. The reverse chains start from each of ``reverse_sources`` as in ``AIS``, the ``data`` source being
    Gibbs runs from rows of ``init_split``: states near the model, not data rows themselves.

    The keywords are those of ``AIS`` (configs/estimator/raise.yaml includes ais.yaml) but ``reverse_fraction``
    (the reverse run takes every beta), and ``init_split``.

    Parameters
    ----------
    init_split : str, default "train"
        train | valid | test, the rows the ``data`` reverse source's Gibbs runs start from in ``evaluate.py``
        (from Python: ``estimate(..., init=rows)``).
    num_chains : int, default 100
        Forward and reverse AIS chains.
    schedule : str, default "adaptive"
        The ladder of betas (adaptive | paper | linear | sigmoid), as in ``AIS``.
    num_betas : int, default 14500
        The ladder's steps, taken by both directions.
    pilot_fraction : float, default 0.05
        Adaptive only: the pilot's steps as a share of num_betas (at most 0.1).
    base_smoothing : float, default 0.05
        s in the base-rate marginals p = (mean + s) / (1 + 2 s).
    certify : bool, default True
        Must be true: raise is forward and reverse AIS.
    reverse_sources : list of str, default ["forward", "particles", "data"]
        Where reverse chains start (``forward``, ``particles``, ``data``), as in ``AIS``.
    reverse_burn_in : int or None, default None
        Block-Gibbs sweeps at beta = 1 before the reverse run (None: per source, as in ``AIS``).
    max_gap : float, default 1.0
        Nats; a forward-reverse gap above it fails the certificate.
    min_ess_fraction : float, default 0.1
        A forward ESS below this share of num_chains fails the certificate.
    num_climb : int, default 256
        Random starts of the hill-climbed probe states.
    num_data_probes : int, default 1000
        Data rows used as probes and as the ``data`` source's reverse-chain starts.
    batch_size : int, default 1000
        Examples per batch of free energies.
    accel : str, default "auto"
        none | compile | cudagraphs | auto, as in ``AIS``.
    cache : bool, default True
        Keep the certified log Z in ``<checkpoint>.log_z.json`` when evaluating a checkpoint.

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``certify`` is false, ``init_split`` is not train, valid or test, or another setting is out of range
        (as in ``AIS``).

    Examples
    --------
    >>> import torch
    >>> from nvil.models import RBM
    >>> from nvil.estimators import RAISE
    >>> rbm = RBM(6, 4)
    >>> x = torch.bernoulli(torch.full((8, 6), 0.5))
    >>> est = RAISE(num_chains=16, num_betas=100, num_climb=4, num_data_probes=8, reverse_sources=["forward", "data"])
    >>> result = est.estimate(rbm, x, train=x, init=x)
    >>> result.log_p.shape, result.extras["init_split"]
    (torch.Size([8]), 'train')
    >>> result.extras["log_z_reverse_num_betas"] == result.extras["log_z_num_betas"] == 100
    True
    >>> sorted(result.extras["log_z_reverse_runs"])
    ['data', 'forward']
    """

    name = "raise"
    reverse_fraction = 1.0

    config_only = ("reverse_fraction",)  # raise.yaml inherits it from ais.yaml; the reverse run takes every beta

    def __init__(self, *, init_split: str = "train", num_chains: int = 100, schedule: str = "adaptive",
                 num_betas: int = 14500, pilot_fraction: float = 0.05, base_smoothing: float = 0.05,
                 certify: bool = True,
                 reverse_sources: list[str] = ["forward", "particles", "data"],  # noqa: B006  (the yaml's list)
                 reverse_burn_in: int | None = None, max_gap: float = 1.0, min_ess_fraction: float = 0.1,
                 num_climb: int = 256, num_data_probes: int = 1000, batch_size: int = 1000, accel: str = "auto",
                 cache: bool = True) -> None:
        super().__init__(num_chains=num_chains, schedule=schedule, num_betas=num_betas, pilot_fraction=pilot_fraction,
                         base_smoothing=base_smoothing, certify=certify, reverse_sources=reverse_sources,
                         reverse_burn_in=reverse_burn_in, max_gap=max_gap, min_ess_fraction=min_ess_fraction,
                         num_climb=num_climb, num_data_probes=num_data_probes, batch_size=batch_size, accel=accel,
                         cache=cache)
        if not self.cert.certify:
            raise ConfigError("estimator=raise is forward and reverse AIS; it needs estimator.certify=true")
        self.init_split = init_split
        if self.init_split not in ("train", "valid", "test"):
            raise ConfigError(f"estimator.init_split must be train, valid or test, got {self.init_split!r}")

    def dataset_inputs(self, model, data, split, rows, checkpoint=None, payload=None, **_) -> dict:
        """The keywords ``estimate`` needs beyond the rows: those of ``AIS`` and the ``init_split`` rows as ``init``.

        Parameters
        ----------
        model : torch.nn.Module
            The Boltzmann machine being evaluated.
        data : nvil.data.Dataset
            The dataset, whose ``train`` split makes the base rate and whose ``init_split`` starts the ``data``
            source's Gibbs runs.
        split : str
            The split being evaluated (not used).
        rows : tuple of int
            ``(start, stop)`` of the rows evaluated (not used).
        checkpoint : str or path-like or None, default None
            The file the model came from, where log Z is cached.
        payload : dict or None, default None
            The loaded checkpoint, whose learner state may hold persistent particles.
        **_ : Any
            Other keywords of the hook, ignored.

        Returns
        -------
        dict
            ``train``, ``init``, ``particles`` (or None) and ``checkpoint``.
        """
        return {"train": data.split("train"), "init": data.split(self.init_split),
                "particles": stored_particles(payload, model.n_visible), "checkpoint": checkpoint}

    def rows_split(self, init) -> str:
        """The split the probes and the ``data`` reverse source come from (part of the cache key).

        Parameters
        ----------
        init : torch.Tensor or None
            The rows given as ``estimate(..., init=)``, or None.

        Returns
        -------
        str
            ``"train"`` without ``init``, else ``init_split``.
        """
        return "train" if init is None else self.init_split

    def side(self, c: CertifiedLogZ) -> LogZ:
        """The log Z that ``mean_log_p`` uses: the reverse one (an over-estimate in expectation from exact samples).

        Parameters
        ----------
        c : CertifiedLogZ
            The certified log Z.

        Returns
        -------
        LogZ
            ``c.reverse``, the reverse AIS estimate the certificate kept.
        """
        return c.reverse

    @torch.no_grad()
    def estimate(self, model, data, **kwargs) -> Result:
        """Both sides per example: ``log_p`` from the reverse log Z, ``mean_log_p_ais`` from the forward one.

        Parameters
        ----------
        model : torch.nn.Module
            An RBM or semi-RBM (or a DBM, through its top machine).
        data : torch.Tensor
            ``[examples, model.n_visible]`` rows to score.
        **kwargs : Any
            The keywords of ``AIS.estimate`` (``train``, ``seed``, ``generator``, ``progress``, ``particles``,
            ``init``, ``inference``, ``checkpoint``).

        Returns
        -------
        Result
            As ``AIS.estimate``, with ``mean_log_p_ais``, ``log_z_gap`` (reverse less forward log Z) and
            ``init_split`` in ``extras``.

        Raises
        ------
        nvil.core.errors.ConfigError
            If the model is not a Boltzmann machine.
        ValueError
            If the rows are not 2-D with ``model.n_visible`` columns, or ``seed`` is not an integer.
        """
        result = super().estimate(model, data, **kwargs)
        gap = result.extras["log_z_reverse"] - result.extras["log_z"]
        result.extras.update({"mean_log_p_ais": round(result.mean + gap, 4), "log_z_gap": round(gap, 4),
                              "init_split": self.init_split})
        return result
