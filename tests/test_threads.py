"""Intra-op threads chosen by the work of a step (nvil/backend/threads.py): one thread for the default job's NVIL
step, more for products large enough to split, never more than the cores the process may run on (its affinity
mask, shared among torchrun's ranks on the node), and a user's number capped the same way."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from nvil.backend import threads
from nvil.backend.threads import WORK_PER_THREAD, choose_threads, model_work, restored_threads, threads_for_work
from nvil.core.errors import ConfigError


def test_small_steps_get_one_thread_large_ones_up_to_the_cores():
    sbn200 = [nn.Linear(200, 784), nn.Linear(784, 200), nn.Linear(784, 100)]  # decoder, q, baseline (MNIST SBN-200)
    assert threads_for_work(model_work(sbn200, 20), cores=2) == 1      # NVIL at batch 20: 6.7M multiply-adds
    rbm500 = [nn.Linear(784, 500)]
    assert threads_for_work(model_work(rbm500, 1000), cores=2) == 2    # AIS on 1,000 chains: 392M
    assert threads_for_work(model_work(rbm500, 1000), cores=64) == 392_000_000 // WORK_PER_THREAD
    assert threads_for_work(1e15, cores=3) == 3 and threads_for_work(0, cores=8) == 1


def test_biases_do_not_count_as_work():
    layer = nn.Linear(10, 4)
    assert model_work([layer, None], 3) == 3 * 40


def test_idle_cores_are_read_from_the_cpu_times(monkeypatch):
    """Two samples of /proc/stat: cpu0 busy all the time, cpu1 idle 3/4 of it -> 0.75 idle cores."""
    if hasattr(os, "sched_getaffinity"):  # this machine's own file parses: a busy and an idle count per core
        stat = threads._cpu_times(os.sched_getaffinity(0))
        assert stat.keys() == os.sched_getaffinity(0) and all(b >= 0 and i >= 0 for b, i in stat.values())
    samples = iter([{0: (100, 50), 1: (10, 500)}, {0: (200, 50), 1: (35, 575)}])
    monkeypatch.setattr(threads, "_cpu_times", lambda mask: next(samples))
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    assert threads.idle_cores() == pytest.approx(0.75)


def test_a_busy_neighbour_keeps_its_core(monkeypatch):
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    monkeypatch.setattr(threads, "idle_cores", lambda seconds=0.2: 1.1)   # the other core is taken
    assert choose_threads("auto", 1e15, "eval.threads") == 1
    monkeypatch.setattr(threads, "idle_cores", lambda seconds=0.2: 1.9)   # both idle
    assert choose_threads("auto", 1e15, "eval.threads") == 2
    monkeypatch.setattr(threads, "idle_cores", lambda seconds=0.2: 0.0)   # all taken: still one thread
    assert choose_threads("auto", 1e15, "eval.threads") == 1
    assert choose_threads(2, 1e15, "eval.threads") == 2                   # a number is the user's choice


def test_the_cores_are_the_affinity_mask_shared_by_local_ranks(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert threads.available_cores() == 6
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert threads.available_cores() == 1                               # 6 cores, 4 ranks: one thread each
    assert choose_threads(8, 0.0, "trainer.threads") == 1               # a user's number is capped too
    assert choose_threads("auto", 1e15, "trainer.threads") == 1


@pytest.mark.parametrize("bad", [0, -1, "two", True, 1.5])
def test_a_bad_setting_is_one_line_naming_the_key(bad):
    with pytest.raises(ConfigError, match=r"^eval.threads must be auto or a positive number of threads, got"):
        choose_threads(bad, 0.0, "eval.threads")


def test_the_previous_count_comes_back():
    before = torch.get_num_threads()
    with restored_threads():
        torch.set_num_threads(2 if before == 1 else 1)
    assert torch.get_num_threads() == before


def test_a_training_run_records_its_threads(tmp_path):
    from conftest import SYNTHETIC, make_cfg
    from nvil.app.main import train

    metrics = train(make_cfg("train", [*SYNTHETIC, "trainer.max_steps=20"]), tmp_path / "a")
    assert metrics["threads"] == 1                                      # a 12-pixel SBN: one thread
    metrics = train(make_cfg("train", [*SYNTHETIC, "trainer.max_steps=20", "trainer.threads=64"]), tmp_path / "b")
    assert metrics["threads"] == threads.available_cores()
