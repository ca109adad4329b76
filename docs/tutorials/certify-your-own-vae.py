# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Certify your own VAE
#
# A variational autoencoder is trained on a lower bound, the ELBO, and usually reported with another lower bound,
# the importance-weighted bound of Burda et al. (2016) with K = 5000 samples. How far below log p(x) the bound lies
# is exactly what a bound cannot say. Wu, Burda, Salakhutdinov & Grosse (2017) answered it for decoder-based
# models with annealed importance sampling (AIS) from the prior to the posterior with Hamiltonian Monte Carlo
# moves, and checked the AIS schedule by bidirectional Monte Carlo (BDMC, Grosse et al. 2015) on data simulated
# from the model, where an exact posterior sample is known.
#
# `nvil.evaluate_model` does all of that for a model of your own, written in plain PyTorch, with nothing to
# subclass. This tutorial:
#
# 1. writes the VAE of the PyTorch examples (`pytorch/examples`, `vae/main.py`: 784-400-20, Gaussian latent,
#    Bernoulli decoder, BCE loss) as users write it, and trains it briefly on binarised MNIST;
# 2. adds the five methods of the protocol (`nvil.models.protocol`) in a small subclass;
# 3. scores 20 test images with IWAE (K = 5000) and with certified AIS, and reads the certificate;
# 4. plots AIS on test images and the BDMC sandwich on simulated images against the number of temperatures, the
#    shape of Wu et al.'s figures;
# 5. shows what makes a certificate fail, and the same evaluation from the command line.
#
# The sizes are chosen for a CPU and a couple of minutes: a model trained for three epochs, 20 test images, four
# chains per image. Every file goes to a temporary directory.

# %%
from nvil.backend.cpu_kernels import choose_kernels

choose_kernels()  # before torch's first operation: the CPU kernel set train.py and evaluate.py choose

import math
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Independent, Normal

import nvil
from nvil.core.errors import ConfigError
from nvil.data import mnist_data

torch.set_num_threads(1)  # small batches: one thread is enough
workdir = Path(tempfile.mkdtemp(prefix="nvil-vae-"))

# %% [markdown]
# ## 1. The VAE, as the PyTorch example writes it
#
# The model and loss of `pytorch/examples/vae/main.py`, unchanged: an encoder to the mean and log-variance of
# q(z | x), the reparameterised sample, a decoder to 784 pixel probabilities, and the negative ELBO as binary
# cross-entropy plus the closed-form KL divergence from the standard normal prior.

# %%
class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 400)
        self.fc21 = nn.Linear(400, 20)
        self.fc22 = nn.Linear(400, 20)
        self.fc3 = nn.Linear(20, 400)
        self.fc4 = nn.Linear(400, 784)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 784))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction="sum")
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return BCE + KLD


# %% [markdown]
# ## 2. Train it briefly
#
# `mnist_data()` is what `data=mnist` loads: the pinned MNIST package, binarised once with a fixed seed
# (`binarize="fixed"`), 50,000 / 10,000 / 10,000 images as float tensors of 0s and 1s. Nothing downloads. Three
# epochs of Adam with the example's settings (batch 128, learning rate 1e-3) give a model that is far from
# converged but good enough to evaluate; the example itself runs ten.

# %%
data = mnist_data(binarize="fixed")
x_train, x_test = data.split("train"), data.split("test")

torch.manual_seed(0)
vae = VAE()
optimizer = torch.optim.Adam(vae.parameters(), lr=1e-3)
t0 = time.perf_counter()
for epoch in range(3):
    total = 0.0
    for batch in torch.randperm(x_train.shape[0]).split(128):
        x = x_train[batch]
        recon, mu, logvar = vae(x)
        loss = loss_function(recon, x, mu, logvar)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
    print(f"epoch {epoch + 1}: training loss (negative ELBO) {total / x_train.shape[0]:.2f} nats per image, "
          f"{time.perf_counter() - t0:.0f} s")
torch.save(vae.state_dict(), workdir / "vae.pt")  # what a user has: the class and its weights

# %% [markdown]
# ## 3. The protocol: five methods and one attribute
#
# The estimators need the model's densities, not its training loss: the prior log p(z), the likelihood
# log p(x | z), samplers for both (to simulate data for BDMC) and, optionally, the encoder's q(z | x) as a
# `torch.distributions.Distribution` to start from. A subclass adds them without touching the original class, and
# loads the trained weights unchanged:

