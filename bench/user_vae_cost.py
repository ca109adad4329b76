"""Cost of certifying a user's VAE (nvil.estimators.evaluate_model): AIS with 1,000 sigmoid temperatures x 16 chains
(HMC, 10 leapfrog steps, step sizes from a 2-chain pilot) on a 784-400-50 Gaussian VAE with a Bernoulli decoder, per
test example, against IWAE with 5,000 proposal samples, and IWAE given the same time as AIS.

    python bench/user_vae_cost.py [--examples 20] [--train-steps 600] [--device cpu|cuda] [--threads N]

The VAE (the model of docs/tutorials/certify-your-own-vae.py, 50 latents) is first trained for ``--train-steps`` Adam
steps on binarised MNIST so that the estimates mean something; the timings cover the estimators only. Prints one JSON
line per measurement and a table."""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

import nvil
from nvil.data import mnist_data
from nvil.estimators import evaluate_model


class VAE(nn.Module):
    """784-400-L Gaussian VAE, Bernoulli decoder, with the five methods of nvil.models.protocol."""

    def __init__(self, latent: int = 50) -> None:
        super().__init__()
        self.latent = nvil.Latent.continuous(latent)
        self.fc1, self.fc21, self.fc22 = nn.Linear(784, 400), nn.Linear(400, latent), nn.Linear(400, latent)
        self.fc3, self.fc4 = nn.Linear(latent, 400), nn.Linear(400, 784)

    def encode(self, x):
        h = F.relu(self.fc1(x))
        return self.fc21(h), self.fc22(h)

    def decode_logits(self, z):
        return self.fc4(F.relu(self.fc3(z)))

    def loss(self, x):
        mu, log_var = self.encode(x)
        z = mu + torch.randn_like(mu) * (0.5 * log_var).exp()
        bce = F.binary_cross_entropy_with_logits(self.decode_logits(z), x, reduction="sum")
        return (bce - 0.5 * torch.sum(1 + log_var - mu.pow(2) - log_var.exp())) / x.shape[0]

    def log_prior(self, z):
        return -0.5 * (z.square().sum(-1) + z.shape[-1] * math.log(2 * math.pi))

    def log_likelihood(self, x, z):
        return -F.binary_cross_entropy_with_logits(self.decode_logits(z), x, reduction="none").sum(-1)

    def sample_prior(self, n, generator):
        return torch.randn(n, self.latent.size, generator=generator, device=generator.device)

    def sample_likelihood(self, z, generator):
        p = torch.sigmoid(self.decode_logits(z))
        return (torch.rand(p.shape, generator=generator, device=p.device) < p).float()

    def proposal(self, x):
        mu, log_var = self.encode(x)
        return torch.distributions.Independent(torch.distributions.Normal(mu, (0.5 * log_var).exp()), 1)


def train(vae: VAE, x: torch.Tensor, steps: int, batch: int = 128) -> float:
    opt = torch.optim.Adam(vae.parameters(), lr=1e-3)
    g = torch.Generator(device=x.device).manual_seed(0)
    loss = math.nan
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (batch,), generator=g, device=x.device)
        loss = vae.loss(x[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=20)
    p.add_argument("--train-steps", type=int, default=600)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--num-betas", type=int, default=1000)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    data = mnist_data()
    vae = VAE().to(dev)
    loss = train(vae, data.split("train").to(dev), a.train_steps)
    x = data.split("test")[: a.examples].to(dev)
    rows = []

    def record(name, result, seconds):
        row = {"estimator": name, "mean_log_p": round(result.mean_log_p, 3), "stderr": round(result.stderr, 3),
               "seconds_per_example": round(seconds / a.examples, 4), "certified": result.certified,
               "device": str(dev), "threads": torch.get_num_threads(), "train_loss": round(loss, 2)}
        print(json.dumps(row), flush=True)
        rows.append(row)

    ais, t_ais = timed(lambda: evaluate_model(vae, x, "ais", num_betas=a.num_betas, num_chains=16, num_simulated=0,
                                              iwae_samples=0, batch_size=a.examples))
    record(f"ais {a.num_betas}x16", ais, t_ais)
    iwae, t_iwae = timed(lambda: evaluate_model(vae, x, "iwae", num_samples=5000, batch_size=a.examples))
    record("iwae 5000", iwae, t_iwae)
    k = max(1, round(5000 * t_ais / t_iwae))
    same, t_same = timed(lambda: evaluate_model(vae, x, "iwae", num_samples=k, batch_size=a.examples))
    record(f"iwae {k} (AIS's time)", same, t_same)
    print(f"\n{'estimator':<28} {'log p(x)':>10} {'s / example':>12}")
    for r in rows:
        print(f"{r['estimator']:<28} {r['mean_log_p']:>10.2f} {r['seconds_per_example']:>12.4f}")
    print(f"AIS / IWAE(5000) cost per example: {t_ais / t_iwae:.1f}x; AIS - IWAE at equal time: "
          f"{ais.mean_log_p - same.mean_log_p:.2f} nats")


if __name__ == "__main__":
    main()
