"""Ctrl-C stops a training run promptly while a reward request hangs (issue 16, item 5).

A local service on 127.0.0.1 accepts connections and never answers; the OCR reward's client would wait 120 s x 4
attempts. One SIGINT to train.sh's process group (what a terminal's Ctrl-C sends) must end the run within seconds,
with the per-rank log keeping the last lines and no half-written checkpoint left in place: single process, under
torchrun with 2 gloo ranks, and during a checkpoint save (which leaves only ``checkpoint-N.tmp``, cleaned up by the
resume).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import psutil
import pytest

from tests.trainer.helpers import read_metrics, train_sh

# serial: bounds on how fast a run stops; scripts/test.sh runs these alone, not beside another xdist worker's test
pytestmark = [pytest.mark.slow, pytest.mark.serial]

# Ctrl-C -> every process of the run gone. The issue asks for ~5 s. Measured on a 2-core CPU machine shared with
# other jobs (load 2-7.5): 0.21-0.25 s for one process with a hung reward request; under torchrun 0.02-0.04 s for
# both ranks and 0.25-0.55 s for their rank_tee wrappers and log tees; 0.23-0.30 s during a checkpoint save. 6 s =
# the 5 s plus 1 s for CI noise; far below the minutes a join of the reward threads (120 s x 4 attempts) takes.
STOP_BOUND_S = 6.0
# torchrun itself exits 2.0-4.2 s after the Ctrl-C (measured as above), 2-3.5 s after its last rank: its own
# teardown and SignalException traceback, not our code. Bounded separately, with a wider CI margin.
TORCHRUN_EXIT_BOUND_S = 10.0


class HungService:
    """Accepts TCP connections on 127.0.0.1 and never sends a byte."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connected = threading.Event()
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self._conns.append(conn)  # held open, never answered
            self.connected.set()

    def close(self):
        self._stop.set()
        self._thread.join(5)
        for c in self._conns:
            c.close()
        self.sock.close()


def _ocr_dataset(tmp_path, prompts: int = 2) -> str:
    texts = ["OPEN", "HELLO", "EXIT", "SALE"][:prompts]
    (tmp_path / "text.txt").write_text("".join(f'A sign that says "{t}"\n' for t in texts))
    (tmp_path / "m.yaml").write_text("datasets:\n  - name: text\n    path: text.txt\n    rewards:\n"
                                     "      - ocr: 1.0\n")
    return str(tmp_path / "m.yaml")


def settled(condition, seconds: float):
    """A readiness check: ``condition()``, then ``seconds`` more for the run to be well inside that state."""
    return lambda: condition() and (time.sleep(seconds) or True)


