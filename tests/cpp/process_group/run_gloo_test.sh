#!/usr/bin/env bash
# Starts a gloo test program as N processes of this machine meeting at a free local port:
# run_gloo_test.sh N PROGRAM [ARGS...]. Fails when any of them fails; rank 1 of --killed-case ends on purpose, with 0.
set -euo pipefail
ranks="$1"
shift
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for ((rank = 0; rank < ranks; rank++)); do
  DEEPINFER_TEST_RANK=$rank DEEPINFER_TEST_SIZE=$ranks DEEPINFER_TEST_ADDR=127.0.0.1:$port "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=1
done
exit $status
