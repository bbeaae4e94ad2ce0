"""Deterministic seeds derived from several parts (Python's hash() is salted per process, so never use it)."""

from __future__ import annotations

import hashlib

import torch


def derive_seed(*parts) -> int:
    """A 63-bit seed that depends only on ``parts`` (ints/strings), identical in every process and run."""
    text = "\x1f".join(str(p) for p in parts).encode("utf-8")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & 0x7FFF_FFFF_FFFF_FFFF


def make_generator(*parts, device: str | torch.device = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(derive_seed(*parts))
