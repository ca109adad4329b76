"""Variational and importance-sampled lower bounds on log p(v) from an inference network q(h | v).

- ELBO (Mnih & Gregor 2014, Eq. 1), estimated per example as the mean over S samples of
  log w = log p(v, h) - log q(h | v). With S = 10 this is the number Table 1 of the NVIL paper reports.
- Importance-sampled bound (Burda et al. 2016's L_K): log (1/K) sum_k w_k, a log-mean-exp over K
  samples from q. Its expectation does not decrease with K and tends to log p(v) as K grows.

Both run batched over examples and samples, in chunks of samples so that K = 5000 fits in memory,
accumulating on the fly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import torch

from nvil.backend.accel import check_mode
from nvil.core.config import positive_int
from nvil.core.errors import ConfigError
from nvil.core.ops import StreamingLogMeanExp, StreamingMean
from nvil.data import take_rows
from nvil.estimators.base import (
    BatchProgress,
    Estimator,
    Result,
    batch_generator,
    check_rows,
    chunks,
    default_generator,
    phase_namer,
    shows_progress,
)
from nvil.estimators.reverse_starts import stored_particles
from nvil.estimators.log_z import apply_log_z, has_top_log_z, top_log_z
from nvil.estimators.latent_model import BOLTZMANN_ESTIMATORS
from nvil.estimators.settings import LOG_Z, LogZSettings
from nvil.estimators.protocol_view import check_start, eval_mode, expand_rows, protocol
from nvil.models.protocol import FREE_ENERGY, ProtocolModel, capable, follows_protocol, protocol_only

MAX_ELEMENTS = 2**22  # floats per chunk of samples (estimator.max_elements): the logits stay in the caches and heap


def log_weights(model, inference, x: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """[k, batch] log importance weights log w = log p(x, h) - log q(h | x), h ~ q(. | x) (Burda et al. 2016, Eq. 8)."""
    xk = x.unsqueeze(0).expand(k, *x.shape)
    hs, log_q = inference.sample(xk, generator=generator)
    return model.log_joint(xk, hs) - torch.stack(log_q).sum(0)


class InferenceWeights:
    """q(h | v) of a built-in inference network (an SBN's or fDARN's, a DBN's greedy up-pass): ``for_rows(x)`` is a
    function ``(k, generator) -> [k, rows]`` of log w = log p(x, h) - log q(h | x), h ~ q(. | x)."""

    def __init__(self, model, inference) -> None:
        self.model, self.inference = model, inference
        self.n_latent = model.n_latent

    def for_rows(self, x: torch.Tensor):
        return lambda k, g: log_weights(self.model, self.inference, x, k, g)


class BaseWeights:
    """The base density f_0 of a model seen through the protocol (``nvil.models.protocol``: its ``proposal(x)``
    or its prior): ``for_rows(x)`` builds q(. | x) once for the rows and returns ``(k, generator) -> [k, rows]``
    log w = log p(x, z) - log q(z | x), z ~ q, in float64."""

    def __init__(self, pm: ProtocolModel, start: str) -> None:
        self.pm, self.start = pm, start
        self.n_latent = pm.n_latent

    def for_rows(self, x: torch.Tensor):
        base = self.pm.base(self.start, x)

        def log_w(k: int, g: torch.Generator) -> torch.Tensor:
            z = base.sample(k, g)  # [k, rows, D]
            log_joint = self.pm.log_joint(expand_rows(x, k), z.reshape(k * x.shape[0], -1)).view(k, -1)
            return log_joint.double() - base.log_prob(z).double()

        return log_w


@torch.no_grad()
def _reduce_log_weights(weights, data, num_samples, accumulator, *, batch_size, generator,
                        max_elements, progress, seed: int | None = None, row_offset: int = 0) -> torch.Tensor:
    """The one loop of both bounds, over batches of rows and chunks of samples, for any ``weights``
    (``InferenceWeights`` or ``BaseWeights``). With ``seed``, each batch draws from its own generator seeded by
    (seed, first row in the whole split), so an example's estimate does not depend on how the split is sharded;
    otherwise ``generator`` serves all. ``progress`` advances by the batch's share after each chunk of samples."""
    out = []
    for start, stop in chunks(data.shape[0], batch_size):
        x = take_rows(data, start, stop)
        g = generator if seed is None else batch_generator(seed, row_offset + start, x.device)
        log_w = weights.for_rows(x)
        acc = accumulator()
        per_sample = math.prod(x.shape[1:]) + weights.n_latent  # floats per (row, sample): x and its latents
        k_chunk = max(1, max_elements // (x.shape[0] * per_sample))
        share = BatchProgress(progress, stop - start, num_samples)
        for k0, k1 in chunks(num_samples, k_chunk):
            acc.update(log_w(k1 - k0, g), dim=0)
            share.advance(k1 - k0)
        out.append(acc.result().cpu())
        share.finish()
    return torch.cat(out)


def importance_sampled_bound(model, inference, data, num_samples, *, generator, batch_size=100,
                             max_elements=MAX_ELEMENTS, progress=None, **seeding) -> torch.Tensor:
    """Per-example L_K = log (1/K) sum_k p(v, h_k) / q(h_k | v), h_k ~ q(. | v)."""
    return _reduce_log_weights(InferenceWeights(model, inference), data, num_samples, StreamingLogMeanExp,
                               batch_size=batch_size, generator=generator, max_elements=max_elements,
                               progress=progress, **seeding)


def elbo(model, inference, data, num_samples, *, generator, batch_size=100, max_elements=MAX_ELEMENTS,
         progress=None, **seeding) -> torch.Tensor:
    """Per-example ELBO: the mean of log w over ``num_samples`` samples from q."""
    return _reduce_log_weights(InferenceWeights(model, inference), data, num_samples, StreamingMean,
                               batch_size=batch_size, generator=generator, max_elements=max_elements,
                               progress=progress, **seeding)


class SampledBound(Estimator):
    """``estimator=iwae`` or ``estimator=elbo``: a stochastic lower bound on log p(v) per example from samples of q.

    ``iwae``: K = ``num_samples``, Burda et al. 2016's L_K = log (1/K) sum_k w_k; ``elbo``: the mean of log w over
    ``num_samples`` (Mnih & Gregor 2014, Eq. 1), log w = log p(v, h) - log q(h | v). ``IWAE`` and ``ELBO`` are the
    two with their configs' defaults. One estimator for every model: q is the built-in inference network where
    there is one (SBN, fDARN; a DBN's greedy up-pass), else the model's base density through the protocol (a
    user's model, the VAE, the Gaussian nets: its ``proposal(x)`` or its prior). The result's ``bound`` says what
    the number is (``WORDING``): only L_K tightens with more samples (Burda et al. 2016, Theorem 1); the ELBO's
    samples only average, so its gap, KL(q(h | v) || p(h | v)), stays whatever their number. ``certified`` is None
    (no check of its own) but for a DBN, which carries its log Z's certificate.

    Parameters
    ----------
    bound : str, default "iwae"
        ``iwae`` | ``elbo``: which bound (and the estimator's ``name``).
    num_samples : int, default 1000
        Samples from q per example: K for ``iwae``, the ELBO's average for ``elbo``.
    start : str or None, default None
        For a model seen through the protocol: ``prior`` | ``proposal`` (None: the proposal where the model
        defines one, else the prior). A built-in inference network is its own q.
    batch_size : int, default 100
        Examples per batch.
    max_elements : int, default MAX_ELEMENTS (2^22)
        Samples are chunked so that a chunk holds about this many floats (2^22: its logits stay in the CPU's
        caches and in malloc's heap).
    accel : str, default "auto"
        auto | native (an autoregressive q draws its layers with the C kernel, ``nvil.backend.native``; the
        evaluation driver applies it) | none.
    log_z : LogZSettings or Mapping, default LOG_Z
        A DBN's top-RBM log Z (``nvil.estimators.settings.LogZSettings`` or a mapping of its fields;
        configs/log_z/ais.yaml); not used for other models.

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If ``bound`` is not a known bound, or a setting is out of range (one line naming
        ``estimator.KEY``).

    Examples
    --------
    >>> import torch
    >>> from nvil.models import SBN, LayeredInference, VAE
    >>> from nvil.estimators import SampledBound
    >>> sbn, q = SBN(6, [3]), LayeredInference(6, [3])
    >>> x = (torch.rand(5, 6) < 0.5).float()
    >>> result = SampledBound("iwae", num_samples=64).estimate(sbn, x, inference=q)
    >>> result.estimator, result.log_p.shape, result.extras["proposal"], result.certified
    ('iwae', torch.Size([5]), 'inference network', None)

    A model without an inference network (here a VAE) is sampled through the protocol, from its prior or its
    proposal:

    >>> vae = VAE(6, [2], [[4]])
    >>> SampledBound("elbo", num_samples=16, start="prior").estimate(vae, x).extras["proposal"]
    'prior'
    >>> SampledBound("kl")
    Traceback (most recent call last):
        ...
    nvil.core.errors.ConfigError: unknown bound 'kl'; known bounds: iwae, elbo
    """

    ACCUMULATORS = {"iwae": StreamingLogMeanExp, "elbo": StreamingMean}
    # The JSON line's ``bound``: what the number is. Only L_K tightens with more samples (Burda et al. 2016,
    # Theorem 1); the ELBO's samples only average, so its gap, KL(q(h | v) || p(h | v)), stays whatever their number.
    WORDING = {"iwae": "stochastic lower bound: E[estimate] <= log p(v), tight as num_samples grows",
               "elbo": "stochastic lower bound: E[estimate] = ELBO = log p(v) - KL(q(h | v) || p(h | v)); more "
                       "samples lower its variance, not its gap"}
    row_offset_aware = True  # evaluate_checkpoint passes the first row's index in the whole split
    serves_protocol = True  # a model seen through the protocol alone is scored here too (``BaseWeights``)

    def __init__(self, bound: str = "iwae", *, num_samples: int = 1000, start: str | None = None,
                 batch_size: int = 100, max_elements: int = MAX_ELEMENTS, accel: str = "auto",
                 log_z: LogZSettings | Mapping = LOG_Z) -> None:
        if bound not in self.ACCUMULATORS:
            raise ConfigError(f"unknown bound {bound!r}; known bounds: {', '.join(self.ACCUMULATORS)}")
        self.name = bound
        self.num_samples = positive_int(num_samples, "estimator.num_samples")
        check_start(start)
        self.start = start
        self.batch_size = positive_int(batch_size, "estimator.batch_size")
        self.max_elements = positive_int(max_elements, "estimator.max_elements")
        self.accel = check_mode(accel, what="estimator.accel")
        self.log_z_settings = LogZSettings.of(log_z)

    def check(self, model, inference=None) -> None:
        """Refuse, in one line and before any work, a model this bound cannot draw latents for.

        Parameters
        ----------
        model : nn.Module or object
            The model to be scored.
        inference : nn.Module or None, default None
            q(h | v) of an SBN or fDARN; None for a DBN (its greedy up-pass) or a model seen through the protocol.

        Raises
        ------
        ConfigError
            (``nvil.core.errors``) If ``model`` is a Boltzmann machine (no q: its hidden units are summed exactly),
            or has neither an inference network, a top machine nor the protocol; a user's model that lacks part of
            the protocol is refused naming what it lacks.
        """
        if capable(model, FREE_ENERGY):
            raise ConfigError(f"estimator={self.name} draws h from an inference network q(h | v), which a Boltzmann "
                              "machine does not have (its hidden units are summed exactly in its free energy); for "
                              f"model=rbm or srbm use estimator={BOLTZMANN_ESTIMATORS}")
        if inference is None and not has_top_log_z(model) and protocol_only(model):
            protocol(model)  # a user's model: what it lacks of the protocol, in one line
        elif inference is None and not has_top_log_z(model) and not follows_protocol(model):
            raise ConfigError(f"estimator={self.name} needs a model with an inference network (sbn, fdarn), a DBN, "
                              "a DBM, or a model that follows the protocol (vae, gbn, dbn_dynamic, your own: its "
                              "proposal q(z | x), or the prior where it has none)")

    def weights(self, model, inference):
        """What the samples come from: the built-in inference network, or the model's base density through the protocol.

        The built-in inference network is ``InferenceWeights`` (a DBN's up-pass where ``inference`` is None); a
        model without one is seen through the protocol (``BaseWeights``), from ``start`` or, when that is None,
        its default base (its proposal where it defines one, else its prior).

        Parameters
        ----------
        model : nn.Module or object
            The model to be scored.
        inference : nn.Module or None
            q(h | v) of an SBN or fDARN, or None.

        Returns
        -------
        tuple
            ``(weights, proposal)``: an ``InferenceWeights`` or ``BaseWeights`` whose ``for_rows(x)`` gives
            ``(k, generator) -> (k, rows)`` log-weights, and the JSON line's ``proposal``
            (``"up-pass"``, ``"inference network"``, ``"prior"`` or ``"proposal"``).
        """
        if inference is None and has_top_log_z(model):
            return InferenceWeights(model, model.recognition()), "up-pass"
        if inference is not None:
            return InferenceWeights(model, inference), "inference network"
        pm = protocol(model)
        start = self.start or pm.default_base()
        return BaseWeights(pm, start), start

    def dataset_inputs(self, model, data, split, rows, checkpoint=None, payload=None, **_) -> dict:
        """The keywords ``estimate`` needs beyond the rows: for a model with a top machine (a DBN), its log Z's.

        Parameters
        ----------
        model : nn.Module or object
            The model to be scored.
        data : Dataset
            (``nvil.data.dataset``) the dataset the rows come from.
        split : str
            The split being scored (not used).
        rows : torch.Tensor or None
            The rows being scored (not used).
        checkpoint : str or Path or None, default None
            The checkpoint the model came from; its log Z is cached beside it.
        payload : dict or None, default None
            The checkpoint's contents, whose learner may hold persistent particles.
        **_ : object
            Other keywords of the evaluation driver, ignored.

        Returns
        -------
        dict
            ``{}``, or for a DBN ``train`` (the training split), ``checkpoint`` and ``log_z_particles`` (the stored
            particles that fit its top RBM, or None).
        """
        if not has_top_log_z(model):
            return {}
        return {"train": data.split("train"), "checkpoint": checkpoint,
                "log_z_particles": stored_particles(payload, model.top.n_visible)}

    def estimate(self, model, data, *, inference=None, seed: int = 0, generator=None, progress=None, train=None,
                 checkpoint=None, row_offset: int = 0, log_z_particles=None) -> Result:
        """The bound for each row of ``data``: L_K (``iwae``) or the averaged ELBO (``elbo``).

        For a DBN log P = log P* - log Z with the shared top-RBM log Z (``nvil.estimators.log_z``), its certificate
        carried into the result.

        Parameters
        ----------
        model : nn.Module or object
            The model to be scored (SBN, fDARN, DBN, DBM, or a model that follows the protocol).
        data : torch.Tensor
            ``(examples, ...)`` rows; ``(examples, model.n_visible)`` for a built-in model.
        inference : nn.Module or None, default None
            q: an SBN's or fDARN's inference network; None for a DBN (its greedy up-pass) or for a model that
            follows the protocol without one (its proposal or prior, ``start``).
        seed : int, default 0
            Each batch draws from a generator seeded by (``seed``, first row + ``row_offset``), so an example's
            estimate does not depend on how the split is sharded.
        generator : torch.Generator or None, default None
            Optional: the draws come from each batch's generator (``seed``), so this one is not used.
        progress : tqdm or None, default None
            A bar counting examples, advanced by the batch's share after each chunk of samples; a DBN's log Z
            phase names itself on it.
        train : torch.Tensor or None, default None
            The training rows, whose base rates (passed up the net) start a DBN's log Z; required for a DBN.
        checkpoint : str or Path or None, default None
            The file the model came from; a DBN's log Z is cached beside it.
        row_offset : int, default 0
            The index of ``data``'s first row in the whole split.
        log_z_particles : torch.Tensor or None, default None
            Persistent particles the DBN's reverse log Z run starts from.

        Returns
        -------
        Result
            (``nvil.estimators.base``) ``log_p`` ``(examples,)``; ``extras`` with ``num_samples``, ``proposal`` (what
            q was) and ``bound`` (what the number is, ``WORDING``), and a DBN's log Z keys; ``shared_stderr`` the
            log Z's standard error.

        Raises
        ------
        ConfigError
            (``nvil.core.errors``) As ``check``, or for a DBN without ``train``.
        ValueError
            If ``data`` is not a 2-D tensor with ``model.n_visible`` columns (a built-in model), or ``seed`` is not
            an integer.
        """
        self.check(model, inference)
        if inference is not None or has_top_log_z(model):
            check_rows(model, data)
        generator = default_generator(generator, seed, model, data)
        if has_top_log_z(model) and train is None:
            raise ConfigError(f"estimator={self.name} on a {type(model).__name__} needs train= (the training rows): its log Z "
                              "starts from base rates of the training data passed up the net")
        t0 = time.perf_counter()
        log_z, log_z_se, certificate = 0.0, 0.0, None
        if has_top_log_z(model):
            certificate = top_log_z(model, train, self.log_z_settings, checkpoint, shows_progress(progress),
                                    log_z_particles, phase=phase_namer(progress, self.name))
            log_z, log_z_se = certificate[0].log_z, certificate[0].stderr
            if shows_progress(progress) and hasattr(progress, "reset"):
                progress.reset()  # the rate and ETA from here on are the examples' own
        weights, proposal = self.weights(model, inference)
        with eval_mode(model):
            log_p = _reduce_log_weights(weights, data, self.num_samples, self.ACCUMULATORS[self.name],
                                        batch_size=self.batch_size, generator=generator,
                                        max_elements=self.max_elements, progress=progress, seed=seed,
                                        row_offset=row_offset)
        result = Result(self.name, log_p - log_z, time.perf_counter() - t0, seed,
                        {"num_samples": self.num_samples, "proposal": proposal, "bound": self.WORDING[self.name]},
                        shared_stderr=log_z_se)
        if certificate is not None:
            apply_log_z(result, *certificate)
        return result


class IWAE(SampledBound):
    """``estimator=iwae``: the importance-sampled bound L_K = log (1/K) sum_k w_k, K = ``num_samples``.

    ``SampledBound("iwae", ...)`` with the defaults of configs/estimator/iwae.yaml (Burda et al. 2016); the
    keywords are ``SampledBound``'s. Its expectation does not decrease with K and tends to log p(v).

    Parameters
    ----------
    num_samples : int, default 1000
        K, the samples from q per example.
    start : str or None, default None
        For a model seen through the protocol: ``prior`` | ``proposal`` (None: the proposal where the model
        defines one, else the prior). A built-in inference network is its own q.
    batch_size : int, default 100
        Examples per batch.
    max_elements : int, default MAX_ELEMENTS (2^22)
        Samples are chunked so that a chunk holds about this many floats (2^22: its logits stay in the CPU's
        caches and in malloc's heap).
    accel : str, default "auto"
        auto | native (an autoregressive q draws its layers with the C kernel, ``nvil.backend.native``; the
        evaluation driver applies it) | none.
    log_z : LogZSettings or Mapping, default LOG_Z
        A DBN's top-RBM log Z (``nvil.estimators.settings.LogZSettings`` or a mapping of its fields;
        configs/log_z/ais.yaml); not used for other models.

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If a setting is out of range, in one line naming ``estimator.KEY``.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import SBN, LayeredInference
    >>> from nvil.estimators import IWAE
    >>> sbn, q = SBN(6, [3]), LayeredInference(6, [3])
    >>> x = (torch.rand(5, 6) < 0.5).float()
    >>> result = IWAE(num_samples=64).estimate(sbn, x, inference=q)
    >>> result.log_p.shape, result.extras["num_samples"], result.extras["proposal"]
    (torch.Size([5]), 64, 'inference network')
    >>> result.extras["bound"]
    'stochastic lower bound: E[estimate] <= log p(v), tight as num_samples grows'

    The same seed gives the same estimate:

    >>> torch.equal(IWAE(num_samples=64).estimate(sbn, x, inference=q, seed=0).log_p, result.log_p)
    True
    """

    name = "iwae"

    def __init__(self, *, num_samples: int = 1000, start: str | None = None, batch_size: int = 100,
                 max_elements: int = MAX_ELEMENTS, accel: str = "auto", log_z: LogZSettings | Mapping = LOG_Z) -> None:
        super().__init__("iwae", num_samples=num_samples, start=start, batch_size=batch_size,
                         max_elements=max_elements, accel=accel, log_z=log_z)


class ELBO(SampledBound):
    """``estimator=elbo``: the ELBO, the mean of log w = log p(v, h) - log q(h | v) over ``num_samples`` samples of q.

    ``SampledBound("elbo", ...)`` with the defaults of configs/estimator/elbo.yaml (Mnih & Gregor 2014, Eq. 1;
    10 samples: the NVIL paper's Table 1 measure); the keywords are ``SampledBound``'s. More samples lower its
    variance, not its gap KL(q(h | v) || p(h | v)).

    Parameters
    ----------
    num_samples : int, default 10
        Samples from q per example, averaged.
    start : str or None, default None
        For a model seen through the protocol: ``prior`` | ``proposal`` (None: the proposal where the model
        defines one, else the prior). A built-in inference network is its own q.
    batch_size : int, default 100
        Examples per batch.
    max_elements : int, default MAX_ELEMENTS (2^22)
        Samples are chunked so that a chunk holds about this many floats (2^22: its logits stay in the CPU's
        caches and in malloc's heap).
    accel : str, default "auto"
        auto | native (an autoregressive q draws its layers with the C kernel, ``nvil.backend.native``; the
        evaluation driver applies it) | none.
    log_z : LogZSettings or Mapping, default LOG_Z
        A DBN's top-RBM log Z (``nvil.estimators.settings.LogZSettings`` or a mapping of its fields;
        configs/log_z/ais.yaml); not used for other models.

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If a setting is out of range, in one line naming ``estimator.KEY``.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import SBN, LayeredInference
    >>> from nvil.estimators import ELBO
    >>> sbn, q = SBN(6, [3]), LayeredInference(6, [3])
    >>> x = (torch.rand(5, 6) < 0.5).float()
    >>> result = ELBO().estimate(sbn, x, inference=q)
    >>> result.estimator, result.log_p.shape, result.extras["num_samples"]
    ('elbo', torch.Size([5]), 10)
    >>> result.extras["bound"].startswith("stochastic lower bound: E[estimate] = ELBO")
    True
    """

    name = "elbo"

    def __init__(self, *, num_samples: int = 10, start: str | None = None, batch_size: int = 100,
                 max_elements: int = MAX_ELEMENTS, accel: str = "auto", log_z: LogZSettings | Mapping = LOG_Z) -> None:
        super().__init__("elbo", num_samples=num_samples, start=start, batch_size=batch_size,
                         max_elements=max_elements, accel=accel, log_z=log_z)
