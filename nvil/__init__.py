"""nvil: learning and evaluating latent-variable models (NVIL, SAP, MCEM-HMC, AIS, Chib)."""

__version__ = "0.1.0"
