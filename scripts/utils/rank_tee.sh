#!/usr/bin/env bash
# Run a command with its stdout/stderr also appended to $DEEPGEN_LOG_DIR/<global rank>.log (torchrun sets RANK).
set -uo pipefail
mkdir -p "${DEEPGEN_LOG_DIR:?DEEPGEN_LOG_DIR must be set}"
log="$DEEPGEN_LOG_DIR/${RANK:-0}.log"
"$@" > >(tee -a "$log") 2> >(tee -a "$log" >&2)
status=$?
wait
exit $status
