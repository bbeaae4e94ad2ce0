"""ZeRO-3 evaluation with uneven shards: every rank runs as many DiT forwards as rank 0 (each forward of a
partitioned DiT is a collective). The 2-process ZeRO-3 run is tests/trainer/test_distributed.py::
test_eval_uses_ema_weights_under_zero3[no-ema] (--eval_max_prompts 1: the demo_txt dataset has 1 item on 2 ranks)."""

from __future__ import annotations

import pytest
import torch

from deepgen_rl.evaluation.config import EvalDatasetSpec, EvalPrompt
from deepgen_rl.evaluation.generate import generate_eval_images, num_batches
from tests.trainer.helpers import tiny_model


class CountingDiT(torch.nn.Module):
    def __init__(self, dit):
        super().__init__()
        self.dit, self.calls = dit, 0
        self.dtype = next(dit.parameters()).dtype

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.dit(*args, **kwargs)


@pytest.mark.parametrize("items,world,bs,expected", [(1, 2, 8, 1), (3, 2, 1, 2), (5, 4, 1, 2), (8, 2, 4, 1),
                                                     (9, 2, 4, 2), (0, 2, 4, 0)])
def test_num_batches_is_rank0s_count(items, world, bs, expected):
    assert num_batches(items, world, bs) == expected
    per_rank = [len(range(r, items, world)) for r in range(world)]
    assert expected == max(-(-n // bs) for n in per_rank)


def test_uneven_shards_run_the_same_number_of_dit_forwards(tmp_path):
    model = tiny_model()
    spec = EvalDatasetSpec(name="d", path=tmp_path / "d.txt", prompts=[EvalPrompt(0, "a red square")],
                           cfg_scale=2.0, num_inference_steps=2, duplicates=3)
    calls, written = [], []
    for rank in (0, 1):  # 3 items on 2 ranks, batch 1: rank 0 has 2 batches, rank 1 one
        dit = CountingDiT(model.transformer)
        recs = generate_eval_images(model, spec, tmp_path / f"r{rank}", rank=rank, world_size=2, height=32,
                                    width=32, transformer=dit, batch_size=1, progress=False, pad_batches=True)
        calls.append(dit.calls)
        written.append(sorted(p.name for p in (tmp_path / f"r{rank}" / "d").glob("*.png")))
        assert len(recs) == len(written[-1])
    assert calls == [4, 4]  # 2 batches x 2 steps (CFG batched in one forward) on both ranks
    assert written == [["0.0.png", "0.2.png"], ["0.1.png"]]  # the padding batch writes nothing
    dit = CountingDiT(model.transformer)
    generate_eval_images(model, spec, tmp_path / "nopad", rank=1, world_size=2, height=32, width=32,
                         transformer=dit, batch_size=1, progress=False)
    assert dit.calls == 2  # a plain (unpartitioned) DiT is not padded by default
