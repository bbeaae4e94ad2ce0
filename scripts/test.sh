#!/usr/bin/env bash
# Run the test suite: builds/reuses .venv from the repo's own files, then runs pytest offline.
# Extra arguments go to pytest (e.g. bash scripts/test.sh tests/rl -x).
# Workers: the whole suite (no arguments) runs in DEEPGEN_TEST_WORKERS pytest-xdist processes (default 2, one per core
# of a 2-core machine: each test is single-threaded or starts its own 2 processes), after the tests marked "serial"
# (wall-clock bounds) have run alone; with arguments the default is 1 (one process, so -s prints live).
# DEEPGEN_TEST_WORKERS=1 always runs everything in one process.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh
# shellcheck disable=SC1091
. "${DEEPGEN_VENV:-$ROOT/.venv}/bin/activate"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export WANDB_MODE="${WANDB_MODE:-offline}" SWANLAB_MODE="${SWANLAB_MODE:-disabled}"
export DEEPGEN_TINY_DIR="${DEEPGEN_TINY_DIR:-$ROOT/.cache/deepgen_tiny}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.cache/torch_extensions}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Pinned CPU numerics: the suite's numbers (the toy model's build, the toy RL test's runs) are the same on every
# x86-64 machine with AVX2.
# shellcheck source=scripts/utils/pinned_numerics.sh
. scripts/utils/pinned_numerics.sh
workers="${DEEPGEN_TEST_WORKERS:-$([ "$#" -eq 0 ] && echo 2 || echo 1)}"
if ! [[ "$workers" =~ ^[1-9][0-9]*$ ]]; then
  echo "scripts/test.sh: DEEPGEN_TEST_WORKERS must be a positive integer, got '$workers'" >&2
  exit 2
fi
if [ "$workers" -gt 1 ]; then
  # Tests marked "serial" assert wall-clock bounds (how fast a Ctrl-C stops a run, time to a start-up error): they run
  # first, alone in one process; the rest then run in the workers (worksteal: an idle worker takes queued tests from a
  # busy one, so a few minute-long tests do not end the run alone). Exit status 5 (nothing selected) of one phase is
  # not a failure when the other phase ran tests.
  set +e
  python -m pytest -m serial "$@"
  serial_rc=$?
  python -m pytest -n "$workers" --dist worksteal -m "not serial" "$@"
  rest_rc=$?
  set -e
  if [ "$serial_rc" -eq 5 ] && [ "$rest_rc" -eq 5 ]; then exit 5; fi
  [ "$serial_rc" -eq 5 ] && serial_rc=0
  [ "$rest_rc" -eq 5 ] && rest_rc=0
  if [ "$serial_rc" -ne 0 ]; then exit "$serial_rc"; fi
  exit "$rest_rc"
fi
exec python -m pytest "$@"
