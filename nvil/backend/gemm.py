"""Dense products of float32 CPU matrices through oneDNN where torch's MKL leaves the AVX-512 units idle.

torch multiplies float32 CPU matrices with MKL's sgemm. MKL runs its AVX-512 kernels on Intel CPUs only: on an AMD
CPU with AVX-512 (Zen 4, Zen 5) it takes its AVX2 code, half the vector width. oneDNN, which torch also ships
(``torch.ops.mkldnn._linear_pointwise``, the op Inductor uses for frozen linear layers), dispatches on the
instruction sets alone, and on such a CPU runs the AIS and Gibbs products of an RBM about twice as fast
(``python bench/gemm.py``); at NVIL's batch of 20 with weights that change every step oneDNN's per-call weight
reorder eats the gain.

So ``backend()`` is ``"onednn"`` where the CPU is AMD's with AVX-512 and torch has oneDNN, else ``"aten"`` (torch's
own product, MKL on x86), unless the environment variable ``NVIL_GEMM`` says ``onednn`` or ``aten``. ``matmul``,
``linear``, ``addmm`` and ``addmm_`` take oneDNN for float32 CPU products of at least ``MIN_MACS`` multiply-adds outside
autograd (an input that requires grad under grad mode takes torch's product, which autograd differentiates), and
torch's product otherwise: the same values up to float32 rounding (tests/test_gemm.py). Under ``torch.compile`` the
oneDNN call is an opaque operator of the graph (``nvil::onednn_linear``: Inductor's own lowering of the oneDNN op
requires a constant weight).

Products with few rows (NVIL's decoders at batch 20) stay with torch: a register-blocked kernel for them did not
pay and is not kept (docs/benchmarks.md, "Fast paths kept and removed"). The routing to oneDNN is kept for the
workloads where it pays, block Gibbs, tempered transitions and SAP's gradient on RBMs (``nvil.backend.registry``,
entry ``onednn_products``, with the measured gains).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from nvil.backend.accel import opaque_when_compiled
from nvil.backend.cpu_kernels import cpu_flags
from nvil.core.errors import ConfigError

VARIABLE = "NVIL_GEMM"
BACKENDS = ("auto", "onednn", "aten")
MIN_MACS = 1 << 22  # ~4.2 M multiply-adds: [100, 784] x [784, 500] has 39 M; near 1 M the call overhead wins


def cpu_vendor() -> str:
    """The CPU's vendor string from /proc/cpuinfo ("AuthenticAMD", "GenuineIntel"; "" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("vendor_id")), "")
    except OSError:
        return ""
    return line.partition(":")[2].strip()


def backend() -> str:
    """"onednn" or "aten": ``NVIL_GEMM`` where set, else oneDNN on an AMD CPU with AVX-512 (where MKL runs AVX2).
    Chosen on the first product (``choose_backend``; importing the package reads neither the environment nor the
    CPU), then fixed, so a compiled graph reads it as a constant."""
    return _backend if _backend is not None else choose_backend(strict=False)


def choose_backend(strict: bool = True) -> str:
    """Read ``NVIL_GEMM`` and the CPU and set ``backend()``: on the first product (``strict=False``: a bad value
    leaves torch's product, for ``train.py`` / ``evaluate.py`` to report), where they start (``nvil.app.cli.run_task``:
    a bad value is a one-line ConfigError), and in tests that change the variable."""
    global _backend
    choice = os.environ.get(VARIABLE, "auto").lower()
    if not strict and choice not in BACKENDS:
        _backend = _backend or "aten"
        return _backend
    if choice not in BACKENDS:
        raise ConfigError(f"{VARIABLE}={choice!r} is not one of {', '.join(BACKENDS)}")
    available = torch.backends.mkldnn.is_available()
    if choice == "onednn" and not available:
        raise ConfigError(f"{VARIABLE}=onednn but this torch build has no oneDNN")
    if choice == "auto":
        amd_avx512 = cpu_vendor() == "AuthenticAMD" and "avx512f" in cpu_flags()
        choice = "onednn" if available and amd_avx512 else "aten"
    _backend = choice
    return choice


