"""The gradient of a Boltzmann machine's free energy in closed form: its sufficient statistics.

With a(x) = c + v'W + y'U and p = p(h = 1 | x) = sigmoid(a(x)), the free energy of ``nvil.models.rbm``,

    F(x) = E_vis(v) - d'y - 1/2 v'L v - sum_j softplus(a_j(x)),

has the derivatives (Salakhutdinov 2009, Algorithm 1: the data and the particles' statistics <v h'>, <h>, <v>)

    dF/dW = -v p',   dF/dU = -y p',   dF/dc = -p,   dF/dd = -y,
    dF/db = dE_vis/db: -v (binary pixels, E_vis = -b'v) or b - v (Gaussian, E_vis = 1/2 |v - b|^2),
    dF/dL = -1/2 (v v') o (1 - I)   (L enters as 1/2 (L + L') o (1 - I): symmetric, zero diagonal).

``free_energy_grad`` returns sum_n w_n dF(x_n)/dtheta for row weights w: with the data's rows at 1/B and the
particles' at -1/M it is the gradient of the learners' surrogate mean F(data) - mean F(negatives) (the learners
pass both sets stacked, so each statistic is one matrix product). ``BIAS_GRAD`` lists the visible layers whose
dE_vis/db is known here; a machine with another layer is differentiated by autograd.
"""

from __future__ import annotations

import torch

from nvil.backend import gemm
from nvil.models.visible import Bernoulli, Gaussian, LateralBernoulli


def bernoulli_bias_grad(v: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum_n w_n d(-b'v_n)/db = -w'v."""
    return -(w @ v)


def gaussian_bias_grad(v: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum_n w_n d(1/2 |v_n - b|^2)/db = (sum_n w_n) b - w'v."""
    return w.sum() * b - w @ v


BIAS_GRAD = {Bernoulli: bernoulli_bias_grad, LateralBernoulli: bernoulli_bias_grad, Gaussian: gaussian_bias_grad}


def free_energy_grad(model, x: torch.Tensor, w: torch.Tensor, hidden_probs: torch.Tensor,
                     lr: float | None = None) -> dict[str, torch.Tensor] | None:
    """{parameter name: sum_n w_n dF(x_n)/dtheta} for a ``nvil.models.rbm.BoltzmannMachine`` whose visible layer is in
    ``BIAS_GRAD``. ``hidden_probs`` is p(h = 1 | x) = sigmoid(a(x)) at the current parameters, [rows, n_hidden].

    With ``lr``, plain SGD's step theta <- theta - lr * gradient is applied to the parameters in place instead (each
    weight matrix's by the GEMM that computes its gradient: no gradient buffer, no optimiser pass), returning None."""
    v, y = model.split(x)
    minus_wp = -w.unsqueeze(-1) * hidden_probs  # each row's -w_n p_n: the sign folded in before the products
    products = {"W": (v, minus_wp)}  # gradient = left' @ right
    vectors = {"b": BIAS_GRAD[type(model.visible_layer)](v, w, model.b), "c": minus_wp.sum(0)}
    if y is not None:
        products["U"], vectors["d"] = (y, minus_wp), -(w @ y)
    if model.L is not None:
        vectors["L"] = -0.5 * (v.T @ (w.unsqueeze(-1) * v)) * model.off_diagonal
    if lr is None:
        return {**{k: gemm.matmul(left.T, right) for k, (left, right) in products.items()}, **vectors}
    params = dict(model.named_parameters())
    with torch.no_grad():
        for k, (left, right) in products.items():
            gemm.addmm_(params[k], left.T, right, alpha=-lr)
        for k, g in vectors.items():
            params[k].sub_(g, alpha=lr)
    return None
