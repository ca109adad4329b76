"""Adam's update as one C call over every parameter (``adam.h``, built into the library of ``nvil.native``): the CPU
step of ``nvil.learners.adam.Adam``."""

from __future__ import annotations

import ctypes

import torch

from nvil.native import _array, library, threads_for

PER_THREAD = 1 << 16  # floats per thread, at least (NVIL's SBN-200, 0.4 M parameters: 2 threads; 1 and 2 took the
                      # same 0.16 ms with the tensors in cache)


class AdamCall:
    """Adam's step in place (``adam.h``) over a fixed set of float32 CPU tensors: per parameter (theta, its gradient,
    exp_avg, exp_avg_sq, its float32 step count), the four in one layout; ``group_of`` each parameter's group,
    whose rate the call takes. The pointer arrays are built once; the tensors are held, so no address in them is
    reused while the call exists."""

    def __init__(self, tensors: list[tuple[torch.Tensor, ...]], group_of: list[int], beta1: float, beta2: float,
                 eps: float):
        self.tensors, self.group_of = tensors, group_of
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        columns = list(zip(*tensors)) or [()] * 5
        self.arrays = [_array(ctypes.c_void_p, [t.data_ptr() for t in ts]) for ts in columns]
        self.numel = _array(ctypes.c_int64, [p.numel() for p in columns[0]])
        self.threads = threads_for(sum(p.numel() for p in columns[0]), PER_THREAD)

    def __call__(self, group_lrs: list[float]) -> None:
        if not self.tensors:
            return
        p, g, m, v, t = self.arrays
        lrs = _array(ctypes.c_double, [float(group_lrs[k]) for k in self.group_of])
        if library().adam_threads_f32(len(self.tensors), p, g, m, v, self.numel, t, lrs, self.beta1, self.beta2,
                                      self.eps, self.threads):
            raise MemoryError("Adam's C step could not allocate its scratch (a few bytes per parameter tensor)")
