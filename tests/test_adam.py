"""The learners' Adam (``nvil.learners.adam``): its C step (``nvil/native/adam.h``) against Adam in float64, over
several groups, an input-major weight, replaced gradients and a checkpoint's state; the cases it leaves to torch; and
an NVIL run with it against the same run with torch's step. The comparison has a broken variant that must fail it."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import make_cfg, tiny_model
from nvil.learners.adam import Adam
from nvil.learners.nvil import NVIL

SHAPES = [(20, 30), (20,), (30, 20), (30,), (5, 30), (5,)]  # (3, 7) below is stored input-major
LRS = (1e-2, 2e-3, 5e-2)


pytestmark = pytest.mark.usefixtures("native_kernels")


def parameters(dtype=torch.float32) -> list[torch.nn.Parameter]:
    """The same values in either precision (drawn in float32)."""
    g = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(*s, generator=g).to(dtype)) for s in SHAPES]
    transposed = torch.randn(7, 3, generator=g).to(dtype).t()  # a [3, 7] weight stored input-major
    return ps + [torch.nn.Parameter(transposed)]


def groups(ps) -> list[dict]:
    return [{"params": ps[:2], "lr": LRS[0]}, {"params": ps[2:4], "lr": LRS[1]}, {"params": ps[4:], "lr": LRS[2]}]


def native_adam(ps, **kw) -> Adam:
    opt = Adam(groups(ps), lr=1e-3, betas=kw.pop("betas", (0.9, 0.999)), **kw)
    opt.accelerate("auto", "cpu")
    assert opt.native
    return opt


def gradients(step: int, ps) -> list[torch.Tensor]:
    """Gradients of mixed sizes (1e-4 to 10) and signs, a new draw each step; in each parameter's layout."""
    g = torch.Generator().manual_seed(100 + step)
    out = []
    for p in ps:
        scale = 10.0 ** torch.randint(-4, 2, p.shape, generator=g)
        out.append(torch.empty_like(p).copy_(torch.randn(p.shape, generator=g) * scale))
    return out


def run(opt, ps, steps: range, reset_step: bool = False, fresh_grads: bool = False) -> None:
    for t in steps:
        for p, grad in zip(ps, gradients(t, ps)):
            if p.grad is None or fresh_grads:
                p.grad = grad.to(p.dtype)
            else:
                p.grad.copy_(grad)
        if reset_step:  # broken: every step taken as the first (no bias correction after step 1)
            for p in ps:
                if opt.state[p]:
                    opt.state[p]["step"].zero_()
        opt.step()


def close_to_float64(ps32, opt32, ps64, opt64) -> bool:
    """Parameters, exp_avg and exp_avg_sq within float32 rounding of Adam in float64: 1e-5 of each entry's scale
    (float32's unit roundoff is 6e-8; 40 steps add up to a few hundred of them), the scale of exp_avg its RMS
    gradient sqrt(exp_avg_sq) (an average of gradients of both signs may cancel far below its terms)."""
    for p32, p64 in zip(ps32, ps64):
        s32, s64 = opt32.state[p32], opt64.state[p64]
        rms = s64["exp_avg_sq"].sqrt()
        for a, b, scale in ((p32, p64, p64.abs() + 1e-3), (s32["exp_avg"], s64["exp_avg"], rms),
                            (s32["exp_avg_sq"], s64["exp_avg_sq"], s64["exp_avg_sq"])):
            if not bool(((a.double() - b).abs() <= 1e-5 * scale).all()):
                return False
    return True


@pytest.mark.parametrize("fresh_grads", [False, True], ids=["same buffers", "new gradients"])
def test_the_c_step_is_adam(fresh_grads):
    """40 steps over three groups with their own rates, an input-major weight among them: the C step within float32
    rounding of torch's Adam in float64, its step counts those of torch; with the gradients written into the same
    buffers (the hand-derived path) or new tensors each step (autograd's). A step count held at 1 fails it."""
    ps32, ps64 = parameters(), parameters(torch.float64)
    opt32, opt64 = native_adam(ps32), torch.optim.Adam(groups(ps64), lr=1e-3)
    run(opt32, ps32, range(40), fresh_grads=fresh_grads)
    run(opt64, ps64, range(40))
    assert ps32[-1].stride() == (1, 3)  # still input-major
    assert all(opt32.state[p]["step"].item() == 40 for p in ps32)
    assert close_to_float64(ps32, opt32, ps64, opt64)

    broken32, broken64 = parameters(), parameters(torch.float64)
    opt_b, opt_64 = native_adam(broken32), torch.optim.Adam(groups(broken64), lr=1e-3)
    run(opt_b, broken32, range(40), reset_step=True)
    run(opt_64, broken64, range(40))
    assert not close_to_float64(broken32, opt_b, broken64, opt_64)


