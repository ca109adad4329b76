"""Deep Boltzmann machines (nvil.models.dbm, nvil.learners.dbm, estimator=dbm_bound) against exact answers on
machines small enough to enumerate every joint state (v, h_1, ..., h_L):

- the model's identities: log Z, log p(v), log p*(v, h_even) (``log_joint``, ``latent_density``) and the energy
  equal brute-force sums written here from the definition E = -sum_l h_{l-1}' W_l h_l - b'v - sum_l c_l' h_l, for
  two, three and four hidden layers; the blocks of ``top.W`` between layers that are not neighbours stay zero;
- one block-Gibbs sweep of ``top`` (odd layers | even, even | odd) leaves the exact p(v, h) invariant, by its
  closed-form transition matrix and by a chi-square test of the sampler itself; a sweep with one wrong
  conditional fails both;
- mean field: the fixed point is a stationary point and the best maximum of -E(v, mu) + H(mu) that L-BFGS finds
  from random starts; the bound is below log p(v) by exactly KL(q || p(h | v)); one sweep is not stationary;
- ``sap_gradient`` with the mean-field positive phase and exact model statistics is the autograd gradient of
  mean_v bound(v) - log Z (also through the converged mean-field iterations), and is not at an unconverged mu;
- estimators: AIS's certified log Z (and a too-short ladder refused), dbm_bound below exact, chib and
  ais_posterior within 3 SE of exact where the bound is not, exact equal to enumeration;
- learner=dbm_sap: pretraining then the joint phase, exact resumes (inside pretraining, at the boundary between
  two pretrained RBMs, at the start of the joint phase, inside it), and training raises the exact
  log-likelihood of data from a known DBM while the reversed gradient lowers it;
- bad input refused in one line.

Every expected value is computed here by enumeration, in float64; statistical checks use fixed seeds.
"""

from __future__ import annotations

import inspect
import io
import math

import pytest
import torch
from scipy.stats import chi2

import nvil.learners.dbm as dbm_learner
from nvil.core.errors import ConfigError
from nvil.core.ops import enumerate_states
from nvil.estimators import AIS, AISPosterior, Chib, DBMBound, Exact
from nvil.estimators.exact import exact_log_marginal
from nvil.learners.dbm import DBMSAP, sap_gradient
from nvil.mcmc import BlockGibbs
from nvil.models.dbm import DBM
from nvil.models.rbm import BoltzmannMachine, State

DT = torch.float64
# the per-example estimators and AIS run partly in float32 kernels and round log Z to 4 decimals in their extras
ROUNDING = 1e-3


# ---- tiny machines and brute force ---------------------------------------------------------------------------


def all_states(n: int) -> torch.Tensor:
    return enumerate_states(n, 0, 2**n, dtype=DT)


def make_dbm(n_visible: int, sizes: list[int], seed: int, w_scale: float = 1.0, b_scale: float = 0.5):
    """A float64 DBM with W_l ~ N(0, w_scale^2), biases ~ N(0, b_scale^2), written through ``weight(l)`` and
    ``bias(l)`` after ``top.W`` was filled everywhere (the non-neighbour blocks too) and ``constrain_``-ed.
    Returns (dbm, [W_1..W_L], [b, c_1..c_L]): the parameters of the definition, kept apart from the machine."""
    g = torch.Generator().manual_seed(seed)
    widths = [n_visible, *sizes]
    Ws = [w_scale * torch.randn(widths[l - 1], widths[l], generator=g, dtype=DT) for l in range(1, len(widths))]
    bs = [b_scale * torch.randn(n, generator=g, dtype=DT) for n in widths]
    dbm = DBM(n_visible, sizes).to(DT)
    with torch.no_grad():
        dbm.top.W.normal_(0.0, w_scale, generator=g)
        dbm.constrain_()
        for l, W in enumerate(Ws, start=1):
            dbm.weight(l).copy_(W)
        for l, b in enumerate(bs):
            dbm.bias(l).copy_(b)
    return dbm, Ws, bs


def brute_energy(Ws, bs, hs) -> torch.Tensor:
    """E(h_0, ..., h_L) from the definition, states (or means) of every layer, v first."""
    e = -(hs[0] * bs[0]).sum(-1)
    for l in range(1, len(hs)):
        e = e - ((hs[l - 1] @ Ws[l - 1]) * hs[l]).sum(-1) - (hs[l] * bs[l]).sum(-1)
    return e


def split_xy(x: torch.Tensor, y: torch.Tensor, widths: list[int]) -> list[torch.Tensor]:
    """Layers v, h_1, ..., h_L from x = [v, h_2, h_4, ...] and y = [h_1, h_3, ...]."""
    hs, ox, oy = [], 0, 0
    for l, n in enumerate(widths):
        if l % 2 == 0:
            hs.append(x[..., ox:ox + n])
            ox += n
        else:
            hs.append(y[..., oy:oy + n])
            oy += n
    return hs


