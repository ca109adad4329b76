"""Exact log p(v) by enumerating every joint state of the latent units (at most ~20 of them).

log p(v) = logsumexp_h log p(v, h) over all 2^L states h, computed in chunks of states and accumulated
in log space; the states broadcast against the examples, so nothing loops over examples or states.

For a DBN the enumerated sum is over h_1..h_{L-1} of the unnormalised P*(v, h_1..h_{L-1}) (Murray &
Salakhutdinov 2009, Eq. 16, top layer summed out analytically), so log P(v) = log sum_h P*(v, h) - log Z with
Z the top RBM's partition function, itself enumerated over its smaller side (``top_log_z_exact``).
A model that follows the protocol (``nvil.models.protocol``: a user's model, the VAE) is enumerated through its
``log_prior`` and ``log_likelihood`` over the 2^D states of its binary latent, by the same loop
(``exact_log_marginal`` with the protocol's joint). Models with continuous latent variables have nothing to
enumerate and are refused.
"""

from __future__ import annotations

import time

import torch

from nvil.core.config import positive_int
from nvil.core.errors import ConfigError
from nvil.core.ops import StreamingLogMeanExp, enumerate_states
from nvil.data import take_rows
from nvil.estimators.base import Estimator, Result, check_rows, check_seed, chunks
from nvil.estimators.log_z import has_top_log_z
from nvil.estimators.protocol_view import eval_mode
from nvil.models.protocol import CONTINUOUS_LATENTS, FREE_ENERGY, ProtocolModel, capable, protocol_only

MAX_LATENT = 20


def split_layers(h: torch.Tensor, layers: list[int]) -> list[torch.Tensor]:
    return list(torch.split(h, layers, dim=-1))


def check_enumerable(model, max_latent: int = MAX_LATENT) -> None:
    continuous = (not model.binary) if isinstance(model, ProtocolModel) else capable(model, CONTINUOUS_LATENTS)
    if continuous:
        raise ConfigError(f"estimator=exact enumerates binary latent states; this {type(model).__name__} has "
                          "continuous latents: use estimator=ais (with bdmc), ais_hmc, chib_mh or iwae")
    if model.n_latent > max_latent:
        raise ConfigError(
            f"estimator=exact enumerates 2^D latent states and is limited to D <= {max_latent}; "
            f"this model has D = {model.n_latent} binary latent units (use estimator=ais or iwae)"
        )