def ctrl_c(proc, ready) -> tuple[float, dict[str, float], str, list]:
    """Wait for ``ready()``, then send ONE SIGINT to the run's foreground process group (as a terminal's Ctrl-C
    does: train.sh exec's python or torchrun; torchrun's workers live in their own sessions and get it from torchrun).

    Returns (seconds until every process of the run had exited, ``{"pid command line": seconds until that process
    exited}``, the run's output, the processes still alive 30 s later, which are then killed).
    """
    deadline = time.monotonic() + 300
    while not ready():
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "the run never reached the point to interrupt"
        time.sleep(0.1)
    tree = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    names = {p.pid: " ".join(p.cmdline()) for p in tree}
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.communicate()[0]), daemon=True)
    reader.start()

    def running(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    gone: dict[str, float] = {}
    alive = list(tree)
    while alive and time.monotonic() - t0 < 30:
        for p in [p for p in alive if not running(p)]:
            gone[f"{p.pid} {names[p.pid]}"] = time.monotonic() - t0
            alive.remove(p)
        time.sleep(0.02)
    for p in alive:  # never leave a stray rank behind, even when the test fails
        p.kill()
    reader.join(60)
    assert box, "train.sh's output never closed"
    return (max(gone.values()) if gone else float("nan")), gone, box[0], alive


def test_one_ctrl_c_stops_training_while_a_reward_request_hangs(tmp_path):
    service = HungService()
    out = tmp_path / "run"
    proc = None
    try:
        proc = train_sh(out, "--max_steps", "3", "--save_steps", "1", "--reward_kwargs",
                        json.dumps({"ocr": {"url": f"http://127.0.0.1:{service.port}"}}),
                        dataset_config=_ocr_dataset(tmp_path), popen=True)
        all_gone, gone, output, alive = ctrl_c(proc, settled(service.connected.is_set, 0.5))
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        service.close()
    print(f"SIGINT -> every process gone: {all_gone:.2f} s")
    assert not alive and all_gone < STOP_BOUND_S, f"took {all_gone:.1f} s to stop after Ctrl-C: {gone}"
    assert proc.returncode == 130
    assert "deepgen_rl: interrupted at step 0" in output
    log = (out / "logs" / "0.log").read_text()
    assert "deepgen_rl: interrupted at step 0; last complete checkpoint: none" in log  # the tee kept the last line
    assert not list(out.glob("checkpoint-*"))  # nothing half-written left as a checkpoint


def test_one_ctrl_c_stops_both_torchrun_ranks_while_reward_requests_hang(tmp_path):
    """scripts/train.sh with NGPUS=2 on the CPU (torchrun, gloo): torchrun forwards the SIGINT to each rank's process
    group; every rank stops, says so, and its own log (logs/<rank>.log) keeps that last line."""
    service = HungService()
    out = tmp_path / "run"
    proc = None
    try:
        proc = train_sh(out, "--max_steps", "3", "--save_steps", "1", "--reward_kwargs",
                        json.dumps({"ocr": {"url": f"http://127.0.0.1:{service.port}"}}),
                        dataset_config=_ocr_dataset(tmp_path, prompts=4), ngpus=2, popen=True)  # 2 per rank
        # both ranks have sent their reward requests (each rank opens at least one connection)
        all_gone, gone, output, alive = ctrl_c(proc, settled(lambda: len(service._conns) >= 2, 1.0))
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        service.close()
    ranks = {k: t for k, t in gone.items() if "-m deepgen_rl.grpo_deepgen" in k and "rank_tee" not in k
             and "torchrun" not in k}
    per_rank = max(t for k, t in gone.items() if "torchrun" not in k)  # the ranks, their wrappers and tees
    print(f"2 ranks: SIGINT -> both ranks gone: {max(ranks.values()):.2f} s, their wrappers and log tees: "
          f"{per_rank:.2f} s, torchrun: {all_gone:.2f} s")
    assert not alive and len(ranks) == 2
    assert per_rank < STOP_BOUND_S, f"took {per_rank:.1f} s for the ranks to stop after Ctrl-C: {gone}"
    assert all_gone < TORCHRUN_EXIT_BOUND_S, f"torchrun took {all_gone:.1f} s to exit: {gone}"
    assert proc.returncode != 0
    assert output.count("deepgen_rl: interrupted at step 0") == 2, output[-3000:]
    for rank in (0, 1):
        log = (out / "logs" / f"{rank}.log").read_text()
        last = [ln for ln in log.splitlines() if ln.strip()][-1]
        assert last.startswith("deepgen_rl: interrupted at step 0; last complete checkpoint: none"), (rank, last)
    assert not list(out.glob("checkpoint-*"))


def test_ctrl_c_during_a_checkpoint_save_leaves_only_tmp_and_resume_cleans_it(tmp_path):
    """The save of checkpoint-2 is held open (--debug_checkpoint_delay_s, the trainer's test hook: rank 0 sleeps with
    a WRITING marker in checkpoint-2.tmp before the rename); one Ctrl-C then stops the run at once, leaving
    checkpoint-1 complete and checkpoint-2 only as .tmp. The resume removes the .tmp, continues from checkpoint-1 and
    metrics.jsonl holds each step once."""
    out = tmp_path / "run"
    proc = None
    try:
        proc = train_sh(out, "--max_steps", "3", "--save_steps", "1", "--debug_checkpoint_delay_s", "5", popen=True)
        marker = out / "checkpoint-2.tmp" / "WRITING"
        all_gone, gone, output, alive = ctrl_c(proc, marker.exists)
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    print(f"during a save: SIGINT -> every process gone: {all_gone:.2f} s")
    assert not alive and all_gone < STOP_BOUND_S, gone
    assert proc.returncode == 130
    assert "deepgen_rl: interrupted at step 2; last complete checkpoint: checkpoint-1" in output
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2.tmp"]
    assert (out / "checkpoint-1" / "checkpoint_meta.json").is_file()
    assert not (out / "checkpoint-2.tmp" / "checkpoint_meta.json").exists()  # never mistaken for a complete one

    resumed = train_sh(out, "--max_steps", "3", "--save_steps", "1")
    log = resumed.stdout + resumed.stderr
    assert "checkpoint-1 (step 1)" in log
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert all((out / f"checkpoint-{n}" / "checkpoint_meta.json").is_file() for n in (1, 2, 3))
    assert [m["step"] for m in read_metrics(out)] == [1, 2, 3]


def test_daemon_executor_never_holds_up_exit():
    from deepgen_rl.trainer.reward_workers import DaemonExecutor

    release = threading.Event()
    pool = DaemonExecutor(max_workers=1, thread_name_prefix="t")
    running = pool.submit(release.wait, 30)
    queued = pool.submit(lambda: 1)
    assert pool.submit(lambda x: x * 2, 21) is not None
    time.sleep(0.2)
    t0 = time.monotonic()
    pool.shutdown(wait=False, cancel_futures=True)
    assert time.monotonic() - t0 < 0.5
    assert queued.cancelled() and not running.done()
    assert all(t.daemon for t in pool._threads)  # the interpreter does not join them at exit
    release.set()
    assert running.result(timeout=5) is True
    with pytest.raises(RuntimeError):
        pool.submit(lambda: 0)
