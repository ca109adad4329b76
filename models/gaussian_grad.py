"""A Gaussian net's log joint and its gradient with respect to the state, in closed form (no autograd): the target
``GaussianNet.posterior(x)`` hands to HMC, whose leapfrog (Neal 2011, Eq. 5.18-5.20) needs the gradient at every
point and the log density only at the end point (``grad`` / ``value_and_grad``).

Notation (models/gaussian.py, Kingma 2013, Sec. 3): a_i = W_i z_pa(i) + b_i, mu_i = f(a_i),
r_i = (z_i - mu_i) / sigma_i^2; out_j = V_j z_pa(j) + c_j. Each visible type is written in exponential-family form,
log p(x | out) = t(x).out - A(out) + log h(x), so that d/d out = t(x) - A'(out) and the pull-back V^T t(x) is fixed
by the data (computed once):

    Bernoulli: t(x) = x,            A'(out) = sigmoid(out)       (d/d out = x - sigmoid(out))
    Gaussian:  t(x) = x / sigma_x^2, A'(out) = out / sigma_x^2   (d/d out = (x - out) / sigma_x^2)

The likelihood's gradient wrt z_pa(j), G_j = V_j^T t(x_j) - V_j^T A'(out_j), is then one matmul, one elementwise pass
(in place) and one matmul per observed vector. With the likelihood tempered by beta (AIS's path p(s) p(x | s)^beta):

- centred (state z): d/dz_k = -r_k (-z_k at a root) + sum_{i: pa(i)=k} W_i^T (f'(a_i) r_i) + beta sum_{j: pa(j)=k} G_j;
- auxiliary (state eps, z = z(eps), Kingma 2013, Eq. 7): the adjoints g_k = dlog p(x | z) / dz_k run in reverse
  ancestral order, g_k = beta sum_{j: pa(j)=k} G_j + sum_{i: pa(i)=k} W_i^T (f'(a_i) g_i), and d/deps_k = -eps_k +
  sigma_k g_k (g_k at a root).

The values are the model's own (``gaussian_log_prob``, ``visible_layer.log_prob``) from the same a_i and out_j.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from nvil.backend import gemm
from nvil.models.visible import gaussian_log_prob

# f'(a) given a and mu = f(a); hard_tanh's and hard_sigmoid's are 0 at the kinks, as autograd's.
DERIVATIVES = {"tanh": lambda a, mu: 1 - mu * mu, "sigmoid": lambda a, mu: mu * (1 - mu),
               "hard_tanh": lambda a, mu: ((a > -1) & (a < 1)).to(a.dtype),
               "hard_sigmoid": lambda a, mu: ((a > -3) & (a < 3)).to(a.dtype) / 6,
               "identity": lambda a, mu: torch.ones_like(a)}


class BernoulliTerms:
    """log p(x | out) = x.out - sum softplus(out): t(x) = x, A'(out) = sigmoid(out)."""

    @staticmethod
    def natural(x, log_sigma):
        return x

    @staticmethod
    def log_prob(out, x, log_sigma, linear):
        """``linear`` (= x.out, from the pulled-back data) - sum softplus(out): no product x * out."""
        return linear - F.softplus(out).sum(-1)

    @staticmethod
    def mean_(out, log_sigma):
        return out.sigmoid_()


class GaussianTerms:
    """log N(x; out, sigma_x^2) = (x / sigma_x^2).out - sum out^2 / (2 sigma_x^2) + log h(x):
    A'(out) = out / sigma_x^2."""

    @staticmethod
    def natural(x, log_sigma):
        return x * torch.exp(-2 * log_sigma)

    @staticmethod
    def log_prob(out, x, log_sigma, linear):
        """The density as written (the expanded square would cancel in float32); ``linear`` unused."""
        return gaussian_log_prob(x, out, log_sigma)

    @staticmethod
    def mean_(out, log_sigma):
        return out.mul_(torch.exp(-2 * log_sigma))


TERMS = {"bernoulli": BernoulliTerms, "gaussian": GaussianTerms}  # keyed on the visible layer's name


