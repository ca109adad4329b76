"""Numerics shared by learners and estimators: one place each, never re-derived elsewhere."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from nvil.core.distributed import global_mean_var


def bernoulli_log_prob(logits: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """log Bernoulli(value; sigmoid(logits)), summed over the last dimension.

    Uses log sigmoid(a) = -softplus(-a): sum(value * a) - sum(softplus(a)), stable for any logit. The first sum
    is one fused dot product (``vecdot``) and the second reduces the logits' own shape before broadcasting, so
    neither materialises a broadcast product. This is the definition; ``nvil.backend.native.bernoulli_log_prob``
    runs it as one C pass over large float32 CPU logits outside autograd.
    """
    return torch.linalg.vecdot(value, logits) - F.softplus(logits).sum(-1)


def sigmoid_and_softplus_sum(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sigmoid(a), sum of softplus(a) over the last dimension): a Bernoulli layer's probabilities and, with
    vecdot(value, a) - the sum, its log-probability (``bernoulli_log_prob``). Eagerly: two ATen kernels. Under
    ``torch.compile``: one exp per element, e = exp(-|a|), for both: sigmoid(a) = where(a >= 0, 1, e) / (1 + e) and
    sum softplus(a) = sum max(a, 0) + sum log(1 + e), taken as one log per group of G <= 16 factors (1 + e) in
    (1, 2], whose product stays below 2^16 (rounding ~1e-6 relative per group, as the terms'). Compiled, that beats
    the two kernels; eagerly its extra ops make it slower, hence two forms."""
    if not torch.compiler.is_compiling():
        return torch.sigmoid(logits), F.softplus(logits).sum(-1)
    e = torch.exp(-logits.abs())
    n = logits.shape[-1]
    group = next(g for g in (16, 8, 4, 2, 1) if n % g == 0)
    log_terms = torch.log((1 + e).unflatten(-1, (n // group, group)).prod(-1)).sum(-1)
    return torch.where(logits >= 0, 1.0, e) / (1 + e), logits.clamp(min=0).sum(-1) + log_terms


def chunks(n: int, size: int):
    """(start, stop) pairs covering range(n) in pieces of at most ``size``."""
    for start in range(0, n, size):
        yield start, min(start + size, n)


def enumerate_states(n_bits: int, start: int, stop: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """Binary states start..stop-1 of ``n_bits`` units as rows of a [stop - start, n_bits] tensor."""
    codes = torch.arange(start, stop, device=device, dtype=torch.int64)
    bits = torch.arange(n_bits - 1, -1, -1, device=device, dtype=torch.int64)
    return ((codes.unsqueeze(-1) >> bits) & 1).to(dtype)


def take_rows(x: torch.Tensor, start: int, stop: int | None = None, dense: bool = True) -> torch.Tensor:
    """Rows start..stop-1 of a dense or sparse COO split; sparse rows are densified unless dense=False."""
    stop = x.shape[0] if stop is None else min(stop, x.shape[0])
    if not x.is_sparse:
        return x[start:stop]
    rows = x.index_select(0, torch.arange(start, stop, device=x.device))
    return rows.to_dense() if dense else rows


def log_mean_exp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """log (1/K) sum_k exp(x_k) along ``dim``, computed with log-sum-exp."""
    return torch.logsumexp(x, dim=dim) - math.log(x.shape[dim])


def value_and_grad(log_density, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log_density(position) [chains] and its gradient wrt position [chains, dim], by autograd.

    Works under ``torch.no_grad()``, returns detached tensors, and differentiates with respect to the
    position only, so no ``nn.Parameter`` inside ``log_density`` accumulates a ``.grad``. Non-finite
    values pass through; the accept step deals with them.
    """
    with torch.enable_grad():
        q = position.detach().requires_grad_(True)
        log_p = log_density(q)
        (grad,) = torch.autograd.grad(log_p.sum(), inputs=[q], allow_unused=True, materialize_grads=True)
    return log_p.detach(), grad.detach()


class StreamingLogMeanExp:
    """log-mean-exp accumulated over chunks, so K samples never need to sit in memory at once."""

    def __init__(self) -> None:
        self.log_sum: torch.Tensor | None = None
        self.count = 0

    def update(self, log_w: torch.Tensor, dim: int = 0) -> None:
        chunk = torch.logsumexp(log_w, dim=dim)
        self.log_sum = chunk if self.log_sum is None else torch.logaddexp(self.log_sum, chunk)
        self.count += log_w.shape[dim]

    def result(self) -> torch.Tensor:
        if self.log_sum is None:
            raise ValueError("no samples were accumulated")
        return self.log_sum - math.log(self.count)


def mean_and_stderr(x: torch.Tensor) -> tuple[float, float]:
    """Sample mean and its standard error, std / sqrt(n) (0 for a single value)."""
    x = x.double()
    n = x.numel()
    mean = x.mean().item()
    if n < 2:
        return mean, 0.0
    return mean, (x.std(unbiased=True) / math.sqrt(n)).item()


class RunningMoments(torch.nn.Module):
    """Exponentially smoothed mean and variance of a scalar signal (NVIL's c and v).

    Mnih & Gregor 2014, Algorithm 1: c <- alpha c + (1 - alpha) mean(l), v <- alpha v + (1 - alpha) var(l),
    with alpha = 0.8. Buffers, so they travel in ``state_dict`` and a resumed run continues exactly.
    """

    def __init__(self, alpha: float = 0.8) -> None:
        super().__init__()
        self.alpha = alpha
        self.register_buffer("mean", torch.zeros(()))
        self.register_buffer("var", torch.ones(()))
        self.register_buffer("initialised", torch.zeros((), dtype=torch.bool))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Under data parallelism (several ranks) the statistics are those of every rank's ``x`` together,
        so c and v stay the same on every rank and equal those of one process with the whole batch."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            batch_mean, batch_var = global_mean_var(x)
        else:
            batch_var, batch_mean = torch.var_mean(x, correction=0)
        # The first minibatch sets the statistics rather than being shrunk towards (0, 1): the weight of the new
        # minibatch is 1 until initialised, 1 - alpha after; chosen on the device (no host sync).
        w = torch.where(self.initialised, 1.0 - self.alpha, 1.0)
        self.mean.lerp_(batch_mean, w)
        self.var.lerp_(batch_var, w)
        self.initialised.fill_(True)


class StreamingMean:
    """Mean accumulated over chunks in float64 (same interface as ``StreamingLogMeanExp``)."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.count = 0

    def update(self, x: torch.Tensor, dim: int = 0) -> None:
        chunk = x.double().sum(dim)
        self.total = chunk if self.total is None else self.total + chunk
        self.count += x.shape[dim]

    def result(self) -> torch.Tensor:
        if self.total is None:
            raise ValueError("no samples were accumulated")
        return (self.total / self.count).float()


def to_floats(metrics: dict) -> dict[str, float]:
    """Device tensors to Python floats, with one host sync for the whole dict."""
    if not metrics:
        return {}
    keys = list(metrics)
    device = next((v.device for v in metrics.values() if isinstance(v, torch.Tensor)), None)
    values = torch.stack([torch.as_tensor(metrics[k], device=device).float().reshape(()) for k in keys])
    return dict(zip(keys, values.cpu().tolist()))
