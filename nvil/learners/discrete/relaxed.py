"""REBAR (Tucker et al. 2017) and RELAX (Grathwohl et al. 2018): a continuous relaxation as control variate.

Each Bernoulli unit of q is b = H(z), z = alpha + log u - log(1 - u) (logistic around its logit alpha). z~ is a
draw of z given b (``conditional_logistic``, REBAR's Appendix), and c(z) a differentiable control variate:

    g_phi = [f(b) - c(z~)] grad_phi log q(b | x) + grad_phi c(z) - grad_phi c(z~)           (RELAX Eq. 5)

is unbiased for any c, because z and z~ have the same distribution and E[c(z~) | b] is what the first term
subtracts. REBAR: c(z) = eta f(sigma_lambda(z)), f evaluated at the relaxed sample sigma(z / lambda) (Eq. 7 of
REBAR); RELAX adds a neural network, c(z) = eta f(sigma_lambda(z)) + r_rho(sigma_lambda(z)). eta, lambda and rho
descend the single-sample estimate of the variance of g_phi, d/d(eta, lambda, rho) sum(g_phi^2) (REBAR Sec. 3.3,
RELAX Sec. 3.3; the mean of g_phi does not depend on them). That needs g_phi with its graph: a second backward.

With several layers, layer i's estimator conditions on the hard samples below it (as REBAR does for its multi-layer SBNs): its control
variate c_i relaxes layer i alone, z_i = alpha_i(b_{i-1}) + logistic noise, and carries the relaxed sample up through
the layers above with their own logistic noise (the noise that drew b above i), so c_i is a smooth function of z_i
and the identity holds for layer i's parameters phi_i. (One control variate of all the layers' z at once would be
biased: z_{i+1} jumps with b_i as phi_i moves.) That is 2 relaxed evaluations per layer; the model's gradient is
grad_theta log p(x, b).

phi_i enters g_phi only through layer i's logits alpha_i = W_i v_i + c_i (v_i: the centred x, or b_{i-1}), so
Eq. 5 is computed per example in logit space, D_i = d/d alpha_i of [(f - c(z~)) log q(b_i | alpha_i) / N +
mean(c(z) - c(z~))] ([N, units]), and mapped to the weights once: g_W = D_i' v_i, g_c = 1' D_i. The variance the
control variate descends is then the Gram form sum(g_W^2) + sum(g_c^2) = sum_nm (D_i D_i')_nm (v_n . v_m + 1),
whose second backward runs through [N, units] and [N, N] tensors instead of weight-sized ones (equal to the
parameter-space form, tests/test_discrete_estimators.py). z and z~ go through c in one stacked pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nvil.backend.accel import check_mode
from nvil.backend.native.bernoulli_log_prob import bernoulli_log_prob
from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.learners.base import grad_norms
from nvil.learners.discrete.common import EPS, DiscreteLearner
from nvil.learners.discrete.control_variate import (CV_ACTIVATIONS, CV_INPUTS, CV_NOISE, CV_OBJECTIVES, ControlVariate,
                                                    _cat_broadcast, on_parts)
from nvil.learners.discrete.control_variate import mlp  # noqa: F401 (re-exported: tests import it from here)


def conditional_logistic(alpha: torch.Tensor, b: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """z~ ~ p(z | b) from a uniform v, reparameterised in alpha (REBAR Appendix; theta = sigmoid(alpha)):
    z~ = log(1 + v / ((1 - v)(1 - theta))) where b = 1, -log(1 + (1 - v) / (v theta)) where b = 0, written as
    softplus(logit v + softplus(alpha)) and -softplus(softplus(-alpha) - logit v) (-log(1 - theta) = softplus(alpha)):
    finite with finite gradients for every alpha and v in (0, 1), in both branches. (The ratio form overflowed in the
    branch torch.where discards, e.g. v = 1e-6 and theta ~ 1e-30, and its gradient 0 * inf = NaN reached the update:
    REBAR diverged at update 68,300 of RELAX's protocol.)"""
    logit_v = torch.logit(v)
    on = F.softplus(logit_v + F.softplus(alpha))
    off = -F.softplus(F.softplus(-alpha) - logit_v)
    return torch.where(b > 0, on, off)


def conditional_uniform(u: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The uniform v that gives z~ = z through ``conditional_logistic`` when b = H(z), z = alpha + logit u: given b, u
    is uniform on (u', 1) (b = 1) or (0, u') (b = 0), u' = sigmoid(-alpha), so v = (u - u') / (1 - u') or u / u' is
    uniform on (0, 1) and z~(alpha; v) is a draw of p(z | b) equal to z in value (the RELAX authors' ``v_from_u``:
    common random numbers for z and z~). No gradient flows through v."""
    u_prime = torch.sigmoid(-alpha)
    v = torch.where(b > 0, (u - u_prime) / (1 - u_prime).clamp_min(1e-30), u / u_prime.clamp_min(1e-30))
    return v.clamp(EPS, 1 - EPS).detach()


class REBAR(DiscreteLearner):
    """REBAR. Keywords (defaults: configs/learner/rebar.yaml): ``DiscreteLearner``'s, and ``eta`` (the control
    variate's initial scale), ``temperature`` (the initial lambda of sigmoid(z / lambda)), ``cv_lr_scale`` (the
    control variate's rate relative to lr; the authors' code: 10), ``cv_objective`` (what eta, lambda (and r_rho)
    descend: ``parameters``, the second moment of the inference weights' estimate; ``logits``, the mean square of the
    per-example logit-space estimate, the RELAX authors' code), ``cv_noise`` (``independent``: z~ from its own
    uniform v; ``common``: v from z's u, so z~ = z in value, the RELAX authors' ``v_from_u``)."""

    needs_bernoulli_q = True
    supports_data_parallel = False  # the update is set by hand (two backward passes), not through DDP's backward
    neural = False                  # RELAX: add r_rho to the control variate
    NAME = "rebar"

    def __init__(self, model: nn.Module, inference: nn.Module, *, device: torch.device | str = "cpu", seed: int = 0,
                 optimizer: str = "adam", lr: float = 0.001, momentum: float = 0.0, inference_lr_scale: float = 0.2,
                 eta: float = 1.0, temperature: float = 0.5, cv_lr_scale: float = 1.0, cv_objective: str = "parameters",
                 beta2: float = 0.999, cv_noise: str = "independent") -> None:
        self._build(model, inference, dict(device=device, seed=seed, optimizer=optimizer, lr=lr, momentum=momentum,
                                           beta2=beta2, inference_lr_scale=inference_lr_scale, cv_lr_scale=cv_lr_scale),
                    eta, temperature, cv_objective, cv_noise)

    def _build(self, model: nn.Module, inference: nn.Module, learner: dict, eta: float, temperature: float,
               objective: str, noise: str, hidden: int | None = None, depth: int = 1, activation: str = "tanh",
               inputs: str = "relaxed", weight_decay: float = 0.0) -> None:
        """The control variate (r_rho: ``hidden`` units, ``depth`` layers, for RELAX), then ``DiscreteLearner``'s
        setup with the keywords ``learner``."""
        self.objective, self.noise = objective, noise
        for key, value, allowed in (("cv_inputs", inputs, CV_INPUTS), ("cv_activation", activation, CV_ACTIVATIONS),
                                    ("cv_objective", objective, CV_OBJECTIVES), ("cv_noise", noise, CV_NOISE)):
            if value not in allowed:
                raise ConfigError(f"learner.{key} must be one of {list(allowed)}, got {value!r}")
        self.weight_decay = float(weight_decay)
        if not self.weight_decay >= 0:
            raise ConfigError(f"learner.cv_weight_decay must be >= 0, got {self.weight_decay}")
        sizes = [enc.out_features for enc in inference.encoders]
        cv = ControlVariate(float(eta), positive_float(temperature, "learner.temperature"), sizes, hidden,
                            model.n_visible, inputs, depth, activation)
        DiscreteLearner.__init__(self, model, inference, control_variate=cv, **learner)
        self.evaluations_per_example = 1 + 2 * len(inference.encoders)  # f(b); the relaxed f at z_i and z~_i

    def relaxed_f(self, x: torch.Tensor, soft: list[torch.Tensor], logits: list[torch.Tensor]) -> torch.Tensor:
        """f(h) = log p(x, h) - log q(h | x) at relaxed h in (0, 1)^n, given each layer's inference logits (from the
        relaxed layer below)."""
        log_q = sum(bernoulli_log_prob(a, h) for a, h in zip(logits, soft))
        return self.model.log_joint(x, soft) - log_q

    def c(self, x: torch.Tensor, below: list[torch.Tensor], logits: list[torch.Tensor], z: torch.Tensor,
          u_above: list[torch.Tensor]) -> torch.Tensor:
        """c_i(z) [batch] for layer i = len(below): the hard layers ``below``, layer i relaxed from ``z``, the layers
        above relaxed from their uniforms ``u_above`` (each one's logits from the relaxed layer beneath). ``logits``:
        the inference logits of layers 0..i (their inputs x and the hard ``below`` are fixed). ``z`` may carry leading
        dimensions (z and z~ stacked: one relaxed pass for both), which the result keeps."""
        cv = self.control_variate
        temperature = cv.log_temperature.exp()
        soft, logits = [*below, torch.sigmoid(z / temperature)], list(logits)
        for j, u in enumerate(u_above, start=len(soft)):
            logits.append(self.inference.layer_logits(j, soft[-1]))
            soft.append(torch.sigmoid((logits[-1] + torch.logit(u)) / temperature))
        out = cv.eta * self.relaxed_f(x, soft, logits)
        if cv.net is not None:
            out = out + cv.net(_cat_broadcast(soft)).squeeze(-1)
        elif cv.nets is not None:  # the authors' r_rho for layer i: (x - mean, z_i, 2 b_<i - 1)
            parts = [self.inference.centre(x), z] + [2 * b - 1 for b in below]
            out = out + on_parts(cv.nets[len(below)], parts).squeeze(-1)
        return out

    def correction(self, c_z: torch.Tensor, c_zt: torch.Tensor) -> torch.Tensor:
        """The term whose phi-gradient is grad c(z) - grad c(z~) (mean over the minibatch)."""
        return (c_z - c_zt).mean()

    def estimate(self, x: torch.Tensor, tune: bool) -> tuple[dict, list, dict]:
        """({name: ascent direction} of model and inference network, d sum(g_phi^2) / d(control variate) (empty
        unless ``tune``), metrics), from one draw of (u, v) per unit."""
        inf, batch = self.inference, x.shape[0]
        sizes = [enc.out_features for enc in inf.encoders]
        us = [self.open_rand((batch, n), x) for n in sizes]
        vs = [self.open_rand((batch, n), x) for n in sizes] if self.noise == "independent" else None
        alphas, bs, inputs, below = [], [], [], x
        for i, u in enumerate(us):
            alpha = inf.layer_logits(i, below)                   # with its graph to phi_i
            inputs.append(inf.centre(x) if i == 0 else below)    # v_i, the affine layer's input
            below = (alpha.detach() + torch.logit(u) > 0).to(x.dtype)
            alphas.append(alpha)
            bs.append(below)
        fixed = [a.detach() for a in alphas]
        log_p = self.model.log_joint(x, bs)
        f = (log_p - sum(bernoulli_log_prob(a, b) for a, b in zip(fixed, bs))).detach()
        phi, g_phi, var = {}, [], torch.zeros((), device=x.device, dtype=x.dtype)
        for i, (b, u) in enumerate(zip(bs, us)):
            v = vs[i] if vs is not None else conditional_uniform(u, b, fixed[i])  # cv_noise: z~ beside z, or at it
            a = fixed[i].clone().requires_grad_()                 # alpha_i as a leaf: D_i = d(...)/d alpha_i
            z = torch.stack([a + torch.logit(u), conditional_logistic(a, b, v)])  # z and z~: one relaxed pass
            c_z, c_zt = self.c(x, bs[:i], fixed[:i] + [a], z, us[i + 1:]).unbind(0)
            (d_correction,) = torch.autograd.grad(self.correction(c_z, c_zt), a, create_graph=tune)
            d_alpha = ((f - c_zt) / batch).unsqueeze(-1) * (b - torch.sigmoid(fixed[i])) + d_correction
            phi_i = dict(inf.encoders[i].named_parameters(prefix=f"inference.encoders.{i}"))
            phi.update(phi_i)
            g_phi += torch.autograd.grad(alphas[i], list(phi_i.values()), grad_outputs=d_alpha.detach())
            if tune:
                var = var + self.variance_term(d_alpha, inputs[i], inf.encoders[i].bias is not None)
        cv_grads = {}
        if tune:
            cv_params = dict(self.control_variate.named_parameters())
            grads = torch.autograd.grad(var, list(cv_params.values()), allow_unused=True)
            cv_grads = self.with_weight_decay(dict(zip(cv_params, grads)), cv_params)
        theta = dict(self.model.named_parameters(prefix="model"))
        g_theta = torch.autograd.grad(log_p.mean(), list(theta.values()), allow_unused=True)
        ascent = {k: (g.detach() if g is not None else torch.zeros_like(p))
                  for k, g, p in zip(list(theta) + list(phi), list(g_theta) + g_phi,
                                     list(theta.values()) + list(phi.values()))}
        metrics = {"train/elbo": f.mean(), "train/model_loss": -log_p.detach().mean()}
        if tune:
            metrics.update({"rebar/eta": self.control_variate.eta.detach().clone(),
                            "rebar/temperature": self.control_variate.log_temperature.detach().exp(),
                            "rebar/grad_square": var.detach()})
        return ascent, cv_grads, metrics

    def variance_term(self, d_alpha: torch.Tensor, v: torch.Tensor, bias: bool) -> torch.Tensor:
        """Layer i's part of what the control variate descends, from D_i = ``d_alpha`` [N, units] and the layer's
        input v [N, in]: ``cv_objective=parameters``, sum(g_W^2) + sum(g_c^2) = sum_nm (D D')_nm (v_n . v_m + 1) (the
        second moment of the weights' estimate; its mean does not depend on the control variate); ``logits``, the
        RELAX authors' code, the mean of D_i^2 over examples and units (the same argument per logit)."""
        if self.objective == "logits":
            return d_alpha.pow(2).mean()
        gram = v @ v.T + bias
        return ((d_alpha @ d_alpha.T) * gram).sum()

    def with_weight_decay(self, grads: dict, params: dict) -> dict:
        """``grads`` plus d/d rho of 0.5 wd |rho|^2 on r_rho's parameters (``learner.cv_weight_decay``, the RELAX
        authors' L2), added outside the variance's graph (one add per tensor instead of its own backward)."""
        if not self.weight_decay:
            return grads
        decayed = {id(p) for net in self.control_variate.networks() for p in net.parameters()}
        for k, p in params.items():
            if id(p) in decayed:
                g = grads[k]
                grads[k] = p.detach() * self.weight_decay if g is None else g.add(p.detach(), alpha=self.weight_decay)
        return grads

    def gradient_estimate(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.estimate(x, tune=False)[0]

    def step(self, x: torch.Tensor, diagnostics: bool = False) -> dict[str, torch.Tensor]:
        """One update: the estimate's ascent direction for theta and phi, and the variance's gradient for the
        control variate, through the one optimiser."""
        ascent, cv_grads, metrics = self.estimate(x, tune=True)
        params = self.estimated_params()
        for k, p in params.items():
            p.grad = -ascent[k]
        for k, p in self.control_variate.named_parameters():
            g = cv_grads.get(k)
            p.grad = g.detach() if g is not None else torch.zeros_like(p)
        if diagnostics:
            metrics.update(grad_norms(self.optimizer))
        self.optimizer.step()
        return metrics

    def accelerate(self, mode: str, device=None, steps: int | None = None) -> "REBAR":
        """Nothing to compile here: the double backward runs eagerly in every mode (``trainer.accel`` is checked)."""
        check_mode(mode, device, "trainer.accel")
        return self


class RELAX(REBAR):
    """RELAX: REBAR's keywords (defaults: configs/learner/relax.yaml) and r_rho's: ``cv_hidden`` units in each of
    ``cv_depth`` hidden layers (the authors' code: 2 or 4), ``cv_activation`` (tanh | relu), ``cv_inputs``
    (``relaxed``: one r_rho on every layer's relaxed units; ``x_z``: the authors' code, one r_rho per latent layer i
    on (x - mean, z_i, 2 b_<i - 1)), ``cv_weight_decay`` (L2 on r_rho, added to the variance objective)."""

    neural = True
    NAME = "relax"

    def __init__(self, model: nn.Module, inference: nn.Module, *, device: torch.device | str = "cpu", seed: int = 0,
                 optimizer: str = "adam", lr: float = 0.001, momentum: float = 0.0, inference_lr_scale: float = 0.2,
                 eta: float = 1.0, temperature: float = 0.5, cv_lr_scale: float = 1.0, cv_objective: str = "parameters",
                 beta2: float = 0.999, cv_hidden: int = 200, cv_depth: int = 1, cv_activation: str = "tanh",
                 cv_inputs: str = "relaxed", cv_weight_decay: float = 0.0, cv_noise: str = "independent") -> None:
        hidden = positive_int(cv_hidden, "learner.cv_hidden")
        self._build(model, inference, dict(device=device, seed=seed, optimizer=optimizer, lr=lr, momentum=momentum,
                                           beta2=beta2, inference_lr_scale=inference_lr_scale, cv_lr_scale=cv_lr_scale),
                    eta, temperature, cv_objective, cv_noise, hidden, positive_int(cv_depth, "learner.cv_depth"),
                    cv_activation, cv_inputs, cv_weight_decay)
