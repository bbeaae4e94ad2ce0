# Sourced by scripts/quickstart.sh and scripts/quickstart_tiny.sh (after `cd "$ROOT"`): builds/reuses .venv
# (scripts/setup_env.sh), activates it and sets the offline, thread and cache variables both quickstarts use.
bash scripts/setup_env.sh
# shellcheck disable=SC1091
. "${DEEPGEN_VENV:-$ROOT/.venv}/bin/activate"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
export DEEPGEN_TINY_DIR="${DEEPGEN_TINY_DIR:-$ROOT/.cache/deepgen_tiny}"
export DEEPGEN_TOY_DIR="${DEEPGEN_TOY_DIR:-$ROOT/.cache/deepgen_toy${DEEPGEN_TOY_VARIANT:+_$DEEPGEN_TOY_VARIANT}}"
# glibc malloc: keep freed activation memory in the process (fewer page faults; the same numbers)
# shellcheck source=scripts/utils/cpu_malloc.sh
. scripts/utils/cpu_malloc.sh
