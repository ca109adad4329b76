"""A JAX port of a Gaussian net's log joint log p(x, s) (models/gaussian.py), for bench/peer_blackjax.py.

``export(model)`` copies a ``GaussianNet``'s parameters into NumPy arrays (a pytree) and its graph into a
hashable ``Spec``; ``make_log_joint(spec, form)`` returns ``log_joint(params, x, state)`` in jax.numpy, for one
row (x [n_visible], state [n_latent]) or any leading batch shape, computing what ``GaussianNet.log_joint``
computes in either form (centred: the state is z; auxiliary: the state is eps and z = z(eps)). The graph is the
general one (each latent has at most one latent parent, each observed vector one), so both
``GaussianBeliefNet`` and ``DynamicBayesNet`` port. ``compare(model, x, states, form)`` returns the largest
relative errors of the port's log joint and of its gradient against the torch model's (autograd) at the given
points; the benchmark asserts on them before timing and tests/test_peer_blackjax.py checks them.

Importing this module imports jax: set XLA_FLAGS and the CPU affinity before (bench/peer_blackjax.py does).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

LOG_2PI = math.log(2 * math.pi)
NONLINEARITIES = {"tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid, "hard_tanh": lambda a: jnp.clip(a, -1.0, 1.0),
                  "hard_sigmoid": lambda a: jnp.clip(a / 6 + 0.5, 0.0, 1.0), "identity": lambda a: a}


class Spec(NamedTuple):
    """The static part of a Gaussian net: its graph, nonlinearity and visible type (hashable)."""
    latent_sizes: tuple
    latent_parent: tuple   # None for a root
    latent_link: tuple     # index into params["links"] / params["log_sigmas"] (None for a root)
    obs_sizes: tuple
    obs_parent: tuple
    obs_link: tuple        # index into params["emissions"]
    nonlinearity: str
    visible: str           # bernoulli | gaussian


def export(model, dtype=np.float32) -> tuple[Spec, dict]:
    """(spec, params) of a torch ``GaussianNet``: params holds ``links`` [(W [out, in], b [out])], ``log_sigmas``,
    ``emissions`` [(V, c)] and ``log_sigma_x`` (Gaussian visibles only), as NumPy arrays of ``dtype``."""
    def arr(t):
        return np.asarray(t.detach().cpu().numpy(), dtype=dtype)

    spec = Spec(tuple(model.latent_sizes), tuple(model.latent_parent), tuple(model.latent_link), tuple(model.obs_sizes),
                tuple(model.obs_parent), tuple(model.obs_link), model.nonlinearity, model.visible)
    params = {"links": [(arr(m.weight), arr(m.bias)) for m in model.links],
              "log_sigmas": [arr(s) for s in model.log_sigmas],
              "emissions": [(arr(m.weight), arr(m.bias)) for m in model.emissions]}
    if model.visible == "gaussian":
        params["log_sigma_x"] = arr(model.log_sigma_x)
    return spec, params


def gaussian_log_prob(x, mean, log_sigma):
    """log N(x; mean, diag exp(log_sigma)^2), summed over the last axis (nvil.models.gaussian.gaussian_log_prob)."""
    z = (x - mean) * jnp.exp(-log_sigma)
    return jnp.sum(-0.5 * z * z - log_sigma - 0.5 * LOG_2PI, axis=-1)


def make_log_joint(spec: Spec, form: str):
    """``log_joint(params, x, state)``: log p(x, state) in ``form`` (auxiliary | centred), summed over the last
    axis, so a row gives a scalar and a [chains, dim] batch gives [chains]."""
    if form not in ("auxiliary", "centred"):
        raise ValueError(f"form must be auxiliary or centred, got {form!r}")
    f = NONLINEARITIES[spec.nonlinearity]
    offsets = np.cumsum((0,) + spec.latent_sizes)
    obs_offsets = np.cumsum((0,) + spec.obs_sizes)

    def prior_mean(params, i, z_parent):
        w, b = params["links"][spec.latent_link[i]]
        return f(z_parent @ w.T + b)

    def log_joint(params, x, state):
        parts = [state[..., offsets[i]:offsets[i + 1]] for i in range(len(spec.latent_sizes))]
        if form == "auxiliary":  # z_root = eps_root, z_i = f(W_i z_pa(i) + b_i) + sigma_i eps_i
            log_prior = jnp.sum(-0.5 * state * state - 0.5 * LOG_2PI, axis=-1)
            zs = []
            for i, e in enumerate(parts):
                p = spec.latent_parent[i]
                zs.append(e if p is None else
                          prior_mean(params, i, zs[p]) + jnp.exp(params["log_sigmas"][spec.latent_link[i]]) * e)
        else:
            zs = parts
            log_prior = 0.0
            for i, zi in enumerate(zs):
                p = spec.latent_parent[i]
                if p is None:
                    log_prior = log_prior + jnp.sum(-0.5 * zi * zi - 0.5 * LOG_2PI, axis=-1)
                else:
                    log_prior = log_prior + gaussian_log_prob(zi, prior_mean(params, i, zs[p]),
                                                              params["log_sigmas"][spec.latent_link[i]])
        log_lik = 0.0
        for j in range(len(spec.obs_sizes)):
            xj = x[..., obs_offsets[j]:obs_offsets[j + 1]]
            v, c = params["emissions"][spec.obs_link[j]]
            out = zs[spec.obs_parent[j]] @ v.T + c
            if spec.visible == "bernoulli":  # x a - softplus(a) = log Bernoulli(x; sigmoid(a))
                log_lik = log_lik + jnp.sum(xj * out - jax.nn.softplus(out), axis=-1)
            else:
                log_lik = log_lik + gaussian_log_prob(xj, out, params["log_sigma_x"])
        return log_prior + log_lik

    return log_joint


def compare(model, x, states, form: str) -> dict:
    """The port against the torch model at ``states`` [n, n_latent] with data ``x`` [n, n_visible] (torch
    tensors on any device): {"value": max |lp_jax - lp_torch| / max(1, max |lp_torch|), "grad": the same for the
    gradient wrt the state, "max_abs_value", "max_abs_grad"}, everything in the model's dtype. The torch side is
    taken both ways, autograd through ``model.log_joint`` and the closed form of ``model.posterior`` (what the
    benchmark times), and the larger error of the two is reported."""
    import torch

    from nvil.mcmc.hmc import value_and_grad

    dtype = np.dtype(str(next(model.parameters()).dtype).removeprefix("torch."))
    spec, params = export(model, dtype)
    log_joint = make_log_joint(spec, form)
    x_np = x.detach().cpu().numpy().astype(dtype)
    s_np = states.detach().cpu().numpy().astype(dtype)
    lp_j, g_j = jax.jit(jax.vmap(jax.value_and_grad(log_joint, argnums=2), in_axes=(None, 0, 0)))(params, x_np, s_np)
    with torch.no_grad():
        torch_paths = [value_and_grad(lambda s: model.log_joint(x, s, form), states),
                       model.posterior(x, form).value_and_grad(states)]
    lp_j, g_j = np.asarray(lp_j), np.asarray(g_j)
    out = {"value": 0.0, "grad": 0.0}
    for lp_t, g_t in torch_paths:
        lp_t, g_t = lp_t.cpu().numpy(), g_t.cpu().numpy()
        out["value"] = max(out["value"], float(np.max(np.abs(lp_j - lp_t)) / max(1.0, float(np.max(np.abs(lp_t))))))
        out["grad"] = max(out["grad"], float(np.max(np.abs(g_j - g_t)) / max(1.0, float(np.max(np.abs(g_t))))))
        out.update(max_abs_value=float(np.max(np.abs(lp_t))), max_abs_grad=float(np.max(np.abs(g_t))))
    return out
