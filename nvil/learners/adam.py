"""The learners' Adam: ``torch.optim.Adam`` (fused), whose step on CPU float32 parameters is one C call over all of
them (``nvil.native.adam``) once ``accelerate`` has chosen it."""

from __future__ import annotations

import torch

from nvil import native
from nvil.native.adam import AdamCall


class Adam(torch.optim.Adam):
    """``torch.optim.Adam(..., fused=True)`` with the same state (per parameter ``step``, ``exp_avg``,
    ``exp_avg_sq``), so checkpoints and either path interchange. With ``native`` (``accelerate``: ``trainer.accel``
    auto, native or compile on a CPU where the C kernels build) a step whose parameters qualify is one C call
    (``adam.h``: torch's arithmetic, float32 rounding apart) instead of torch's, whose Python took ~0.3 ms of a 3.4 ms
    NVIL step at batch 20 on a Zen 3 core. It qualifies when no group asks for weight decay, AMSGrad, maximize,
    differentiable or a tensor rate, the groups share betas and eps, and every parameter with a gradient is a float32
    CPU tensor, contiguous or a contiguous transpose (the layout ``nvil.ops.input_major_`` gives a weight; the update
    is elementwise, so any layout its four tensors share will do), with its gradient in its layout; else torch's step
    runs."""

    native = False
    _plan: AdamCall | None = None  # the C call for the parameters, gradients and settings of _plan_key; None: torch's
    _plan_key: tuple | None = None

    def __init__(self, params, lr: float, betas: tuple[float, float]):
        super().__init__(params, lr=lr, betas=betas, fused=True)

    def __getstate__(self) -> dict:
        """torch's (defaults, state, groups) and ``native``, for a deep copy; the call is built again."""
        return {**super().__getstate__(), "native": self.native}

    def accelerate(self, mode: str, device=None) -> None:
        """``trainer.accel``: the C step on a CPU with auto, native or compile (where the kernels build, silently
        torch's step where they do not: the same values); torch's with none."""
        self.native = mode in ("auto", "native", "compile") and native.wanted("auto", device or "cpu")

    def step(self, closure=None):
        if closure is None and self.native and self._native_step():
            return None
        return super().step(closure)

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._plan_key = None  # new state tensors

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        self._plan_key = None

    def _native_step(self) -> bool:
        """The C step over every parameter with a gradient; False (nothing changed) where one does not qualify. What
        qualifies is checked when the parameters, their gradients (new tensors on the autograd path; the same
        buffers on the hand-derived one) or the groups' settings change, not at every step (Python's ~5 us per check
        and tensor would be a tenth of the step)."""
        groups = self.param_groups
        key = (tuple(t.data_ptr() if t is not None else 0 for g in groups for p in g["params"] for t in (p, p.grad)),
               tuple((g["betas"], g["eps"], g["weight_decay"], g["amsgrad"], g["maximize"], g["differentiable"],
                      torch.is_tensor(g["lr"])) for g in groups))
        if key != self._plan_key:
            self._plan, self._plan_key = self._new_plan(), key
        if self._plan is None:
            return False
        self._plan([g["lr"] for g in groups])
        return True

    def _new_plan(self) -> AdamCall | None:
        """The C call over every parameter with a gradient, its state made where it has none (as torch's first step
        makes it) and put in the parameter's layout where a checkpoint's is not; None where one does not qualify."""
        betas, eps = self.param_groups[0]["betas"], self.param_groups[0]["eps"]
        tensors, group_of = [], []
        for k, group in enumerate(self.param_groups):
            if (group["weight_decay"] or group["amsgrad"] or group["maximize"] or group["differentiable"]
                    or torch.is_tensor(group["lr"]) or group["betas"] != betas or group["eps"] != eps):
                return None
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not _qualifies(p, p.grad):
                    return None
                state = self.state[p]
                if not state:
                    state.update(step=torch.zeros((), dtype=torch.float32), exp_avg=torch.zeros_like(p),
                                 exp_avg_sq=torch.zeros_like(p))
                if state["step"].dtype != torch.float32 or state["step"].device.type != "cpu":
                    return None
                for name in ("exp_avg", "exp_avg_sq"):
                    if state[name].stride() != p.stride() or state[name].dtype != torch.float32:
                        state[name] = torch.empty_like(p).copy_(state[name])
                tensors.append((p.detach(), p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"]))
                group_of.append(k)
        return AdamCall(tensors, group_of, float(betas[0]), float(betas[1]), float(eps))


def _qualifies(p: torch.Tensor, g: torch.Tensor) -> bool:
    """A float32 CPU parameter, contiguous or a contiguous transpose, whose dense gradient has its layout."""
    if p.dtype != torch.float32 or p.device.type != "cpu" or g.dtype != torch.float32 or g.is_sparse:
        return False
    stride = p.stride()
    return g.stride() == stride and (p.is_contiguous() or (p.dim() == 2 and stride == (1, p.shape[0])))
