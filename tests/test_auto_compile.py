"""``trainer.accel=auto`` compiles the NVIL-family fused step in a long CPU run (``FusedPath.auto_compiles``), and falls
back to the eager step, after one warning, where the compilation fails (``nvil.backend.accel.eager_if_uncompilable``).

No test here compiles for real (``test_accel.py`` checks compiled steps against eager ones): ``torch.compile`` is
replaced by a recorder that hands back the function itself, or by one whose compiled function fails as Inductor
does without a C++ compiler."""

from __future__ import annotations

import warnings

import pytest
import torch

import nvil.backend.accel
from conftest import make_cfg, tiny_model
from nvil.backend.accel import AUTO_COMPILE_STEPS, eager_if_uncompilable
from nvil.app.build import build
from nvil.learners import build_learner
from nvil.learners.nvil import NVIL


def nvil_learner(autoregressive_q: bool = False) -> NVIL:
    model, inference = tiny_model(n_visible=12, layers=(6,), autoregressive_q=autoregressive_q)
    return build_learner(make_cfg().learner, model.float(), inference.float(), "cpu", 0)


def data() -> torch.Tensor:
    return (torch.rand(8, 12, generator=torch.Generator().manual_seed(1)) < 0.4).float()


@pytest.fixture
def compile_calls(monkeypatch) -> list:
    """``torch.compile`` as nvil.backend.accel calls it, recording each call and compiling nothing."""
    calls = []

    def recorder(fn, **kwargs):
        calls.append(fn)
        return fn

    monkeypatch.setattr(nvil.backend.accel.torch, "compile", recorder)
    return calls


@pytest.mark.parametrize("mode, device, steps, autoregressive_q, expected", [
    ("auto", "cpu", AUTO_COMPILE_STEPS, False, True),
    ("auto", "cpu", 50_000, False, True),
    ("auto", "cpu", AUTO_COMPILE_STEPS - 1, False, False),  # too short to repay the compilation
    ("auto", "cpu", None, False, False),                    # length unknown (a bench, a test)
    ("auto", "cuda", 50_000, False, False),                 # CUDA: compile / cudagraphs are the user's choice
    ("auto", "cpu", 50_000, True, False),                   # autoregressive q: the step is not one graph
    ("none", "cpu", 50_000, False, False),
    ("native", "cpu", 50_000, False, False),
])
def test_auto_compiles_a_long_cpu_run_whose_step_is_one_graph(mode, device, steps, autoregressive_q, expected):
    assert nvil_learner(autoregressive_q).auto_compiles(mode, device, steps) is expected


def test_a_long_run_compiles_its_step_and_a_short_one_does_not(compile_calls):
    short, long = nvil_learner(), nvil_learner()
    short.accelerate("auto", "cpu", steps=AUTO_COMPILE_STEPS - 1)
    assert compile_calls == []
    long.accelerate("auto", "cpu", steps=AUTO_COMPILE_STEPS)
    assert len(compile_calls) == 1 and compile_calls[0].__name__ == "fused_step"
    x = data()
    for _ in range(3):  # the recorder's "compiled" step is the eager one: the same updates
        short.step(x), long.step(x)
    for a, b in zip(short.parameters(), long.parameters()):
        assert torch.equal(a, b)


def test_build_passes_the_run_length(compile_calls):
    """The default job's config (50,000 steps) compiles its NVIL step through ``nvil.app.build``; a short run does not."""
    build(make_cfg(overrides=["data=synthetic", "trainer.max_steps=50000"]), torch.device("cpu"))
    assert len(compile_calls) == 1
    build(make_cfg(overrides=["data=synthetic", "trainer.max_steps=1000"]), torch.device("cpu"))
    assert len(compile_calls) == 1


def test_a_failed_compilation_falls_back_to_the_eager_step_with_one_warning(monkeypatch):
    tries = []

    def failing_compile(fn, **kwargs):
        def compiled(*args, **kw):
            tries.append(1)
            raise RuntimeError("InductorError: CppCompileError: C++ compile error\nmore lines of the compiler's output")
        return compiled

    monkeypatch.setattr(nvil.backend.accel.torch, "compile", failing_compile)
    fallen, eager = nvil_learner(), nvil_learner()
    fallen.accelerate("auto", "cpu", steps=AUTO_COMPILE_STEPS)
    eager.accelerate("auto", "cpu")
    x = data()
    with pytest.warns(UserWarning, match=r"trainer.accel=auto could not compile the step \(RuntimeError: "
                                         r"InductorError: CppCompileError: C\+\+ compile error\); it runs eagerly"):
        fallen.step(x)
    eager.step(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, no second try
        for _ in range(2):
            fallen.step(x), eager.step(x)
    assert len(tries) == 1
    for a, b in zip(fallen.parameters(), eager.parameters()):
        assert torch.equal(a, b)


def test_errors_that_are_not_the_compilation_s_are_raised():
    def eager(x):
        raise ValueError("a shape the step does not take")

    def compiled(x):
        raise RuntimeError("compiled: fails too")

    with pytest.warns(UserWarning, match="could not compile"), pytest.raises(ValueError, match="shape"):
        eager_if_uncompilable(compiled, eager, "trainer.accel")(1)  # the eager step's own error surfaces

    calls = []

    def works_once(x):
        calls.append(x)
        if len(calls) > 1:
            raise FloatingPointError("a later failure")
        return x

    step = eager_if_uncompilable(works_once, lambda x: -x, "trainer.accel")
    assert step(3) == 3
    with pytest.raises(FloatingPointError):  # after a first success, nothing falls back
        step(4)
