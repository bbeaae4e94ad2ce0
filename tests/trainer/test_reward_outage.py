"""Reward service outage during training: the OCR service is stopped mid-run and restarted. Training goes on,
failures are counted and excluded, no sample gets a fabricated score, and a call retried across the restart
succeeds."""

from __future__ import annotations

import threading
import time

import pytest
from deepgen_rl.rewards import get_reward
from deepgen_rl.services.ocr.launch import OcrServiceProcess, free_port, render_text_image
from tests.trainer.helpers import run_inprocess

pytestmark = pytest.mark.slow


def _mixture(tmp_path):
    (tmp_path / "text.txt").write_text('A sign that says "OPEN"\nA poster that says "HELLO"\n')
    (tmp_path / "m.yaml").write_text("datasets:\n  - name: text\n    path: text.txt\n    rewards:\n"
                                     "      - brightness: 0.5\n      - ocr: 0.5\n")
    return str(tmp_path / "m.yaml")


def test_training_survives_ocr_outage(tmp_path):
    port = free_port()
    service = OcrServiceProcess(port=port).start()
    ocr = get_reward("ocr", url=service.url, max_retries=1, backoff_s=0.1, timeout_s=30)
    rewards = {"brightness": get_reward("brightness"), "ocr": ocr}

    from deepgen_rl.trainer.grpo_trainer import DeepGenGRPOTrainer

    orig_step = DeepGenGRPOTrainer.grpo_step
    state = {"service": service}

    def step_with_outage(self, step):
        if step == 1:
            state["service"].stop()  # outage during steps 2 and 3
        if step == 3:
            state["service"] = OcrServiceProcess(port=port).start()  # back on the same port for step 4
        return orig_step(self, step)

    DeepGenGRPOTrainer.grpo_step = step_with_outage
    try:
        _, history = run_inprocess(tmp_path / "out", dataset_config=_mixture(tmp_path), rewards=rewards,
                                   max_steps=4, rollout_n=4, rollout_micro_batch_size=8)
    finally:
        DeepGenGRPOTrainer.grpo_step = orig_step
        state["service"].stop()
    assert len(history) == 4
    for i, m in enumerate(history):
        assert m["reward_calls/ocr"] == 8
        if i in (1, 2):
            assert m["reward_failures/ocr"] == 8           # every OCR request failed and was counted
            assert m["reward/ocr"] != m["reward/ocr"]      # NaN: no OCR score exists, none was made up
            assert m["advantage/num_partial_reward"] == 8  # advantages used the brightness part only
            assert m["reward/brightness"] == m["reward/brightness"]
        else:
            assert m["reward_failures/ocr"] == 0 and 0.0 <= m["reward/ocr"] <= 1.0
    assert [m["train/optimizer_steps"] for m in history] == [1.0, 2.0, 3.0, 4.0]


def test_retry_succeeds_after_service_restart(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    image = render_text_image("OPEN")
    ocr = get_reward("ocr", url=url, max_retries=8, backoff_s=0.5, max_backoff_s=2.0, timeout_s=30)
    holder = {}

    def start_later():
        time.sleep(1.0)  # the first attempts hit a closed port
        holder["svc"] = OcrServiceProcess(port=port).start()

    t = threading.Thread(target=start_later)
    t.start()
    try:
        out = ocr([image], ['A sign that says "OPEN"'], [{}])
    finally:
        t.join()
        holder["svc"].stop()
    assert bool(out.valid[0]) and float(out.scores[0]) >= 0.9
