"""Mistakes a newcomer makes, each answered with one line that names the problem and the remedy (exit status 2 for
a user error, no traceback), and the small surprises around them:

- a run directory that cannot be created (in /proc, or under a file) is refused before Hydra makes it;
- ``model=rbm`` (or dbm) left with the default ``learner=nvil`` names the learners that train it;
- a Boltzmann machine given to ``evaluate_model`` is scored (AIS, exact), and IWAE's refusal names the estimators
  that do score it;
- each human line of an ``evaluate.py -m checkpoint=A,B`` sweep names its checkpoint;
- ``log_z_exact()`` is a plain number unless the gradient is asked for, and models print their sizes;
- the tests collect without Hydra's plugin package (``pip install -e '.[dev]'`` without the cluster extra).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import ROOT, SYNTHETIC, run_script

from nvil.app.cli import check_launcher, has_submitit
from nvil.core.errors import ConfigError
from nvil.estimators import evaluate_model
from nvil.models import DBM, RBM


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize("where, says", [("/proc/nvil-run", "no directory can be created in /proc"),
                                         ("{file}/run", "is a file, not a directory")], ids=["proc", "under_a_file"])
def test_a_run_directory_that_cannot_be_made_is_one_line(tmp_path, where, says):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    run_dir = where.format(file=blocker)
    line = one_error_line(run_script("train.py", *SYNTHETIC, "trainer.max_steps=2", f"hydra.run.dir={run_dir}"))
    assert says in line and "hydra.run.dir" in line, line
    assert not (tmp_path / "a_file" / "run").exists() and blocker.is_file()


@pytest.mark.parametrize("model, learners", [("rbm", "learner=sap, trans_sap, pt_sap, cd or exact_ml"),
                                             ("dbm", "learner=dbm_sap")])
def test_a_boltzmann_machine_without_its_learner_is_told_which_to_use(model, learners):
    overrides = [o for o in SYNTHETIC if not o.startswith("model.layers")]
    line = one_error_line(run_script("train.py", *overrides, f"model={model}", "trainer.max_steps=2"))
    assert "learner=nvil trains directed models" in line and learners in line, line


def test_an_rbm_given_to_evaluate_model_is_scored_and_iwae_names_what_scores_it():
    rbm = RBM(6, 4)
    x = (torch.rand(20, 6, generator=torch.Generator().manual_seed(0)) < 0.5).float()
    exact = (-rbm.free_energy(x) - rbm.log_z_exact()).mean().item()
    assert evaluate_model(rbm, x, estimator="exact").mean_log_p == pytest.approx(exact, abs=1e-4)
    ais = evaluate_model(rbm, x)
    assert ais.certified and abs(ais.mean_log_p - exact) < 0.05
    with pytest.raises(ConfigError, match="use estimator=ais"):
        evaluate_model(rbm, x, estimator="iwae")


def test_each_line_of_a_checkpoint_sweep_names_its_checkpoint(tmp_path):
    a, b = "bench/checkpoints/nvil_fdarn200.pt", "bench/checkpoints/nvil_sbn200x3.pt"
    proc = run_script("evaluate.py", "-m", f"checkpoint={a},{b}", "estimator=iwae", "eval.num_examples=10",
                      "estimator.num_samples=5", f"eval.output={tmp_path}/eval.jsonl", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    human = [line for line in proc.stderr.splitlines() if "log p(v) >=" in line and "%" not in line]
    assert [line.split(": ")[0] for line in human] == [a, b], human


def test_log_z_exact_is_a_number_and_models_print_their_sizes():
    rbm = RBM(6, 4)
    log_z = rbm.log_z_exact()
    assert not log_z.requires_grad and float(log_z.numpy()) == pytest.approx(log_z.item())
    assert rbm.log_z_exact(grad=True).requires_grad
    assert "n_visible=6" in repr(rbm) and "n_hidden=4" in repr(rbm)
    assert not DBM(5, [4, 3]).log_z_exact().requires_grad


def test_without_hydras_plugin_package_the_launcher_is_one_line_and_the_tests_collect(monkeypatch):
    """``hydra_plugins`` absent: ``find_spec`` of the launcher raises instead of answering None."""
    import importlib.util

    def absent(name, *args):
        raise ModuleNotFoundError(f"No module named '{name.split('.')[0]}'")

    monkeypatch.setattr(importlib.util, "find_spec", absent)
    assert not has_submitit()
    with pytest.raises(ConfigError, match=r"pip install -e '.\[cluster\]'"):
        check_launcher(["hydra/launcher=local"])
    monkeypatch.undo()
    hide = ("import sys, pytest; sys.modules['hydra_plugins'] = None; "
            "sys.exit(pytest.main(['--collect-only', '-q', '-m', 'slow or not slow', '-p', 'no:cacheprovider', 'tests/test_faults_cluster.py']))")
    proc = subprocess.run([sys.executable, "-c", hide], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
