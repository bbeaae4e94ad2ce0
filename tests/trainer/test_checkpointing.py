"""Checkpoint directory protocol: completeness, atomic replacement, crash recovery, rotation."""

from __future__ import annotations

import json

from deepgen_rl.checkpoints import rl_format as ckpt


def _write_tmp(out, step, payload="x", with_meta=False):
    tmp = ckpt.tmp_dir_for(out, step)
    tmp.mkdir(parents=True)
    (tmp / "dit.safetensors").write_text(payload)
    if with_meta:
        (tmp / ckpt.META_FILE).write_text(json.dumps({"format": ckpt.CHECKPOINT_FORMAT, "global_step": step}))
    return tmp


def test_finalize_and_latest(tmp_path):
    for step in (1, 2, 10):
        ckpt.finalize(_write_tmp(tmp_path, step), ckpt.final_dir_for(tmp_path, step), {"global_step": step})
    _write_tmp(tmp_path, 11)  # partial: no meta
    (tmp_path / "checkpoint-12").mkdir()  # no meta: incomplete
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["checkpoint-1", "checkpoint-2", "checkpoint-10"]
    assert ckpt.latest_checkpoint(tmp_path).name == "checkpoint-10"
    assert json.loads((tmp_path / "checkpoint-10" / ckpt.META_FILE).read_text())["format"] == ckpt.CHECKPOINT_FORMAT


def test_rewriting_a_step_replaces_it(tmp_path):
    final = ckpt.final_dir_for(tmp_path, 3)
    ckpt.finalize(_write_tmp(tmp_path, 3, "old"), final, {"global_step": 3})
    ckpt.finalize(_write_tmp(tmp_path, 3, "new"), final, {"global_step": 3})
    assert (final / "dit.safetensors").read_text() == "new"
    assert not final.with_name("checkpoint-3.old").exists() and not ckpt.tmp_dir_for(tmp_path, 3).exists()


def test_crash_recovery(tmp_path):
    # partial tmp: deleted; complete tmp whose rename was missed: promoted
    _write_tmp(tmp_path, 1)
    _write_tmp(tmp_path, 2, "done", with_meta=True)
    # crash between "final -> .old" and "tmp -> final": the .old copy is restored
    ckpt.finalize(_write_tmp(tmp_path, 3, "v1"), ckpt.final_dir_for(tmp_path, 3), {"global_step": 3})
    (tmp_path / "checkpoint-3").rename(tmp_path / "checkpoint-3.old")
    ckpt.remove_stale_tmp(tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["checkpoint-2", "checkpoint-3"]
    assert (tmp_path / "checkpoint-2" / "dit.safetensors").read_text() == "done"
    assert (tmp_path / "checkpoint-3" / "dit.safetensors").read_text() == "v1"
    assert ckpt.latest_checkpoint(tmp_path).name == "checkpoint-3"


def test_rotate_keeps_newest(tmp_path):
    for step in (5, 10, 15, 20):
        ckpt.finalize(_write_tmp(tmp_path, step), ckpt.final_dir_for(tmp_path, step), {"global_step": step})
    removed = ckpt.rotate(tmp_path, 2)
    assert [p.name for p in removed] == ["checkpoint-5", "checkpoint-10"]
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["checkpoint-15", "checkpoint-20"]
    assert ckpt.rotate(tmp_path, None) == []
