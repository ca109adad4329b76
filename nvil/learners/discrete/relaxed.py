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
    """REBAR: the relaxed f as a control variate, its scale and temperature tuned online (Tucker et al. 2017).

    Layer i's estimate is g_phi = [f(b) - c(z~)] grad_phi log q(b | x) + grad_phi c(z) - grad_phi c(z~)
    (RELAX Eq. 5) with c(z) = eta f(sigma_lambda(z)) (REBAR Eq. 7); eta and lambda descend the single-sample
    estimate of g_phi's variance, which takes a second backward pass (``estimate``). 1 + 2 n evaluations of f per
    example for n layers (``evaluations_per_example``). Defaults: configs/learner/rebar.yaml.

    Parameters
    ----------
    model : nn.Module
        The directed model p(x, h) with parameters theta (an ``nvil.models.SBN``).
    inference : nn.Module
        The inference network q(h | x) with parameters phi: factorial Bernoulli layers
        (``nvil.models.LayeredInference`` with ``autoregressive=False``).
    device : torch.device or str, default "cpu"
        Where the learner and its generator live.
    seed : int, default 0
        Seed of the learner's generator, which draws the uniforms u (and v).
    optimizer : str, default "adam"
        ``adam`` or ``sgd``.
    lr : float, default 0.001
        The model's learning rate.
    momentum : float, default 0.0
        SGD's momentum.
    inference_lr_scale : float, default 0.2
        q's rate relative to ``lr`` (the authors' code: 1, one rate).
    eta : float, default 1.0
        The control variate's initial scale eta.
    temperature : float, default 0.5
        The initial lambda of sigmoid(z / lambda).
    cv_lr_scale : float, default 1.0
        The control variate's rate relative to ``lr`` (the authors' code: 10).
    cv_objective : str, default "parameters"
        What eta, lambda (and r_rho) descend: ``parameters``, the second moment of the inference weights' estimate;
        ``logits``, the mean square of the per-example logit-space estimate (the RELAX authors' code).
    beta2 : float, default 0.999
        Adam's second-moment decay (the authors' code: 0.99999).
    cv_noise : str, default "independent"
        ``independent``: z~ from its own uniform v; ``common``: v from z's u, so z~ = z in value (the RELAX
        authors' ``v_from_u``).

    Raises
    ------
    ConfigError
        If ``cv_objective`` or ``cv_noise`` is not one of its choices, ``temperature`` is not positive, the inference
        network's layers are not factorial Bernoulli, or an optimiser setting is invalid.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import SBN, LayeredInference
    >>> from nvil.learners import REBAR
    >>> learner = REBAR(SBN(6, [4, 3]), LayeredInference(6, [4, 3]))
    >>> learner.evaluations_per_example
    5
    >>> x = torch.bernoulli(torch.full((8, 6), 0.5))
    >>> sorted(learner.step(x))
    ['rebar/eta', 'rebar/grad_square', 'rebar/temperature', 'train/elbo', 'train/model_loss']
    """

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
        """f(h) = log p(x, h) - log q(h | x) at relaxed h in (0, 1)^n, given each layer's inference logits.

        Parameters
        ----------
        x : torch.Tensor
            The minibatch ``[batch, n_visible]``.
        soft : list of torch.Tensor
            The relaxed (or hard) units of every layer, ``[..., batch, units]``.
        logits : list of torch.Tensor
            Each layer's inference logits (from the relaxed layer below).

        Returns
        -------
        torch.Tensor
            f at the relaxed sample, ``[..., batch]``.
        """
        log_q = sum(bernoulli_log_prob(a, h) for a, h in zip(logits, soft))
        return self.model.log_joint(x, soft) - log_q

    def c(self, x: torch.Tensor, below: list[torch.Tensor], logits: list[torch.Tensor], z: torch.Tensor,
          u_above: list[torch.Tensor]) -> torch.Tensor:
        """The control variate c_i(z) for layer i = len(below), with the layers above relaxed from their uniforms.

        The hard layers ``below``, layer i relaxed from ``z``, the layers above relaxed from their uniforms ``u_above``
        (each one's logits from the relaxed layer beneath). ``logits``: the inference logits of layers 0..i (their
        inputs x and the hard ``below`` are fixed). ``z`` may carry leading dimensions (z and z~ stacked: one relaxed
        pass for both), which the result keeps. c_i = eta f(sigma_lambda(z)), plus r_rho for RELAX.

        Parameters
        ----------
        x : torch.Tensor
            The minibatch ``[batch, n_visible]``.
        below : list of torch.Tensor
            The hard samples b_0..b_{i-1} of the layers below i.
        logits : list of torch.Tensor
            The inference logits of layers 0..i.
        z : torch.Tensor
            Layer i's logistic sample (before the sigmoid), ``[..., batch, units]``.
        u_above : list of torch.Tensor
            The uniforms of the layers above i.

        Returns
        -------
        torch.Tensor
            c_i(z), ``[..., batch]``.
        """
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
        """The term whose phi-gradient is grad c(z) - grad c(z~) (mean over the minibatch).

        Parameters
        ----------
        c_z : torch.Tensor
            c(z), ``[batch]``.
        c_zt : torch.Tensor
            c(z~), ``[batch]``.

        Returns
        -------
        torch.Tensor
            0-d: mean(c(z) - c(z~)).
        """
        return (c_z - c_zt).mean()

    def estimate(self, x: torch.Tensor, tune: bool) -> tuple[dict, list, dict]:
        """One draw of the ascent direction of model and inference network, and the control variate's gradient.

        From one draw of (u, v) per unit: layer i's estimate in logit space D_i, mapped to the weights once, and with
        ``tune`` the gradient of sum(g_phi^2) in the control variate's parameters (a second backward pass).

        Parameters
        ----------
        x : torch.Tensor
            The minibatch ``[batch, n_visible]``.
        tune : bool
            Also compute d sum(g_phi^2) / d(control variate) and the ``rebar/*`` metrics.

        Returns
        -------
        ascent : dict of str to torch.Tensor
            The ascent direction per parameter name (``model.*``, ``inference.*``).
        cv_grads : dict
            d sum(g_phi^2) / d(control variate) per parameter name (weight decay added); empty unless ``tune``.
        metrics : dict
            ``train/elbo``, ``train/model_loss`` and, with ``tune``, ``rebar/eta``, ``rebar/temperature`` and
            ``rebar/grad_square``.
        """
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
        """Layer i's part of what the control variate descends, from D_i and the layer's input v.

        ``cv_objective=parameters``: sum(g_W^2) + sum(g_c^2) = sum_nm (D D')_nm (v_n . v_m + 1) (the second moment of
        the weights' estimate; its mean does not depend on the control variate); ``logits``, the RELAX authors' code,
        the mean of D_i^2 over examples and units (the same argument per logit).

        Parameters
        ----------
        d_alpha : torch.Tensor
            D_i, the estimate in layer i's logits, ``[N, units]``.
        v : torch.Tensor
            The affine layer's input, ``[N, in]``.
        bias : bool
            Whether the layer has a bias (the ``+ 1`` of the Gram form).

        Returns
        -------
        torch.Tensor
            0-d: the layer's term of the variance objective.
        """
        if self.objective == "logits":
            return d_alpha.pow(2).mean()
        gram = v @ v.T + bias
        return ((d_alpha @ d_alpha.T) * gram).sum()

    def with_weight_decay(self, grads: dict, params: dict) -> dict:
        """``grads`` plus d/d rho of 0.5 wd |rho|^2 on r_rho's parameters (``learner.cv_weight_decay``).

        The RELAX authors' L2, added outside the variance's graph (one add per tensor instead of its own backward).

        Parameters
        ----------
        grads : dict
            The control variate's gradients per parameter name (None where the variance does not reach a parameter).
        params : dict
            The control variate's parameters per name.

        Returns
        -------
        dict
            ``grads`` with the decay added to r_rho's entries (``grads`` itself when the decay is 0).
        """
        if not self.weight_decay:
            return grads
        decayed = {id(p) for net in self.control_variate.networks() for p in net.parameters()}
        for k, p in params.items():
            if id(p) in decayed:
                g = grads[k]
                grads[k] = p.detach() * self.weight_decay if g is None else g.add(p.detach(), alpha=self.weight_decay)
        return grads

    def gradient_estimate(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """One draw of the ascent direction of model and inference network, the control variate left untuned.

        Parameters
        ----------
        x : torch.Tensor
            The minibatch ``[batch, n_visible]``.

        Returns
        -------
        dict of str to torch.Tensor
            The ascent direction per parameter name (``model.*``, ``inference.*``).
        """
        return self.estimate(x, tune=False)[0]

    def step(self, x: torch.Tensor, diagnostics: bool = False) -> dict[str, torch.Tensor]:
        """One update: theta and phi along the estimate, the control variate down its variance, one optimiser.

        The estimate's ascent direction for theta and phi, and the variance's gradient for the control variate.

        Parameters
        ----------
        x : torch.Tensor
            The minibatch ``[batch, n_visible]``.
        diagnostics : bool, default False
            A logging step: also report the gradient norms ``grad_norm/<group>``.

        Returns
        -------
        dict of str to torch.Tensor
            ``train/elbo``, ``train/model_loss``, ``rebar/eta``, ``rebar/temperature``, ``rebar/grad_square`` (and the
            gradient norms on a logging step).
        """
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
        """Nothing to compile here: the double backward runs eagerly in every mode (``trainer.accel`` is checked).

        Parameters
        ----------
        mode : str
            ``trainer.accel``'s value (``nvil.backend.accel``).
        device : torch.device or str or None, default None
            The run's device, which the mode is checked against.
        steps : int or None, default None
            The run's length (unused).

        Returns
        -------
        REBAR
            The learner itself, unchanged.
        """
        check_mode(mode, device, "trainer.accel")
        return self


class RELAX(REBAR):
    """RELAX: REBAR's control variate plus a neural network r_rho, trained on the variance (Grathwohl et al. 2018).

    c(z) = eta f(sigma_lambda(z)) + r_rho(sigma_lambda(z)); eta, lambda and rho descend the single-sample estimate of
    the inference gradient's variance. REBAR's keywords (defaults: configs/learner/relax.yaml) and r_rho's.

    Parameters
    ----------
    model : nn.Module
        The directed model p(x, h) with parameters theta (an ``nvil.models.SBN``).
    inference : nn.Module
        The inference network q(h | x) with parameters phi: factorial Bernoulli layers.
    device : torch.device or str, default "cpu"
        Where the learner and its generator live.
    seed : int, default 0
        Seed of the learner's generator.
    optimizer : str, default "adam"
        ``adam`` or ``sgd``.
    lr : float, default 0.001
        The model's learning rate.
    momentum : float, default 0.0
        SGD's momentum.
    inference_lr_scale : float, default 0.2
        q's rate relative to ``lr``.
    eta : float, default 1.0
        The control variate's initial scale eta.
    temperature : float, default 0.5
        The initial lambda of sigmoid(z / lambda).
    cv_lr_scale : float, default 1.0
        The control variate's rate relative to ``lr`` (the authors' code: 10).
    cv_objective : str, default "parameters"
        ``parameters`` or ``logits``, as REBAR's (the authors' code: logits).
    beta2 : float, default 0.999
        Adam's second-moment decay (the authors' code: 0.99999).
    cv_hidden : int, default 200
        Units in each of r_rho's hidden layers.
    cv_depth : int, default 1
        r_rho's hidden layers (the authors' code: 2 or 4).
    cv_activation : str, default "tanh"
        ``tanh`` or ``relu`` (the authors' code: relu).
    cv_inputs : str, default "relaxed"
        ``relaxed``: one r_rho on every layer's relaxed units; ``x_z``: the authors' code, one r_rho per latent
        layer i on (x - mean, z_i, 2 b_<i - 1).
    cv_weight_decay : float, default 0.0
        L2 on r_rho, added to the variance objective (the authors' code: 1e-4).
    cv_noise : str, default "independent"
        ``independent`` or ``common``, as REBAR's (the RELAX authors' code: common).

    Raises
    ------
    ConfigError
        If ``cv_hidden`` or ``cv_depth`` is not a positive integer, a choice (``cv_inputs``, ``cv_activation``,
        ``cv_objective``, ``cv_noise``) is unknown, ``cv_weight_decay`` is negative, or another setting is invalid.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import SBN, LayeredInference
    >>> from nvil.learners import RELAX
    >>> learner = RELAX(SBN(6, [4, 3]), LayeredInference(6, [4, 3]), cv_hidden=8)
    >>> x = torch.bernoulli(torch.full((8, 6), 0.5))
    >>> metrics = learner.step(x, diagnostics=True)
    >>> "grad_norm/control_variate" in metrics, len(learner.control_variate.networks())
    (True, 1)
    """

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