# %%
class CertifiableVAE(VAE):
    latent = nvil.Latent.continuous(20)  # z in R^20

    def log_prior(self, z):  # log N(z; 0, I): [N]
        return -0.5 * (z.pow(2) + math.log(2 * math.pi)).sum(-1)

    def log_likelihood(self, x, z):  # log p(x | z), Bernoulli pixels: [N]
        logits = self.fc4(F.relu(self.fc3(z)))
        return -F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(-1)

    def sample_prior(self, n, generator):  # z ~ p(z): [n, 20]
        return torch.randn(n, 20, generator=generator, device=generator.device)

    def sample_likelihood(self, z, generator):  # x ~ p(x | z): [N, 784]
        return torch.bernoulli(self.decode(z), generator=generator)

    def proposal(self, x):  # q(z | x), batch shape [N], event shape [20]
        mu, logvar = self.encode(x)
        return Independent(Normal(mu, torch.exp(0.5 * logvar)), 1)


model = CertifiableVAE()
model.load_state_dict(torch.load(workdir / "vae.pt", weights_only=True))

# %% [markdown]
# Each method returns one value (or one row) per row of its input, and each sampler draws from the
# `torch.Generator` it is given, so a seed fixes every estimate. Two choices matter:
#
# - `log_likelihood` is **normalised in x**: a sum of Bernoulli log-probabilities over the 784 pixels, not a
#   mean, and not a loss with a constant dropped. No check can detect a missing constant; every number would
#   simply be shifted.
# - It works from the decoder's **logits**. The example's `decode` returns probabilities and
#   `F.binary_cross_entropy` clamps their logarithm at -100, which is harmless for training but flat for HMC,
#   which follows the gradient of log p(x | z) in z.
#
# One line checks that the subclass scores the model that was trained: at the encoder's mean, its
# log-likelihood is the example's binary cross-entropy, image by image.

# %%
x_eval = x_test[:20]
with torch.no_grad():
    mu, logvar = model.encode(x_eval)
    bce = F.binary_cross_entropy(model.decode(mu), x_eval, reduction="none").sum(-1)
    print("largest difference, nats:", (model.log_likelihood(x_eval, mu) + bce).abs().max().item())

# %% [markdown]
# ## 4. IWAE with K = 5000
#
# `evaluate_model(model, x, estimator="iwae")` is Burda et al.'s bound
# L_K = log (1/K) sum_k p(x, z_k) / q(z_k | x), with z_k from the proposal. Its expectation lies below log p(x),
# so it carries no certificate (`certified` is None) and says what it is in `bound`:

# %%
iwae = nvil.evaluate_model(model, x_eval, estimator="iwae", num_samples=5000)
print(f"IWAE(5000): {iwae.mean_log_p:.2f} +- {iwae.stderr:.2f} nats over {len(x_eval)} test images, "
      f"{iwae.seconds:.1f} s;  certified = {iwae.certified}")
print("bound:", iwae.extras["bound"])

# %% [markdown]
# ## 5. AIS with its certificate
#
# `estimator="ais"` runs, per test image, `num_chains` AIS chains along
# f_beta(z) = q(z | x)^(1 - beta) p(x, z)^beta from the encoder (beta = 0) to the posterior (beta = 1), one HMC
# transition of 10 leapfrog steps per temperature (Wu et al.'s settings). The step sizes, one per image and
# temperature, come from a pilot run of 2 chains per image that adapt theirs towards 65% acceptance, and are fixed
# before the chains that count start. The chains' averaged weights are unbiased for p(x), so the log is a
# stochastic lower bound too, but one that closes on log p(x) as the temperatures get finer. With it come two
# comparisons: IWAE with `iwae_samples` from the same start, and BDMC at the same settings on `num_simulated`
# images drawn from the model.

# %%
ais = nvil.evaluate_model(model, x_eval, estimator="ais", num_betas=300, num_chains=4, num_simulated=10,
                          iwae_samples=1000, seed=0)
e = ais.extras
print(f"AIS (300 temperatures, 4 chains): {ais.mean_log_p:.2f} +- {ais.stderr:.2f} nats, {ais.seconds:.1f} s "
      f"(with its checks); HMC acceptance {e['accept_rate']:.2f}")
print(f"  above_iwae:  AIS - IWAE(1000) = {e['ais_minus_iwae']:+.3f} +- {e['ais_minus_iwae_stderr']:.3f} nats (paired)")
print(f"  bdmc_gap:    {e['bdmc_gap']:.3f} +- {e['bdmc_gap_stderr']:.3f} nats on {e['num_simulated']} simulated images "
      f"(lower, upper: {e['bdmc_mean_log_p_lower_upper']})")
print(f"  example_ess: min, q10, q50 {e['example_ess_min_q10_q50']} of 4 chains")
print(f"  likelihood_consistency: sampler dependence {e['sampler_dependence_z']}, "
      f"log-likelihood ratio {e['log_likelihood_ratio_z']} (standard errors)")
print(f"checks {ais.checks}\ncertified = {ais.certified}, warnings = {ais.warnings}")

