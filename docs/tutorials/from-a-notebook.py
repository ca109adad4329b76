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
# # From a notebook: load, sample, evaluate, compare
#
# Everything `train.py` and `evaluate.py` do is a Python call on objects: `nvil.train` returns a run,
# `nvil.load` turns a checkpoint into its model, every family samples, `nvil.evaluate` scores a model on rows you
# hold (or a checkpoint on its test split), and `nvil.compare` gives the paired difference of two models on the
# same examples and random draws. This page does each once, on two small RBMs trained on binarised MNIST by two
# learners: contrastive divergence (CD-1, Hinton 2002) and stochastic approximation with persistent chains (SAP,
# [Tieleman 2008](https://doi.org/10.1145/1390156.1390290)). Their 16 hidden units keep log Z enumerable, so each
# estimate below is checked against the exact value. It runs on a CPU in about a minute; every file goes to a
# temporary directory.

# %%
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import nvil
from nvil.data import mnist_data

workdir = Path(tempfile.mkdtemp(prefix="nvil-notebook-"))

# %% [markdown]
# ## 1. Train two models
#
# `nvil.train` takes the command line's overrides as keywords (or as `"key=value"` strings) and writes the same
# run directory `python train.py` writes. The two runs differ only in their learner.

# %%
common = {"model.n_hidden": 16, "data.num_train": 2000, "trainer.batch_size": 50, "trainer.max_steps": 2000,
          "trainer.val_every": 500, "trainer.progress": False, "trainer.tensorboard": False,
          "final_eval.enabled": False}
runs = {learner: nvil.train(model="rbm", learner=learner, data="mnist", run_dir=workdir / learner, **common)
        for learner in ("cd", "sap")}
for learner, run in runs.items():
    print(f"{learner}: {run.checkpoint.relative_to(workdir)}")

# %% [markdown]
# ## 2. Load a checkpoint
#
# `nvil.load` rebuilds the model from the model registry (the checkpoint names its model by a registry key, never
# by a class path, and is read with `torch.load(weights_only=True)`) and puts it in eval mode on the device asked
# for. It is a plain `nn.Module`.

# %%
model = nvil.load(runs["sap"].checkpoint)
print(model)
print(sum(p.numel() for p in model.parameters()), "parameters")

# %% [markdown]
# ## 3. Sample
#
# Every family has `sample(n)`. An RBM's samples come from block-Gibbs chains started at uniform hidden states
# (`gibbs_sweeps` of them, 1,000 by default); it returns the visible and the hidden states.

# %%
torch.manual_seed(0)
v, h = model.sample(16)
fig, axes = plt.subplots(2, 8, figsize=(8, 2.2))
for ax, image in zip(axes.flat, v):
    ax.imshow(image.reshape(28, 28), cmap="gray_r")
    ax.axis("off")
fig.suptitle("samples of the SAP-trained RBM (1,000 Gibbs sweeps from uniform h)")
plt.show()

# %% [markdown]
# ## 4. Evaluate
#
# `nvil.evaluate(model, x, estimator=...)` scores rows you hold; settings are keywords with the names the
# estimator's config uses. Data passes one door first: the rows must be finite, of the model's width and, for
# binary pixels, in {0, 1}. Here the same 500 test images are scored by exact enumeration and by AIS, whose
# result carries its certificate and an interval for the mean log p that accounts for the Monte Carlo error of
# both sides of its log Z sandwich.

# %%
x_test = mnist_data(binarize="fixed").split("test")[:500]
exact = nvil.evaluate(model, x_test, estimator="exact")
ais = nvil.evaluate(model, x_test, estimator="ais", num_chains=100, num_betas=1000)
print(f"exact: {exact.mean_log_p:.3f} nats")
print(f"AIS:   {ais.mean_log_p:.3f} ± {ais.stderr:.3f} (test-set and Monte Carlo error), certified: {ais.certified}")
low, high = ais.extras["mean_log_p_band"]
print(f"AIS interval for the mean log p: [{low:.3f}, {high:.3f}]; contains the exact value: {low <= exact.mean_log_p <= high}")

# %% [markdown]
# A checkpoint alone is scored on its own test split: `nvil.evaluate(path, estimator="ais", num_chains=100)` is
# `python evaluate.py checkpoint=path estimator=ais estimator.num_chains=100`.
#
# ## 5. Compare two checkpoints
#
# `nvil.compare(a, b, ...)` runs one estimator with one seed on both, on the same examples, and pairs the
# per-example estimates. Each example's difference carries only what differs between the two models, so the
# paired standard error is far below the one the two means would have as independent estimates.

# %%
d = nvil.compare(runs["sap"].checkpoint, runs["cd"].checkpoint, x_test, estimator="exact")
print(d)
fig, ax = plt.subplots(figsize=(6, 3))
ax.hist(d.log_p_difference.numpy(), bins=40, color="tab:blue")
ax.axvline(d.mean_difference, color="black", lw=1)
ax.set_xlabel("log p_SAP(v) - log p_CD(v)  (nats, per test image)")
ax.set_ylabel("test images")
ax.set_title(f"SAP - CD: {d.mean_difference:.3f} ± {d.stderr:.3f} paired (± {d.unpaired_stderr:.3f} unpaired)")
plt.show()
