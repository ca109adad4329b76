"""A Bernoulli layer's log-probability in one C pass (``nvil.backend.native.bernoulli_log_prob``, taken by
``nvil.core.ops.bernoulli_log_prob`` for large float32 CPU logits outside autograd) against the log-probability in float64,
for every way the K-sample bounds broadcast their operands; the cases it must leave to torch; and the importance-sampled
bound through it against the bound through torch's form. Each check has a broken variant that must fail it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nvil.estimators.bounds import importance_sampled_bound
from nvil.core import ops
from nvil.backend.native import bernoulli_log_prob as blp


pytestmark = pytest.mark.usefixtures("native_kernels")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def reference(logits: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """In float64, log sigmoid(a) = -log(1 + e^-a) and log(1 - sigmoid(a)) = -log(1 + e^a), each from log1p."""
    a, v = torch.broadcast_tensors(logits.double(), value.double())
    log_on = -torch.log1p(torch.exp(-a.abs())) - (-a).clamp(min=0)
    log_off = -torch.log1p(torch.exp(-a.abs())) - a.clamp(min=0)
    return (v * log_on + (1 - v) * log_off).sum(-1)


def matches(fn, logits: torch.Tensor, value: torch.Tensor) -> bool:
    """``fn`` within float32 rounding of the float64 log-probability: 2e-6 of the sum of the terms' sizes per row
    (torch's own float32 form is off by up to ~1e-6 of it on these rows)."""
    a, v = torch.broadcast_tensors(logits.double(), value.double())
    scale = (v * a).abs().sum(-1) + F.softplus(a).sum(-1) + 1.0
    out = fn(logits, value)
    return out is not None and out.shape == scale.shape and bool(((out.double() - reference(logits, value)).abs()
                                                                   <= 2e-6 * scale).all())


def cases(width: int):
    """(logits, value) pairs as the bounds make them: x expanded over K samples; q's first logits expanded over K;
    both full; an implicitly broadcast value; extreme logits (|a| up to 120, zeros) in every row."""
    k, b = 7, 9
    a = torch.randn(k, b, width, generator=gen(width)) * 6
    a[0, 0, :] = 0.0
    a[1, 1, : width // 2 + 1] = 120.0
    a[2, 2, : width // 2 + 1] = -120.0
    x = (torch.rand(b, width, generator=gen(width + 1)) < 0.3).float()
    h = (torch.rand(k, b, width, generator=gen(width + 2)) < 0.5).float()
    return [(a, x.unsqueeze(0).expand(k, b, width)),   # log p(x | h): x repeats over the samples
            (a[0].unsqueeze(0).expand(k, b, width), h),  # log q(h_1 | x): the logits repeat over the samples
            (a, h),
            (a, x),                                    # value broadcast without expand
            (a.reshape(-1, width), x.repeat(k, 1))]


@pytest.mark.parametrize("width", [1, 7, 128, 129, 784])
def test_the_c_pass_is_the_log_probability_for_every_broadcast(width, monkeypatch):
    """The kernel (its size threshold lowered so that small cases take it) against float64, over widths below, at
    and across its 128-term blocks; the same kernel with the value rows taken one row late fails it."""
    monkeypatch.setattr(blp, "MIN_ELEMENTS", 1)
    for logits, value in cases(width):
        assert matches(blp.bernoulli_log_prob, logits, value), (logits.shape, value.shape)
        assert matches(ops.bernoulli_log_prob, logits, value)
    logits, value = cases(width)[2]
    assert not matches(lambda a, v: blp.in_c(a, v.roll(1, dims=1)), logits, value)


def test_a_nan_stays_in_its_row(monkeypatch):
    monkeypatch.setattr(blp, "MIN_ELEMENTS", 1)
    logits = torch.randn(4, 300, generator=gen(0))
    logits[2, 17] = float("nan")
    out = blp.in_c(logits, torch.ones(300))
    assert out[2].isnan() and not out[[0, 1, 3]].isnan().any()


def test_cases_the_c_pass_leaves_to_torch():
    """None (the caller's torch form) for inputs that autograd must differentiate, float64, too few terms, and an
    operand whose rows do not repeat with a period along the output's rows (ops then answers with torch's form, which
    autograd differentiates); either operand may repeat."""
    a = torch.randn(50, 784, generator=gen(1))
    x = (torch.rand(50, 784, generator=gen(2)) < 0.3).float()
    assert blp.in_c(a, x) is not None
    grad_a = a.clone().requires_grad_()
    assert blp.in_c(grad_a, x) is None
    with torch.no_grad():
        assert blp.in_c(grad_a, x) is not None
    assert blp.in_c(a.double(), x.double()) is None
    assert blp.in_c(a[:2, :100], x[:2, :100]) is None
    columns = x[:, :1].expand(50, 784)  # stride 0 in the last dimension: not rows that repeat
    assert blp.in_c(a, columns) is None
    per_block = x[:3].unsqueeze(1)  # [3, 1, 784] against logits [3, 50, 784]: each row repeated 50 times, in place
    assert blp.in_c(a.expand(3, 50, 784).contiguous(), per_block) is None
    assert matches(blp.bernoulli_log_prob, a[0], x)  # one row of logits for every row of x: period 1, it applies
    assert matches(blp.bernoulli_log_prob, a, x.unsqueeze(0).expand(3, 50, 784))  # logits repeat with period 50
    loss = ops.bernoulli_log_prob(grad_a, x).sum()
    loss.backward()
    assert torch.allclose(grad_a.grad, x - torch.sigmoid(a))


def test_the_bound_through_the_c_pass_equals_the_bound_through_torch(monkeypatch):
    """IWAE(200) of an SBN-200 on binary images, per example, with the C pass (the default here) and with torch's form
    (threshold above every call): the same samples, so equal to float32 rounding; the C pass pairing each row with the
    next example's (its repeated rows shifted by one) fails the comparison."""
    from nvil.models.inference import LayeredInference
    from nvil.models.sbn import SBN

    torch.manual_seed(0)
    model, inference = SBN(784, [200]), LayeredInference(784, [200])
    with torch.no_grad():
        for p in list(model.parameters()) + list(inference.parameters()):
            p.normal_(0, 0.3)
    x = (torch.rand(30, 784, generator=gen(3)) < 0.2).float()

    def bound(data):
        return importance_sampled_bound(model, inference, data, 200, generator=gen(4), batch_size=10,
                                        max_elements=2**18)

    periodic_rows = blp.periodic_rows

    def shifted(t, shape):
        rows = periodic_rows(t, shape)
        return rows if rows is None or rows.shape[0] < 2 else rows.roll(1, dims=0)

    with torch.no_grad():
        fast = bound(x)
        monkeypatch.setattr(blp, "periodic_rows", shifted)
        broken = bound(x)
        monkeypatch.setattr(blp, "MIN_ELEMENTS", 2**62)
        slow = bound(x)
    assert torch.allclose(fast, slow, rtol=0, atol=2e-3)
    assert not torch.allclose(broken, slow, rtol=0, atol=2e-3)