# %% [markdown]
# The standard errors above are over the 20 images, whose log p(x) differ by tens of nats. The comparison that
# matters is paired, image by image, against IWAE with K = 5000:

# %%
diff = ais.log_p - iwae.log_p
print(f"AIS - IWAE(5000), per image: mean {diff.mean():+.3f} nats, standard error "
      f"{diff.std() / math.sqrt(len(diff)):.3f}, range [{diff.min():+.3f}, {diff.max():+.3f}]")

# %% [markdown]
# Both are stochastic lower bounds, so a positive difference says IWAE lies at least that far below log p(x), in
# expectation: the part of the bound's gap that IWAE alone cannot reveal.
#
# The certificate (`ais.checks`, `ais.failed`, `ais.warnings`, `ais.certified`, and the same keys in
# `ais.to_json()`):
#
# | check | passes when | fails on |
# |---|---|---|
# | `nonzero_estimates` | no image is estimated at p(x) = 0 | an image that every chain scores at log p = -inf (a decoder that gives one of its pixels probability exactly 0) |
# | `example_ess` | each image's effective number of chains, (sum w)^2 / sum w^2, is at least max(1.5, 0.2 x chains) | one chain carrying an image's estimate: too few temperatures |
# | `run_spread` | the spread of the test mean over chains, / sqrt(chains), is within the reported standard error | heavy-tailed weights that the standard error understates |
# | `above_iwae` | AIS is not below IWAE(`iwae_samples`) by more than 3 standard errors of the paired difference | an AIS run worse than a cheaper bound: too few temperatures, or HMC that does not move |
# | `bdmc_gap` | on simulated images, reverse AIS (upper) minus forward AIS (lower) is at most `max_gap` (1 nat) on average | a schedule too short to trust on real data |
# | `bdmc_order` | the upper side is not below the lower side by more than 3 standard errors | a bug in the model's samplers or densities, or too few chains |
# | `likelihood_consistency` | where `sample_likelihood(z)` depends on z, so does `log_likelihood(x, z)` | a `log_likelihood` that ignores z or scores another model than the sampler draws from |
#
# `certified` is true when every check that ran passed. BDMC certifies the *schedule* on simulated images: it
# vouches for the real-data estimate only as far as the simulated images resemble the test images, a caveat Wu
# et al. discuss. Here they resemble them only roughly: a model trained for three epochs draws rough digits.

# %%
with torch.no_grad():
    simulated = model.sample_likelihood(model.sample_prior(8, torch.Generator().manual_seed(0)),
                                        torch.Generator().manual_seed(1))
fig, axes = plt.subplots(2, 1, figsize=(9, 3))
for ax, images, title in ((axes[0], x_eval[:8], "test images"),
                          (axes[1], simulated, "simulated: z ~ p(z), x ~ p(x | z), what BDMC scores")):
    ax.imshow(torch.cat(list(images.view(8, 28, 28)), dim=1), cmap="gray")
    ax.set_axis_off()
    ax.set_title(title, fontsize=9)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 6. Against the number of temperatures
#
# Wu et al.'s figures plot the estimates against the number of intermediate distributions. Below, 5 test images
# and 5 simulated ones, from both starts: the prior (`start="prior"`, f_0 = p(z), their path) with ladders of 10
# to 1000 temperatures, and the encoder (`start="proposal"`, the default when the model has a proposal) with
# ladders of 10 to 100 (section 5 ran 300). Each call is one `evaluate_model`, so each point comes with its certificate;
# `iwae_samples=0` leaves out the IWAE comparison, which the plot draws as a line.

# %%
x_few = x_eval[:5]
ladders = {"prior": [10, 30, 100, 1000], "proposal": [10, 30, 100]}
iwae_few = iwae.log_p[:5].mean().item()
print(f"IWAE(5000) on these 5 test images: {iwae_few:.2f}")
sweep = {}
for start, ks in ladders.items():
    for k in ks:
        r = nvil.evaluate_model(model, x_few, estimator="ais", num_betas=k, num_chains=4, start=start,
                                num_simulated=5, iwae_samples=0, seed=0)
        sweep[start, k] = r
        lower, upper = r.extras["bdmc_mean_log_p_lower_upper"]
        print(f"from the {start:8s} {k:5d} temperatures: AIS {r.mean_log_p:8.2f};  BDMC on simulated "
              f"{lower:8.2f} .. {upper:8.2f} (gap {r.extras['bdmc_gap']:6.2f});  {r.seconds:5.1f} s;  "
              f"failed {r.failed or 'none'}")

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
for start, marker, color in (("prior", "o", "C0"), ("proposal", "s", "C1")):
    ks = ladders[start]
    left.plot(ks, [sweep[start, k].mean_log_p for k in ks], marker + "-", color=color, label=f"AIS from the {start}")
    bdmc = [sweep[start, k].extras["bdmc_mean_log_p_lower_upper"] for k in ks]
    right.plot(ks, [b[0] for b in bdmc], marker + "-", color=color, label=f"forward AIS from the {start} (lower)")
    right.plot(ks, [b[1] for b in bdmc], marker + "--", color=color, label=f"reverse AIS to the {start} (upper)")
