"""nvil: learning and evaluating latent-variable models (NVIL, SAP, MCEM-HMC, AIS, Chib)."""

__version__ = "0.1.0"

from nvil.cpu_kernels import prefer_avx2 as _prefer_avx2

_prefer_avx2()  # before any torch operation: torch's AVX2 kernels on AVX-512 CPUs (nvil/cpu_kernels.py)
