"""``--max_train_minutes``: the budget's arithmetic on a fake clock, the trainer stopping at the step the budget
allows (then evaluating and saving it, with the weights of a ``--max_steps`` run of that length), and the ranks'
agreement (``dist.any_rank`` in two gloo processes)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from deepgen_rl.services.ocr.launch import free_port
from deepgen_rl.trainer.time_budget import TimeBudget
from tests.trainer.helpers import ROOT, run_inprocess, subprocess_env


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ten_second_steps(monkeypatch) -> FakeClock:
    """The trainer's budget reads a fake clock that every GRPO step advances by 10 s (the real step still runs)."""
    from deepgen_rl.trainer import grpo_trainer
    from deepgen_rl.trainer.grpo_trainer import DeepGenGRPOTrainer

    clock = FakeClock()
    monkeypatch.setattr(grpo_trainer, "TimeBudget", lambda minutes, **kw: TimeBudget(minutes, clock=clock, **kw))
    step = DeepGenGRPOTrainer.grpo_step

    def ten_seconds(self, s):
        out = step(self, s)
        clock.now += 10.0
        return out

    monkeypatch.setattr(DeepGenGRPOTrainer, "grpo_step", ten_seconds)
    return clock


def test_budget_stops_when_elapsed_plus_the_mean_of_the_last_steps_passes_it():
    clock = FakeClock()
    b = TimeBudget(1.0, clock=clock, window=2)  # 60 s
    assert b.active and not b.next_step_would_overrun()  # no step timed yet: no estimate, no stop
    for seconds, overrun in [(10, False), (20, False), (30, True)]:
        clock.now += seconds
        b.step_done(seconds)
        assert b.next_step_would_overrun() is overrun, seconds
    # elapsed 60 after three steps; the estimate is the mean of the last two (20, 30), not of all three
    assert b.elapsed_s() == 60 and b.step_estimate_s() == 25
    clock2 = FakeClock()
    b2 = TimeBudget(0.5, clock=clock2)
    clock2.now += 15
    b2.step_done(15)
    assert not b2.next_step_would_overrun()  # 15 + 15 = 30: ending exactly at the budget is within it
    clock2.now += 0.001
    assert b2.next_step_would_overrun()


def test_budget_keeps_room_for_the_longest_eval_and_leaves_evals_out_of_the_step_estimate():
    clock = FakeClock()
    b = TimeBudget(1.0, clock=clock, window=2)  # 60 s
    clock.now += 5  # a start eval of 5 s
    b.eval_done(5)
    clock.now += 10
    b.step_done(10)
    assert not b.next_step_would_overrun()  # 15 + 10 + 5 = 30
    clock.now += 12 + 8  # a step of 12 s, then an eval_freq eval of 8 s (recorded apart)
    b.step_done(12)
    b.eval_done(8)
    assert b.step_estimate_s() == 11 and b.eval_reserve_s == 8
    assert not b.next_step_would_overrun()  # 35 + 11 + 8 = 54
    clock.now += 10
    b.step_done(10)
    # 45 + 11 + 8 = 64 > 60; without the eval's reserve (45 + 11 = 56) the step would run and its eval end at 64
    assert b.next_step_would_overrun()
    b.eval_done(3)
    assert b.eval_reserve_s == 8  # the longest eval is kept


def test_budget_counts_from_a_given_unix_time():
    clock = FakeClock()  # also the wall clock here
    b = TimeBudget(1.0, clock=clock, start_unix=clock.now - 30, wall=clock)
    assert b.elapsed_s() == 30
    clock.now += 20
    b.step_done(20)
    assert b.elapsed_s() == 50 and b.next_step_would_overrun()  # 50 + 20 > 60
    assert TimeBudget(1.0, clock=clock, start_unix=clock.now + 0.5, wall=clock).elapsed_s() == 0  # clock jitter
    with pytest.raises(ValueError, match="in the future"):
        TimeBudget(1.0, clock=clock, start_unix=clock.now + 10, wall=clock)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="Unix time"):
            TimeBudget(1.0, clock=clock, start_unix=bad, wall=clock)


def test_no_budget_never_stops_and_bad_budgets_are_refused():
    clock = FakeClock()
    b = TimeBudget(0.0, clock=clock)
    clock.now += 1e9
    b.step_done(1e9)
    assert not b.active and not b.next_step_would_overrun()
    with pytest.raises(ValueError, match=">= 0 minutes"):
        TimeBudget(-1.0)
    with pytest.raises(ValueError, match=">= 0 minutes"):
        TimeBudget(float("nan"))
    with pytest.raises(ValueError, match="window"):
        TimeBudget(1.0, window=0)