class Brute:
    """-E over every (x, y) state, x = [v, h_even] and y = h_odd in ``enumerate_states`` order, and what follows
    from it: log Z, p(x, y), log p*(x) = log sum_y exp(-E), log p(v)."""

    def __init__(self, widths, Ws, bs) -> None:
        self.widths = widths
        nx, ny = sum(widths[0::2]), sum(widths[1::2])
        self.X, self.Y = all_states(nx), all_states(ny)
        xx = self.X[:, None, :].expand(-1, len(self.Y), -1)
        yy = self.Y[None, :, :].expand(len(self.X), -1, -1)
        self.neg_e = -brute_energy(Ws, bs, split_xy(xx, yy, widths))  # [2^nx, 2^ny]
        self.log_z = torch.logsumexp(self.neg_e.flatten(), 0)
        self.log_pi = self.neg_e - self.log_z
        self.log_p_star_x = torch.logsumexp(self.neg_e, 1)
        self.V = all_states(widths[0])
        self.log_p_v = self.log_p_star_x.view(len(self.V), -1).logsumexp(1) - self.log_z

    def sample_v(self, n: int, seed: int) -> torch.Tensor:
        """n exact draws of v from p(v)."""
        g = torch.Generator().manual_seed(seed)
        return self.V[torch.multinomial(self.log_p_v.exp(), n, replacement=True, generator=g)]


CONFIGS = {"2-layers": (7, [5, 4], 0), "3-layers": (6, [4, 3, 3], 1), "4-layers": (4, [3, 2, 3, 2], 2)}


@pytest.fixture(scope="module", params=list(CONFIGS), ids=list(CONFIGS))
def machine(request):
    n_visible, sizes, seed = CONFIGS[request.param]
    dbm, Ws, bs = make_dbm(n_visible, sizes, seed)
    return dbm, Ws, bs, Brute([n_visible, *sizes], Ws, bs)



def exact_log_p(dbm: DBM, v: torch.Tensor, log_z=None) -> torch.Tensor:
    """log p(v) by enumeration: the even hidden layers summed (``exact_log_marginal``), log Z of ``dbm.top``."""
    return exact_log_marginal(dbm, v) - (dbm.log_z_exact(grad=True) if log_z is None else log_z)

# ---- 1. the model's identities against brute force ---------------------------------------------------------


def test_log_z_log_p_and_log_joint_equal_enumeration(machine):
    dbm, Ws, bs, brute = machine
    nv = dbm.n_visible
    with torch.no_grad():
        assert abs(dbm.log_z_exact().item() - brute.log_z.item()) < 1e-10
        torch.testing.assert_close(exact_log_p(dbm, brute.V), brute.log_p_v, rtol=0, atol=1e-10)
        assert abs(brute.log_p_v.exp().sum().item() - 1) < 1e-12  # the reference itself is normalised
        v, h_even = brute.X[:, :nv], brute.X[:, nv:]
        assert dbm.layers == brute.widths[2::2] and dbm.n_latent == h_even.shape[1]
        torch.testing.assert_close(dbm.log_joint(v, [h_even]), brute.log_p_star_x, rtol=0, atol=1e-10)
        torch.testing.assert_close(dbm.latent_density(v).log_prob(h_even), brute.log_p_star_x, rtol=0, atol=1e-10)
        torch.testing.assert_close(dbm.join(v, h_even), brute.X, rtol=0, atol=0)
        # the energy of states and of fractional means, layer by layer
        g = torch.Generator().manual_seed(0)
        hs = [torch.rand(50, n, generator=g, dtype=DT) for n in brute.widths]
        hs = [torch.where(torch.arange(50)[:, None] < 25, (h < 0.5).to(DT), h) for h in hs]
        torch.testing.assert_close(dbm.energy(hs), brute_energy(Ws, bs, hs), rtol=0, atol=1e-12)
        for l, W in enumerate(Ws, start=1):
            assert torch.equal(dbm.weight(l), W) and torch.equal(dbm.bias(l), bs[l])
        assert torch.equal(dbm.bias(0), bs[0])
        result = Exact().estimate(dbm, brute.V)
        torch.testing.assert_close(result.log_p.to(DT), brute.log_p_v, rtol=0, atol=1e-9)
        assert abs(result.extras["log_z"] - brute.log_z.item()) < 1e-4 and result.certified is True


def test_blocks_of_layers_that_are_not_neighbours_are_zero(machine):
    dbm, Ws, bs, brute = machine
    widths = brute.widths
    expected = torch.zeros_like(dbm.mask)
    for l in range(1, len(widths)):
        rows, cols = dbm.block(l)
        assert (rows.stop - rows.start, cols.stop - cols.start) == ((widths[l - 1], widths[l]) if l % 2
                                                                    else (widths[l], widths[l - 1]))
        expected[rows, cols] = 1.0
    assert torch.equal(dbm.mask, expected)
    assert dbm.mask.sum().item() == sum(widths[l - 1] * widths[l] for l in range(1, len(widths)))
    if len(widths) > 3:  # v and h_3 share no block: filled at random before constrain_, zero after it
        assert (dbm.mask == 0).any()
    assert torch.equal(dbm.top.W * (1 - dbm.mask), torch.zeros_like(dbm.top.W))
    assert torch.count_nonzero(dbm.top.W).item() == dbm.mask.sum().item()


