"""Save and resume walk the same ``stateful_parts`` mapping: every entry written is restored (by file suffix: JSON,
safetensors, torch), a required entry missing on resume is an error naming it, an optional one is skipped; the
trainer's own mapping names every piece of training state. No model: a Linear stands in for the DiT."""

from __future__ import annotations

import pytest
import torch

from deepgen_rl.checkpoints.training_state import (DictState, Part, RngState, TrainingStateView,
                                                   load_training_checkpoint, save_training_checkpoint)


class Box:
    def __init__(self, state):
        self.state = state
        self.loaded = None

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.loaded = state


def _view(parts, dit=None):
    return TrainingStateView(dit=dit or torch.nn.Linear(3, 2), engine=None, zero_stage=0, rank=0, world=1,
                             parts=parts)


def _save(tmp_path, parts, dit):
    return save_training_checkpoint(_view(parts, dit), tmp_path, 7, args_json="{}", run_configs={},
                                    save_total_limit=None, has_ema=False)


def test_every_part_saved_is_restored_by_suffix(tmp_path):
    dit = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(dit.parameters(), lr=0.1)
    dit(torch.ones(1, 3)).sum().backward()
    opt.step()
    counters = {"optimizer_steps": 3}
    saved = {"optimizer.pt": opt, "a.json": Box({"x": 1, "y": [1, 2]}), "b.pt": Box({"t": torch.arange(4)}),
             "c.safetensors": Box({"w": torch.full((2, 2), 0.5)}), "counters.json": DictState(counters),
             "rng_state.pt": RngState()}
    path = _save(tmp_path, saved, dit)
    assert (path / "rng_state_rank0.pt").is_file()  # per-rank parts carry the rank
    expected_rng = torch.get_rng_state()
    torch.rand(5)  # move the RNG on; resume must bring it back

    new_dit = torch.nn.Linear(3, 2)
    new_opt = torch.optim.AdamW(new_dit.parameters(), lr=0.1)
    new_counters = {"optimizer_steps": 0}
    loaded = {"optimizer.pt": new_opt, "a.json": Box(None), "b.pt": Box(None), "c.safetensors": Box(None),
              "counters.json": DictState(new_counters), "rng_state.pt": RngState()}
    assert load_training_checkpoint(_view(loaded, new_dit), path) == 7
    assert loaded["a.json"].loaded == {"x": 1, "y": [1, 2]}
    assert torch.equal(loaded["b.pt"].loaded["t"], torch.arange(4))
    assert torch.equal(loaded["c.safetensors"].loaded["w"], torch.full((2, 2), 0.5))
    assert new_counters == {"optimizer_steps": 3}
    assert torch.equal(torch.get_rng_state(), expected_rng)
    assert all(torch.equal(a, b) for a, b in zip(dit.parameters(), new_dit.parameters()))
    assert torch.equal(new_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_missing_required_part_names_it_and_optional_is_skipped(tmp_path):
    dit = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(dit.parameters(), lr=0.1)
    path = _save(tmp_path, {"optimizer.pt": opt}, dit)
    skipped = Part(lambda: None, lambda s: pytest.fail("an absent optional part must not be loaded"), optional=True)
    load_training_checkpoint(_view({"optimizer.pt": opt, "extra.pt": skipped}, dit), path)
    with pytest.raises(ValueError, match="has no EMA weights"):
        load_training_checkpoint(_view({"optimizer.pt": opt, "ema_dit.safetensors": Part(
            lambda: {}, lambda s: None, missing_message="has no EMA weights but --ema_decay > 0")}, dit), path)
    with pytest.raises(ValueError, match="has no new_state.json"):
        load_training_checkpoint(_view({"optimizer.pt": opt, "new_state.json": Box({})}, dit), path)


def test_the_trainers_mapping_names_every_piece_of_training_state():
    from types import SimpleNamespace

    from deepgen_rl.trainer.grpo_trainer import DeepGenGRPOTrainer

    fake = SimpleNamespace(engine=None, optimizer=object(), lr_scheduler=object(), ema={"w": torch.zeros(1)},
                           sampler=object(), sftaux=Box({}), counters={}, state=None, device="cpu")
    names = set(DeepGenGRPOTrainer.stateful_parts(fake))
    assert names == {"optimizer.pt", "scheduler.pt", "ema_dit.safetensors", "rng_state.pt", "sampler_state.json",
                     "sftaux_state.pt", "counters.json", "trainer_state.json"}
    fake.engine, fake.ema, fake.sftaux = object(), None, None  # DeepSpeed keeps optimizer + scheduler itself
    assert set(DeepGenGRPOTrainer.stateful_parts(fake)) == {"rng_state.pt", "sampler_state.json", "counters.json",
                                                             "trainer_state.json"}