def test_max_train_minutes_is_validated():
    from deepgen_rl.config import GRPOConfig

    with pytest.raises(ValueError, match="--max_train_minutes must be >= 0"):
        GRPOConfig(output_dir="/tmp/x", report_to="none", max_train_minutes=-0.5)
    with pytest.raises(ValueError, match="max_train_minutes"):
        GRPOConfig(output_dir="/tmp/x", report_to="none", max_train_minutes=float("nan"))
    with pytest.raises(ValueError, match="--max_train_minutes_from must be a Unix time"):
        GRPOConfig(output_dir="/tmp/x", report_to="none", max_train_minutes_from=-1.0)
    with pytest.raises(ValueError, match="not in the future"):
        GRPOConfig(output_dir="/tmp/x", report_to="none", max_train_minutes_from=time.time() + 3600)


def test_trainer_stops_at_the_budget_then_evaluates_and_saves_the_weights_of_a_run_that_long(tmp_path, monkeypatch,
                                                                                              caplog):
    from deepgen_rl.trainer.grpo_trainer import DeepGenGRPOTrainer

    ten_second_steps(monkeypatch)  # the budget is 0.5 minutes
    evals = []
    monkeypatch.setattr(DeepGenGRPOTrainer, "_maybe_eval",
                        lambda self, s, force=False: evals.append((s, force)))
    # after step 1: 10 + 10 <= 30; after 2: 20 + 10 <= 30; after 3: 30 + 10 > 30 -> stop after step 3 of 6
    with caplog.at_level(logging.WARNING):
        trainer, history = run_inprocess(tmp_path / "budget", max_steps=6, max_train_minutes=0.5, eval_freq=2)
    assert len(history) == 3 and trainer.state.global_step == 3
    assert evals == [(1, False), (2, False), (3, False), (3, True)]  # step 3 is not an eval_freq step: forced
    assert "stopping after step 3 of 6" in caplog.text
    lines = (tmp_path / "budget" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(ln)["step"] for ln in lines] == [1, 2, 3]
    assert (tmp_path / "budget" / "checkpoint-3" / "dit.safetensors").exists()
    # the same run with --max_steps 3 and no budget trains the same weights
    plain, _ = run_inprocess(tmp_path / "plain", max_steps=3, eval_freq=2)
    a = load_file(str(tmp_path / "budget" / "checkpoint-3" / "dit.safetensors"))
    b = load_file(str(tmp_path / "plain" / "checkpoint-3" / "dit.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    # without a budget the same fake clock never stops the run
    evals.clear()
    _, history = run_inprocess(tmp_path / "none", max_steps=4, eval_freq=2)
    assert len(history) == 4 and evals == [(1, False), (2, False), (3, False), (4, False)]


def test_trainer_keeps_room_for_the_eval_after_its_last_step(tmp_path, monkeypatch):
    from deepgen_rl.trainer.grpo_trainer import DeepGenGRPOTrainer

    clock = ten_second_steps(monkeypatch)  # evals take 5 fake seconds; the budget is 0.75 minutes (45 s)
    evals = []

    def five_second_eval(self, s, force=False):
        if not (force or s % self.args.eval_freq == 0):
            return False
        clock.now += 5.0
        evals.append((s, force, clock.now - 100.0))
        return True

    monkeypatch.setattr(DeepGenGRPOTrainer, "_maybe_eval", five_second_eval)
    # start eval 0-5 s; steps end at 15, 25, 35; after step 3: 35 + 10 + 5 = 50 > 45, so it stops there and its
    # forced eval ends at 40 s (counting the start eval's 5 s and the next step only, 35 + 10 = 45, would have run
    # step 4 and ended its eval at 50 s)
    _, history = run_inprocess(tmp_path / "budget", max_steps=6, max_train_minutes=0.75, eval_freq=100,
                               eval_at_start=True)
    assert len(history) == 3
    assert evals == [(0, True, 5.0), (3, True, 40.0)]


def test_one_rank_out_of_time_stops_every_rank(tmp_path):
    code = ("import json, os, torch\n"
            "torch.distributed.init_process_group(backend='gloo')\n"
            "from deepgen_rl.utils import dist\n"
            "r = dist.rank()\n"
            "out = [dist.any_rank(r == 1), dist.any_rank(False), dist.any_rank(True)]\n"
            "print('ANY ' + json.dumps(out), flush=True)\n"
            "torch.distributed.destroy_process_group()\n")
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=subprocess_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                                            MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                                                            CUDA_VISIBLE_DEVICES=""))
             for r in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        lines = [ln for ln in out.splitlines() if ln.startswith("ANY ")]
        assert p.returncode == 0 and lines, err[-3000:]
        assert json.loads(lines[-1][4:]) == [True, False, True]
