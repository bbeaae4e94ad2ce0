"""Shared by tests/models/test_dit_text_mask.py and tests/models/dit_mask_deepspeed_worker.py: record every DiT call of
a path and compare each row with diffusers' stock DiT fed only that row's prompt, encoded alone (n + Q real rows)."""

from __future__ import annotations

import copy
from typing import Callable

import torch
from diffusers.models.attention_processor import JointAttnProcessor2_0

PROMPTS = ["a cat", "two dogs run across a green field under a clear sky at night with many people",
           "a red apple on a wooden table"]
ATOL = 1e-5  # fp32


def plain_dit(dit: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``dit`` (a plain module, not a ZeRO-3-partitioned one) with diffusers' stock, unmasked processor."""
    plain = copy.deepcopy(dit)
    plain.set_attn_processor(JointAttnProcessor2_0())
    return plain.float().eval()


class Recorder:
    """Wraps ``model.predict_velocity``: keeps (latents, sigma, cond, transformer, output) of every call.

    ``patch(obj, name, value)`` installs the wrapper: pytest's ``monkeypatch.setattr`` in a test, ``setattr`` in a
    worker process that ends after the check.
    """

    def __init__(self, model, patch: Callable = setattr):
        self.calls = []
        original = model.predict_velocity

        def recording(latents, sigma, cond, transformer=None):
            out = original(latents, sigma, cond, transformer=transformer)
            self.calls.append((latents.detach().clone(), torch.as_tensor(sigma).detach().clone(), cond,
                               transformer, out.detach().clone()))
            return out

        patch(model, "predict_velocity", recording)


def encode_alone(model, prompts=PROMPTS) -> dict:
    """prompt -> its Conditioning encoded alone (n + Q rows, all real), the empty CFG prompt included."""
    out = {p: model.encode_prompts([p]) for p in list(prompts) + [""]}
    assert len({c.prompt_embeds.shape[1] for c in out.values()}) == len(out)  # all lengths differ
    return out


def compare_with_alone(calls, alone: dict, reference_for: Callable) -> dict:
    """Max |v_call − v_alone| over every row of ``calls``, plus how many calls mixed prompt lengths (masked).

    ``reference_for(transformer)`` gives the plain DiT holding the weights that call ran with. Each row's prompt is
    identified by its pooled embedding (unique per prompt); the row must hold exactly that prompt's real rows.
    """
    worst, masked, rows = 0.0, 0, 0
    for latents, sigma, cond, transformer, out in calls:
        plain = reference_for(transformer)
        masked += cond.trimmed().text_mask is not None
        sigma = sigma.reshape(-1).expand(latents.shape[0])
        for i in range(len(cond)):
            matches = [p for p, c in alone.items()
                       if torch.allclose(c.pooled_embeds[0], cond.pooled_embeds[i].float(), atol=1e-4, rtol=0)]
            assert len(matches) == 1, matches
            ref_cond = alone[matches[0]]
            n_rows = int(cond.mask[i].sum())
            assert n_rows == ref_cond.prompt_embeds.shape[1] and cond.mask[i, :n_rows].all()
            with torch.no_grad():
                ref = plain(hidden_states=latents[i:i + 1].float(), encoder_hidden_states=ref_cond.prompt_embeds,
                            pooled_projections=ref_cond.pooled_embeds, timestep=sigma[i:i + 1].float() * 1000.0,
                            return_dict=False)[0]
            worst = max(worst, float((out[i:i + 1].float() - ref).abs().max()))
            rows += 1
    return {"max_abs_diff": worst, "masked_calls": masked, "calls": len(calls), "rows": rows}
