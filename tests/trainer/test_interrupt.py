"""Ctrl-C stops a training run promptly while a reward request hangs (issue 16, item 5).

A local service on 127.0.0.1 accepts connections and never answers; the OCR reward's client would wait 120 s x 4
attempts. One SIGINT to train.sh's process group (what a terminal's Ctrl-C sends) must end the run within seconds,
with the per-rank log keeping the last lines and no half-written checkpoint left in place.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import pytest

from tests.trainer.helpers import train_sh

pytestmark = pytest.mark.slow


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


def test_one_ctrl_c_stops_training_while_a_reward_request_hangs(tmp_path):
    (tmp_path / "text.txt").write_text('A sign that says "OPEN"\nA poster that says "HELLO"\n')
    (tmp_path / "m.yaml").write_text("datasets:\n  - name: text\n    path: text.txt\n    rewards:\n"
                                     "      - ocr: 1.0\n")
    service = HungService()
    out = tmp_path / "run"
    proc = None
    try:
        proc = train_sh(out, "--max_steps", "3", "--save_steps", "1", "--reward_kwargs",
                        json.dumps({"ocr": {"url": f"http://127.0.0.1:{service.port}"}}),
                        dataset_config=str(tmp_path / "m.yaml"), popen=True)
        assert service.connected.wait(240), "the trainer never sent a reward request"
        time.sleep(0.5)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # one Ctrl-C to the whole foreground group (train.sh, tee, python)
        try:
            output, _ = proc.communicate(timeout=60)
        except Exception:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        elapsed = time.monotonic() - t0
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        service.close()
    print(f"SIGINT -> exit: {elapsed:.2f} s")
    assert elapsed < 10.0, f"took {elapsed:.1f} s to stop after Ctrl-C"
    assert proc.returncode == 130
    assert "deepgen_rl: interrupted at step 0" in output
    log = (out / "logs" / "0.log").read_text()
    assert "deepgen_rl: interrupted at step 0; last complete checkpoint: none" in log  # the tee kept the last line
    assert not list(out.glob("checkpoint-*"))  # nothing half-written left as a checkpoint


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