left.axhline(iwae_few, color="k", lw=1, label="IWAE, K = 5000")
left.set(xscale="log", xlabel="temperatures", ylabel="mean log p(x), nats", title="5 test images")
right.set(xscale="log", xlabel="temperatures", title="BDMC on 5 simulated images")
left.legend(fontsize=8)
right.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# From the prior, short ladders lie far below IWAE on the test images, and on simulated images the two sides of
# BDMC lie tens of nats apart; the certificate fails (`bdmc_gap`, and `example_ess` where one chain carries an
# image), and the printed `failed` lists say so. As the ladder lengthens both sides close on log p(x), and the
# estimate on test images rises to IWAE's level and above it. From the encoder the chains start where the
# posterior mass is, so even short ladders come close: the same reason IWAE with this proposal is a good bound in
# the first place. The certificate does not take that on trust; BDMC measures it, at the settings used.
#
# ## 7. What makes a certificate fail
#
# - **Too few temperatures** (section 6): `bdmc_gap`, `example_ess`, and `above_iwae` where AIS falls below IWAE.
#   Raise `num_betas` until BDMC's gap is below `max_gap`.
# - **HMC that does not move**: an `accept_rate` far from `target_accept` says the step-size adaptation did not
#   find a workable step (`step_size` is where it starts, `max_step_size` its ceiling); chains that hardly move
#   show up as `above_iwae`, `example_ess` or `bdmc_gap` failures.
# - **A model that does not hold together**: a `log_likelihood` that ignores z, or scores another model than
#   `sample_likelihood` draws from. A common way to get there is to reuse `forward`, which encodes x again and
#   never looks at the z it was given:

# %%
class Broken(CertifiableVAE):
    def log_likelihood(self, x, z):  # decodes the encoder's mean of x, not z
        logits = self.fc4(F.relu(self.fc3(self.encode(x)[0])))
        return -F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(-1)


broken = Broken()
broken.load_state_dict(model.state_dict())
r = nvil.evaluate_model(broken, x_few, estimator="bdmc", num_betas=10, num_chains=2, num_simulated=5)
print(f"bdmc on the broken model: certified = {r.certified}, failed {r.failed}")
print(r.warnings[r.failed.index("likelihood_consistency")])

# %% [markdown]
# - **A method of the wrong shape** is refused before any estimate, in one line naming the method. A
#   `log_likelihood` with the loss's `reduction="sum"` returns one number for the whole batch:

# %%
class Summed(CertifiableVAE):
    def log_likelihood(self, x, z):
        return -F.binary_cross_entropy(self.decode(z), x, reduction="sum")


try:
    nvil.evaluate_model(Summed(), x_few, estimator="iwae", num_samples=10)
except ConfigError as err:
    print("ConfigError:", err)

# %% [markdown]
# What no check can see: a `log_likelihood` that is not normalised in x (a mean squared error without the
# Gaussian's constant, a mean over pixels instead of a sum, greyscale pixels scored as Bernoulli). Every check
# passes and every number is wrong.
#
# ## 8. The same from the command line
#
# `evaluate.py` takes a model of your own by `model_module=FILE.py:NAME`: the file defines the class (here `VAE`
# and `CertifiableVAE`, with their imports), `checkpoint=` holds its state dict, and `data.name=mnist` scores the
# package's binarised MNIST test split (`data_file=x.pt` scores a tensor of your own). The estimator's settings
# are `estimator.KEY=VALUE`, with the keyword names used above:
#
# ```bash
# python evaluate.py model_module=my_vae.py:CertifiableVAE checkpoint=vae.pt data.name=mnist \
#     eval.num_examples=20 estimator=ais estimator.num_betas=300 estimator.num_chains=4 estimator.num_simulated=10
# python evaluate.py model_module=my_vae.py:CertifiableVAE checkpoint=vae.pt data.name=mnist \
#     estimator=iwae estimator.num_samples=5000
# ```
#
# Each prints one JSON line (`ais.to_json()` above) and appends it to `vae.pt.eval.jsonl`;
# `estimator.strict=true` exits with code 3 when the certificate fails.
#
# ## Next
#
# - Every method, setting and check in one place, binary latents and exact enumeration included:
#   [Evaluate your own model](../../how-to/evaluate-your-own-model/).
# - The certificates of the package's own estimators: [Certificates](../../concepts/certificates/).
# - AIS with HMC on the package's Gaussian belief nets:
#   [a Gaussian belief net in two forms](../gaussian-belief-net-two-forms/).
