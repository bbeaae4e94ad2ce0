"""Subprocess driver: a tiny run whose LAST policy piece of every update is non-finite (optionally under DeepSpeed
ZeRO-2, single process on gloo). Prints a JSON line with the outcome."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deepgen_rl.trainer import grpo_trainer, policy  # noqa: E402
from tests.trainer.helpers import ROOT, run_inprocess  # noqa: E402


class InfGrad(torch.autograd.Function):
    """Identity forward (a finite loss), infinite gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("inf")


def main():
    out, mode, which = sys.argv[1], sys.argv[2], sys.argv[3]  # mode: plain|zero2; which: last|all|infgrad
    orig = policy.policy_piece_loss
    calls = {"n": 0}

    def poisoned(trainer, batch, advantages, mb, j):
        loss, stats = orig(trainer, batch, advantages, mb, j)
        calls["n"] += 1
        # 2 micro-batches x 2 trained steps = 4 pieces per update
        if which == "infgrad":
            loss = InfGrad.apply(loss)
        elif which == "all" or calls["n"] % 4 == 0:
            loss = loss * float("nan")
        return loss, stats

    grpo_trainer.policy_piece_loss = poisoned
    extra = {"deepspeed": str(ROOT / "scripts/deepspeed/zero2.json")} if mode == "zero2" else {}
    from tests.trainer.helpers import tiny_model

    model = tiny_model()
    initial = {n: p.detach().clone() for n, p in model.transformer.named_parameters()}
    trainer, history = run_inprocess(Path(out), model=model, max_steps=2, atrain_micro_batch_size=4, **extra)
    unchanged = all(torch.equal(initial[n], p.detach()) for n, p in trainer.dit_module.named_parameters())
    opt_state_empty = mode == "plain" and len(trainer.optimizer.state) == 0
    weights_finite = all(bool(torch.isfinite(p).all()) for p in trainer.dit_module.parameters())
    print(json.dumps({"nonfinite": [m["train/nonfinite_losses"] for m in history],
                      "steps": [m["train/optimizer_steps"] for m in history],
                      "skipped": [m["train/skipped_updates"] for m in history],
                      "weights_finite": weights_finite, "weights_unchanged": unchanged,
                      "optimizer_state_empty": opt_state_empty,
                      "weights": {n: p.detach().double().flatten()[:64].tolist()
                                  for n, p in trainer.dit_module.named_parameters()}}))


if __name__ == "__main__":
    main()