class LogJoint:
    """s -> log p(s) + beta log p(x | s) for one data row per chain (x [chains, n_visible]) in ``form``, callable
    like any log density (differentiable by autograd wrt the parameters) and with its gradient wrt s in closed
    form: ``grad(s)`` and ``value_and_grad(s)``, detached, for the parameters as they were when it was made
    (V^T t(x) is computed once): make a new one once they move (MCEM makes one per E-step)."""

    def __init__(self, net, x: torch.Tensor, form: str, beta=1.0) -> None:
        self.net, self.x, self.form, self.beta = net, x, form, beta
        self.terms = TERMS[net.visible_layer.name]
        self._buffer = None
        self.df = DERIVATIVES[net.nonlinearity]
        with torch.no_grad():  # per observed vector, V_j^T t(x_j) [chains, n_parent] and t(x_j).c_j [chains]
            naturals = [(self.terms.natural(xj, net.log_sigma_x), net.emissions[net.obs_link[j]])
                        for j, xj in enumerate(net.split_obs(x))]
            self.pulled = [t @ emission.weight for t, emission in naturals]
            self.offset = [t @ emission.bias for t, emission in naturals]

    def _scratch(self, like: torch.Tensor) -> torch.Tensor:
        """One [chains, n_obs] buffer for the emission's output, reused by every call: a fresh tensor of that size
        would be a fresh mapping of memory, whose page faults cost as much as a pass over it."""
        buffer = self._buffer
        if buffer is None or (buffer.shape, buffer.dtype, buffer.device) != (like.shape, like.dtype, like.device):
            self._buffer = torch.empty(like.shape, dtype=like.dtype, device=like.device)
        return self._buffer

    def tempered(self, beta) -> "LogJoint":
        """The same target with the likelihood tempered by ``beta`` (a float or a 0-d tensor), sharing V^T t(x)."""
        other = copy.copy(self)
        other.beta = beta
        return other

    def __call__(self, s: torch.Tensor) -> torch.Tensor:
        return self.net.log_prior(s, self.form) + self.beta * self.net.log_likelihood(self.x, s, self.form)

    def grad(self, s: torch.Tensor) -> torch.Tensor:
        return self._evaluate(s, value=False)[1]

    def value_and_grad(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._evaluate(s, value=True)

    @torch.no_grad()
    def _evaluate(self, s: torch.Tensor, value: bool):
        net = self.net
        parts = net.split(s)
        zs, links = self._forward(parts)
        log_lik, adjoint = self._likelihood(zs, value)
        prior = self._auxiliary_prior if self.form == "auxiliary" else self._centred_prior
        log_prior, grads = prior(s, parts, zs, links, adjoint, value)
        return (log_prior + log_lik if value else None), torch.cat(grads, -1)

    def _forward(self, parts):
        """z_i (ancestral order) and, for each non-root latent, (a_i, mu_i); None at a root."""
        net, zs, links = self.net, [], []
        for i, e in enumerate(parts):
            p = net.latent_parent[i]
            if p is None:
                zs.append(e)
                links.append(None)
                continue
            link = net.links[net.latent_link[i]]
            a = F.linear(zs[p], link.weight, link.bias)
            mu = net.f(a)
            zs.append(mu + torch.exp(net.log_sigma(i)) * e if self.form == "auxiliary" else e)
            links.append((a, mu))
        return zs, links

    def _auxiliary_prior(self, s, parts, zs, links, adjoint, value):
        """log N(eps; 0, I) and d/deps_k = -eps_k + sigma_k g_k, the adjoints g_k of z_k run children first."""
        net = self.net
        for i in reversed(range(len(parts))):
            p = net.latent_parent[i]
            if p is not None and adjoint[i] is not None:
                a, mu = links[i]
                adjoint[p] = _addmm(adjoint[p], self.df(a, mu) * adjoint[i], net.links[net.latent_link[i]].weight)
                adjoint[i] = torch.exp(net.log_sigma(i)) * adjoint[i]
        log_prior = gaussian_log_prob(s, 0.0, torch.zeros((), device=s.device)) if value else None
        return log_prior, [_sub(g, e) for g, e in zip(adjoint, parts)]

    def _centred_prior(self, s, parts, zs, links, adjoint, value):
        """sum_i log N(z_i; mu_i, sigma_i^2) and its gradient: -r_k at z_k, W_i^T (f'(a_i) r_i) at z_pa(i)."""
        net, log_prior, grads = self.net, 0.0, list(adjoint)
        for i, z in enumerate(zs):
            p = net.latent_parent[i]
            if p is None:
                grads[i] = _sub(grads[i], z)
                if value:
                    log_prior = log_prior + gaussian_log_prob(z, 0.0, torch.zeros((), device=s.device))
                continue
            a, mu = links[i]
            if value:
                log_prior = log_prior + gaussian_log_prob(z, mu, net.log_sigma(i))
            r = (z - mu) * torch.exp(-2 * net.log_sigma(i))
            grads[i] = _sub(grads[i], r)
            grads[p] = _addmm(grads[p], self.df(a, mu) * r, net.links[net.latent_link[i]].weight)
        return log_prior, grads

    def _likelihood(self, zs, value: bool):
        """(beta log p(x | z) or None, [beta dlog p(x | z) / dz_k for each latent k], None where it is 0)."""
        net, beta = self.net, self.beta
        adjoint: list = [None] * len(zs)
        log_lik = 0.0
        for j, xj in enumerate(net.split_obs(self.x)):
            k, emission = net.obs_parent[j], net.emissions[net.obs_link[j]]
            out = gemm.addmm(emission.bias, zs[k], emission.weight.t(), out=self._scratch(xj))
            if value:  # t(x).out = z.V^T t(x) + t(x).c
                linear = torch.linalg.vecdot(zs[k], self.pulled[j]) + self.offset[j]
                log_lik = log_lik + self.terms.log_prob(out, xj, net.log_sigma_x, linear)
            pulled = gemm.addmm(self.pulled[j], self.terms.mean_(out, net.log_sigma_x), emission.weight, alpha=-1)
            adjoint[k] = _add(adjoint[k], pulled if _is_one(beta) else beta * pulled)
        return (log_lik if _is_one(beta) else beta * log_lik) if value else None, adjoint


# Sums whose first term may be None, standing for 0 (a latent no gradient has reached yet).
def _add(total, term):
    return term if total is None else total + term


def _sub(total, term):
    return -term if total is None else total - term


def _addmm(total, a, weight):
    return a @ weight if total is None else torch.addmm(total, a, weight)


def _is_one(beta) -> bool:
    return not torch.is_tensor(beta) and beta == 1
