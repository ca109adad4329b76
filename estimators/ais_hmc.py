"""log p(x) for models with continuous latent variables (Gaussian belief nets): AIS from the prior to the
posterior with HMC transitions (Wu, Burda, Salakhutdinov & Grosse 2017), one chain per example x run.

The path tempers the likelihood, f_beta(s) = p(s) p(x | s)^beta, from the normalised prior (beta = 0, Z_0 = 1) to
the unnormalised posterior p(s) p(x | s) (beta = 1, Z_1 = p(x)); the generic loop of ``nvil.estimators.ais`` takes
each weight increment (beta_k - beta_{k-1}) log p(x | s) before the move. Each move is one HMC transition at
beta_k (Neal 2011, Sec. 5.3.2). exp(log w) is unbiased for p(x) (Neal 2001) when the kernel of every move
leaves its f_beta invariant and is chosen independently of the chain it moves, so log p(x) is under-estimated in
expectation (Jensen).

Step sizes (``nvil.estimators.model_paths.pilot_steps``): a pilot AIS run of ``pilot_chains`` chains per example,
each with its own step size multiplied by 1.02 or 0.98 after every move towards an acceptance of ``target_accept``
(Wu et al. 2017, Sec. 5), kept within [1e-4, ``max_step_size``]; per example and beta, the geometric mean over its
pilot chains is the step size every main chain of that example uses at that beta. The pilot chains are then thrown
away: the step sizes depend on x and the pilot's random numbers only, so each main move is a fixed f_beta-invariant
kernel.
Adapting on the main chain itself breaks this: the step size of move k is set from the acceptance of move k - 1,
which depends on the state move k starts from. On a linear-Gaussian net (2 latents, 5 visibles, sigma 0.5;
1,000 sigmoid betas, 10 leapfrog steps, 600 examples x 16 chains) such chains average exp(log w) / p(x) =
1.072 +- 0.004 and their per-example log-mean-exp sits 0.066 +- 0.003 nats above log p(x), a "lower bound" above
the truth; with 3 leapfrog steps the error changes sign (0.906 +- 0.003). With pilot step sizes the average is
1.000 +- 0.004 (tests/test_ais_hmc_unbiased.py). ``adapt=false``: every move uses the constant ``step_size``,
and no pilot runs.

The estimator is ``ModelAIS`` (``nvil.estimators.ais_per_example``), the AIS every model of the protocol gets,
seeing the net through ``ContinuousLatent``; its path is ``nvil.estimators.model_paths.ModelPath`` with the prior as
its base; the net declares ``closed_form_gradient``, so its leapfrog steps use ``GaussianNet.posterior``
instead of autograd (``nvil.backend.registry``). The sampler runs in the auxiliary form by default (the state is
eps, the prior is N(0, I)); ``form=centred`` runs on z. Both estimate the same p(x).
"""

from __future__ import annotations

import torch

from nvil.core.errors import ConfigError
from nvil.estimators.ais_per_example import ModelAIS
from nvil.estimators.model_paths import (  # noqa: F401  (the names this estimator's docstring and tests use)
    CONTINUOUS_HINT,
    MAX_STEP_SIZE,
    ContinuousLatent,
    ais_hmc_log_w,
    fixed_kernel_path,
)
from nvil.models.gaussian import FORMS
from nvil.models.protocol import ProtocolModel