_backend: str | None = None  # not chosen yet


def _takes_onednn(a: torch.Tensor, b: torch.Tensor, n: int) -> bool:
    """Whether the product of a [..., k] and the 2-D b with n output columns goes to oneDNN: the backend chosen, at
    least ``MIN_MACS`` multiply-adds, float32 CPU tensors, no autograd through them. The cheapest tests first: every
    product of a step asks."""
    return (backend() == "onednn" and a.numel() * n >= MIN_MACS and a.dim() >= 2 and b.dim() == 2
            and a.dtype == torch.float32 and b.dtype == torch.float32 and a.device.type == "cpu"
            and not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)))


@opaque_when_compiled("nvil::onednn_linear", lambda x, weight, bias: x.new_empty(*x.shape[:-1], weight.shape[0]))
def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x weight' + bias by oneDNN (``torch.ops.mkldnn._linear_pointwise``), x [..., in], weight [out, in] (any
    strides), bias [out] or None; under ``torch.compile`` an opaque operator (``nvil.backend.accel.opaque_when_compiled``)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@opaque_when_compiled("nvil::onednn_linear_add", lambda x, other, weight: torch.empty_like(other))
def onednn_linear_add(x: torch.Tensor, other: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """other + x weight' by oneDNN (its binary post-op "add", out of place); compiled as ``onednn_linear``."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, other, weight, None, "add")


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for a [..., k] and b [k, n]."""
    return onednn_linear(a, b.t(), None) if _takes_onednn(a, b, b.shape[-1]) else a @ b


def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """bias + alpha a b for bias [n] or [m, n] (or broadcastable to the product), a [..., k] ([m, k]), b [k, n]:
    ``torch.addmm`` (into ``out`` where given and torch's product runs; oneDNN writes a new matrix)."""
    if _takes_onednn(a, b, b.shape[-1]):
        if bias.dim() == 1:
            a, b = _scaled(a, b, alpha)
            return onednn_linear(a, b.t(), bias)
        if a.dim() == 2 and bias.shape == (a.shape[0], b.shape[1]):
            a, b = _scaled(a, b, alpha)
            return onednn_linear_add(a, bias, b.t())
    if a.dim() != 2:
        return bias + (a @ b if alpha == 1 else alpha * (a @ b))
    return torch.addmm(bias, a, b, alpha=alpha) if out is None else torch.addmm(bias, a, b, alpha=alpha, out=out)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x weight' + bias for weight [out, in]: ``F.linear``."""
    return onednn_linear(x, weight, bias) if _takes_onednn(x, weight, weight.shape[0]) else F.linear(x, weight, bias)


def addmm_(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0, beta: float = 1.0
           ) -> torch.Tensor:
    """out = beta out + alpha a b in place, beta 1 or 0 (a weight's SGD step written by the product that computes
    its gradient; a gradient into its buffer): oneDNN writes the result into a new matrix, copied back (one more
    pass over ``out``; still faster than MKL's in-place product on an RBM's weight, ``bench/gemm.py``).
    Returns ``out``."""
    if beta not in (0, 1):
        raise ValueError(f"addmm_ takes beta 0 or 1, got {beta}")
    if not _takes_onednn(a, b, b.shape[-1]) or out.requires_grad and torch.is_grad_enabled():
        return out.addmm_(a, b, alpha=alpha, beta=beta)
    a, b = _scaled(a, b, alpha)
    return out.copy_(onednn_linear_add(a, out, b.t()) if beta else onednn_linear(a, b.t(), None))


def _scaled(a: torch.Tensor, b: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) with alpha multiplied into the smaller of the two."""
    if alpha == 1:
        return a, b
    return (a * alpha, b) if a.numel() <= b.numel() else (a, b * alpha)


class Linear(torch.nn.Linear):
    """``nn.Linear`` whose product is ``linear``'s (oneDNN outside autograd where ``backend()`` says so): the SBN's
    and the inference network's layers, so the evaluators' K-sample products take it. The same parameters and
    state-dict keys as ``nn.Linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
