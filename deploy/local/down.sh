#!/usr/bin/env bash
# Stops the cluster deploy/local/up.sh started: SIGTERM to every process (they drain: calls in
# flight finish), waits up to 60 s, then SIGKILL what is left.
#
#   deploy/local/down.sh [-d RUN_DIR]     (default /tmp/knnserve-local)
set -euo pipefail
run_dir=/tmp/knnserve-local
if [[ ${1:-} == -d ]]; then run_dir=$2; fi
[[ -f $run_dir/pids ]] || { echo "down.sh: no cluster in $run_dir" >&2; exit 0; }
source "$(dirname "$0")/processes.sh"
# Only the servers this cluster started: a listed PID whose start time differs is another process.
mapfile -t pids < <(running_processes "$run_dir/pids")
for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
for ((i = 0; i < 600; i++)); do
  alive=0
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
  ((alive)) || break
  sleep 0.1
done
for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
rm -f "$run_dir/pids"
echo "stopped ${#pids[@]} processes"
