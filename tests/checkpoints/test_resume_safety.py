"""A run's weights are never lost (issue 16, items 1-4), through ``grpo_deepgen.main`` in-process on the tiny model:

- the final weights are written even where a ``checkpoint-N`` folder already exists (incomplete or from another run);
- ``--no_auto_resume`` in a used folder refuses with one line, or moves the old run aside with
  ``--overwrite_output_dir``;
- an unreadable checkpoint (meta, optimizer, DiT, sampler state) is moved aside, never deleted, and training resumes
  from the newest readable one before it; ``metrics.jsonl`` never holds a step twice;
- a run whose every update was skipped does not exit 0.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.helpers import DEMO_PROGRAMMATIC, TINY_ARGS, TINY_CONFIG, read_metrics

pytestmark = pytest.mark.slow


def _argv(out, **over) -> list[str]:
    values = {**TINY_ARGS, "eval_freq": 0, "max_steps": 2, **over}
    argv = ["--model_config", TINY_CONFIG, "--dataset_config", DEMO_PROGRAMMATIC, "--output_dir", str(out)]
    for k, v in values.items():
        argv += [f"--{k}", str(v)]
    return argv


def _main(out, **over):
    from deepgen_rl.grpo_deepgen import main

    return main(_argv(out, **over))


def _exit_code(out, **over) -> int:
    with pytest.raises(SystemExit) as e:
        _main(out, **over)
    return e.value.code


def _last_stderr_line(capfd) -> str:
    lines = [x for x in capfd.readouterr().err.splitlines() if x.strip()]
    return lines[-1]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 2-step run that saved checkpoint-1 and checkpoint-2."""
    out = tmp_path_factory.mktemp("run") / "out"
    _main(out, save_steps=1)
    assert (out / "checkpoint-2" / "checkpoint_meta.json").is_file()
    return out


def _copy(finished_run, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    return out


def test_final_weights_replace_an_incomplete_folder(tmp_path):
    out = tmp_path / "out"
    stale = out / "checkpoint-2"
    stale.mkdir(parents=True)
    (stale / "dit.safetensors").write_text("left by a crashed copy")  # no meta: incomplete
    trainer = _main(out)
    meta = json.loads((out / "checkpoint-2" / "checkpoint_meta.json").read_text())
    assert meta["global_step"] == 2
    saved = load_file(str(out / "checkpoint-2" / "dit.safetensors"))
    for name, p in trainer.dit_module.state_dict().items():
        assert torch.equal(saved[name], p.detach().float()), name
    # the stale folder was moved aside, not deleted
    assert (out / "checkpoint-2.corrupt" / "dit.safetensors").read_text() == "left by a crashed copy"


def test_no_auto_resume_refuses_a_folder_with_another_runs_checkpoints(finished_run, tmp_path, capfd):
    out = _copy(finished_run, tmp_path)
    before = (out / "checkpoint-2" / "dit.safetensors").read_bytes()
    capfd.readouterr()
    assert _exit_code(out, auto_resume=False, seed=7) == 2
    line = _last_stderr_line(capfd)
    assert line.startswith("deepgen_rl: error: --output_dir") and "--overwrite_output_dir" in line
    assert (out / "checkpoint-2" / "dit.safetensors").read_bytes() == before


def test_overwrite_output_dir_writes_the_new_runs_final_weights(finished_run, tmp_path):
    out = _copy(finished_run, tmp_path)
    before = (out / "checkpoint-2" / "dit.safetensors").read_bytes()
    trainer = _main(out, auto_resume=False, overwrite_output_dir=True, seed=7)
    saved = load_file(str(out / "checkpoint-2" / "dit.safetensors"))
    for name, p in trainer.dit_module.state_dict().items():
        assert torch.equal(saved[name], p.detach().float()), name
    assert (out / "checkpoint-2" / "dit.safetensors").read_bytes() != before
    (previous,) = out.glob("previous_run_*")
    assert (previous / "checkpoint-2" / "dit.safetensors").read_bytes() == before  # the old run is kept
    assert [m["step"] for m in read_metrics(out)] == [1, 2]


@pytest.mark.parametrize("max_steps", [2, 4])
def test_truncated_meta_resumes_from_the_previous_checkpoint(finished_run, tmp_path, caplog, max_steps):
    out = _copy(finished_run, tmp_path)
    meta = out / "checkpoint-2" / "checkpoint_meta.json"
    meta.write_bytes(meta.read_bytes()[:10])
    _main(out, max_steps=max_steps)
    assert "checkpoint-2 is unusable" in caplog.text and "resumed from" in caplog.text
    assert "checkpoint-1 (step 1)" in caplog.text
    assert len((out / "checkpoint-2.corrupt" / "checkpoint_meta.json").read_bytes()) == 10  # kept, not deleted
    final = json.loads((out / f"checkpoint-{max_steps}" / "checkpoint_meta.json").read_text())
    assert final["global_step"] == max_steps  # with --max_steps 2 the redone step's weights are saved again
    steps = [m["step"] for m in read_metrics(out)]
    assert steps == list(range(1, max_steps + 1))  # step 2 was redone, and logged once


def _truncate(path):
    path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 2)])


def _garbage(path):
    path.write_bytes(b"\x00\x01not a file of this kind")


@pytest.mark.parametrize("name,damage", [("optimizer.pt", _truncate), ("dit.safetensors", _truncate),
                                         ("sampler_state.json", _garbage)])
def test_unreadable_file_falls_back_and_explicit_resume_names_it(finished_run, tmp_path, caplog, capfd, name,
                                                                   damage):
    out = _copy(finished_run, tmp_path)
    damage(out / "checkpoint-2" / name)
    # explicit: one line naming the file, before the model is built
    capfd.readouterr()
    assert _exit_code(out, resume_from_checkpoint=str(out / "checkpoint-2")) == 2
    line = _last_stderr_line(capfd)
    assert line.startswith("deepgen_rl: error: --resume_from_checkpoint") and name in line
    assert "older checkpoint" in line
    # automatic: the damaged folder is moved aside and step 2 is redone from checkpoint-1
    _main(out)
    assert f"checkpoint-2/{name}" in caplog.text and "moved aside to checkpoint-2.corrupt" in caplog.text
    assert (out / "checkpoint-2.corrupt" / name).is_file()
    assert json.loads((out / "checkpoint-2" / "checkpoint_meta.json").read_text())["global_step"] == 2
    assert [m["step"] for m in read_metrics(out)] == [1, 2]


def test_a_run_whose_every_update_was_skipped_exits_1(tmp_path, monkeypatch, capfd):
    from deepgen_rl.trainer import grpo_trainer

    orig = grpo_trainer.policy_piece_loss

    def nan_loss(*a, **k):
        loss, stats = orig(*a, **k)
        return loss * float("nan"), stats

    monkeypatch.setattr(grpo_trainer, "policy_piece_loss", nan_loss)
    capfd.readouterr()
    assert _exit_code(tmp_path / "out", max_steps=1) == 1
    err = capfd.readouterr().err
    assert "0 optimizer update(s) applied, 1 skipped" in err
    assert "deepgen_rl: error: every one of this run's 1 update(s) was skipped" in err