def layered_joint(model):
    """[states, 1, D] x [batch, n_visible] -> [states, batch]: log p(v, h) of a built-in model, h split into its
    ``model.layers``."""
    def joint(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return model.log_joint(x.unsqueeze(0), [t.unsqueeze(1) for t in split_layers(h, model.layers)])
    return joint


def protocol_joint(pm: ProtocolModel):
    """The same for a model seen through the protocol: log p(z) + log p(x | z) on every (state, row) pair."""
    def joint(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        rows = x.unsqueeze(0).expand(z.shape[0], *x.shape).reshape(z.shape[0] * x.shape[0], *x.shape[1:])
        return pm.log_joint(rows, z.repeat_interleave(x.shape[0], 0)).view(z.shape[0], x.shape[0]).double()
    return joint


@torch.no_grad()
def exact_log_marginal(model, data: torch.Tensor, *, batch_size: int = 1000, max_elements: int = 2**26,
                       max_latent: int = MAX_LATENT, progress=None, joint=None) -> torch.Tensor:
    """Per-example log p(v) = log sum_h p(v, h) over the 2^D states h of ``model.n_latent`` binary units;
    ``joint(x, h)`` is log p(v, h) [states, batch] (default: ``layered_joint(model)``)."""
    check_enumerable(model, max_latent)
    joint = joint or layered_joint(model)
    n_latent = model.n_latent
    n_states = 2**n_latent
    width = max(getattr(model, "n_visible", 0) or 0, n_latent, 1)
    out = []
    for start, stop in chunks(data.shape[0], batch_size):
        x = take_rows(data, start, stop)
        acc = StreamingLogMeanExp()
        s_chunk = max(1, max_elements // (x.shape[0] * width))
        dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
        for s0, s1 in chunks(n_states, s_chunk):
            h = enumerate_states(n_latent, s0, s1, device=x.device, dtype=dtype)
            acc.update(joint(x, h), dim=0)
        # acc holds log mean over states; the marginal is the sum.
        out.append(acc.result() + n_latent * torch.log(torch.tensor(2.0, dtype=acc.result().dtype, device=x.device)))
        if progress is not None:
            progress.update(stop - start)
    return torch.cat(out)


def check_top_enumerable(top, max_units: int = MAX_LATENT) -> None:
    """Refuse (one line) a DBN whose top RBM has neither side small enough to enumerate for its log Z."""
    if min(top.n_pixels, top.n_hidden) > max_units:
        raise ConfigError(f"estimator=exact needs the log Z of the model's top machine (a DBN's top RBM, a DBM's "
                          f"bipartite form), which enumerates the smaller of its "
                          f"{top.n_pixels} visible and {top.n_hidden} hidden units; the limit is {max_units} (use "
                          "estimator=ais_posterior or chib with an AIS log Z)")


@torch.no_grad()
def top_log_z_exact(top, max_units: int = MAX_LATENT, chunk_elements: int = 2**24) -> torch.Tensor:
    """log Z of a DBN's top RBM (binary, no labels, no lateral weights), enumerating its smaller side:
    the hidden units with the visibles summed out (``BoltzmannMachine.log_z_exact``), or the visible units
    (= h_{L-1}) with the hiddens summed out, log Z = logsumexp_v -F_top(v)."""
    check_top_enumerable(top, max_units)
    if top.n_hidden <= top.n_pixels or top.L is not None or top.n_labels:
        return top.log_z_exact(max_units)
    n, dev, dt = top.n_pixels, top.W.device, top.W.dtype
    terms = [torch.logsumexp(-top.free_energy(enumerate_states(n, s0, s1, device=dev, dtype=dt)), 0)
             for s0, s1 in chunks(2**n, max(1, chunk_elements // max(n, top.n_hidden)))]
    return torch.logsumexp(torch.stack(terms), 0)


class Exact(Estimator):
    """``estimator=exact``: exact log p(v) by enumeration, for models with at most ``max_latent`` binary latent units.

    What is enumerated: a Boltzmann machine's log Z (reported as ``log_z``; log p(v) = -F(v) - log Z), a directed
    net's hidden states, a DBN's (minus its top RBM's exact log Z, reported as ``log_z``), or the binary latent of
    a model that follows the protocol (``nvil.models.protocol``: a user's model, the VAE). Models with continuous
    latents are refused. The defaults are configs/estimator/exact.yaml's.

    Parameters
    ----------
    batch_size : int, default 1000
        Examples per batch.
    max_latent : int, default 20
        The most latent units (2^L states) enumerated, a DBN's top RBM included.

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If a setting is not a positive integer, in one line naming ``estimator.KEY``.

    Examples
    --------
    >>> import itertools
    >>> import torch
    >>> from nvil.models import RBM, SBN
    >>> from nvil.estimators import Exact
    >>> rbm = RBM(6, 4)
    >>> x = (torch.rand(3, 6) < 0.5).float()
    >>> result = Exact().estimate(rbm, x)
    >>> result.log_p.shape, sorted(result.extras), result.certified
    (torch.Size([3]), ['log_z', 'num_latent'], True)

    Over all 2^6 visible vectors the probabilities sum to one:

    >>> every_v = torch.tensor(list(itertools.product([0., 1.], repeat=6)))
    >>> bool(abs(torch.logsumexp(Exact().estimate(rbm, every_v).log_p, 0)) < 1e-4)
    True
    >>> Exact(max_latent=2).estimate(SBN(6, [3]), x)
    Traceback (most recent call last):
        ...
    nvil.core.errors.ConfigError: estimator=exact enumerates 2^D latent states and is limited to D <= 2; ...
    """

    name = "exact"
    serves_protocol = True  # a protocol-only model (a user's, the VAE) is enumerated here too

    def __init__(self, *, batch_size: int = 1000, max_latent: int = MAX_LATENT) -> None:
        self.batch_size = positive_int(batch_size, "estimator.batch_size")
        self.max_latent = positive_int(max_latent, "estimator.max_latent")

    def check(self, model, inference=None) -> None:
        """Refuse, in one line and before any work, a model whose states are too many (or not binary) to enumerate.

        A model seen through the protocol needs binary latents (at most ``max_latent``); a Boltzmann machine, at
        most ``max_latent`` hidden units (pixels, for a semi-RBM; ``check_exact``); a directed net, at most
        ``max_latent`` latent units, and a DBN or DBM also a top machine with a side that small.

        Parameters
        ----------
        model : nn.Module or object
            The model to be scored.
        inference : nn.Module or None, default None
            Not used (nothing is sampled).

        Raises
        ------
        ConfigError
            (``nvil.core.errors``) If the latents are continuous, or too many units would be enumerated.
        """
        if protocol_only(model) or isinstance(model, ProtocolModel):
            check_enumerable(model if isinstance(model, ProtocolModel) else ProtocolModel(model), self.max_latent)
        elif capable(model, FREE_ENERGY):  # Boltzmann machines: log Z by enumeration
            model.check_exact(self.max_latent)
        else:
            check_enumerable(model, self.max_latent)
            if has_top_log_z(model):
                check_top_enumerable(model.top, self.max_latent)

    def estimate(self, model, data, *, inference=None, seed: int = 0, generator=None, progress=None, **_) -> Result:
        """Exact log p(v) for each row of ``data``; nothing is random.

        Parameters
        ----------
        model : nn.Module or object
            The model: a Boltzmann machine, an SBN or fDARN, a DBN, a DBM, or a model that follows the protocol
            with binary latents.
        data : torch.Tensor
            ``(examples, model.n_visible)`` rows (a protocol model's rows: whatever its ``log_likelihood`` takes).
        inference : nn.Module or None, default None
            Not used (every estimator is handed it).
        seed : int, default 0
            Recorded in the result; nothing is drawn.
        generator : torch.Generator or None, default None
            Not used.
        progress : tqdm or None, default None
            A bar counting examples, advanced after each batch.
        **_ : object
            Other keywords the evaluation driver passes to every estimator (``train=``, ``checkpoint=``, ...),
            ignored.

        Returns
        -------
        Result
            (``nvil.estimators.base``) ``log_p`` ``(examples,)``; ``extras`` with ``num_latent`` and, for a Boltzmann
            machine or a DBN, the exact ``log_z``; the ``enumeration`` check (every log p finite).

        Raises
        ------
        ConfigError
            (``nvil.core.errors``) As ``check``.
        ValueError
            If ``data`` is not a 2-D tensor with ``model.n_visible`` columns, or ``seed`` is not an integer.
        """
        self.check(model, inference)
        check_seed(seed)
        t0 = time.perf_counter()
        extras, n_latent = {}, getattr(model, "n_latent", None)
        if protocol_only(model) or isinstance(model, ProtocolModel):
            pm = model if isinstance(model, ProtocolModel) else ProtocolModel(model)
            n_latent = pm.n_latent
            with eval_mode(pm):
                log_p = exact_log_marginal(pm, data, batch_size=self.batch_size, max_latent=self.max_latent,
                                           progress=progress, joint=protocol_joint(pm))
        elif capable(model, FREE_ENERGY):
            check_rows(model, data)
            log_p = exact_boltzmann_log_prob(model, data, batch_size=self.batch_size, progress=progress)
            extras = {"log_z": round(model.log_z_exact().item(), 4)}
        else:
            check_rows(model, data)
            log_p = exact_log_marginal(model, data, batch_size=self.batch_size, max_latent=self.max_latent,
                                       progress=progress)
            if has_top_log_z(model):  # log P(v) = log sum_h P*(v, h) - log Z_top (Eq. 16)
                log_z = top_log_z_exact(model.top, self.max_latent)
                log_p = log_p - log_z.to(log_p)
                extras = {"log_z": round(log_z.item(), 4), "log_z_is": "exact"}
        result = Result(self.name, log_p.cpu(), time.perf_counter() - t0, seed, {"num_latent": n_latent, **extras})
        result.check("enumeration", bool(torch.isfinite(result.log_p).all()),
                     "enumeration gave a non-finite log p for some example: the model gives it probability 0, or "
                     "its log densities overflow (float32?)")
        return result


@torch.no_grad()
def exact_boltzmann_log_prob(model, data: torch.Tensor, *, batch_size: int = 1000, progress=None) -> torch.Tensor:
    """log p(x) = -F(x) - log Z for a Boltzmann machine, log Z enumerated once."""
    log_z = model.log_z_exact()
    out = []
    for start, stop in chunks(data.shape[0], batch_size):
        out.append(model.exact_log_prob(take_rows(data, start, stop), log_z))
        if progress is not None:
            progress.update(stop - start)
    return torch.cat(out)
