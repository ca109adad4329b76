"""The Python API on objects, run as a notebook would run it: from a directory outside the checkout, in a fresh
interpreter. ``nvil.train`` with keywords (and a list of overrides), ``nvil.load`` of the checkpoint, ``sample``
on every family, ``nvil.evaluate`` with keywords on a path and on a model with rows, ``nvil.compare`` paired on
the same examples; settings keep the user's names (``num_chains`` in errors and in the JSON line)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import nvil
from nvil.core.errors import ConfigError
from nvil.models import build_model

NOTEBOOK = textwrap.dedent('''
    import json, torch, nvil
    quiet = {"trainer.progress": False, "trainer.tensorboard": False, "trainer.val_every": 50,
             "trainer.ckpt_every": 50, "trainer.device": "cpu", "final_eval.enabled": False}
    run = nvil.train(model="rbm", learner="sap", data="synthetic", run_dir="run",
                     **{"model.n_hidden": 6, "trainer.max_steps": 100, **quiet})
    model = nvil.load(run.checkpoint)
    x, h = model.sample(32, gibbs_sweeps=20)
    exact = nvil.evaluate(model, x, estimator="exact")
    ais = nvil.evaluate(run.checkpoint, estimator="ais", num_chains=20, num_betas=300,
                        **{"eval.num_examples": 40, "eval.progress": False})
    strings = nvil.evaluate(run.checkpoint, "estimator=exact", "eval.progress=false", "eval.num_examples=40")
    again = nvil.train(["model=rbm", "learner=sap", "data=synthetic", "model.n_hidden=6", "trainer.max_steps=60",
                        *[f"{k}={str(v).lower()}" for k, v in quiet.items()]], run_dir="run2")
    d = nvil.compare(run.last_checkpoint, again.last_checkpoint, estimator="exact", **{"eval.num_examples": 40,
                                                                            "eval.progress": False})
    print("RESULT " + json.dumps({"shape": list(x.shape), "exact": exact.mean_log_p, "ais": ais.mean_log_p,
                                  "ais_se": ais.stderr, "strings": strings.mean_log_p, "n": strings.log_p.numel(),
                                  "diff": d.mean_difference, "diff_se": d.stderr, "a": d.a.mean_log_p,
                                  "b": d.b.mean_log_p, "inference": model.inference_network is None,
                                  "repr": repr(model), "file": nvil.__file__}))
''')


@pytest.fixture(scope="module")
def notebook(tmp_path_factory) -> dict:
    cwd = tmp_path_factory.mktemp("notebook")
    out = subprocess.run([sys.executable, "-c", NOTEBOOK], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(next(l for l in out.stdout.splitlines() if l.startswith("RESULT "))[7:])


def test_the_notebook_runs_outside_the_checkout(notebook):
    assert notebook["shape"] == [32, 12] and notebook["inference"] is True  # an RBM has no inference network
    assert "n_visible=12, n_hidden=6" in notebook["repr"]


def test_keywords_and_strings_reach_the_same_estimator(notebook):
    assert notebook["n"] == 40
    assert abs(notebook["ais"] - notebook["strings"]) < 4 * notebook["ais_se"] + 0.05  # AIS near the exact value


def test_compare_is_the_difference_of_its_two_estimates(notebook):
    assert notebook["diff"] == pytest.approx(notebook["a"] - notebook["b"], abs=1e-6)
    assert notebook["diff_se"] > 0


def test_every_family_samples():
    for name, spec in (("rbm", {"n_hidden": 3}), ("srbm", {"n_hidden": 3}), ("sbn", {"layers": [3, 2]}),
                       ("dbn", {"layers": [3, 2]}), ("dbm", {"layers": [3, 2]}), ("gbn", {"layers": [3]}),
                       ("vae", {"latent": [2], "hidden": [[4]]})):
        model, _ = build_model({"name": name, **spec}, 6)
        kwargs = {"gibbs_sweeps": 3} if name in ("rbm", "srbm", "dbn", "dbm") else {}
        x, _ = model.sample(5, torch.Generator().manual_seed(0), **kwargs)
        assert x.shape == (5, 6), name


def test_compare_pairs_the_draws(tmp_path):
    """Two models that differ only in their visible bias: the paired SE is far below the unpaired one, because the
    IWAE draws (same seed, same shapes) are the same for both."""
    torch.manual_seed(0)
    a, q = build_model({"name": "sbn", "layers": [4]}, 6)
    b, _ = build_model({"name": "sbn", "layers": [4]}, 6)
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        b.decoders[0].bias.add_(0.01)
    x = torch.bernoulli(torch.full((200, 6), 0.5))
    d = nvil.compare(a, b, x, estimator="iwae", num_samples=5, inference=q)
    assert d.stderr < d.unpaired_stderr / 10
    independent = nvil.compare(a, b, x, estimator="iwae", num_samples=5, inference=q, seed=0)
    assert independent.mean_difference == pytest.approx(d.mean_difference)  # the seed fixes both sides


def test_names_stay_as_the_user_set_them():
    from nvil.models.protocol import Latent, gaussian_log_prob

    class Tiny(torch.nn.Module):
        latent = Latent.continuous(1)

        def log_prior(self, z):
            return gaussian_log_prob(z)

        def log_likelihood(self, x, z):
            return -0.5 * (x - z).square().sum(-1)

        def sample_prior(self, n, generator):
            return torch.randn(n, 1, generator=generator)

        def sample_likelihood(self, z, generator):
            return z + torch.randn(z.shape, generator=generator)

    with pytest.raises(ConfigError, match=r"estimator\.num_chains must be a positive integer"):
        nvil.evaluate(Tiny(), torch.zeros(3, 1), estimator="ais", num_chains=0)
    r = nvil.evaluate(Tiny(), torch.zeros(3, 1), estimator="ais", num_chains=3, num_betas=20, iwae_samples=0,
                      num_simulated=0)
    assert r.summary()["num_chains"] == 3 and "num_runs" not in r.summary()
    with pytest.raises(ConfigError, match="settings"):
        nvil.evaluate(Tiny(), torch.zeros(3, 1), estimator=nvil.estimators.IWAE(), num_samples=3)
    with pytest.raises(ConfigError, match="override strings"):
        nvil.evaluate(Tiny(), torch.zeros(3, 1), "estimator=iwae")
    with pytest.raises(ConfigError, match="an override must be a string"):
        nvil.train(["model=rbm", 3])