# ---- 2. block Gibbs leaves p(v, h) invariant ---------------------------------------------------------------


def log_bernoulli(p: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """[rows of p, states]: log prod_j p_j^s_j (1 - p_j)^(1 - s_j)."""
    return states @ torch.log(p).T + (1 - states) @ torch.log1p(-p).T  # [states, rows]


def sweep_matrix(dbm: DBM, X: torch.Tensor, Y: torch.Tensor, beta_odd: float = 1.0) -> torch.Tensor:
    """T[(x', y'), (x, y)] of one sweep y' ~ p(y' | x) (odd layers at inverse temperature ``beta_odd``), then
    x' ~ p(x' | y'), from the machine's conditionals."""
    top = dbm.top
    log_y_given_x = log_bernoulli(top.h_given_x(X, beta_odd), Y).T  # [x, y']
    log_x_given_y = log_bernoulli(torch.sigmoid(top.b + Y @ top.W.T), X)  # [x', y']
    nX, nY = len(X), len(Y)
    log_t = log_x_given_y[:, :, None, None] + log_y_given_x.T[None, :, :, None]  # [x', y', x, 1]
    return log_t.expand(nX, nY, nX, nY).reshape(nX * nY, nX * nY).exp()


@pytest.mark.parametrize("n_visible, sizes", [(3, [3, 2]), (2, [2, 2, 2])], ids=["2-layers", "3-layers"])
def test_sweep_transition_matrix_leaves_the_joint_invariant(n_visible, sizes):
    dbm, Ws, bs = make_dbm(n_visible, sizes, seed=3)
    brute = Brute([n_visible, *sizes], Ws, bs)
    pi = brute.log_pi.exp().flatten()
    with torch.no_grad():
        T = sweep_matrix(dbm, brute.X, brute.Y)
        torch.testing.assert_close(T.sum(0), torch.ones_like(pi), rtol=0, atol=1e-12)
        torch.testing.assert_close(T @ pi, pi, rtol=0, atol=1e-10)
        wrong = sweep_matrix(dbm, brute.X, brute.Y, beta_odd=0.5)  # one conditional at the wrong temperature
        torch.testing.assert_close(wrong.sum(0), torch.ones_like(pi), rtol=0, atol=1e-12)
        assert (wrong @ pi - pi).abs().max().item() > 1e-3


def pearson(samples: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson chi-square of binary rows against the probabilities of all 2^k states (enumerate_states order)."""
    k = samples.shape[1]
    codes = (samples * 2 ** torch.arange(k - 1, -1, -1, dtype=DT)).sum(1).long()
    observed = torch.bincount(codes, minlength=2**k).to(DT)
    expected = samples.shape[0] * probs
    assert expected.min().item() > 5, expected.min().item()
    return ((observed - expected) ** 2 / expected).sum().item(), 2**k - 1


def test_block_gibbs_sweep_samples_leave_the_joint_invariant():
    """Chains started at exact draws of (x, y) are still exact draws after one ``BlockGibbs`` step of ``top``; the
    same sweep with the odd layers drawn at beta = 0.5 is rejected by the same statistic."""
    dbm, Ws, bs = make_dbm(2, [2, 2], seed=4, w_scale=0.6, b_scale=0.3)  # x: 4 units, y: 2 -> 64 joint states
    brute = Brute([2, 2, 2], Ws, bs)
    pi = brute.log_pi.exp().flatten()
    n, nY = 40000, len(brute.Y)
    g = torch.Generator().manual_seed(5)
    idx = torch.multinomial(pi, n, replacement=True, generator=g)
    start = State(brute.X[idx // nY], brute.Y[idx % nY])
    top = dbm.top
    with torch.no_grad():
        new, _ = BlockGibbs(top).step(start, 1.0, g)
        y_wrong = top.sample_h(start.x, 0.5, g)
        wrong = State(top.sample_x_given_h(y_wrong, 1.0, g), y_wrong)
    limit = chi2.ppf(0.999, len(pi) - 1)
    stat, _ = pearson(torch.cat([new.x, new.h], 1), pi)
    assert stat < limit, (stat, limit)
    stat, _ = pearson(torch.cat([wrong.x, wrong.h], 1), pi)
    assert stat > 3 * limit, (stat, limit)


# ---- 3. mean field -------------------------------------------------------------------------------------------


def objective_grad(dbm: DBM, v: torch.Tensor, mus: list[torch.Tensor]) -> list[torch.Tensor]:
    """d/d mu_l of -E(v, mu) + H(mu), by autograd."""
    leaves = [m.detach().clone().requires_grad_() for m in mus[1:]]
    f = dbm.variational_bound(v, [v, *leaves]).sum()
    return list(torch.autograd.grad(f, leaves))


@pytest.mark.parametrize("n_visible, sizes, seed", [CONFIGS["2-layers"], CONFIGS["3-layers"]],
                         ids=["2-layers", "3-layers"])
def test_mean_field_fixed_point_is_the_maximum_of_the_variational_objective(n_visible, sizes, seed):
    dbm, Ws, bs = make_dbm(n_visible, sizes, seed)
    V = all_states(n_visible)
    with torch.no_grad():
        fixed = dbm.mean_field(V, max_iter=1000, tol=1e-13)
        default = dbm.mean_field(V)
        one_sweep = dbm.mean_field(V, max_iter=1)
    grads = objective_grad(dbm, V, fixed)
    assert max(gr.abs().max().item() for gr in grads) < 1e-9
    # the default stopping rule (no mean moves by 1e-7): the gradient in the logits, mu (1 - mu) d/d mu, ~tol
    default_logit_grads = [gr * mu * (1 - mu) for gr, mu in zip(objective_grad(dbm, V, default), default[1:])]
    assert max(gr.abs().max().item() for gr in default_logit_grads) < 1e-6
    # one sweep from the bottom-up start is not stationary
    assert max(gr.abs().max().item() for gr in objective_grad(dbm, V, one_sweep)) > 1e-2
    with torch.no_grad():
        f_fixed = dbm.variational_bound(V, fixed)
        assert (dbm.variational_bound(V, one_sweep) <= f_fixed + 1e-12).all()
        torch.testing.assert_close(f_fixed, dbm.variational_bound(V), rtol=0, atol=1e-6)  # mus=None: its own
    # L-BFGS on the logits of mu from random starts, for a subset of v (the objective is separable over rows)
    rows = V[torch.randperm(len(V), generator=torch.Generator().manual_seed(6))[:12]]
    with torch.no_grad():
        f_rows = dbm.variational_bound(rows, dbm.mean_field(rows, max_iter=1000, tol=1e-13))
    g = torch.Generator().manual_seed(7)
    best = torch.full_like(f_rows, -math.inf)
    for _ in range(4):
        logits = [(3 * torch.randn(len(rows), n, generator=g, dtype=DT)).requires_grad_() for n in sizes]
        opt = torch.optim.LBFGS(logits, max_iter=100, tolerance_grad=1e-10, tolerance_change=1e-14,
                                line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = -dbm.variational_bound(rows, [rows, *[torch.sigmoid(a) for a in logits]]).sum()
            loss.backward()
            return loss

        opt.step(closure)
        with torch.no_grad():
            best = torch.maximum(best, dbm.variational_bound(rows, [rows, *[torch.sigmoid(a) for a in logits]]))
    # nothing above the fixed point, which the search itself reaches from some start for every row
    torch.testing.assert_close(best, f_rows, rtol=0, atol=1e-6)
    with torch.no_grad():  # and the comparison has power: one sweep's mu falls short of the best by more
        f_one_sweep = dbm.variational_bound(rows, dbm.mean_field(rows, max_iter=1))
    assert (best - f_one_sweep).max().item() > 1e-3


LEARNER = {name: p.default for name, p in inspect.signature(DBMSAP).parameters.items()}


def sweeps_taken(dbm: DBM, v: torch.Tensor, max_iter: int, tol: float, omega: float):
    """(sweeps, means) of ``DBM.mean_field``."""
    mus, sweeps = dbm.mean_field(v, max_iter, tol, omega=omega, return_sweeps=True)
    return sweeps, mus


@pytest.mark.parametrize("sizes", [[60, 50], [60, 50, 40]], ids=["2-layers", "3-layers"])
def test_over_relaxed_mean_field_reaches_the_plain_fixed_point_in_fewer_sweeps(sizes):
    """omega = 1.3 run to convergence gives the plain update's fixed point in at most 60% of its sweeps, omega = auto
    (Young's rule) in fewer than the plain update's; at the
    learner's defaults (tol 1e-3) the bound is within 1e-5 nats of the fixed point's for every row, which one sweep,
    the variant that stops too early, is not; a large omega falls back to the plain update and still converges."""
    dbm, _, _ = make_dbm(80, sizes, 3, w_scale=0.3)
    v = (torch.rand(50, 80, generator=torch.Generator().manual_seed(1)) < 0.3).to(DT)
    with torch.no_grad():
        n_plain, plain = sweeps_taken(dbm, v, 5000, 1e-10, 1.0)
        n_over, over = sweeps_taken(dbm, v, 5000, 1e-10, 1.3)
        assert n_over <= 0.6 * n_plain, (n_over, n_plain)
        assert max((a - b).abs().max().item() for a, b in zip(plain[1:], over[1:])) < 1e-8
        f_fixed = dbm.variational_bound(v, plain)
        n_default, default = sweeps_taken(dbm, v, LEARNER["mean_field_iters"], LEARNER["mean_field_tol"],
                                          LEARNER["mean_field_omega"])
        assert (f_fixed - dbm.variational_bound(v, default)).abs().max().item() < 1e-5
        assert n_default < n_plain / 3
        assert (f_fixed - dbm.variational_bound(v, dbm.mean_field(v, 1))).max().item() > 1e-3
        n_auto, auto = sweeps_taken(dbm, v, 5000, 1e-10, "auto")
        assert n_auto < n_plain, (n_auto, n_plain)
        assert max((a - b).abs().max().item() for a, b in zip(plain[1:], auto[1:])) < 1e-8
        _, wild = sweeps_taken(dbm, v, 5000, 1e-10, 1.95)
        assert max((a - b).abs().max().item() for a, b in zip(plain[1:], wild[1:])) < 1e-8
    with pytest.raises(ValueError, match="omega"):
        dbm.mean_field(v, omega=2.0)


def test_variational_bound_is_below_log_p_by_the_kl_of_q(machine):
    """log p(v) - (bound(v) - log Z) = KL(q || p(h | v)) >= 0, q the product of Bernoulli(mu) over every hidden
    layer, with both sides enumerated."""
    dbm, Ws, bs, brute = machine
    widths = brute.widths
    V = brute.V
    with torch.no_grad():
        mus = dbm.mean_field(V, max_iter=1000, tol=1e-13)
        bound = dbm.variational_bound(V, mus) - brute.log_z
        gap = brute.log_p_v - bound
        assert (gap >= -1e-12).all()
        H = all_states(sum(widths[1:]))
        hs = list(torch.split(H, widths[1:], -1))
        log_q = sum(log_bernoulli(mu, h).T for mu, h in zip(mus[1:], hs))  # [v, h]
        neg_e = -brute_energy(Ws, bs, [V[:, None, :]] + [h[None] for h in hs])  # [v, h]
        log_post = neg_e - torch.logsumexp(neg_e, 1, keepdim=True)
        kl = (log_q.exp() * (log_q - log_post)).sum(1)
        torch.testing.assert_close(gap, kl, rtol=0, atol=1e-9)
        assert gap.max().item() > 1e-2  # the bound is not tight: the identity has content


def test_recognition_is_the_mean_field_marginal_of_the_even_layers(machine):
    """Q(h_even | v) of the per-example estimators: the product of Bernoulli(mu_2, mu_4, ...) at the fixed point,
    normalised, its ``latent_density`` equal to its ``log_prob``, its draws distributed as Q."""
    dbm, Ws, bs, brute = machine
    q = dbm.recognition()
    x = brute.V[:: max(1, len(brute.V) // 6)]
    H = all_states(dbm.n_latent)
    X, HH = x.repeat_interleave(len(H), 0), H.repeat(len(x), 1)
    with torch.no_grad():
        mu_even = torch.cat(dbm.mean_field(x)[2::2], -1)
        torch.testing.assert_close(torch.sigmoid(q.logits(x)), mu_even, rtol=0, atol=1e-12)
        log_q = q.log_prob([HH], X)
        torch.testing.assert_close(log_q, log_bernoulli(mu_even, H).T.flatten(), rtol=0, atol=1e-9)
        torch.testing.assert_close(q.latent_density(X).log_prob(HH), log_q, rtol=0, atol=1e-9)
        torch.testing.assert_close(log_q.view(len(x), -1).logsumexp(1), torch.zeros(len(x), dtype=DT), rtol=0,
                                   atol=1e-12)
        hs, log_qs = q.sample(x.repeat(4000, 1), torch.Generator().manual_seed(8))
        torch.testing.assert_close(log_qs[0], q.log_prob(hs, x.repeat(4000, 1)), rtol=0, atol=1e-9)
        freq = hs[0].view(4000, len(x), -1).mean(0)
    assert (freq - mu_even).abs().max().item() < 5 * 0.5 / math.sqrt(4000)


# ---- 4. the SAP gradient ----------------------------------------------------------------------------------


def exact_negative_statistics(dbm: DBM, brute: Brute) -> dict[str, torch.Tensor]:
    """E_model[x y'], E[x], E[y] by enumeration of every (x, y)."""
    p = brute.log_pi.exp()  # [x, y]
    return {"W": brute.X.T @ p @ brute.Y, "b": p.sum(1) @ brute.X, "c": p.sum(0) @ brute.Y}


def sap_with_exact_negatives(dbm: DBM, brute: Brute, x_pos, y_pos) -> dict[str, torch.Tensor]:
    """``sap_gradient`` with the model's exact statistics as its negative rows: every (x, y) state, the rows of
    one side weighted by N p(x, y) (rows are averaged, so the weighted side's average is the expectation). W and b
    come from x weighted, c from y weighted; W must agree between the two."""
    p = brute.log_pi.exp().flatten()
    nY = len(brute.Y)
    X = brute.X.repeat_interleave(nY, 0)
    Y = brute.Y.repeat(len(brute.X), 1)
    w = (len(p) * p)[:, None]
    with torch.no_grad():
        by_x = sap_gradient(dbm, x_pos, y_pos, X * w, Y)
        by_y = sap_gradient(dbm, x_pos, y_pos, X, Y * w)
    torch.testing.assert_close(by_x["W"], by_y["W"], rtol=0, atol=1e-12)
    return {"W": by_x["W"], "b": by_x["b"], "c": by_y["c"]}


def autograd_gradient(dbm: DBM, v: torch.Tensor, mus: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """d/dtheta of mean_v [-E(v, mu) + H(mu)] - log Z for top's W (masked), b, c."""
    top = dbm.top
    objective = dbm.variational_bound(v, mus).mean() - dbm.log_z_exact(grad=True)
    gW, gb, gc = torch.autograd.grad(objective, [top.W, top.b, top.c])
    return {"W": gW * dbm.mask, "b": gb, "c": gc}


@pytest.mark.parametrize("n_visible, sizes, seed", [(5, [4, 3], 8), (4, [3, 3, 2], 9)], ids=["2-layers", "3-layers"])
def test_sap_gradient_with_exact_negatives_is_the_gradient_of_the_bound(n_visible, sizes, seed):
    dbm, Ws, bs = make_dbm(n_visible, sizes, seed)
    brute = Brute([n_visible, *sizes], Ws, bs)
    v = brute.sample_v(30, seed=10)
    # the model's statistics, as the learner forms them: x = [v, mu_even], y = mu_odd
    neg = exact_negative_statistics(dbm, brute)
    fixed = dbm.mean_field(v, max_iter=1000, tol=1e-13)
    with torch.no_grad():
        x_pos, y_pos = dbm.join(v, torch.cat(fixed[2::2], -1)), torch.cat(fixed[1::2], -1)
        sap = sap_with_exact_negatives(dbm, brute, x_pos, y_pos)
    pos = {"W": x_pos.T @ y_pos / len(v), "b": x_pos.mean(0), "c": y_pos.mean(0)}
    for name in ("W", "b", "c"):  # the definition, term by term
        expected = (pos[name] - neg[name]) * (dbm.mask if name == "W" else 1)
        torch.testing.assert_close(sap[name], expected, rtol=0, atol=1e-12, msg=name)
    detached = autograd_gradient(dbm, v, [m.detach() for m in fixed])
    through = autograd_gradient(dbm, v, fixed)  # through every mean-field iteration: equal at the fixed point
    for name in ("W", "b", "c"):
        torch.testing.assert_close(sap[name], detached[name], rtol=0, atol=1e-10, msg=name)
        torch.testing.assert_close(sap[name], through[name], rtol=0, atol=1e-8, msg=name)
    assert torch.equal(sap["W"] * (1 - dbm.mask), torch.zeros_like(sap["W"]))
    # at one sweep's unconverged mu the partial derivative is not the total one
    early = dbm.mean_field(v, max_iter=1)
    with torch.no_grad():
        x_e, y_e = dbm.join(v, torch.cat(early[2::2], -1)), torch.cat(early[1::2], -1)
        sap_early = sap_with_exact_negatives(dbm, brute, x_e, y_e)
    through_early = autograd_gradient(dbm, v, early)
    gap = max((sap_early[k] - through_early[k]).abs().max().item() for k in ("W", "b", "c"))
    assert gap > 1e-3, gap
    # at the learner's stopping rule (over-relaxed by Young's rule, tol 1e-3) the partial derivative is the total one to 3e-4
    learned = dbm.mean_field(v, LEARNER["mean_field_iters"], LEARNER["mean_field_tol"],
                             omega=LEARNER["mean_field_omega"])
    with torch.no_grad():
        x_l, y_l = dbm.join(v, torch.cat(learned[2::2], -1)), torch.cat(learned[1::2], -1)
        sap_learned = sap_with_exact_negatives(dbm, brute, x_l, y_l)
    through_learned = autograd_gradient(dbm, v, learned)
    gap = max((sap_learned[k] - through_learned[k]).abs().max().item() for k in ("W", "b", "c"))
    assert gap < 3e-4, gap


# ---- 5. estimators against exact answers -------------------------------------------------------------------

LOG_Z = {"num_chains": 100, "num_betas": 1000, "num_climb": 16, "num_data_probes": 200}


@pytest.fixture(scope="module")
def scored():
    """A 2-layer machine, 150 exact draws of v, and exact log p(v) of each."""
    dbm, Ws, bs = make_dbm(*CONFIGS["2-layers"])
    brute = Brute([7, 5, 4], Ws, bs)
    x = brute.sample_v(150, seed=11)
    with torch.no_grad():
        exact = exact_log_p(dbm, x, brute.log_z)
    return dbm, brute, x, exact


def within(result, exact: torch.Tensor, k: float = 3.0) -> tuple[bool, float, float]:
    """Whether the mean over rows of (estimate - exact) is within k standard errors (the per-example spread over
    the rows, and the shared log Z's) plus rounding; returns (ok, mean difference, its SE)."""
    diff = result.log_p.to(DT) - exact
    se = math.sqrt(diff.var().item() / len(diff) + result.shared_stderr**2)
    return abs(diff.mean().item()) < k * se + ROUNDING, diff.mean().item(), se


def test_ais_log_z_of_a_dbm_is_certified_and_agrees_with_enumeration(scored):
    dbm, brute, x, exact = scored
    with torch.no_grad():
        result = AIS(num_chains=100, num_betas=1000, num_climb=16, num_data_probes=200).estimate(dbm, x, train=x)
    log_z, se = result.extras["log_z"], result.shared_stderr
    assert se < 0.02
    assert abs(log_z - brute.log_z.item()) < 3 * se + ROUNDING, (log_z, brute.log_z.item(), se)
    assert result.certified is True and result.failed == [], result.warnings
    with torch.no_grad():  # per example, estimator=ais on a DBM reports the mean-field bound
        bound = dbm.variational_bound(x) - log_z
    torch.testing.assert_close(result.log_p.to(DT), bound, rtol=0, atol=ROUNDING)
    assert "log_p_is" in result.extras


def test_ais_log_z_on_a_too_short_ladder_is_not_certified():
    """Strong weights (N(0, 2.5^2)): 2 betas are refused, 1,000 on the same machine are certified and right."""
    dbm, _, _ = make_dbm(8, [6, 5], seed=12, w_scale=2.5)
    x = (torch.rand(100, 8, generator=torch.Generator().manual_seed(13)) < 0.5).to(DT)
    with torch.no_grad():
        log_z = dbm.log_z_exact().item()
        short = AIS(num_chains=50, num_betas=2, num_climb=16, num_data_probes=100).estimate(dbm, x, train=x)
        long = AIS(num_chains=50, num_betas=1000, num_climb=16, num_data_probes=100).estimate(dbm, x, train=x)
    assert short.certified is False and short.failed and short.warnings, short.summary()
    assert long.certified is True, long.warnings
    assert abs(long.extras["log_z"] - log_z) < 3 * long.shared_stderr + ROUNDING


def test_per_example_estimators_against_exact_log_p(scored, tmp_path):
    dbm, brute, x, exact = scored
    checkpoint = tmp_path / "dbm.pt"  # the shared log Z is cached beside it: computed once, then reused
    with torch.no_grad():
        bound = DBMBound(log_z=LOG_Z).estimate(dbm, x, train=x, checkpoint=checkpoint)
        chib = Chib(num_steps=10, num_runs=10, accel="none", log_z=LOG_Z).estimate(dbm, x, train=x,
                                                                                   checkpoint=checkpoint)
        ais = AISPosterior(num_betas=50, num_runs=10, accel="none", log_z=LOG_Z).estimate(dbm, x, train=x,
                                                                                          checkpoint=checkpoint)
    assert [r.extras["log_z_cached"] for r in (bound, chib, ais)] == [False, True, True]
    log_z = bound.extras["log_z"]
    assert chib.extras["log_z"] == log_z == ais.extras["log_z"]
    assert abs(log_z - brute.log_z.item()) < 3 * bound.shared_stderr + ROUNDING
    for r in (bound, chib, ais):
        assert r.certified is True, (r.estimator, r.warnings)
    # the bound, with exact log Z, is below exact log p(v) for every row; with the estimated log Z on average
    with torch.no_grad():
        assert (dbm.variational_bound(x) - brute.log_z <= exact + 1e-12).all()
    torch.testing.assert_close(bound.log_p.to(DT), (dbm.variational_bound(x) - bound.extras["log_z"]).detach(),
                               rtol=0, atol=ROUNDING)
    assert bound.mean <= exact.mean().item() + 3 * bound.shared_stderr + ROUNDING
    for r in (chib, ais):
        ok, diff, se = within(r, exact)
        assert ok, (r.estimator, diff, se)
        assert r.mean >= bound.mean - 3 * r.stderr
    ok, diff, se = within(bound, exact)  # the same check has power: it refuses the bound
    assert not ok and diff < -10 * se, (diff, se)


# ---- 6. the learner -------------------------------------------------------------------------------------------


def learner(dbm: DBM, **overrides) -> DBMSAP:
    settings = dict(pretrain_steps=4, pretrain_lr=0.05, lr=0.02, lr_decay=1.001, lr_min=0.001, momentum_switch=3,
                    num_particles=20, k=2, seed=3)
    settings.update(overrides)
    return DBMSAP(dbm, None, **settings)


def minibatch(data: torch.Tensor, i: int, size: int = 10) -> torch.Tensor:
    s0 = (i * size) % len(data)
    return data[s0:s0 + size]


def checkpoint(dbm: DBM, learner_: DBMSAP) -> dict:
    """The model's and the learner's state through torch.save / torch.load, as a checkpoint carries them."""
    buffer = io.BytesIO()
    torch.save({"model": dbm.state_dict(), "learner": learner_.learner_state()}, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


RESUMES = [
    pytest.param([4, 3], [4, 4], 2, id="2-layers-inside-rbm1"),
    pytest.param([4, 3], [4, 4], 4, id="2-layers-rbm1-to-rbm2"),
    pytest.param([4, 3], [4, 4], 6, id="2-layers-inside-rbm2"),
    pytest.param([4, 3], [4, 4], 8, id="2-layers-joint-start"),
    pytest.param([4, 3], [4, 4], 11, id="2-layers-inside-joint"),
    pytest.param([4, 3, 3], [3, 3, 3], 4, id="3-layers-inside-rbm2"),
    pytest.param([4, 3, 3], [3, 3, 3], 6, id="3-layers-rbm2-to-rbm3"),
    pytest.param([4, 3, 3], [3, 3, 3], 9, id="3-layers-joint-start"),
    pytest.param([4, 3, 3], [0, 3, 3], 2, id="3-layers-rbm1-given-no-updates"),
]


@pytest.mark.parametrize("sizes, pretrain_steps, stop", RESUMES)
def test_dbm_sap_resumes_exactly(sizes, pretrain_steps, stop):
    data = (torch.rand(40, 6, generator=torch.Generator().manual_seed(14)) < 0.4).to(DT)
    total = sum(pretrain_steps) + 5

    def fresh():
        torch.manual_seed(15)
        return DBM(6, sizes).to(DT)

    dbm = fresh()
    straight = learner(dbm, pretrain_steps=pretrain_steps)
    for i in range(stop):
        straight.step(minibatch(data, i))
    saved = checkpoint(dbm, straight)
    for i in range(stop, total):
        straight.step(minibatch(data, i))
    assert straight.updates == total and straight.joint_updates == 5

    dbm2 = fresh()
    dbm2.load_state_dict(saved["model"])
    resumed = learner(dbm2, pretrain_steps=pretrain_steps)
    resumed.load_learner_state(saved["learner"])
    for i in range(stop, total):
        resumed.step(minibatch(data, i))
    for (name, p), q in zip(dbm.named_parameters(), dbm2.parameters()):
        assert torch.equal(p, q), name
    assert torch.equal(straight.phase.chains.x, resumed.phase.chains.x)
    assert torch.equal(straight.generator.get_state(), resumed.generator.get_state())
    assert torch.equal(dbm.top.W * (1 - dbm.mask), torch.zeros_like(dbm.top.W))  # still no non-neighbour weights
    # the run changed the machine: its weights moved from the initial ones in every layer, biases composed
    start = fresh()
    for l in range(1, len(sizes) + 1):
        assert not torch.allclose(dbm.weight(l), start.weight(l))


def exact_mean_log_lik(dbm: DBM, data: torch.Tensor) -> float:
    with torch.no_grad():
        return exact_log_p(dbm, data).mean().item()


def test_dbm_sap_raises_the_exact_log_likelihood_and_the_reversed_gradient_does_not(monkeypatch):
    """Data from a DBM with strong weights, which an independent-pixels model fits ~0.45 nats worse: pretraining then
    the joint phase, and the joint phase alone, beat that model; the joint phase improves on the composed
    pretrained machine; the same learner with the joint gradient's sign flipped lowers the likelihood."""
    teacher, Ws, bs = make_dbm(6, [4, 3], seed=16, w_scale=2.5, b_scale=0.3)
    data = Brute([6, 4, 3], Ws, bs).sample_v(200, seed=17)
    p = data.mean(0)
    independent = (data * torch.log(p) + (1 - data) * torch.log1p(-p)).sum(1).mean().item()
    assert exact_mean_log_lik(teacher, data) > independent + 0.3  # the data have structure to learn

    def train(pretrain_steps: int, joint_steps: int) -> tuple[float, float, float]:
        """(exact mean log p(data) at the start, after pretraining, at the end)."""
        torch.manual_seed(18)
        student = DBM(6, [4, 3]).to(DT)
        before = exact_mean_log_lik(student, data)
        fit = learner(student, pretrain_steps=pretrain_steps, lr=0.05, lr_decay=1.0, momentum_switch=20,
                      num_particles=50, k=3)
        for i in range(2 * pretrain_steps):
            fit.step(minibatch(data, i, 20))
        composed = exact_mean_log_lik(student, data) if pretrain_steps else before
        for i in range(2 * pretrain_steps, 2 * pretrain_steps + joint_steps):
            fit.step(minibatch(data, i, 20))
        assert fit.joint_updates == joint_steps
        return before, composed, exact_mean_log_lik(student, data)

    before, composed, after = train(pretrain_steps=100, joint_steps=200)
    assert after > independent + 0.2, (before, composed, after, independent)
    assert after > composed + 0.3, (composed, after)
    before, _, joint_only = train(pretrain_steps=0, joint_steps=200)
    assert joint_only > independent + 0.2, (before, joint_only, independent)
    ascent = sap_gradient

    def descent(*args):
        return {k: -v for k, v in ascent(*args).items()}

    monkeypatch.setattr(dbm_learner, "sap_gradient", descent)
    before, _, wrong = train(pretrain_steps=0, joint_steps=200)
    assert wrong < before, (before, wrong)


# ---- 7. bad input --------------------------------------------------------------------------------------------


def test_bad_input_is_refused_in_one_line():
    with pytest.raises(ValueError, match="at least two hidden layers"):
        DBM(6, [5])
    dbm = DBM(6, [5, 4])
    with pytest.raises(ConfigError, match="pretrain_steps") as err:
        DBMSAP(dbm, None, pretrain_steps=[1])
    assert "\n" not in str(err.value)
    rbm = BoltzmannMachine(6, 4)
    with pytest.raises(ConfigError, match="dbm_bound") as err:
        DBMBound().check(rbm, None)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="model=dbm") as err:
        DBMSAP(rbm, None)
    assert "\n" not in str(err.value)
    DBMBound().check(dbm, None)  # a DBM passes
