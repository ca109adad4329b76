"""What a user reads after a run: the human line on stderr beside each JSON line (nvil/app/report.py), the run's
config and final scores in TensorBoard's hparams view (nvil/app/logging.py), the words of the estimators' fields
(which mean to report, what a bound is, which estimators fit a model) and the version the package reports."""

from __future__ import annotations

import errno
import json
import re
import subprocess
import sys

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

import nvil
import nvil.app.logging as run_logging
from conftest import ROOT, SYNTHETIC, make_cfg, run_script, tiny_model
from nvil.app.evaluation import _report
from nvil.app.main import hparams_view
from nvil.app.report import headline
from nvil.core.errors import ConfigError
from nvil.estimators import ELBO, ESTIMATORS, IWAE, Chib, Harmonic, Result
from nvil.estimators.latent_model import BOLTZMANN_ESTIMATORS
from nvil.models.rbm import BoltzmannMachine

TINY = [*SYNTHETIC, "trainer.max_steps=20"]


def ais_line(**changes) -> dict:
    """A JSON line as ``estimator=ais`` prints it (the keys the human line reads)."""
    line = {"estimator": "ais", "mean_log_p": -84.5712, "stderr": 0.2103, "num_examples": 10000, "split": "test",
            "log_z": 451.2, "log_z_ess": 980.1, "log_z_num_chains": 1000, "log_z_band": [451.2, 451.23],
            "certified": True, "failed_checks": [], "warnings": [],
            "checks": ["ess", "hard_lower_bound", "sandwich_order", "sandwich_gap", "reverse_hard_lower_bound"]}
    return {**line, **changes}


# ---- the human line ------------------------------------------------------------------------------------------


def test_the_human_line_of_a_certified_estimate():
    assert headline(ais_line()) == ("ais: log p(v) = -84.57 ± 0.21 nats over 10,000 test examples "
                                    "[certified: hard bound, log Z interval 0.03 nats]")
    exact = headline({"estimator": "exact", "mean_log_p": -6.39, "stderr": 0.38, "num_examples": 1,
                      "certified": True, "checks": ["enumeration"]})
    assert exact == "exact: log p(v) = -6.39 ± 0.38 nats over 1 test example [certified: exact, by enumeration]"
    chib = headline({"estimator": "chib", "mean_log_p": -85.9, "stderr": 3.01, "num_examples": 50, "num_runs": 10,
                     "run_spread": 0.004, "certified": True, "checks": ["nonzero_estimates", "run_spread"]})
    assert chib.endswith("[certified: run spread 0.004 nats over 10 runs]"), chib


def test_the_human_line_says_what_a_budget_spent():
    rounds = [{"num_betas": 62, "num_chains": 4, "seconds": 2.5, "certified": False, "failed": ["example_ess"]},
              {"num_betas": 124, "num_chains": 8, "seconds": 3.5, "certified": True, "failed": []}]
    line = headline(ais_line(budget={"seconds": 300.0, "spent": 6.04, "rounds": rounds}))
    assert line.endswith("log Z interval 0.03 nats; budget: 6 s of 300 s, round 2 (num_betas=124, num_chains=8)]")
    smc = headline(ais_line(estimator="smc", budget={"seconds": 60, "spent": 1.2, "rounds": [
        {"cess": 0.875, "num_particles": 8, "seconds": 1.2, "certified": True, "failed": []}]}))
    assert smc.endswith("budget: 1 s of 60 s, round 1 (cess=0.875, num_particles=8)]"), smc
    assert "budget" not in headline(ais_line())  # run once: nothing to say


def test_the_human_line_gives_the_sandwich_on_the_real_rows():
    line = {"estimator": "ais", "mean_log_p": -3.47, "stderr": 0.6, "num_examples": 64, "certified": True,
            "checks": ["example_ess", "reverse_order", "reverse_gap", "bdmc_gap"], "bdmc_gap": 0.11,
            "ais_minus_reverse": -0.0234}
    assert headline(line).endswith("[certified: BDMC gap 0.11 nats, reverse sandwich 0.02 nats, per-example ESS]")


def test_the_human_line_of_an_estimate_that_is_not_certified():
    warning = ("forward and reverse AIS disagree by 2.31 nats (more than estimator.max_gap=1.0): log Z lies "
               "somewhere in [450.00, 452.31]; use more betas or chains")
    line = headline(ais_line(certified=False, failed_checks=["sandwich_gap", "ess"], warnings=[warning, "x"]))
    assert line.startswith("ais: log p(v) = -84.57 ± 0.21 nats over 10,000 test examples [not certified: ")
    assert line.endswith("[not certified: forward and reverse AIS disagree by 2.31 nats (more than "
                         "estimator.max_gap=1.0) (and 1 more failed check)]"), line
    long = headline(ais_line(certified=False, failed_checks=["bdmc_gap"], warnings=["bdmc_gap: " + "y" * 300]))
    assert "[not certified: yyy" in long and "bdmc_gap:" not in long and long.endswith("...]") and len(long) < 250


