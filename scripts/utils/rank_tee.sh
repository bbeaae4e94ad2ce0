#!/usr/bin/env bash
# Run a command with its stdout/stderr also appended to $DEEPGEN_LOG_DIR/<global rank>.log (torchrun sets RANK).
# The tee processes ignore SIGINT: a Ctrl-C reaches the trainer (which stops within seconds and says so), while the
# tees keep copying until the trainer's output ends, so the log keeps its last lines.
set -uo pipefail
mkdir -p "${DEEPGEN_LOG_DIR:?DEEPGEN_LOG_DIR must be set}"
log="$DEEPGEN_LOG_DIR/${RANK:-0}.log"
"$@" > >(trap '' INT; exec tee -a "$log") 2> >(trap '' INT; exec tee -a "$log" >&2)
status=$?
wait
exit $status
