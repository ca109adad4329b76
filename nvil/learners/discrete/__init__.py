"""Gradient estimators for discrete latents beyond NVIL, each a learner of the same loop (``learner=NAME``):

| name | estimator | estimates | evaluations of f per example |
|---|---|---|---|
| ``rloo`` | REINFORCE, K samples, leave-one-out baselines (Kool et al. 2019) | ELBO gradient | K |
| ``vimco`` | K-sample bound, leave-one-out signals (Mnih & Rezende 2016) | K-sample bound's gradient | K |
| ``arm`` / ``disarm`` | antithetic pairs (Yin & Zhou 2019; Dong, Mnih & Tucker 2020) | ELBO gradient | layers + 1 |
| ``rebar`` / ``relax`` | relaxation as control variate, tuned online (Tucker et al. 2017; Grathwohl et al. |
|  | 2018) | ELBO gradient | 1 + 2 x layers |
| ``gumbel_st`` | straight-through Gumbel-softmax (Jang et al. 2017) | biased | 1 |

NVIL (``nvil.learners.nvil``) is the baseline they are compared with; ``nvil.learners.diagnostics`` measures every
one's gradient variance and SNR the same way.
"""

from nvil.learners.discrete.antithetic import ARM, DisARM
from nvil.learners.discrete.gumbel import GumbelST
from nvil.learners.discrete.relaxed import REBAR, RELAX
from nvil.learners.discrete.rloo import RLOO
from nvil.learners.discrete.vimco import VIMCO

ESTIMATORS = {"vimco": VIMCO, "rloo": RLOO, "arm": ARM, "disarm": DisARM, "rebar": REBAR, "relax": RELAX,
              "gumbel_st": GumbelST}