def test_the_human_line_of_a_bound_a_classifier_and_a_sandwich():
    iwae = headline({"estimator": "iwae", "mean_log_p": -120.0736, "stderr": 0.2599, "num_examples": 10000,
                     "split": "test", "certified": None})
    assert iwae == ("iwae: log p(v) >= -120.07 ± 0.26 nats over 10,000 test examples "
                    "[stochastic lower bound; no certificate]")
    elbo = headline({"estimator": "elbo", "mean_log_p": -113.99, "stderr": 0.25, "num_examples": 100,
                     "split": "valid", "certified": None})
    assert elbo.startswith("elbo: log p(v) >= -113.99 ± 0.25 nats over 100 valid examples")
    classify = headline({"estimator": "classify", "method": "label units", "error_rate": 0.0243, "stderr": 0.0015,
                         "num_examples": 10000})
    assert classify == "classify: error rate = 2.43% ± 0.15% over 10,000 test examples [label units; no certificate]"
    bdmc = headline({"estimator": "bdmc", "mean_log_p": -6.9694, "mean_log_p_upper": -6.8853, "stderr": 0.72,
                     "num_examples": 4, "bdmc_gap": 0.084, "certified": True, "checks": ["bdmc_gap", "bdmc_order"]})
    assert bdmc == ("bdmc: log p(v) between -6.97 and -6.89 ± 0.72 nats over 4 simulated examples "
                    "[certified: BDMC gap 0.08 nats]")
    docs = headline({"estimator": "iwae", "mean_log_p": -310.2, "stderr": 2.0, "num_examples": 30, "split": "test",
                     "perplexity": 1234.5, "perplexity_is": "upper bound", "certified": None})
    assert ", perplexity at most 1,234.5 per word [" in docs
    assert "log p(v) = n/a ± n/a nats" in headline({"estimator": "chib", "mean_log_p": None, "stderr": None,
                                                    "num_examples": 3, "certified": False,
                                                    "failed_checks": ["nonzero_estimates"], "warnings": []})


def test_report_prints_json_on_stdout_and_the_human_line_last_on_stderr(tmp_path, capsys):
    result = Result("chib", torch.tensor([-5.0, -6.0, -7.0]), 1.0, 0, {"split": "test"})
    result.check("run_spread", False, "the spread of the test-set mean over 3 runs is larger than it should be")
    _report(result, "chib", tmp_path / "eval.jsonl")
    out, err = capsys.readouterr()
    assert [json.loads(x) for x in out.splitlines()] == [json.loads((tmp_path / "eval.jsonl").read_text())]
    assert err.splitlines() == [
        "warning: chib: the spread of the test-set mean over 3 runs is larger than it should be",
        "chib: log p(v) = -6.00 ± 0.58 nats over 3 test examples [not certified: the spread of the test-set mean "
        "over 3 runs is larger than it should be]"]


def test_evaluate_and_merge_print_only_json_on_stdout_and_a_human_line_on_stderr(tmp_path):
    run = nvil.train(*TINY, run_dir=tmp_path / "run")
    proc = run_script("evaluate.py", f"checkpoint={run.checkpoint}", "estimator=exact", "eval.progress=false")
    assert proc.returncode == 0, proc.stderr
    (line,) = [json.loads(x) for x in proc.stdout.splitlines()]  # every stdout line is JSON
    assert proc.stderr.strip().splitlines()[-1] == headline(line)
    assert re.fullmatch(r"exact: log p\(v\) = -\d+\.\d\d ± 0\.\d\d nats over 500 test examples "
                        r"\[certified: exact, by enumeration\]", headline(line))
    shards = tmp_path / "shards.jsonl"
    for shard in (0, 1):
        proc = run_script("evaluate.py", f"checkpoint={run.checkpoint}", "estimator=exact", "eval.progress=false",
                          "eval.num_shards=2", f"eval.shard={shard}", f"eval.output={shards}")
        assert proc.returncode == 0, proc.stderr
    proc = run_script("-m nvil.app.merge", str(shards))
    (merged,) = [json.loads(x) for x in proc.stdout.splitlines()]
    assert proc.stderr.strip().splitlines() == [headline(merged)] and merged["num_examples"] == 500


# ---- TensorBoard's hparams view ------------------------------------------------------------------------------


