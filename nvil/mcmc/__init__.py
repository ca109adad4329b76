"""Transition operators, batched over chains, all speaking one protocol (``nvil.mcmc.base.Kernel``):
``init(x, generator) -> state``, ``step(state, beta, generator) -> (state, info)``, ``reverse()``.

- Boltzmann machines: ``BlockGibbs`` (the model's tempered conditionals), ``TemperedTransitions``,
  ``ParallelTempering``; AIS runs ``BlockGibbs`` on its intermediate distributions.
- Binary latents: ``SequentialGibbs`` (single-site, with the transition probabilities the Chib-style estimator
  needs: ``ChibKernel``).
- Continuous latents: ``HMC``, ``MetropolisHastings`` (a ``ChibKernel`` too), dual-averaging step sizes in
  ``adapt``.
"""

from nvil.mcmc.base import ChibKernel, Kernel
from nvil.mcmc.gibbs import BlockGibbs
from nvil.mcmc.parallel_tempering import ParallelTempering
from nvil.mcmc.tempered import TemperedTransitions, uniform_betas

__all__ = ["BlockGibbs", "ChibKernel", "Kernel", "ParallelTempering", "TemperedTransitions", "uniform_betas"]