class AISHMC(ModelAIS):
    """``estimator=ais_hmc``: AIS with HMC moves from the prior to the posterior of a Gaussian net (Wu et al. 2017).

    ``ModelAIS`` from the prior on a Gaussian net in the sampler's ``form`` (``ContinuousLatent``), ``num_runs``
    chains per example, their weights averaged (log-mean-exp); the IWAE comparison and the BDMC check are off by
    default (``estimator=bdmc`` runs BDMC on these nets). The path tempers the likelihood, f_beta(s) = p(s) p(x |
    s)^beta; each move is one HMC transition at beta_k with step sizes fixed in advance by a pilot run, so
    exp(log w) is unbiased for p(x) (the module docstring). Defaults: configs/estimator/ais_hmc.yaml.

    Parameters
    ----------
    num_betas : int, default 1000
        Steps on the ladder ``schedule`` (K).
    schedule : str, default "sigmoid"
        sigmoid | linear | paper.
    num_runs : int, default 16
        Chains per example, their weights averaged.
    num_leapfrog : int, default 10
        Leapfrog steps per HMC move (L).
    step_size : float, default 0.05
        The initial step size of the pilot run (with ``adapt=False``, the step size throughout).
    target_accept : float, default 0.65
        The acceptance rate the pilot chains adapt their step sizes towards.
    max_step_size : float or None, default MAX_STEP_SIZE
        The clamp on the pilot's step sizes (None: no clamp).
    adapt : bool, default True
        Fix the step sizes by a pilot run of ``pilot_chains`` chains per example, whose per-example geometric
        means the main chains use (``nvil.estimators.model_paths.pilot_steps``); False: ``step_size``
        throughout, and no pilot runs.
    pilot_chains : int, default 2
        Pilot chains per example.
    form : str, default "auxiliary"
        auxiliary (the state is eps) | centred (the state is z); both estimate the same p(x).
    batch_size : int, default 100
        Examples per batch (chains = batch_size x num_runs).
    accel : str, default "none"
        none | compile (the tempered log density compiled) | cudagraphs (CUDA only).
    min_example_ess : float or None, default None
        The per-example ESS below which the certificate fails, as ``PerExample`` (None: max(1.5, 0.2 num_runs)).

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``form`` is not auxiliary or centred, or another setting is out of range (as in ``ModelAIS``).

    Examples
    --------
    >>> from nvil.models import GaussianBeliefNet
    >>> from nvil.estimators import AISHMC
    >>> net = GaussianBeliefNet(6, [2])
    >>> x, z = net.sample(5)
    >>> est = AISHMC(num_betas=20, num_runs=4, num_leapfrog=2)
    >>> result = est.estimate(net, x)
    >>> result.log_p.shape, result.checks
    (torch.Size([5]), ['nonzero_estimates', 'example_ess', 'run_spread'])
    >>> result.extras["form"], result.summary()["num_runs"], 0.0 <= result.extras["accept_rate"] <= 1.0
    ('auxiliary', 4, True)
    """

    name = "ais_hmc"
    runs_name = "num_runs"

    def __init__(self, *, num_betas: int = 1000, schedule: str = "sigmoid", num_runs: int = 16, num_leapfrog: int = 10,
                 step_size: float = 0.05, target_accept: float = 0.65, max_step_size: float | None = MAX_STEP_SIZE,
                 adapt: bool = True, pilot_chains: int = 2, form: str = "auxiliary", batch_size: int = 100,
                 accel: str = "none", min_example_ess: float | None = None) -> None:
        super().__init__(num_betas=num_betas, schedule=schedule, num_chains=num_runs, start="prior",
                         batch_size=batch_size, num_leapfrog=num_leapfrog, step_size=step_size,
                         target_accept=target_accept, max_step_size=max_step_size, adapt=adapt,
                         pilot_chains=pilot_chains, iwae_samples=0, num_simulated=0, reverse=False, accel=accel,
                         min_example_ess=min_example_ess)
        if form not in FORMS:
            raise ConfigError(f"estimator.form must be one of {list(FORMS)}, got {form!r}")
        self.form = form

    def latent_model(self, model, inference=None) -> ProtocolModel:
        """The Gaussian net seen through the protocol in the sampler's ``form`` (``ContinuousLatent``).

        Parameters
        ----------
        model : torch.nn.Module
            A Gaussian net (model=gbn or dbn_dynamic).
        inference : torch.nn.Module or None, default None
            Not used (every estimator is handed it).

        Returns
        -------
        ProtocolModel
            The net's latents as a continuous protocol model, its prior the base.

        Raises
        ------
        nvil.core.errors.ConfigError
            If ``model`` has no continuous latents (raised by ``ContinuousLatent``, naming the estimators to use).
        """
        return ProtocolModel(ContinuousLatent(model, self.name, self.form), "the Gaussian net")

    def check(self, model, inference=None) -> None:
        """Refuse, before any work starts, a model that is not a Gaussian net.

        Parameters
        ----------
        model : torch.nn.Module
            The model to be scored.
        inference : torch.nn.Module or None, default None
            Not used.

        Raises
        ------
        nvil.core.errors.ConfigError
            If ``model`` has no continuous latents (``latent_model``).
        """
        self.latent_model(model)

    def settings(self, pm: ProtocolModel | None = None) -> dict:
        """The estimator's settings and HMC diagnostics for the result's ``extras``.

        Parameters
        ----------
        pm : ProtocolModel or None, default None
            Not used (the net's latents are continuous).

        Returns
        -------
        dict
            ``num_betas``, ``schedule``, ``num_leapfrog``, ``form``, ``adapt``, ``pilot_chains``, ``max_step_size``;
            once batches have run, ``accept_rate`` and ``step_size_q10_q50_q90`` (quantiles of the last move's step
            sizes over the chains).
        """
        s = self.path_settings
        out = {"num_betas": self.num_betas, "schedule": self.schedule, "num_leapfrog": s["num_leapfrog"],
               "form": self.form, "adapt": s["adapt"], "pilot_chains": self.pilot_chains,
               "max_step_size": s["max_step_size"]}
        if self.accept:
            accept, steps = torch.cat(self.accept), torch.cat(self.final_steps)
            q = torch.quantile(steps.double(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
            out.update({"accept_rate": round(accept.mean().item(), 4), "step_size_q10_q50_q90": [round(v, 5) for v in q]})
        return out
