"""Training prompt data: YAML, prompt files (incl. the real public files in ../shared/data), the distributed
weighted sampler (rank sharding, per-epoch reshuffle, probabilities, resume)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare

from deepgen_rl.data.prompts import DistributedPromptSampler, load_train_config, read_prompt_file
from tests.shared_data import SHARED_DATA as SHARED, needs_shared_data

ROOT = Path(__file__).resolve().parents[2]


@needs_shared_data
def test_real_public_prompt_files():
    ocr = read_prompt_file(SHARED / "unigenbench_train_data_ocr.txt")
    general = read_prompt_file(SHARED / "unigenbench_train_data_general.txt")
    core = read_prompt_file(SHARED / "corebench.txt")  # no trailing newline, some curly quotes
    dpg = read_prompt_file(SHARED / "prompts_dpgbench.jsonl")
    geneval = read_prompt_file(SHARED / "geneval_prompt.txt")  # 2 blank lines skipped
    assert (len(ocr), len(general), len(core), len(dpg), len(geneval)) == (2861, 7139, 1080, 1065, 553)
    assert all('"' in p or "“" in p for p in ocr[:50])
    csv_prompts = read_prompt_file(SHARED / "unigenbench" / "test_prompts_en.csv")
    assert len(csv_prompts) == 600


def test_seed_yaml_names_every_missing_file(tmp_path):
    (tmp_path / "deepgen_train.yaml").write_text((ROOT / "assets/rl_datasets/deepgen/deepgen_train.yaml").read_text())
    for name in ("unigenbench_train_data_ocr.txt", "unigenbench_train_data_general.txt", "corebench.txt"):
        (tmp_path / name).write_text("a prompt\n")
    with pytest.raises(FileNotFoundError) as e:
        load_train_config(tmp_path / "deepgen_train.yaml")
    msg = str(e.value)
    assert "4 prompt file(s) not found" in msg
    for missing in ("qwenimage_textrender.txt", "text_render_less.txt", "blip3o_60k.txt", "share_4o_img.txt"):
        assert missing in msg
    assert "corebench.txt" not in msg


def test_seed_yaml_weights(tmp_path):
    text = (ROOT / "assets/rl_datasets/deepgen/deepgen_train.yaml").read_text()
    (tmp_path / "t.yaml").write_text(text)
    for line in text.splitlines():
        if line.strip().startswith("path:"):
            (tmp_path / line.split(":", 1)[1].strip()).write_text("p1\np2\n")
    cfg = load_train_config(tmp_path / "t.yaml")
    assert cfg.reward_names == ["unifiedreward_think", "clip_sim", "ocr"]
    ocr = next(d for d in cfg.datasets if d.name == "unigenbench_train_data_ocr")
    assert ocr.sample_weight == 3.0 and ocr.reward_weights == {"unifiedreward_think": 0.2, "clip_sim": 0.1, "ocr": 0.7}
    core = next(d for d in cfg.datasets if d.name == "corebench")
    assert core.reward_weights == {"unifiedreward_think": 0.7, "clip_sim": 0.3}


def _mixture(tmp_path, sizes, weights, mode):
    lines = [f"sampling_mode: {mode}", "datasets:"]
    for i, (n, w) in enumerate(zip(sizes, weights)):
        (tmp_path / f"d{i}.txt").write_text("\n".join(f"d{i} prompt {j}" for j in range(n)) + "\n")
        lines += [f"  - name: d{i}", f"    path: d{i}.txt", f"    sample_weight: {w}", "    rewards:",
                  "      - brightness: 1.0"]
    (tmp_path / "m.yaml").write_text("\n".join(lines) + "\n")
    return load_train_config(tmp_path / "m.yaml")


@pytest.mark.parametrize("mode", ["sample_proportional", "weight_only"])
def test_dataset_probabilities_chi_square(tmp_path, mode):
    sizes, weights = [100, 300, 600], [3.0, 1.0, 1.0]
    cfg = _mixture(tmp_path, sizes, weights, mode)
    s = DistributedPromptSampler(cfg, 10, seed=0)
    counts = Counter()
    for _ in range(s.steps_per_epoch):
        counts.update(it.dataset for it in s.next_batch())
    observed = [counts[f"d{i}"] for i in range(3)]
    w = torch.tensor(weights) * (torch.tensor(sizes, dtype=torch.float) if mode == "sample_proportional" else 1)
    expected = (w / w.sum() * sum(observed)).tolist()
    assert chisquare(observed, expected).pvalue > 1e-3
    wrong = [sum(observed) / 3] * 3  # uniform over datasets is rejected for both modes here
    assert chisquare(observed, wrong).pvalue < 1e-6


def test_ranks_never_share_a_draw_and_epochs_reshuffle(tmp_path):
    cfg = _mixture(tmp_path, [40, 40], [1.0, 1.0], "weight_only")
    r0 = DistributedPromptSampler(cfg, 4, rank=0, world_size=2, seed=5)
    r1 = DistributedPromptSampler(cfg, 4, rank=1, world_size=2, seed=5)
    assert r0.steps_per_epoch == 10
    epoch0 = []
    for _ in range(10):
        a, b = r0.next_batch(), r1.next_batch()
        assert not {x.group_id for x in a} & {x.group_id for x in b}
        epoch0 += [(x.dataset, x.prompt_index) for x in a + b]
    # within an epoch a dataset is not repeated before it is exhausted (40 draws each in expectation)
    per_ds = Counter(epoch0)
    assert max(per_ds.values()) <= 2
    epoch1 = [(x.dataset, x.prompt_index) for _ in range(10) for x in r0.next_batch() + r1.next_batch()]
    assert r0.epoch == 1 and epoch1 != epoch0  # reshuffled
    # deterministic from the seed (independent of the process: no Python hash()); another seed differs
    fresh = [x.prompt for x in DistributedPromptSampler(cfg, 4, rank=0, world_size=2, seed=5).next_batch()]
    other = [x.prompt for x in DistributedPromptSampler(cfg, 4, rank=0, world_size=2, seed=6).next_batch()]
    assert fresh == [cfg.datasets[d].prompts[p] for d, p in [(0 if ds == "d0" else 1, i) for ds, i in epoch0[:4]]]
    assert other != fresh


def test_resume_continues_the_same_stream(tmp_path):
    cfg = _mixture(tmp_path, [30, 50], [1.0, 2.0], "sample_proportional")
    a = DistributedPromptSampler(cfg, 4, seed=9)
    for _ in range(7):
        a.next_batch()
    state = json.loads(json.dumps(a.state_dict()))  # the state is plain JSON
    rest = [[x.prompt for x in a.next_batch()] for _ in range(20)]  # 80 prompts / 4 = 20 steps: crosses an epoch
    b = DistributedPromptSampler(cfg, 4, seed=9)
    b.load_state_dict(state)
    assert [[x.prompt for x in b.next_batch()] for _ in range(20)] == rest
    with pytest.raises(ValueError, match="prompts per global step"):
        DistributedPromptSampler(cfg, 8, seed=9).load_state_dict(state)


def test_batch_larger_than_dataset_and_bad_yaml(tmp_path):
    cfg = _mixture(tmp_path, [3], [1.0], "weight_only")
    with pytest.raises(ValueError, match="smaller than one global batch"):
        DistributedPromptSampler(cfg, 4, world_size=1)
    (tmp_path / "bad.yaml").write_text("datasets:\n  - name: a\n    path: d0.txt\n    rewards:\n      - ocr: -1\n")
    with pytest.raises(ValueError, match="finite number >= 0"):
        load_train_config(tmp_path / "bad.yaml")
    (tmp_path / "bad2.yaml").write_text("sampling_mode: random\ndatasets: []\n")
    with pytest.raises(ValueError, match="sampling_mode"):
        load_train_config(tmp_path / "bad2.yaml")


def test_stream_identical_across_processes(tmp_path):
    import os
    import subprocess
    import sys

    _mixture(tmp_path, [20, 20], [1.0, 1.0], "weight_only")
    code = ("import sys; from deepgen_rl.data.prompts import *; c = load_train_config(sys.argv[1]); "
            "s = DistributedPromptSampler(c, 4, seed=3); print([x.prompt for _ in range(3) for x in s.next_batch()])")
    outs = {subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.yaml")], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": str(h)}, cwd=ROOT, check=True).stdout
            for h in (1, 2)}
    assert len(outs) == 1


GENEVAL_RECORDS = [
    {"tag": "counting", "include": [{"class": "dog", "count": 2}], "exclude": [{"class": "dog", "count": 3}],
     "prompt": "two dogs"},
    {"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a bench"},
]


def test_prompt_files_carry_their_other_fields_as_metadata(tmp_path):
    from deepgen_rl.data.prompts import read_prompt_records

    jsonl = tmp_path / "geneval.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in GENEVAL_RECORDS) + '\n\n{"caption": "a cat", "key": "7"}\n')
    prompts, metadata = read_prompt_records(jsonl)
    assert prompts == ["two dogs", "a bench", "a cat"]
    assert metadata == [{k: v for k, v in r.items() if k != "prompt"} for r in GENEVAL_RECORDS] + [{"key": "7"}]
    csv_file = tmp_path / "p.csv"
    csv_file.write_text("prompt,category,note\na red car,vehicle,\na blue bird,animal,fast\n")
    assert read_prompt_records(csv_file) == (["a red car", "a blue bird"],
                                             [{"category": "vehicle"}, {"category": "animal", "note": "fast"}])
    txt = tmp_path / "p.txt"
    txt.write_text("one\n\ntwo\n")
    assert read_prompt_records(txt) == (["one", "two"], [{}, {}])
    assert read_prompt_file(jsonl) == prompts
    clash = tmp_path / "clash.jsonl"
    clash.write_text('{"prompt": "a", "group_id": 3}\n')
    with pytest.raises(ValueError, match=r"clash.jsonl:1: field\(s\) \['group_id'\] are set by the rollout"):
        read_prompt_records(clash)


def test_sampled_prompt_items_carry_their_records_metadata(tmp_path):
    (tmp_path / "geneval.jsonl").write_text("\n".join(json.dumps(r) for r in GENEVAL_RECORDS) + "\n")
    (tmp_path / "plain.txt").write_text("p1\np2\n")
    (tmp_path / "m.yaml").write_text("datasets:\n  - name: g\n    path: geneval.jsonl\n    rewards: [geneval: 1.0]\n"
                                     "  - name: t\n    path: plain.txt\n    rewards: [brightness: 1.0]\n")
    cfg = load_train_config(tmp_path / "m.yaml")
    assert cfg.datasets[1].metadata == []  # a .txt stores no per-prompt metadata at all
    sampler = DistributedPromptSampler(cfg, prompts_per_rank=2, seed=0)
    items = [it for _ in range(6) for it in sampler.next_batch()]
    assert {it.dataset for it in items} == {"g", "t"}
    for it in items:
        if it.dataset == "g":
            record = GENEVAL_RECORDS[it.prompt_index]
            assert it.prompt == record["prompt"] and it.metadata == {k: v for k, v in record.items() if k != "prompt"}
        else:
            assert it.metadata == {}
