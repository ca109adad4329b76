"""The weight steps of the hand-derived gradients (``nvil.learners.fused``): every entry of
``LayeredBernoulliGradients.output_grads``, (layer, dL/d(output), input v, scale, dL/d bias), made into
the layer's ``.grad`` or, with plain SGD, into its weights directly; and ``affine``, the layers' forward product."""

from __future__ import annotations

import torch
from torch import nn

from nvil.backend import gemm
from nvil.learners.base import grad_norms


@torch.no_grad()
def apply_grads(grads: list[tuple], rates: dict | None) -> None:
    """Each layer's weight gradient d_out' v by one GEMM, into ``.grad``; or with ``rates`` ({id(parameter): lr},
    from ``plain_sgd_rates``) plain SGD's step theta <- theta - lr dL/dtheta, written by the GEMM that computes
    the gradient (``.grad`` left alone): no gradient buffer written and read back, no optimiser pass."""
    for layer, d_out, v, scale, d_bias in grads:
        if v is None:
            _sink(layer, d_bias, rates)
        elif d_bias is None:
            _masked_grads(layer, d_out, v, scale, rates)
        else:
            _affine_grads(layer, d_out, v, scale, d_bias, rates)



def apply_update(grads: list[tuple], metrics: dict, optimizer: torch.optim.Optimizer, rates: dict | None,
                 diagnostics: bool) -> dict:
    """The end of a fused step (NVIL, wake-sleep): the gradients applied (``apply_grads``; with
    ``rates`` plain SGD in the GEMMs), else the optimiser's step, with the gradient norms on a logging step."""
    apply_grads(grads, rates)
    if rates is None:
        if diagnostics:
            metrics.update(grad_norms(optimizer))
        optimizer.step()
    return metrics


def plain_sgd_rates(optimizer: torch.optim.Optimizer) -> dict[int, float] | None:
    """{id(parameter): lr} when ``optimizer`` is plain SGD (no momentum, weight decay, nesterov or maximize), whose
    step theta <- theta - lr g ``apply(grads, rates)`` can apply itself; None for any other optimiser."""
    if not isinstance(optimizer, torch.optim.SGD):
        return None
    rates = {}
    for group in optimizer.param_groups:
        if group["momentum"] or group["weight_decay"] or group["nesterov"] or group["maximize"]:
            return None
        rates.update({id(p): group["lr"] for p in group["params"]})
    return rates


def _sink(p: nn.Parameter, grad: torch.Tensor, rates: dict | None) -> None:
    """``grad`` into ``p.grad``, or with ``rates`` the SGD step p <- p - lr grad."""
    if rates is None:
        _grad_buffer(p).copy_(grad)
    else:
        p.sub_(grad, alpha=rates[id(p)])


def _grad_buffer(p: nn.Parameter) -> torch.Tensor:
    """``p.grad``, kept from step to step: every gradient is written into the same memory (fresh pages for each
    weight-sized gradient cost more on a CPU than the GEMM that fills them)."""
    if p.grad is None:
        p.grad = torch.empty_like(p)
    return p.grad


def affine(linear: nn.Linear, v: torch.Tensor) -> torch.Tensor:
    """W v + b (``nvil.backend.gemm.linear``)."""
    return gemm.linear(v, linear.weight, linear.bias)


def _affine_grads(linear: nn.Linear, d_out: torch.Tensor, v: torch.Tensor, scale: float, d_bias: torch.Tensor,
                  rates: dict | None) -> None:
    """Gradients of an ``nn.Linear`` with input ``v`` [N, in] given dL/d(output) ``d_out`` [N, out]: dL/dW =
    scale d_out' v (one GEMM) and dL/db = ``d_bias`` (reduced by ``output_grads``). Into ``.grad`` (beta=0 ignores
    the buffer's old values), or with ``rates`` into the weight itself, W <- W - lr scale d_out' v."""
    w = linear.weight
    if rates is None:
        gemm.addmm_(_grad_buffer(w), d_out.t(), v, alpha=scale, beta=0)
        _grad_buffer(linear.bias).copy_(d_bias)
    else:
        gemm.addmm_(w, d_out.t(), v, alpha=-rates[id(w)] * scale)
        linear.bias.sub_(d_bias, alpha=rates[id(linear.bias)])


def _masked_grads(layer: nn.Module, d_out: torch.Tensor, v: torch.Tensor, scale: float, rates: dict | None) -> None:
    """The weight gradient of an ``AutoregressiveLinear`` (logits + v (W * mask)'): dL/dW = mask * scale d_out' v,
    the masked entries zero as autograd gives them; into ``.grad``, or with ``rates`` the SGD step on W."""
    g = torch.mm(d_out.t(), v).mul_(layer.mask)
    if rates is None:
        torch.mul(g, scale, out=_grad_buffer(layer.weight))
    else:
        layer.weight.sub_(g, alpha=rates[id(layer.weight)] * scale)
