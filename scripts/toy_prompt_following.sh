#!/usr/bin/env bash
# The toy world's headline run (docs/toy_world.md, "Faster steps and a one-step SDE window", "Counting too",
# "Reliability", "A faster GELU; six rollout steps are not faster learning", "Windows from steps 1-5; 60 steps" and
# "Windows from steps 3-5; the budget from launch"): MR-GRPO (cps_sde, gdpo) on the `slots_wide` toy DeepGen, two ranks
# (torchrun + gloo, one CPU thread each), 1,024 images per step from the mixture assets/rl_datasets/toy/toy_rl_mix.yaml
# (3/4 held-out relations, 1/4 train-split count and region captions), an SDE window of one step starting at step 3-5 of
# 8 (--sde_window_range 3,6: a window at step 0 gave ~0.4x the gradient of one at steps 3-4 for the dearest rollout, one
# at step 6 ~0.1x, with ~65% of its groups' rewards all equal; starts 1-2, the default until 2026-12-07, learn no more
# per step and cost the most after step 0, docs/toy_world.md "Windows from steps 3-5; the budget from launch"), the SFT
# anchor (lambda 0.001, with the recipe's 32 pairs per rank and step: 128 until 2026-12-06, docs/toy_world.md "Where a
# step's time goes; the recipe's anchor batch"), the `soft_color` reward, the DiT's GELUs computed as x*sigmoid(2u)
# (--cpu_fast_gelu: the same function to float rounding, ~7% faster steps), the rollout's last step (sigma 0.009 -> 0)
# taken with the previous step's velocity (--reuse_last_velocity: one DiT forward per image fewer,
# bench/reuse_last_velocity.py; docs/toy_world.md "One DiT forward fewer per image") and an EMA of the DiT evaluated on
# the 64 held-out prompts (8 images each, ODE, fixed seeds) every TOY_EVAL_EVERY steps and at the last step; then prints
# the run's held-out statistics (python -m deepgen_rl.toy.run_report: strict accuracy, claim scores and per-prompt sign
# tests vs step 0, minutes from launch). The headline figure is the last eval's, not the best's.
# A wall-clock budget ends the training (docs/toy_world.md, "A time budget" and "Windows from steps 3-5; the budget from
# launch"): --max_train_minutes TOY_MINUTES (14.75) --max_train_minutes_from <launch> stops before a step that, with an
# eval after it, would end later than 14.75 minutes after launch (start-up included), then evaluates and saves that
# step, so the last eval comes within 15 minutes of launch on any machine: 75-91 steps on the slowest 2-core machine met
# (AVX2 only, ~8.9-11.0 s per step as its speed varied), more on faster ones. The step reached depends on the machine's
# speed; the run up to it does not (TOY_MINUTES=0 TOY_STEPS=N repeats a run that stopped at step N to the last digit).
# TOY_STEPS (200) is the cap; TOY_MINUTES=0 runs exactly TOY_STEPS steps.
# scripts/quickstart_env.sh sets glibc's malloc thresholds (scripts/utils/cpu_malloc.sh: the same numbers).
#   1. builds/reuses .venv and the toy model (built once, announced: ~8.5 minutes, two ranks on the 2 cores)
#   2. writes the SFT anchor's 4,096 train-split pairs (the variant's layout) to $OUT/sftaux
#   3. bash scripts/train.sh with NGPUS=2 and the flags below (extra arguments are passed on to the trainer and
#      override these; e.g. --dataset_config assets/rl_datasets/toy/toy_rl.yaml trains on the held-out relations only)
# Env: TOY_SEED (0), TOY_MINUTES (14.75, from launch; 0 = no budget), TOY_STEPS (200), TOY_EVAL_EVERY (20),
# TOY_OUTPUT_DIR (outputs/toy_prompt_following_seed$TOY_SEED), TOY_VARIANT (slots_wide, a name of
# deepgen_rl.toy.model.VARIANTS; `slots` was the default until 2026-12-05), NGPUS (2: one rank per core). Numerics are
# pinned as in scripts/test.sh, so a run of a given number of steps repeats to the last digit on one machine; numpy is
# pinned too since 2026-12-06 (its SIMD loops had made runs differ between AVX-512 and AVX2 machines).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export DEEPGEN_TOY_VARIANT="${TOY_VARIANT:-slots_wide}"
export OMP_NUM_THREADS=1
# shellcheck source=scripts/quickstart_env.sh
. scripts/quickstart_env.sh
export WANDB_MODE="${WANDB_MODE:-offline}" SWANLAB_MODE="${SWANLAB_MODE:-disabled}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.cache/torch_extensions}"
# shellcheck source=scripts/utils/pinned_numerics.sh
. scripts/utils/pinned_numerics.sh
SEED="${TOY_SEED:-0}"
STEPS="${TOY_STEPS:-200}"
MINUTES="${TOY_MINUTES:-14.75}"
EVAL_EVERY="${TOY_EVAL_EVERY:-20}"
OUT="${TOY_OUTPUT_DIR:-outputs/toy_prompt_following_seed$SEED}"
for v in SEED STEPS EVAL_EVERY; do
  if ! [[ "${!v}" =~ ^[0-9]+$ ]]; then
    echo "scripts/toy_prompt_following.sh: TOY_$v must be a non-negative integer, got '${!v}'" >&2
    exit 2
  fi
