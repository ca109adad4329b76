"""Transition operators for Boltzmann machines, batched over chains: ``step(state, beta, generator)
-> (state, info)``. Gibbs, tempered transitions and parallel tempering share the model's tempered
conditionals; AIS reuses them too."""

from nvil.mcmc.gibbs import BlockGibbs
from nvil.mcmc.parallel_tempering import ParallelTempering
from nvil.mcmc.tempered import TemperedTransitions, uniform_betas

__all__ = ["BlockGibbs", "ParallelTempering", "TemperedTransitions", "uniform_betas"]
