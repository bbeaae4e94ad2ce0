"""Training prompt data: the dataset YAML, prompt files, and the distributed weighted prompt sampler.

YAML format (README.md#training-data)::

    sampling_mode: sample_proportional   # or weight_only
    datasets:
      - name: ocr_prompts
        path: prompts_ocr.txt            # relative to the YAML file
        sample_weight: 3.0
        rewards:
          - ocr: 0.7
          - clip_sim: 0.3

``sample_proportional``: P(dataset) ∝ len(dataset) · sample_weight (a weight of 2 doubles the chance relative to
uniform sampling over all prompts). ``weight_only``: P(dataset) ∝ sample_weight, whatever its size.
Prompt files: ``.txt`` (one prompt per line, blank lines skipped), ``.jsonl`` (``prompt`` or ``caption`` key),
``.csv`` (a ``prompt`` column, e.g. UniGenBench files). Per-prompt metadata: the other fields of a ``.jsonl`` record
(e.g. GenEval's ``tag``/``include``/``exclude``) and the other non-empty columns of a ``.csv`` row travel with the
prompt (``PromptItem.metadata``) into every reward call of its images (``rollout.expand_groups``); the keys the
rollout sets itself (:data:`RESERVED_METADATA_KEYS`) are refused there.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from deepgen_rl.utils.seeding import make_generator

SAMPLING_MODES = ("sample_proportional", "weight_only")
# set per image by rollout.expand_groups; a prompt file may not carry them
RESERVED_METADATA_KEYS = ("dataset", "group_id", "prompt_index", "sample_index")


def _check_reserved(meta: dict, where: str) -> dict:
    clash = sorted(set(meta) & set(RESERVED_METADATA_KEYS))
    if clash:
        raise ValueError(f"{where}: field(s) {clash} are set by the rollout for every image "
                         f"({', '.join(RESERVED_METADATA_KEYS)}); rename them in the prompt file")
    return meta


def read_prompt_records(path: str | os.PathLike) -> tuple[list[str], list[dict]]:
    """(prompts, per-prompt metadata) from a .txt, .jsonl or .csv file (see module docstring).

    Metadata of a .jsonl record: every field but the one holding the prompt (``prompt``, else ``caption``); of a .csv
    row: every other non-empty column (strings); of a .txt line: ``{}``. Raises naming the file (and line) if it is
    missing or malformed, or if a record uses a reserved key.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    suffix = path.suffix.lower()
    prompts: list[str] = []
    metadata: list[dict] = []
    if suffix == ".txt":
        with path.open(encoding="utf-8") as f:
            prompts = [line.strip() for line in f if line.strip()]
        metadata = [{} for _ in prompts]
    elif suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: invalid JSON ({e})") from e
                key = ("prompt" if "prompt" in record else "caption") if isinstance(record, dict) else None
                text = record.get(key) if key else None
                if not isinstance(text, str) or not text.strip():
                    raise ValueError(f"{path}:{lineno}: record has no non-empty 'prompt' or 'caption' string")
                prompts.append(text.strip())
                metadata.append(_check_reserved({k: v for k, v in record.items() if k != key}, f"{path}:{lineno}"))
    elif suffix == ".csv":
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or "prompt" not in reader.fieldnames:
                raise ValueError(f"{path}: CSV needs a 'prompt' column (found {reader.fieldnames})")
            for lineno, row in enumerate(reader, 2):
                if not row.get("prompt") or not row["prompt"].strip():
                    continue
                prompts.append(row["prompt"].strip())
                extra = {k: v for k, v in row.items() if k not in ("prompt", None) and isinstance(v, str) and v.strip()}
                metadata.append(_check_reserved(extra, f"{path}:{lineno}"))
    else:
        raise ValueError(f"{path}: unsupported prompt file type {suffix!r} (use .txt, .jsonl or .csv)")
    if not prompts:
        raise ValueError(f"prompt file {path} holds no prompts")
    return prompts, metadata


def read_prompt_file(path: str | os.PathLike) -> list[str]:
    """The prompts of :func:`read_prompt_records` (without their metadata)."""
    return read_prompt_records(path)[0]