def test_the_run_config_and_final_scores_are_in_tensorboards_hparams_view(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_script("train.py", *TINY, "trainer.tensorboard=true", "final_eval.enabled=true",
                      "final_eval.num_examples=20", "final_eval.estimator.num_samples=5", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr
    final = [json.loads(x) for x in proc.stdout.splitlines()][-1]
    assert [p.parent for p in run_dir.rglob("events.out.tfevents.*")] == [run_dir / "tb"] * 2  # no subdirectory
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    start = HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info.hparams
    assert start["learner.name"].string_value == "nvil" and start["trainer.max_steps"].number_value == 20
    assert start["model.layers"].string_value == "[4, 3]" and start["trainer.tensorboard"].string_value == "true"
    experiment = HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} == {"eval/iwae/mean_log_p", "eval/iwae/stderr",
                                                             "val/elbo_best"}
    (event,) = acc.Scalars("eval/iwae/mean_log_p")
    assert event.step == 20 and event.value == pytest.approx(final["mean_log_p"])


def test_a_refused_hparams_write_is_one_warning_line(tmp_path, monkeypatch, capsys):
    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "tb"))

    monkeypatch.setattr(run_logging, "hparams", full)
    metrics = {"step": 3, "val/tag": "val/elbo", "val/best": -7.0, "final_eval": {"estimator": "iwae",
                                                                                  "mean_log_p": -6.5}}
    hparams_view(make_cfg("train", TINY), tmp_path, metrics)
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith(f"warning: cannot write TensorBoard's hparams log {tmp_path / 'tb'}: the disk is full")


# ---- the estimators' words -------------------------------------------------------------------------------------


def test_only_the_importance_sampled_bound_is_said_to_tighten_with_more_samples():
    model, q = tiny_model()
    x = (torch.rand(10, 6, generator=torch.Generator().manual_seed(0)) < 0.5).float()
    iwae = IWAE(num_samples=4).estimate(model, x, inference=q).summary()["bound"]
    elbo = ELBO(num_samples=4).estimate(model, x, inference=q).summary()["bound"]
    assert "tight as num_samples grows" in iwae
    assert "tight" not in elbo and "not its gap" in elbo and "KL(q(h | v) || p(h | v))" in elbo


def test_per_run_means_say_which_estimate_to_report():
    model, q = tiny_model()
    x = (torch.rand(10, 6, generator=torch.Generator().manual_seed(0)) < 0.5).float()
    chib = Chib(num_steps=3, num_runs=4, accel="none").estimate(model, x, inference=q).summary()
    assert chib["mean_log_p_per_run"] <= chib["mean_log_p"]  # the log of a mean is never below the mean of logs
    assert chib["mean_log_p_per_run_is"].endswith("report mean_log_p") and "never above" in chib["mean_log_p_per_run_is"]
    harmonic = Harmonic(num_samples=3, num_runs=4, accel="none").estimate(model, x, inference=q).summary()
    assert harmonic["mean_log_p_per_run"] >= harmonic["mean_log_p"] and "never below" in harmonic["mean_log_p_per_run_is"]
    single = Chib(num_steps=3, num_runs=1, accel="none").estimate(model, x, inference=q).summary()
    assert "mean_log_p_per_run_is" not in single  # one run: the two means are the same number


def test_a_bound_refused_on_an_rbm_names_the_estimators_that_fit_it():
    rbm = BoltzmannMachine(6, 3)
    named = re.findall(r"\w+", BOLTZMANN_ESTIMATORS.replace(" or ", ", "))
    fit = {name for name, cls in ESTIMATORS.items() if _fits(cls(), rbm)}
    assert set(named) == fit - {"iwae", "elbo"} and "iwae" not in fit
    for cls in (IWAE, ELBO):
        with pytest.raises(ConfigError) as e:
            cls().check(rbm, None)
        assert f"use estimator={BOLTZMANN_ESTIMATORS}" in str(e.value) and "\n" not in str(e.value)


def _fits(estimator, model) -> bool:
    try:
        estimator.check(model, None)
    except ConfigError:
        return False
    return True


# ---- the version ----------------------------------------------------------------------------------------------


def test_the_package_reports_one_version_everywhere():
    version = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert nvil.__version__ == version
    assert re.search(rf"^version: \"?{re.escape(version)}\"?$", (ROOT / "CITATION.cff").read_text(), re.M)
    assert re.search(r"^## \[(\d[^\]]*)\]", (ROOT / "CHANGELOG.md").read_text(), re.M).group(1) == version
    for script in ("train.py", "evaluate.py"):
        out = subprocess.run([sys.executable, str(ROOT / script), "--version"], capture_output=True, text=True,
                             timeout=60)
        assert (out.returncode, out.stdout, out.stderr) == (0, f"nvil {version}\n", "")


def test_the_readme_links_resolve():
    """Every relative link of README.md names a file or directory of the checkout (the docs pages among them)."""
    text = (ROOT / "README.md").read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]
    assert targets and not [t for t in targets if not (ROOT / t).exists()]


def test_the_run_spread_names_the_chains_where_the_estimate_counts_chains():
    line = {"estimator": "ais", "mean_log_p": -84.47, "stderr": 8.74, "num_examples": 10, "num_chains": 16,
            "run_spread": 0.0852, "certified": True, "checks": ["run_spread"], "failed_checks": [], "warnings": [],
            "split": "test"}
    assert headline(line).endswith("run spread 0.09 nats over 16 chains]"), headline(line)
