"""SFT-auxiliary data: an mmengine config of weighted image–caption datasets, an infinite rank-sharded weighted
sampler, and a loader yielding ``{"pixel_values": FloatTensor[B, 3, S, S] in [0, 1], "texts": list[str],
"keys": list[(dataset index, record index)]}`` (a key names one image: the SFT term's latent cache is keyed by it).

Config file (an mmengine ``.py`` config, loaded with ``lazy_import=False`` so it may ``import os`` and read env vars)::

    import os
    DATA_ROOT = os.environ.get("DATA_ROOT", "")
    image_size = 512        # square side S: resize the shorter side to S (bicubic), then center crop
    batch_size = 4          # per rank
    num_workers = 4         # DataLoader worker processes (0 = load in the calling process)
    datasets = [
        dict(name="text_rendering", annotation=os.path.join(DATA_ROOT, "text/anno.jsonl"), weight=2.0),
        dict(name="general", annotation=os.path.join(DATA_ROOT, "general/anno.json"), weight=1.0,
             image_root=DATA_ROOT),   # optional
    ]

Annotation files are ``.jsonl`` (one ``{"image": ..., "caption": ...}`` object per line) or ``.json`` (a list of such
objects). A relative ``annotation`` path is resolved against the config file's folder. A relative ``image`` path is
resolved against the dataset's ``image_root`` when given, else against the annotation file's folder; absolute image
paths are used as they are. Every annotation and image file is checked when the loader is built; a
``FileNotFoundError`` lists all missing files at once.

Sampling: P(dataset) = weight / Σ weights, whatever the dataset sizes. See :class:`WeightedMixtureSampler`.
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from deepgen_rl.utils.seeding import derive_seed

ANNOTATION_SUFFIXES = (".json", ".jsonl")


@dataclass
class SFTDatasetSpec:
    name: str
    annotation: Path
    weight: float
    image_root: Path | None = None


@dataclass
class SFTDataConfig:
    datasets: list[SFTDatasetSpec]
    image_size: int
    batch_size: int
    num_workers: int
    config_path: Path


def load_sft_config(config_path: str | os.PathLike) -> SFTDataConfig:
    """Parse an SFT-auxiliary mmengine config (format in the module docstring)."""
    from mmengine.config import Config

    config_path = Path(config_path).resolve()
    if not config_path.is_file():
        raise FileNotFoundError(f"SFT-auxiliary dataset config not found: {config_path}")
    cfg = Config.fromfile(str(config_path), lazy_import=False).to_dict()
    raw = cfg.get("datasets")
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ValueError(f"{config_path}: `datasets` must be a non-empty list of dicts")
    specs = []
    for i, entry in enumerate(raw):
        where = f"{config_path}: datasets[{i}]"
        if not isinstance(entry, dict) or "annotation" not in entry:
            raise ValueError(f"{where}: needs at least an `annotation` path")
        weight = float(entry.get("weight", 1.0))
        if not weight > 0 or not np.isfinite(weight):
            raise ValueError(f"{where}: weight must be a positive finite number, got {entry.get('weight')!r}")
        annotation = Path(os.path.expanduser(str(entry["annotation"])))
        if not annotation.is_absolute():
            annotation = config_path.parent / annotation
        image_root = entry.get("image_root")
        if image_root:
            image_root = Path(os.path.expanduser(str(image_root)))
            if not image_root.is_absolute():
                image_root = config_path.parent / image_root
        specs.append(SFTDatasetSpec(name=str(entry.get("name", annotation.stem)), annotation=annotation,
                                    weight=weight, image_root=image_root or None))
    return SFTDataConfig(datasets=specs, image_size=int(cfg.get("image_size", 512)),
                         batch_size=int(cfg.get("batch_size", 1)), num_workers=int(cfg.get("num_workers", 0)),
                         config_path=config_path)


def read_annotation(spec: SFTDatasetSpec) -> list[tuple[Path, str]]:
    """``[(absolute image path, caption), ...]`` of one dataset; the annotation file must exist."""
    path = spec.annotation
    if path.suffix.lower() not in ANNOTATION_SUFFIXES:
        raise ValueError(f"{path}: annotation files must be .json or .jsonl")
    if path.suffix.lower() == ".jsonl":
        raw = []
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        raw.append((f"{path}:{lineno}", json.loads(line)))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{lineno}: invalid JSON ({e})") from e
    else:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise ValueError(f"{path}: a .json annotation file must hold a list of {{image, caption}} objects")
        raw = [(f"{path}[{i}]", record) for i, record in enumerate(data)]
    root = spec.image_root or path.parent
    records = []
    for where, record in raw:
        if not (isinstance(record, dict) and isinstance(record.get("image"), str)
                and isinstance(record.get("caption"), str)):
            raise ValueError(f"{where}: each record needs string fields 'image' and 'caption'")
        image = Path(record["image"])
        records.append((image if image.is_absolute() else root / image, record["caption"]))
    if not records:
        raise ValueError(f"{path}: dataset {spec.name!r} has no records")
    return records


def load_image(path: str | os.PathLike, size: int) -> torch.Tensor:
    """RGB image → FloatTensor[3, size, size] in [0, 1]: shorter side resized to ``size`` (bicubic), center crop."""
    with Image.open(path) as img:
        img = img.convert("RGB")
        w, h = img.size
        scale = size / min(w, h)
        new_w, new_h = max(size, round(w * scale)), max(size, round(h * scale))
        if (new_w, new_h) != (w, h):
            img = img.resize((new_w, new_h), Image.BICUBIC)
        left, top = (new_w - size) // 2, (new_h - size) // 2
        img = img.crop((left, top, left + size, top + size))
        array = np.asarray(img, dtype=np.uint8).copy()
    return torch.from_numpy(array).permute(2, 0, 1).float().div_(255.0)


class WeightedMixtureSampler:
    """Infinite, deterministic, rank-sharded weighted sampler over several datasets.

    Global draws t = 0, 1, 2, … are grouped in blocks of ``world_size``; rank r takes draw ``b * world_size + r`` of
    block b, so its k-th draw is global draw ``k * world_size + rank``. The dataset of every global draw is
    P(d) = weight_d / Σ weights, drawn from one numpy PCG64 stream seeded by ``seed`` (the same on every rank, so all
    ranks agree on every block). Within dataset d the c-th global draw (c counts that dataset's draws over all
    ranks) takes sample ``perm_{d, c // N_d}[c % N_d]``, a fresh permutation per pass over the data seeded by
    (seed, d, pass) and adjusted at its start so that no block repeats a sample across a pass boundary (see
    :meth:`_permutation`). Hence ranks never get the same sample for the same draw index, and every sample is seen
    exactly once per pass over its dataset. The state (counters + RNG state) is identical on all ranks apart from ``rank`` itself.
    """

    def __init__(self, sizes: list[int], weights: list[float], *, rank: int = 0, world_size: int = 1, seed: int = 0):
        if len(sizes) != len(weights) or not sizes:
            raise ValueError("need one weight per dataset and at least one dataset")
        if any(int(n) <= 0 for n in sizes):
            raise ValueError(f"every dataset needs at least one sample, sizes={sizes}")
        weights = np.asarray(weights, dtype=np.float64)
        if not np.all(np.isfinite(weights)) or np.any(weights <= 0):
            raise ValueError(f"weights must be positive and finite, got {weights.tolist()}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        self.sizes = [int(n) for n in sizes]
        self.weights = weights.tolist()
        self.probabilities = weights / weights.sum()
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self._rng = np.random.Generator(np.random.PCG64(derive_seed("sftaux-mixture", seed)))
        self.num_draws = 0  # draws taken by this rank (= blocks consumed)
        self.counters = [0] * len(sizes)  # global draws per dataset
        self._perm_cache: dict[int, tuple[int, np.ndarray]] = {}

    def _base_permutation(self, d: int, epoch: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64(derive_seed("sftaux-perm", self.seed, d, epoch)))
        return rng.permutation(self.sizes[d])

    def _permutation(self, d: int, epoch: int) -> np.ndarray:
        """Pass ``epoch``'s order of dataset d: a seeded permutation whose first ``world_size − 1`` entries avoid the
        previous pass's last ``world_size − 1`` (swapped with middle entries; the tail is untouched, so this needs
        only the previous *base* permutation). One block spans at most that window across a pass boundary, so ranks
        never get the same sample for the same draw index (guaranteed when N_d ≥ 4·(world_size − 1))."""
        cached = self._perm_cache.get(d)
        if cached is not None and cached[0] == epoch:
            return cached[1]
        perm = self._base_permutation(d, epoch)
        k, n = self.world_size - 1, self.sizes[d]
        if epoch > 0 and k > 0 and n >= 4 * k:
            previous_tail = set(self._base_permutation(d, epoch - 1)[n - k:].tolist())
            free = (j for j in range(k, n - k) if perm[j] not in previous_tail)
            for j in range(k):
                if perm[j] in previous_tail:
                    m = next(free)
                    perm[j], perm[m] = perm[m], perm[j]
        self._perm_cache[d] = (epoch, perm)
        return perm

    def next_index(self) -> tuple[int, int]:
        """This rank's next ``(dataset index, sample index)``."""
        choices = self._rng.choice(len(self.sizes), size=self.world_size, p=self.probabilities)
        mine = None
        for j, d in enumerate(choices.tolist()):
            c = self.counters[d]
            self.counters[d] += 1
            if j == self.rank:
                mine = (d, int(self._permutation(d, c // self.sizes[d])[c % self.sizes[d]]))
        self.num_draws += 1
        return mine

    def __iter__(self):
        while True:
            yield self.next_index()

    def state_dict(self) -> dict:
        return {"seed": self.seed, "world_size": self.world_size, "sizes": list(self.sizes),
                "weights": list(self.weights), "num_draws": self.num_draws, "counters": list(self.counters),
                "rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "world_size", "sizes", "weights"):
            if state[key] != getattr(self, key):
                raise ValueError(f"sampler state mismatch on {key}: saved {state[key]!r}, now {getattr(self, key)!r}")
        self.num_draws = int(state["num_draws"])
        self.counters = [int(c) for c in state["counters"]]
        self._rng.bit_generator.state = state["rng"]


class _MixtureDataset(Dataset):
    def __init__(self, records: list[list[tuple[Path, str]]], image_size: int):
        self.records, self.image_size = records, image_size

    def __len__(self) -> int:
        return sum(len(r) for r in self.records)

    def __getitem__(self, index: tuple[int, int]) -> tuple[torch.Tensor, str, tuple[int, int]]:
        path, caption = self.records[index[0]][index[1]]
        return load_image(path, self.image_size), caption, (int(index[0]), int(index[1]))


def _collate(items: list[tuple[torch.Tensor, str, tuple[int, int]]]) -> dict:
    return {"pixel_values": torch.stack([image for image, _, _ in items]), "texts": [text for _, text, _ in items],
            "keys": [key for _, _, key in items]}


class _BatchStream:
    """Batches of sampler indices; remembers the sampler state after each batch so the loader can report the state
    of what it has *yielded* (DataLoader workers prefetch ahead of the consumer)."""

    def __init__(self, sampler: WeightedMixtureSampler, batch_size: int, pending: deque):
        self.sampler, self.batch_size, self.pending = sampler, batch_size, pending

    def __iter__(self):
        while True:
            batch = [self.sampler.next_index() for _ in range(self.batch_size)]
            self.pending.append(self.sampler.state_dict())
            yield batch


class SFTLoader:
    """Infinite iterable of ``{"pixel_values": FloatTensor[B, 3, S, S] in [0, 1], "texts": list[str], "keys":
    list[tuple[int, int]]}`` batches (key = (dataset index, record index) of each image).

    ``state_dict()`` describes exactly the batches yielded so far (not those prefetched by workers); after
    ``load_state_dict`` a new ``iter()`` continues the same stream.
    """

    def __init__(self, names: list[str], records: list[list[tuple[Path, str]]], sampler: WeightedMixtureSampler,
                 *, batch_size: int, image_size: int, num_workers: int = 0):
        self.names, self.sampler = names, sampler
        self.batch_size, self.image_size, self.num_workers = batch_size, image_size, num_workers
        self.dataset = _MixtureDataset(records, image_size)
        self._consumed = sampler.state_dict()

    def __iter__(self):
        self.sampler.load_state_dict(self._consumed)
        pending: deque = deque()
        loader = DataLoader(self.dataset, batch_sampler=_BatchStream(self.sampler, self.batch_size, pending),
                            num_workers=self.num_workers, collate_fn=_collate,
                            persistent_workers=False, prefetch_factor=2 if self.num_workers > 0 else None)
        for batch in loader:
            self._consumed = pending.popleft()
            yield batch

    def state_dict(self) -> dict:
        return {"sampler": dict(self._consumed)}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self._consumed = self.sampler.state_dict()


def check_files(config: SFTDataConfig) -> list[list[tuple[Path, str]]]:
    """Read every annotation and check every image exists; raise one ``FileNotFoundError`` listing all missing."""
    missing_annotations, missing_images, all_records = [], [], []
    for spec in config.datasets:
        if not spec.annotation.is_file():
            missing_annotations.append(f"  [{spec.name}] annotation {spec.annotation}")
            all_records.append([])
            continue
        records = read_annotation(spec)
        missing_images += [f"  [{spec.name}] image {path}" for path, _ in records if not path.is_file()]
        all_records.append(records)
    missing = missing_annotations + missing_images
    if missing:
        hint = ("\n(DATA_ROOT is not set: export DATA_ROOT=<folder with the SFT data>)"
                if not os.environ.get("DATA_ROOT") else "")
        raise FileNotFoundError(f"SFT-auxiliary config {config.config_path}: {len(missing)} missing file(s):\n"
                                + "\n".join(missing) + hint)
    return all_records


def build_sft_loader(config_path: str | os.PathLike, *, rank: int, world_size: int, seed: int,
                     batch_size: int | None = None, image_size: int | None = None,
                     num_workers: int | None = None) -> SFTLoader:
    """Build the rank's SFT-auxiliary loader from an mmengine dataset config; ``batch_size``/``image_size``/
    ``num_workers`` override the config's values when given."""
    config = load_sft_config(config_path)
    records = check_files(config)
    sampler = WeightedMixtureSampler([len(r) for r in records], [s.weight for s in config.datasets],
                                     rank=rank, world_size=world_size, seed=seed)
    return SFTLoader([s.name for s in config.datasets], records, sampler,
                     batch_size=batch_size or config.batch_size, image_size=image_size or config.image_size,
                     num_workers=config.num_workers if num_workers is None else num_workers)
