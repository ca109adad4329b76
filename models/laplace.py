"""The Laplace approximation of each row's posterior: N(z*, c^2 H^-1) at the mode z* of log p(x, z).

H = -grad^2 log p(x, z) at z* (MacKay 2003, ch. 27; Bishop 2006, Sec. 4.4). The mode comes from damped Newton steps
(Nocedal & Wright 2006, Sec. 3.1 and 3.4: each row's step halved until its log p(x, z) rises), started from the
best of z = 0 and a few prior draws; H from central differences of autograd gradients, all 2D displaced points of
all rows in one batch, so the user's code is differentiated once, never twice. H is symmetrised and its eigenvalues
floored (``MIN_PRECISION``), so that it is a precision matrix even where the Newton steps stopped short of a mode.

As the base f_0 of an annealing path (``nvil.models.protocol.LaplaceBase``) the fit's covariance is widened by c
(``INFLATION``), so that the base's tails reach past the posterior's: importance weights p(x, z) / f_0(z) are then
bounded where the posterior is near Gaussian. The fit only chooses f_0; the estimate stays unbiased whatever it is.
"""

from __future__ import annotations

import torch

from nvil.core.ops import value_and_grad

INFLATION = 1.2       # c: the base's standard deviations are c times the Laplace fit's
MIN_PRECISION = 1e-2  # floor of H's eigenvalues (a standard deviation of at most 10 along any direction)
NEWTON_STEPS = 50
NEWTON_TOL = 1e-6     # stop a row when its Newton decrement g' H^-1 g / 2 (the predicted rise) falls below this
DIFF_STEP = 1e-3      # central-difference step of the Hessian
MAX_ROWS = 1 << 15    # rows per batch of displaced points


def repeat_rows(x, times: int):
    """x with its N rows repeated ``times`` times, block after block: row j N + i is row i."""
    return x.repeat(times, *[1] * (x.dim() - 1))


def precision(log_joint, x, z: torch.Tensor, eps: float = DIFF_STEP) -> torch.Tensor:
    """H = -grad^2 log p(x, z) [N, D, D] by central differences of the gradient, symmetrised."""
    n, d = z.shape
    axes_per_batch = max(1, MAX_ROWS // (2 * n))
    columns = []
    for start in range(0, d, axes_per_batch):
        axes = torch.arange(start, min(d, start + axes_per_batch), device=z.device)
        shift = eps * torch.nn.functional.one_hot(axes, d).to(z.dtype)                  # [a, D]
        displaced = torch.cat([z + shift[:, None], z - shift[:, None]]).reshape(-1, d)  # [2 a N, D]
        _, grad = value_and_grad(lambda q: log_joint(repeat_rows(x, 2 * len(axes)), q), displaced)
        grad = grad.reshape(2, len(axes), n, d)
        columns.append((grad[1] - grad[0]) / (2 * eps))                                # -dg/dz_a: [a, N, D]
    h = torch.cat(columns).permute(1, 0, 2)
    return 0.5 * (h + h.transpose(1, 2))


def floored(h: torch.Tensor, floor: float = MIN_PRECISION) -> tuple[torch.Tensor, torch.Tensor]:
    """The eigen-decomposition (eigenvalues floored at ``floor``, eigenvectors) of each symmetric H, in float64."""
    lam, vec = torch.linalg.eigh(h.double())
    return lam.clamp(min=floor), vec


def start_point(log_joint, x, n: int, d: int, draw_prior=None, draws: int = 32) -> torch.Tensor:
    """Per row, the best (highest log p(x, z)) of z = 0 and ``draws`` prior draws from a fixed seed."""
    candidates = [torch.zeros(n, d, device=x.device)]
    if draw_prior is not None:
        g = torch.Generator(device=x.device).manual_seed(0)
        candidates += list(draw_prior(draws * n, g).reshape(draws, n, d))
    z = torch.stack(candidates)                                                 # [c, N, D]
    with torch.no_grad():
        scores = log_joint(repeat_rows(x, len(candidates)), z.reshape(-1, d)).reshape(len(candidates), n)
    best = torch.nan_to_num(scores, nan=-torch.inf).argmax(0)
    return z[best, torch.arange(n, device=z.device)]


def laplace_fit(log_joint, x, z0: torch.Tensor, *, steps: int = NEWTON_STEPS, tol: float = NEWTON_TOL
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mode z* [N, D] and the floored precision's eigenvalues [N, D] and eigenvectors [N, D, D] of each row.

    Damped Newton from ``z0``: the step H^-1 g (H floored positive definite), each row's step length halved after a
    step that did not raise its log p(x, z), a row done when its Newton decrement is below ``tol``.
    """
    z = z0.clone()
    value, grad = value_and_grad(lambda q: log_joint(x, q), z)
    length = torch.ones(z.shape[0], dtype=torch.float64, device=z.device)
    active = torch.ones(z.shape[0], dtype=torch.bool, device=z.device)
    for _ in range(steps):
        lam, vec = floored(precision(log_joint, x, z))
        newton = (vec @ ((vec.transpose(1, 2) @ grad.double()[..., None]) / lam[..., None]))[..., 0]  # H^-1 g
        decrement = 0.5 * (grad.double() * newton).sum(-1)
        active &= decrement > tol
        if not active.any():
            break
        trial = z + (length[:, None] * newton).to(z.dtype) * active[:, None]
        new_value, new_grad = value_and_grad(lambda q: log_joint(x, q), trial)
        better = active & torch.isfinite(new_value) & (new_value >= value)
        z = torch.where(better[:, None], trial, z)
        value = torch.where(better, new_value, value)
        grad = torch.where(better[:, None], new_grad, grad)
        length = torch.where(better, torch.ones_like(length), 0.5 * length)
        active &= length > 1e-6
    lam, vec = floored(precision(log_joint, x, z))
    return z, lam, vec
