"""torchrun worker (gloo, CPU) for tests/models/test_dit_text_mask_deepspeed.py; rank 0 prints one JSON line.

    python -m torch.distributed.run --nproc_per_node 2 tests/models/dit_mask_deepspeed_worker.py zero2,zero3

Per case the tiny DeepGen's DiT (fp32, gradient checkpointing, as the trainer sets it up) is wrapped by a real
DeepSpeed engine built from the shipped JSON through ``build_deepspeed_config(..., gloo=True)``: ``zero2``
(scripts/deepspeed/zero2.json) or ``zero3`` (scripts/deepspeed/zero3.json with ``stage3_param_persistence_threshold``
0: every DiT tensor is partitioned over the ranks and gathered by ZeRO-3's hooks in each forward). The trainer's paths
then run with prompts of different lengths and record every DiT call:

- ``rollout``: ``rollout(..., transformer=engine.module)`` with CFG (the trainer's ``dit_module``);
- ``training``: ``policy_piece_loss`` through the engine itself (``dit_forward``) plus the frozen reference DiT built
  by ``dit_from_state`` (β > 0), CFG on; then one ``engine.backward`` / ``engine.step``;
- ``eval_live``: ``generate_eval_images(..., transformer=engine.module)`` (evaluation without EMA), this rank's shard;
- ``eval_ema``: the EMA DiT evaluation uses (``PartitionedEMA`` updated after the step, assembled by
  ``trainer.eval_hook.ema_transformer``) through ``generate_eval_images``.

Each row is compared with diffusers' stock, unmasked DiT holding the same weights, fed only that row's prompt
encoded alone (``tests.models.text_mask_checks.compare_with_alone``).
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from deepgen_rl.evaluation.config import EvalDatasetSpec, EvalPrompt  # noqa: E402
from deepgen_rl.evaluation.generate import generate_eval_images  # noqa: E402
from deepgen_rl.models import build_model  # noqa: E402
from deepgen_rl.rl.samplers import make_sigmas  # noqa: E402
from deepgen_rl.rollout import rollout  # noqa: E402
from deepgen_rl.trainer.deepspeed_utils import (build_deepspeed_config, dit_from_state, dit_hidden_size,  # noqa: E402
                                                fp32_master_state_dict, init_deepspeed_distributed,
                                                partitioned_fraction)
from deepgen_rl.trainer.ema import PartitionedEMA  # noqa: E402
from deepgen_rl.trainer.eval_hook import ema_transformer  # noqa: E402
from deepgen_rl.trainer.policy import PieceInputs, policy_piece_loss  # noqa: E402
from tests.models.text_mask_checks import PROMPTS, Recorder, compare_with_alone, encode_alone, plain_dit  # noqa: E402

DS = ROOT / "scripts/deepspeed"
CPU = torch.device("cpu")


class Args:  # what build_deepspeed_config reads
    max_grad_norm, learning_rate, weight_decay = 1.0, 1e-3, 0.0
    adam_beta1, adam_beta2, adam_epsilon, bf16, fp16 = 0.9, 0.999, 1e-8, False, False


def ds_config(case: str, dit) -> dict:
    cfg = json.loads((DS / ("zero2.json" if case == "zero2" else "zero3.json")).read_text())
    if case == "zero3":  # partition every tensor, not only those above 10 x hidden size
        cfg["zero_optimization"].update({"stage3_param_persistence_threshold": 0, "reduce_bucket_size": 1000,
                                         "stage3_prefetch_bucket_size": 1000})
    return build_deepspeed_config(cfg, Args(), torch.distributed.get_world_size(), hidden_size=dit_hidden_size(dit),
                                  gloo=True)


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def run_case(case: str, model, base, alone, out: Path) -> dict:
    import deepspeed

    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    dit = copy.deepcopy(base).float().requires_grad_(True).train()
    dit.enable_gradient_checkpointing()
    model.transformer = dit  # as the trainer: the engine wraps the model's own DiT
    ref_dit = dit_from_state(dit, dit.state_dict(), device=CPU, dtype=torch.float32)  # the KL reference
    engine, _, _, _ = deepspeed.initialize(model=dit, optimizer=torch.optim.AdamW(dit.parameters(), lr=1e-3),
                                           config=ds_config(case, dit), dist_init_required=False)
    ema = PartitionedEMA(engine.module, engine)
    res: dict = {"partitioned": list(partitioned_fraction(engine.module))}
    initial = plain_dit(base)
    plain = {id(engine): initial, id(engine.module): initial, id(ref_dit): plain_dit(ref_dit)}
    rec = Recorder(model)

    def check(name: str) -> None:
        res[name] = compare_with_alone(rec.calls, alone, lambda t: plain[id(t)])
        rec.calls.clear()

    items = [SimpleNamespace(prompt=p, dataset="d", group_id=g, prompt_index=g) for g, p in enumerate(PROMPTS)]
    sigmas = make_sigmas(2, model.scheduler_shift)
    batch = rollout(model, items, rollout_n=2, micro_batch_size=4, sigmas=sigmas,
                    stochastic=torch.ones(2, dtype=torch.bool), sampler="cps_sde", eta=1.0, cfg_scale=4.5,
                    height=32, width=32, seed=0, step=0, rank=rank, transformer=engine.module)
    check("rollout")

    inputs = PieceInputs(model=model, transformer=engine, ref_transformer=ref_dit, device=CPU, dtype=torch.float32,
                         step=0, rank=rank, seed=0, algorithm="flowgrpo", sampler="cps_sde", eta=1.0, cfg_scale=4.5,
                         clip_range=1e-4, beta=0.1, kl_type="v-based", adv_clip_max=5.0, nft_beta=0.1)
    advantages = torch.linspace(-1.0, 1.0, len(batch))
    loss, _ = policy_piece_loss(inputs, batch, advantages, [1, 2, 4], 0)  # prompts 0, 1, 2: three lengths
    res["training_transformers"] = sorted({"engine" if t is engine else "ref" if t is ref_dit else "other"
                                           for *_, t, _ in rec.calls})
    check("training")
    engine.backward(loss)
    engine.step()

    spec = EvalDatasetSpec(name="mix", path=out / "mix.txt", prompts=[EvalPrompt(i, p) for i, p in enumerate(PROMPTS)],
                           cfg_scale=4.0, num_inference_steps=2, duplicates=2)
    with torch.no_grad():
        live = fp32_master_state_dict(engine.module, engine)  # collective: every rank
        plain[id(engine.module)] = plain_dit(dit_from_state(base, live, device=CPU, dtype=torch.float32))
        engine.module.eval()
        generate_eval_images(model, spec, out / f"{case}_live", rank=rank, world_size=world, height=32, width=32,
                             batch_size=3, progress=False, transformer=engine.module)
        check("eval_live")
        ema.update(0.5)  # ema = (θ0 + θ1) / 2: neither the initial nor the live weights
        ema_dit = ema_transformer(engine.module, ema, CPU, torch.float32)  # collective
        plain[id(ema_dit)] = plain_dit(ema_dit)
        ema_state = {k: v for k, v in ema_dit.state_dict().items() if k in live}
        res["ema_vs_initial"] = max_diff(ema_state, {k: v for k, v in base.state_dict().items() if k in ema_state})
        res["ema_vs_live"] = max_diff(ema_state, {k: live[k] for k in ema_state})
        res["live_vs_initial"] = max_diff({k: live[k] for k in ema_state}, base.state_dict())
        generate_eval_images(model, spec, out / f"{case}_ema", rank=rank, world_size=world, height=32, width=32,
                             batch_size=3, progress=False, transformer=ema_dit)
        check("eval_ema")
    return res


def main():
    torch.distributed.init_process_group("gloo")
    init_deepspeed_distributed("gloo")
    torch.manual_seed(0)
    model = build_model(str(ROOT / "configs/models/deepgen_tiny.py"))
    alone = encode_alone(model)
    base = copy.deepcopy(model.transformer).float().eval()
    out = Path(tempfile.mkdtemp(prefix="dit_mask_ds_"))
    report = {case: run_case(case, model, base, alone, out) for case in sys.argv[1].split(",")}
    reports = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(reports, report)
    if torch.distributed.get_rank() == 0:
        print("MASK_REPORT " + json.dumps(reports), flush=True)
    torch.distributed.barrier()
    shutil.rmtree(out, ignore_errors=True)  # this rank's scratch folder (the exit below skips atexit)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    from deepgen_rl.utils.dist import exit_without_teardown

    exit_without_teardown()  # results are out: no interpreter teardown (its gloo abort, deepgen_rl.utils.dist)
