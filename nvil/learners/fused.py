"""NVIL's gradients derived by hand for layered Bernoulli models (Mnih & Gregor 2014, Eq. 5-6, Sec. 2.3).

When every conditional of the model is a Bernoulli with logits affine in the layer above
(``SBN.layered_bernoulli``: Bernoulli visibles; the prior factorial or, as fDARN's, autoregressive) and every layer
of the inference network is a factorial Bernoulli
(``LayeredInference.layered_bernoulli``: factorial or autoregressive), the gradient of NVIL's surrogate loss L needs no
autograd graph. A Bernoulli layer with logits a = W v + b has d log p(value) / d a = value - sigmoid(a), so with
N examples in the minibatch:

- model layer i (v = h_i, value = h_{i-1}, h_0 = x):  dL/da = (sigmoid(a) - h_{i-1}) / N          (Eq. 5)
- prior logits p:                                      dL/dp = mean over examples of sigmoid(p) - h_n
- fDARN's autoregressive prior, logits l = p + W h_n (W strictly lower-triangular, ``AutoregressiveLinear``):
                                                       dL/dl = (sigmoid(l) - h_n) / N, dL/dp = its sum over
                                                       examples, dL/dW = mask * (dL/dl)' h_n
- inference layer i (v = h_{i-1}, the centred x for i = 1, value = h_i):
                                                       dL/da = a_i (sigmoid(a) - h_i) / N          (Eq. 6)
  where a_i = (l_i - b_i - c_i) / max(1, sqrt(v_i)) is layer i's learning signal (``baselines.learning_signal``);
- an autoregressive inference layer (Table 2; logits a = W v + c + U h_i, U strictly lower-triangular), its
  units drawn in index order by ``AutoregressiveLinear.sample_given``: dL/da as above, dL/dU = mask * (dL/da)' h_i
- baseline b_psi(v) = w2' tanh(W1 v + b1) + b2 (Sec. 2.3.1), backpropagated from dL/db = -(l - c - b) / (scale N)
  (``baselines.baseline_loss_grad``);

and for every affine layer dL/dW = (dL/da)' v and dL/db = sum over examples of dL/da. The forward pass draws h with
the random numbers of ``LayeredInference.sample`` (u < sigmoid(a), one uniform per unit, layer by layer; the units of
an autoregressive layer in index order), so for one seed this path and the autograd path take the same updates to
float rounding (tests/test_nvil_fused.py). An autoregressive q's draws are sequential (in C with ``accel=auto`` on a
CPU), so its step is not compiled (``compilable``).

Its gain over autograd's gradients of the same surrogate (the definition) on the default job's step is measured by
``bench/nvil_step_paths.py`` and listed in ``nvil.backend.registry`` (entry ``nvil_hand_derived``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nvil.backend import gemm
from nvil.backend.accel import accelerate, accelerate_sampling, eager_if_uncompilable
from nvil.backend.native.bernoulli_log_prob import bernoulli_log_prob
from nvil.core.ops import sigmoid_and_softplus_sum
from nvil.learners.baselines import LearningSignal, baseline_loss_grad
from nvil.learners.weight_steps import affine


def covers(model: nn.Module, inference: nn.Module) -> bool:
    """Whether the hand-derived gradients apply to this model and inference network."""
    return model.layered_bernoulli and inference.layered_bernoulli


@dataclass
class Forward:
    """What the backward pass reads of one forward pass (lists run over latent layers, h_1 first)."""

    inputs: list[torch.Tensor]    # each inference layer's input, also its baseline's: centred x, h_1, ...
    hs: list[torch.Tensor]        # the draws h_1, ..., h_n
    q_probs: list[torch.Tensor]   # sigmoid of the inference logits
    p_probs: list[torch.Tensor]   # sigmoid of the logits of x | h_1, h_1 | h_2, ..., h_{n-1} | h_n, and of an
                                  # autoregressive prior's logits p + W h_n (per example) where the model has one
    hidden: list[torch.Tensor]    # each baseline's tanh units
    log_p: list[torch.Tensor]     # [log p(x | h_1), ..., log p(h_n)], as SBN.log_prob_layers
    log_q: list[torch.Tensor]     # [log q(h_1 | x), ...], as LayeredInference.sample
    b: list[torch.Tensor]         # b_psi of each layer (zeros without an input baseline)


class LayeredBernoulliGradients:
    """The forward pass and the hand-derived backward pass of NVIL for an SBN and a factorial inference network,
    with ``baselines`` (one ``InputDependentBaseline`` per latent layer, or none)."""

    def __init__(self, model: nn.Module, inference: nn.Module, baselines: nn.ModuleList) -> None:
        self.model, self.inference, self.baselines = model, inference, baselines

    @torch.no_grad()
    def forward(self, x: torch.Tensor, generator: torch.Generator) -> Forward:
        return self.forward_from(x, self.uniforms(x, generator))

    def uniforms(self, x: torch.Tensor, generator: torch.Generator) -> list[torch.Tensor]:
        """The uniforms the forward pass compares with, one [N, units] tensor per inference layer, drawn in the order
        and shapes of ``LayeredInference.sample`` (so the same stream for one seed)."""
        return [torch.rand(x.shape[0], enc.out_features, generator=generator, device=x.device, dtype=x.dtype)
                for enc in self.inference.encoders]

    @torch.no_grad()
    def forward_from(self, x: torch.Tensor, uniforms: list[torch.Tensor]) -> Forward:
        """The forward pass given its uniforms: h = [u < sigmoid(logits)] layer by layer. A function of tensors (and
        the modules' parameters), so ``trainer.accel`` may compile it together with the backward pass."""
        inputs, hs, q_probs, log_q = [], [], [], []
        v = self.inference.centre(x)
        for i, (enc, u) in enumerate(zip(self.inference.encoders, uniforms)):
            h, logits, prob, softplus_sum = self._draw(i, affine(enc, v), u)
            inputs.append(v), hs.append(h), q_probs.append(prob)
            log_q.append(torch.linalg.vecdot(h, logits) - softplus_sum)  # bernoulli_log_prob(logits, h)
            v = h
        p_probs, log_p = [], []
        for dec, h, value in zip(self.model.decoders, hs, [x] + hs[:-1]):
            logits = gemm.linear(h, dec.weight, dec.bias)
            prob, softplus_sum = sigmoid_and_softplus_sum(logits)
            p_probs.append(prob), log_p.append(torch.linalg.vecdot(value, logits) - softplus_sum)
        prior_ar = self.model.prior_ar
        if prior_ar is None:
            log_p.append(bernoulli_log_prob(self.model.prior_logits, hs[-1]))
        else:  # fDARN: l = p + W h_n, W masked strictly lower-triangular
            logits = torch.addmm(self.model.prior_logits, hs[-1], prior_ar.masked_weight().T)
            prob, softplus_sum = sigmoid_and_softplus_sum(logits)
            p_probs.append(prob), log_p.append(torch.linalg.vecdot(hs[-1], logits) - softplus_sum)
        hidden, b = [], []
        for baseline, v in zip(self.baselines, inputs):
            first, last = baseline.net[0], baseline.net[2]
            hidden.append(torch.tanh(affine(first, v)))
            b.append(F.linear(hidden[-1], last.weight, last.bias).squeeze(-1))
        return Forward(inputs, hs, q_probs, p_probs, hidden, log_p, log_q, b or [torch.zeros_like(q) for q in log_q])

    @property
    def compilable(self) -> bool:
        """Whether the forward pass is a function of tensors that ``torch.compile`` can trace in one graph: not with
        an autoregressive q, whose units are drawn one after another (``AutoregressiveLinear.sample_given``)."""
        return self.inference.factorial

    def _draw(self, i: int, logits: torch.Tensor, u: torch.Tensor) -> tuple:
        """Inference layer i's units h for uniforms u given the logits from the layer below: h = [u < sigmoid(a)]
        (factorial), or drawn in index order with a = logits + U h (autoregressive). Returns (h, a, sigmoid(a),
        sum softplus(a))."""
        if self.inference.within is not None:
            within = self.inference.within[i]
            h = within.sample_given(logits, u)
            logits = within.logits(logits, h)
            prob, softplus_sum = sigmoid_and_softplus_sum(logits)
        else:
            prob, softplus_sum = sigmoid_and_softplus_sum(logits)
            h = (u < prob).to(prob.dtype)
        return h, logits, prob, softplus_sum

    @torch.no_grad()
    def output_grads(self, f: Forward, x: torch.Tensor, signals: list[LearningSignal]) -> list[tuple]:
        """dL/d(output) of every affine layer, as (layer, d_out [N, out], its input v [N, in], scale, dL/d bias), and
        of the prior logits, as (prior, None, None, 1, dL/d prior): the backward pass of NVIL's surrogate loss (what
        ``loss.backward()`` gives on the autograd path) but its weight GEMMs, which ``apply`` makes as
        dL/dW = scale d_out' v. Each dL/da below is N times the gradient of the minibatch mean (scale 1 / N, the bias
        gradient the mean of d_out), except the baseline's (already divided by N: scale 1, the sum). The bias
        reductions are made here, so a compiled step fuses them with the d_out that they reduce."""
        out = self.model_grads(f, x) + self.inference_grads(f, [s.a for s in signals])
        for baseline, s, t, v in zip(self.baselines, signals, f.hidden, f.inputs):
            first, last = baseline.net[0], baseline.net[2]
            d_b = baseline_loss_grad(s).unsqueeze(-1)     # [N, 1], already divided by N
            d_hidden = (d_b * last.weight).mul_(1 - t * t)  # tanh' = 1 - tanh^2, at the weights before this step
            out += [(last, d_b, t, 1, d_b.sum(0)), (first, d_hidden, v, 1, d_hidden.sum(0))]
        return out

    @torch.no_grad()
    def inference_grads(self, f: Forward, signals: list[torch.Tensor], scale: float | None = None) -> list[tuple]:
        """The inference network's part of ``output_grads``: dL/da_i = a_i (sigmoid(a) - h_i) for each layer's
        per-row signal a_i [rows] (Eq. 6), the gradient of -scale sum_rows a_i log q(h_i | h_{i-1}) (``scale`` None:
        1 / rows, the mean)."""
        out, scale = [], 1 / f.hs[0].shape[0] if scale is None else scale
        for i, (enc, a, prob, h, v) in enumerate(zip(self.inference.encoders, signals, f.q_probs, f.hs, f.inputs)):
            d_a, d_bias = _over_rows(prob - h, a, scale)
            out += [(enc, d_a, v, scale, d_bias), *self._within_grads(i, d_a, h, scale)]
        return out

    @torch.no_grad()
    def model_grads(self, f: Forward, x: torch.Tensor, weights: torch.Tensor | None = None,
                    scale: float | None = None) -> list[tuple]:
        """The model's part of ``output_grads``: grad_theta of -mean log p(x, h) at the forward pass's h (Eq. 5; also
        wake-sleep's wake phase); with per-row ``weights`` [rows] of -scale sum_rows weights log p(x, h) (VIMCO's
        model gradient, Mnih & Rezende 2016 Eq. 7: the normalised importance weights w~)."""
        out, scale = [], 1 / x.shape[0] if scale is None else scale
        for dec, prob, h, value in zip(self.model.decoders, f.p_probs, f.hs, [x] + f.hs[:-1]):
            d_a, d_bias = _over_rows(prob - value, weights, scale)
            out.append((dec, d_a, h, scale, d_bias))
        prior, top = self.model.prior_logits, f.hs[-1]
        if self.model.prior_ar is None:
            out.append((prior, None, None, 1, _over_rows(torch.sigmoid(prior) - top, weights, scale)[1]))
        else:  # the masked weights as (layer, d_out, v, scale, None); the logits' bias is the prior's
            d_l, d_bias = _over_rows(f.p_probs[-1] - top, weights, scale)
            out += [(prior, None, None, 1, d_bias), (self.model.prior_ar, d_l, top, scale, None)]
        return out

    @torch.no_grad()
    def sleep_grads(self, x: torch.Tensor, hs: list[torch.Tensor]) -> tuple[list[tuple], torch.Tensor]:
        """Wake-sleep's sleep phase at dreamed (x, h) ~ p: the gradients of -mean log q(h | x), dL/da_i =
        (sigmoid(a_i) - h_i) / N for each inference layer, as ``output_grads``' entries; and log q(h | x) [N]."""
        out, log_q, v, n = [], 0.0, self.inference.centre(x), x.shape[0]
        for i, (enc, h) in enumerate(zip(self.inference.encoders, hs)):
            logits = affine(enc, v)
            if self.inference.within is not None:
                logits = self.inference.within[i].logits(logits, h)
            prob, softplus_sum = sigmoid_and_softplus_sum(logits)
            log_q = log_q + torch.linalg.vecdot(h, logits) - softplus_sum
            d_a = prob - h
            out += [(enc, d_a, v, 1 / n, d_a.mean(0))] + self._within_grads(i, d_a, h, 1 / n)
            v = h
        return out, log_q

    def _within_grads(self, i: int, d_a: torch.Tensor, h: torch.Tensor, scale: float) -> list[tuple]:
        """An autoregressive inference layer's masked weights as an ``output_grads`` entry (dL/dU = mask * scale d_a'
        h); none for a factorial layer."""
        if self.inference.within is None:
            return []
        return [(self.inference.within[i], d_a, h, scale, None)]


def _over_rows(d_a: torch.Tensor, weights: torch.Tensor | None, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(d_a [rows, units] times the per-row ``weights`` (in place; None: 1), scale * its sum over rows): a layer's
    dL/d(output) and its bias gradient, the weight GEMM's scale being ``scale``."""
    if weights is not None:
        d_a.mul_(weights.unsqueeze(-1))
    return d_a, d_a.sum(0).mul_(scale)


def fused_gradients(model: nn.Module, inference: nn.Module, baselines: nn.ModuleList | None = None
                    ) -> LayeredBernoulliGradients | None:
    """The hand-derived gradients for this model and inference network (with NVIL's ``baselines``, else none) where
    ``covers`` holds; None otherwise: the learner keeps autograd's path."""
    if not covers(model, inference):
        return None
    return LayeredBernoulliGradients(model, inference, nn.ModuleList() if baselines is None else baselines)


def compile_fused(step, fused: LayeredBernoulliGradients, mode: str, device, fallback: bool = False) -> object:
    """``trainer.accel=compile`` for a learner's fused step: ``step`` compiled where the forward pass is one graph
    (``fused.compilable``); with an autoregressive q the step stays eager and the sequential draws run in C where the
    kernels build (``auto``; eager on CUDA). The autoregressive layers of the model and q take the mode either way.
    ``fallback`` (``auto``'s choice to compile): the eager step where the compilation fails, after one warning."""
    if fused.compilable:
        eager = step
        step = accelerate(step, mode, device, "trainer.accel")
        if fallback:
            step = eager_if_uncompilable(step, eager, "trainer.accel")
    accelerate_sampling(mode if fused.compilable else "auto", fused.model, fused.inference)
    return step
