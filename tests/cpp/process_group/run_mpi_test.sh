#!/usr/bin/env bash
# Starts an MPI test program on N ranks of this machine: run_mpi_test.sh MPIEXEC N PROGRAM [ARGS...].
# --oversubscribe: more ranks than cores is fine for a test. OpenMPI refuses to start as root unless told, and CI
# runs as root, so the flag is given exactly then.
set -euo pipefail
mpiexec="$1"
ranks="$2"
shift 2
as_root=()
if [ "$(id -u)" = 0 ]; then as_root=(--allow-run-as-root); fi
exec "$mpiexec" --oversubscribe "${as_root[@]}" -np "$ranks" "$@"