def test_the_c_step_does_not_depend_on_the_threads(monkeypatch):
    """Each OpenMP thread takes a share of every tensor (threads.h): one thread and three give the same bits."""
    from nvil.native import adam as native_adam_module
    results = []
    for threads in (1, 3):
        monkeypatch.setattr(native_adam_module, "threads_for", lambda n, per, t=threads: t)
        ps = parameters()
        run(native_adam(ps), ps, range(5))
        results.append(ps)
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_the_c_step_equals_torchs_fused_step_to_rounding():
    """Against torch's own float32 fused step: the same arithmetic, so within a few float32 roundings."""
    ps_c, ps_t = parameters(), parameters()
    opt_c, opt_t = native_adam(ps_c), torch.optim.Adam(groups(ps_t), lr=1e-3, fused=True)
    run(opt_c, ps_c, range(20))
    run(opt_t, ps_t, range(20))
    for a, b in zip(ps_c, ps_t):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_a_checkpoints_state_continues_on_either_path():
    """The state dict is torch's: 10 C steps, then the state into torch's Adam (and torch's into the C step, its
    exp_avg contiguous where the parameter is input-major), 10 more each way: the same parameters."""
    ps_a, ps_b = parameters(), parameters()
    opt_a = native_adam(ps_a)
    run(opt_a, ps_a, range(10))
    with torch.no_grad():
        for a, b in zip(ps_a, ps_b):
            b.copy_(a)
    opt_b = torch.optim.Adam(groups(ps_b), lr=1e-3, fused=True)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    run(opt_a, ps_a, range(10, 20))
    run(opt_b, ps_b, range(10, 20))
    for a, b in zip(ps_a, ps_b):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)

    state = copy.deepcopy(opt_b.state_dict())
    last = state["state"][len(ps_b) - 1]
    last["exp_avg"], last["exp_avg_sq"] = last["exp_avg"].contiguous(), last["exp_avg_sq"].contiguous()
    ps_c = parameters()
    with torch.no_grad():
        for b, c in zip(ps_b, ps_c):
            c.copy_(b)
    opt_c = native_adam(ps_c)
    opt_c.load_state_dict(state)
    run(opt_c, ps_c, range(20, 30))
    run(opt_b, ps_b, range(20, 30))
    for b, c in zip(ps_b, ps_c):
        torch.testing.assert_close(c, b, rtol=1e-6, atol=1e-6)
    assert opt_c.state[ps_c[-1]]["exp_avg"].stride() == ps_c[-1].stride()


@pytest.mark.parametrize("case", ["float64", "weight_decay", "amsgrad", "maximize", "accel none", "deep copy"])
def test_what_the_c_step_leaves_to_torch(case):
    """float64 parameters, weight decay, AMSGrad and maximize take torch's step (bit for bit torch's); so does
    ``trainer.accel=none``; a deep copy keeps the choice."""
    dtype = torch.float64 if case == "float64" else torch.float32
    ps, ref = parameters(dtype), parameters(dtype)
    kw = {"weight_decay": {"weight_decay": 0.1}, "amsgrad": {"amsgrad": True},
          "maximize": {"maximize": True}}.get(case, {})
    opt = Adam(groups(ps), lr=1e-3, betas=(0.9, 0.999))
    opt.accelerate("none" if case == "accel none" else "auto", "cpu")
    for group in opt.param_groups:
        group.update(kw)
    if case == "deep copy":
        assert copy.deepcopy(opt).native
        return
    assert opt.native == (case != "accel none")
    run(opt, ps, range(5))
    torch_opt = torch.optim.Adam(groups(ref), lr=1e-3, fused=True, **kw)
    run(torch_opt, ref, range(5))
    for a, b in zip(ps, ref):
        assert torch.equal(a, b)
    assert opt._plan is None and (opt._plan_key is None) == (case == "accel none")  # asked once, then torch's


def test_nvil_with_the_c_step_takes_torchs_updates():
    """The default job's learner (NVIL, Adam, float32) with trainer.accel=auto against accel=none (torch's step), on
    the same draws: the same parameters after 30 updates, to float32 rounding over the steps."""
    cfg = make_cfg(overrides=["learner.lr=0.003"]).learner
    learners = []
    for mode in ("auto", "none"):
        model, inference = tiny_model(n_visible=12, layers=(6, 4))
        learner = NVIL(model.float(), inference.float(), cfg, "cpu", 0)
        learner.accelerate(mode, "cpu")
        learners.append(learner)
    assert learners[0].optimizer.native and not learners[1].optimizer.native
    x = (torch.rand(30, 16, 12, generator=torch.Generator().manual_seed(0)) < 0.4).float()
    for t in range(30):
        for learner in learners:
            learner.step(x[t], diagnostics=t % 10 == 0)
    fast, slow = (dict(learner.named_parameters()) for learner in learners)
    for name in slow:
        torch.testing.assert_close(fast[name], slow[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("mode, native", [("none", False), ("auto", True), ("compile", True)])
def test_every_accel_path_of_a_learner_reaches_its_optimiser(mode, native):
    """``trainer.accel`` through the learner (the fused path's compiled branch returns before the autograd path's
    ``accelerate``): the C step with auto and compile, torch's with none."""
    model, inference = tiny_model(n_visible=12, layers=(6, 4))
    learner = NVIL(model.float(), inference.float(), make_cfg().learner, "cpu", 0)
    learner.accelerate(mode, "cpu")
    assert learner.optimizer.native == native