@dataclass
class PromptDataset:
    name: str
    path: str
    sample_weight: float
    reward_weights: dict[str, float]
    prompts: list[str] = field(repr=False)
    metadata: list[dict] = field(default_factory=list, repr=False)  # per prompt (prompt-file fields); [] = none

    def __len__(self) -> int:
        return len(self.prompts)


@dataclass
class TrainDataConfig:
    sampling_mode: str
    datasets: list[PromptDataset]
    source: str = ""

    @property
    def reward_names(self) -> list[str]:
        """All rewards any dataset weights, in order of first appearance."""
        names: list[str] = []
        for ds in self.datasets:
            for name in ds.reward_weights:
                if name not in names:
                    names.append(name)
        return names

    def dataset_probabilities(self) -> torch.Tensor:
        w = torch.tensor([ds.sample_weight for ds in self.datasets], dtype=torch.float64)
        if self.sampling_mode == "sample_proportional":
            w = w * torch.tensor([len(ds) for ds in self.datasets], dtype=torch.float64)
        return w / w.sum()

    def num_prompts(self) -> int:
        return sum(len(ds) for ds in self.datasets)


def _parse_rewards(raw, where: str) -> dict[str, float]:
    if isinstance(raw, dict):
        items = list(raw.items())
    elif isinstance(raw, list):
        items = []
        for entry in raw:
            if not isinstance(entry, dict) or len(entry) != 1:
                raise ValueError(f"{where}: each rewards entry must be a one-key mapping like '- ocr: 0.7', got {entry!r}")
            items.extend(entry.items())
    else:
        raise ValueError(f"{where}: 'rewards' must be a list of '- name: weight' entries")
    weights: dict[str, float] = {}
    for name, weight in items:
        if name in weights:
            raise ValueError(f"{where}: reward {name!r} listed twice")
        try:
            weight = float(weight)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: reward {name!r} weight must be a number, got {weight!r}") from None
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"{where}: reward {name!r} weight must be a finite number >= 0, got {weight}")
        weights[str(name)] = weight
    if not weights or sum(weights.values()) <= 0:
        raise ValueError(f"{where}: needs at least one reward with a positive weight")
    return weights


