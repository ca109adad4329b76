"""nvil: learning and evaluating latent-variable models (NVIL, SAP, MCEM-HMC, AIS, Chib)."""

__version__ = "0.1.0"

from nvil.cpu_kernels import choose_kernels as _choose_kernels

_choose_kernels()  # before any torch operation: AVX2 kernels on AVX-512 CPUs, a compile cache per set (cpu_kernels.py)