done
if ! [[ "$MINUTES" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  echo "scripts/toy_prompt_following.sh: TOY_MINUTES must be a non-negative number (0 = no budget), got '$MINUTES'" >&2
  exit 2
fi
# one interpreter: refuse an unknown TOY_VARIANT in one line before anything is built, else build/reuse the model
python -c "import sys; from deepgen_rl.toy.model import VARIANT_NAMES as n, ensure_toy_deepgen; v = sys.argv[1]
if v not in n: sys.exit(f'scripts/toy_prompt_following.sh: TOY_VARIANT must be a toy variant, one of {\", \".join(n)}; got {v!r}')
print(f'[toy] {v} model ready in', ensure_toy_deepgen(variant=v)['root'])" "$DEEPGEN_TOY_VARIANT"
rm -rf "$OUT"
mkdir -p "$OUT"
python -m deepgen_rl.toy.sftaux --variant "$DEEPGEN_TOY_VARIANT" --n 4096 --out "$OUT/sftaux" > /dev/null
t0=$(date +%s.%N)
budget=""
[[ "$MINUTES" =~ ^0*([.]0*)?$ ]] || budget=" (or until $MINUTES minutes)"
echo "[toy] training up to $STEPS steps$budget on ${NGPUS:-2} ranks, seed $SEED: $OUT (log: $OUT/train.log)"
# one line per step and per eval from the log (the trainer's metrics dicts): reward, seconds, held-out strict accuracy
STEP_LINE="s/.*'reward\/toy_compositional': '([^']*)'.*'train\/optimizer_steps': '([^']*)'"
STEP_LINE+=".*'time\/step_s': '([^']*)'.*/[toy]   update \\2: reward \\1, \\3 s/p"
EVAL_LINE="s/.*'eval\/toy_heldout\/strict_acc': '([^']*)'.*'eval\/toy_heldout\/claim_score': '([^']*)'.*/"
EVAL_LINE+="[toy]   held-out eval: strict accuracy \\1, claim score \\2/p"
NGPUS="${NGPUS:-2}" REPORT_TO=none MODEL_CONFIG=configs/models/deepgen_toy.py \
  DATASET_CONFIG=assets/rl_datasets/toy/toy_rl_mix.yaml EVAL_DATASET_CONFIG=tests/toy/eval_toy_heldout.yaml \
  SFTAUX_DATASET_CONFIG="$OUT/sftaux/toy_sftaux.py" OUTPUT_DIR="$OUT" \
  bash scripts/train.sh --rollout_n 8 --rollout_micro_batch_size 64 --atrain_micro_batch_size 64 \
  --rollout_global_batch_size 1024 --num_inference_steps 8 --image_height 64 --image_width 64 \
  --learning_rate 3e-4 --warmup_steps 0 --clip_range 0.2 --beta 0 --sde_eta 0.7 --sde_window_size 1 \
  --sde_window_range 3,6 --reward_kwargs '{"toy_compositional": {"exclusive": true, "soft_color": true}}' \
  --skip_zero_advantage true \
  --sftaux_coef 0.001 --ema_decay 0.95 --gradient_checkpointing false \
  --cpu_fast_gelu true --reuse_last_velocity true \
  --eval_judge false --eval_at_start true --eval_freq "$EVAL_EVERY" --max_steps "$STEPS" --save_steps "$STEPS" \
  --max_train_minutes "$MINUTES" --max_train_minutes_from "$t0" \
  --save_total_limit 1 --log_images_every 0 --reward_workers 2 --seed "$SEED" "$@" 2>&1 \
  | tee "$OUT/train.log" | sed -u -n -E -e "$STEP_LINE" -e "$EVAL_LINE" \
  || { echo "[toy] training failed; the last lines of $OUT/train.log:" >&2; tail -n 30 "$OUT/train.log" >&2; exit 1; }
echo "[toy] done in $(( $(date +%s) - ${t0%.*} )) s; held-out statistics (python -m deepgen_rl.toy.run_report):"
python -m deepgen_rl.toy.run_report "$OUT" --t0 "$t0" --json "$OUT/report.json"