def load_train_config(yaml_path: str | os.PathLike) -> TrainDataConfig:
    """Parse a training dataset YAML and read every prompt file it names.

    Raises FileNotFoundError listing every missing prompt file at once, ValueError on malformed entries.
    """
    yaml_path = Path(yaml_path)
    if not yaml_path.is_file():
        raise FileNotFoundError(f"dataset config not found: {yaml_path} (set DATASET_CONFIG or --dataset_config)")
    try:
        with yaml_path.open(encoding="utf-8") as f:
            raw = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{yaml_path}: not valid YAML{at} ({getattr(e, 'problem', None) or e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{yaml_path}: expected a mapping with a 'datasets' list, got {type(raw).__name__}")
    mode = raw.get("sampling_mode", "sample_proportional")
    if mode not in SAMPLING_MODES:
        raise ValueError(f"{yaml_path}: sampling_mode must be one of {SAMPLING_MODES}, got {mode!r}")
    entries = raw.get("datasets")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{yaml_path}: 'datasets' must be a non-empty list")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "path" not in entry:
            raise ValueError(f"{yaml_path}: datasets[{i}] must be a mapping with 'name', 'path' and 'rewards'")
    missing = []
    for entry in entries:
        p = yaml_path.parent / str(entry.get("path", ""))
        if not p.is_file():
            missing.append(f"  {entry.get('name', '?')}: {p}")
    if missing:
        raise FileNotFoundError(
            f"{yaml_path}: {len(missing)} prompt file(s) not found:\n" + "\n".join(missing)
            + "\n(paths are relative to the YAML file; see README 'Training data' for where to get them)"
        )
    datasets, names = [], set()
    for i, entry in enumerate(entries):
        where = f"{yaml_path}: datasets[{i}]"
        name = entry.get("name")
        if not name or name in names:
            raise ValueError(f"{where}: needs a unique 'name' (got {name!r})")
        names.add(name)
        try:
            weight = float(entry.get("sample_weight", 1.0))
        except (TypeError, ValueError):
            raise ValueError(f"{where}: sample_weight must be a number, got {entry.get('sample_weight')!r}") from None
        if not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"{where}: sample_weight must be > 0, got {weight}")
        path = yaml_path.parent / str(entry["path"])
        prompts, metadata = read_prompt_records(path)
        datasets.append(PromptDataset(name=name, path=str(path), sample_weight=weight,
                                      reward_weights=_parse_rewards(entry.get("rewards"), where), prompts=prompts,
                                      metadata=metadata if any(metadata) else []))
    return TrainDataConfig(sampling_mode=mode, datasets=datasets, source=str(yaml_path))


@dataclass
class PromptItem:
    prompt: str
    dataset: str
    dataset_index: int      # index of the dataset in the config
    prompt_index: int       # index of the prompt inside its dataset
    group_id: int           # globally unique id of this prompt draw (its images form one GRPO group)
    metadata: dict = field(default_factory=dict)  # the prompt file's fields for this prompt (e.g. GenEval's include)


class DistributedPromptSampler:
    """Deterministic weighted prompt stream, sharded by rank, reshuffled every epoch.

    An epoch is ``config.num_prompts()`` global draws. Draw ``g`` of epoch ``e`` picks a dataset with the config's
    probabilities (generator seeded by ``(seed, e)``) and takes the next prompt of that dataset's own permutation
    for the epoch (so a dataset is not repeated before it is exhausted). Step ``s`` uses draws
    ``[s*G, (s+1)*G)`` with ``G = prompts_per_rank * world_size``; rank ``r`` takes the contiguous slice
    ``[r*P, (r+1)*P)`` of them, so ranks never share a draw. ``group_id`` = global draw number across epochs.
    """

    def __init__(self, config: TrainDataConfig, prompts_per_rank: int, *, rank: int = 0, world_size: int = 1,
                 seed: int = 0):
        if prompts_per_rank < 1:
            raise ValueError("prompts_per_rank must be >= 1")
        self.config = config
        self.prompts_per_rank = prompts_per_rank
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.global_prompts = prompts_per_rank * world_size
        self.steps_per_epoch = config.num_prompts() // self.global_prompts
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"the prompt set ({config.num_prompts()} prompts) is smaller than one global batch "
                f"({prompts_per_rank} prompts/rank x {world_size} ranks = {self.global_prompts})")
        self.epoch = 0
        self.step_in_epoch = 0
        self._draws: list[tuple[int, int]] | None = None

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.step_in_epoch, self._draws = epoch, 0, None

    def _epoch_draws(self) -> list[tuple[int, int]]:
        if self._draws is None:
            g = make_generator("prompts", self.seed, self.epoch)
            probs = self.config.dataset_probabilities()
            n = self.steps_per_epoch * self.global_prompts
            ds_choice = torch.multinomial(probs, n, replacement=True, generator=g).tolist()
            perms = [torch.randperm(len(ds), generator=g).tolist() for ds in self.config.datasets]
            cursor = [0] * len(perms)
            draws = []
            for d in ds_choice:
                perm = perms[d]
                draws.append((d, perm[cursor[d] % len(perm)]))
                cursor[d] += 1
            self._draws = draws
        return self._draws

    def next_batch(self) -> list[PromptItem]:
        """This rank's prompts for the next step (advances the epoch when it is used up)."""
        if self.step_in_epoch >= self.steps_per_epoch:
            self.set_epoch(self.epoch + 1)
        draws = self._epoch_draws()
        start = self.step_in_epoch * self.global_prompts + self.rank * self.prompts_per_rank
        base = self.epoch * self.steps_per_epoch * self.global_prompts
        items = []
        for g in range(start, start + self.prompts_per_rank):
            d, p = draws[g]
            ds = self.config.datasets[d]
            items.append(PromptItem(ds.prompts[p], ds.name, d, p, group_id=base + g,
                                    metadata=ds.metadata[p] if ds.metadata else {}))
        self.step_in_epoch += 1
        return items

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "seed": self.seed,
                "global_prompts": self.global_prompts}

    def load_state_dict(self, state: dict) -> None:
        if state.get("global_prompts", self.global_prompts) != self.global_prompts:
            raise ValueError(f"cannot resume the prompt stream: checkpoint used {state['global_prompts']} prompts per "
                             f"global step, this run uses {self.global_prompts}")
        self.epoch, self.step_in_epoch, self._draws = int(state["epoch"]), int(state["step_in_epoch"]), None
