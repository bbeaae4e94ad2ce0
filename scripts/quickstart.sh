#!/usr/bin/env bash
# Quickstart (README's first command; the toy world, docs/toy_world.md): watch RL teach a text-to-image model to
# follow prompts, on a laptop CPU. bash scripts/quickstart_tiny.sh is the pipeline demo with the OCR service instead.
#   1. builds/reuses .venv (same as scripts/test.sh)
#   2. loads the pre-trained toy DeepGen, the `slots_wide` variant (configs/models/deepgen_toy.py), or builds it once
#      (announced, with progress bars: ~8.5 minutes on an idle 2-core machine, two ranks; cached in
#      .cache/deepgen_toy_slots_wide)
#   3. runs the toy world's headline setting (scripts/toy_prompt_following.sh) for QUICKSTART_STEPS steps on NGPUS
#      ranks (2: one per core): MR-GRPO (cps_sde sampler, gdpo advantages), 1,024 images per step, reward
#      toy_compositional (the programmatic checker), the 64 held-out compositions evaluated (8 images each, ODE, fixed
#      seeds, the EMA's weights) at step 0 and every QUICKSTART_EVAL_EVERY steps; one line per step and per eval,
#      then the run's per-prompt statistics (python -m deepgen_rl.toy.run_report)
#   4. writes outputs/quickstart/: checkpoint, samples_before_after.png (the first 12 held-out prompts, each image with
#      its checker verdict), samples_changed.png (images whose verdict changed, labelled as selected by outcome),
#      accuracy_curve.png, reward_curve.png, report.html
# 20 steps take ~4 minutes on 2 cores after the build (docs/toy_world.md, "The CI test and the quickstart on
# slots_wide"); 15 minutes of the same run (bash scripts/toy_prompt_following.sh) gain +15 to +19 points of held-out
# strict accuracy. The toy world needs no reward service (no OCR: it would read nothing in images of coloured shapes).
# Env: QUICKSTART_STEPS (20), QUICKSTART_EVAL_EVERY (10), QUICKSTART_OUTPUT_DIR (outputs/quickstart), QUICKSTART_SEED
# (0), DEEPGEN_TOY_VARIANT (slots_wide: another variant of deepgen_rl.toy.model.VARIANTS runs the same flags), NGPUS
# (2). Extra arguments go to the trainer and override the setting's flags.
# Rerunning is safe: the previous outputs/quickstart is replaced.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${QUICKSTART_OUTPUT_DIR:-outputs/quickstart}"
VARIANT="${DEEPGEN_TOY_VARIANT:-slots_wide}"
STEPS="${QUICKSTART_STEPS:-20}"
EVAL_EVERY="${QUICKSTART_EVAL_EVERY:-10}"
SEED="${QUICKSTART_SEED:-0}"
for v in STEPS EVAL_EVERY; do
  if ! [[ "${!v}" =~ ^[1-9][0-9]*$ ]]; then
    echo "scripts/quickstart.sh: QUICKSTART_$v must be a positive integer, got '${!v}'" >&2
    exit 2
  fi
done
if ! [[ "$SEED" =~ ^[0-9]+$ ]]; then
  echo "scripts/quickstart.sh: QUICKSTART_SEED must be a non-negative integer, got '$SEED'" >&2
  exit 2
fi

echo "[quickstart] MR-GRPO on the toy DeepGen ($VARIANT) for $STEPS steps on the CPU: $OUT"
TOY_VARIANT="$VARIANT" TOY_STEPS="$STEPS" TOY_MINUTES=0 TOY_EVAL_EVERY="$EVAL_EVERY" TOY_SEED="$SEED" \
  TOY_OUTPUT_DIR="$OUT" bash scripts/toy_prompt_following.sh "$@"

echo "[quickstart] writing the report"
# shellcheck disable=SC1091
. "${DEEPGEN_VENV:-$ROOT/.venv}/bin/activate"
python -m deepgen_rl.toy.quickstart --output_dir "$OUT"
echo "[quickstart] done: open $OUT/report.html"
