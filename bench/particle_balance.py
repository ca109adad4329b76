"""Where SAP's persistent particles go at the final parameters: the digit classes (label units) of a checkpoint's
particles over block-Gibbs sweeps with the parameters fixed (Salakhutdinov 2009, Sec. 4.1 and Fig. 2: SAP's
particles follow a model that changes under them, and a tempered-transitions run showed the current model "very
unbalanced, with more probability mass placed on images of four"). A diagnostic, not run by CI.

    python bench/particle_balance.py bench/checkpoints/sap_srbm500.pt bench/checkpoints/transsap_srbm500.pt
    python bench/particle_balance.py RUN/checkpoints/last.pt --sweeps 4000 --every 1000 --seeds 1,2

For each checkpoint of a (semi-)RBM with label units trained by SAP or Trans-SAP (its learner state carries the
particles), block Gibbs at beta = 1 from the stored particles with the final parameters, and a table of the
particles' classes every ``--every`` sweeps (the argmax of the label units, which the sweeps draw as one-hot), with
Pearson's chi-square against the training set's class frequencies: 9 degrees of freedom, so about 9 +- 4.2 for
particles drawn from those frequencies, above 21.7 with probability 0.01. Balanced particles under SAP that leave
balance here were kept balanced by the learning itself (the parameters move under them), not by the model they
are meant to sample.

``--test-classes`` adds what the class balance does to the test log-probability: per class k, the mean over the test
images of class k of log p*(x, y) minus its mean over all of them (log p* unnormalised: the model's log Z cancels,
so no AIS is needed), for each checkpoint, and each later checkpoint's difference from the first with the standard
error of the paired per-image difference. Adding a checkpoint's certified mean test log p (``evaluate.py ...
estimator=ais``) to its row gives the per-class test log p.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from common import markdown_table  # noqa: I001  (puts the repository root on sys.path)

import torch
from omegaconf import OmegaConf

from nvil.models.rbm import State
from nvil.data import build_model_data
from nvil.app.evaluation import load_model
from nvil.mcmc import BlockGibbs


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", nargs="+", type=Path, help="checkpoints of SAP / Trans-SAP runs with label units")
    p.add_argument("--sweeps", type=int, default=1000, help="Gibbs sweeps at the final parameters (default 1000)")
    p.add_argument("--every", type=int, default=250, help="a table row every this many sweeps (default 250)")
    p.add_argument("--seeds", default="0", help="Gibbs seeds, comma-separated: a run from the particles for each")
    p.add_argument("--test-classes", action="store_true", help="also the test log p* per class (see above)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.sweeps < 1 or args.every < 1:
        p.error("--sweeps and --every must be positive")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    return args


def load(path: Path):
    """(model, checkpoint payload, the run's dataset with one-hot labels) of a checkpoint, read once."""
    model, _, payload = load_model(path, torch.device("cpu"))
    data = build_model_data(OmegaConf.create(payload["config"]["data"]), torch.device("cpu"),
                            labels=bool(payload["config"]["model"].get("labels", False)))
    return model, payload, data


def particles(path: Path, model, payload: dict, data) -> tuple[State, torch.Tensor]:
    """(State of the stored particles, training class frequencies [n_labels]) of a SAP / Trans-SAP checkpoint."""
    learner = payload.get("learner") or {}
    if "particles_x" not in learner or not getattr(model, "n_labels", 0):
        raise SystemExit(f"{path}: not a SAP / Trans-SAP checkpoint of a model with label units "
                         "(no particles or labels)")
    counts = torch.bincount(data.labels["train"].long(), minlength=model.n_labels).double()
    return State(learner["particles_x"].clone(), learner["particles_h"].clone()), counts / counts.sum()


def chi_square(counts: torch.Tensor, freq: torch.Tensor) -> float:
    """Pearson's chi-square of class ``counts`` against ``freq`` times their total."""
    expected = freq * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def trace(model, start: State, freq: torch.Tensor, sweeps: int, every: int, seed: int) -> list[list[str]]:
    """Rows (sweep, class counts, chi-square) every ``every`` sweeps of block Gibbs from ``start``."""
    gibbs = BlockGibbs(model, accel="auto")
    generator = torch.Generator().manual_seed(seed)
    state, n_pixels, rows = start, model.n_pixels, []
    for k in range(sweeps + 1):
        if k:
            state, _ = gibbs.step(state, generator=generator)
        if k % every == 0:
            counts = torch.bincount(state.x[:, n_pixels:].argmax(-1), minlength=freq.numel()).double()
            rows.append([str(k), " ".join(str(int(n)) for n in counts), f"{chi_square(counts, freq):.1f}"])
    return rows


@torch.no_grad()
def test_log_p_star(model, data) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p*(x, y) = -F(x, y) of every test image with its label [N], the labels [N])."""
    x = data.split("test")
    log_p_star = torch.cat([-model.free_energy(x[i:i + 1000]) for i in range(0, x.shape[0], 1000)])
    return log_p_star.double(), data.labels["test"].long()


def class_profile(log_p_star: torch.Tensor, labels: torch.Tensor) -> list[tuple[float, float]]:
    """Per class: (mean of log p* over its images minus the mean over all, its standard error)."""
    centred, out = log_p_star - log_p_star.mean(), []
    for k in range(int(labels.max()) + 1):
        v = centred[labels == k]
        out.append((float(v.mean()), float(v.std() / v.numel() ** 0.5)))
    return out


def test_classes(paths: list[Path], scored: list[tuple[torch.Tensor, torch.Tensor]], test_sets: list[torch.Tensor]
                 ) -> None:
    """The per-class table of ``--test-classes``; the differences are paired per image, so every checkpoint's test
    set must be the first's (the same images and binarisation)."""
    for p, x in zip(paths[1:], test_sets[1:]):
        if not torch.equal(x, test_sets[0]):
            raise SystemExit(f"{p}: its run's test images differ from {paths[0]}'s (another data config), so the "
                             "per-image differences are not paired; compare runs of one data config")
    labels = scored[0][1]
    head = ["checkpoint"] + [f"class {k}" for k in range(int(labels.max()) + 1)]
    cells = lambda profile: [f"{m:+.2f} ± {se:.2f}" for m, se in profile]  # noqa: E731
    rows = [[p.name] + cells(class_profile(lp, labels)) for p, (lp, _) in zip(paths, scored)]
    first = scored[0][0]
    for p, (lp, _) in zip(paths[1:], scored[1:]):
        diff = (lp - lp.mean()) - (first - first.mean())  # paired: the same images under both
        rows.append([f"{p.name} - {paths[0].name}"] + cells(class_profile(diff, labels)))
    print("\nTest log p*(x, y) per class, minus the checkpoint's mean over the test set (nats; ± SE over the class's "
          "images):")
    print(markdown_table(head, rows))


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    scored, test_sets = [], []
    for path in args.checkpoints:
        model, payload, data = load(path)
        start, freq = particles(path, model, payload, data)
        print(f"\n{path} ({start.x.shape[0]} particles; training class frequencies "
              f"{' '.join(f'{f:.3f}' for f in freq.tolist())}):")
        for seed in args.seeds:
            began = time.perf_counter()
            rows = trace(model, start, freq, args.sweeps, args.every, seed)
            print(f"Gibbs seed {seed}, {time.perf_counter() - began:.0f} s:")
            print(markdown_table(["sweeps", "particles per class 0-9", "chi-square (9 d.o.f.)"], rows))
        if args.test_classes:
            scored.append(test_log_p_star(model, data))
            test_sets.append(data.split("test"))
    if args.test_classes:
        test_classes(args.checkpoints, scored, test_sets)


if __name__ == "__main__":
    main()
