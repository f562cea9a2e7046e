#!/usr/bin/env bash
# Starts a local knnserve cluster on loopback from one index directory: every shard of the
# index × R replicas (knnserve-shard) and a router (knnserve-router) in front of them. Waits
# until every process reports it is serving, then prints the router's address.
#
#   deploy/local/up.sh INDEX_DIR [-r REPLICAS] [-p BASE_PORT] [-d RUN_DIR] [-n NICE]
#                      [-s SHARD_FLAGS] [-- ROUTER_FLAGS...]
#
# -n runs every server at that niceness (nice(1)): with a decoder on the same machine, e.g.
# -n 19 lets the decoder's model threads go first and the servers fill the time they leave.
# -s passes flags to every knnserve-shard, split at spaces: e.g. -s "--subset-only --threads 2".
# Ports: the router listens on BASE_PORT (default 6000), its metrics on BASE_PORT+1; shard s,
# replica r on BASE_PORT+10+2*(s*R+r), its metrics on the port after. Logs, pids and the shard
# map go to RUN_DIR (default /tmp/knnserve-local). Binaries come from $KNNSERVE_BIN (default
# build/bin). deploy/local/down.sh stops the cluster.
set -euo pipefail

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 1 ]] || usage
index_dir=$1; shift
replicas=1; base_port=6000; run_dir=/tmp/knnserve-local; niceness=0; shard_flags=()
while [[ $# -gt 0 ]]; do
  case $1 in
    -r) replicas=$2; shift 2 ;;
    -p) base_port=$2; shift 2 ;;
    -d) run_dir=$2; shift 2 ;;
    -n) niceness=$2; shift 2 ;;
    -s) read -r -a shard_flags <<< "$2"; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
router_flags=("$@")
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=${KNNSERVE_BIN:-$repo/build/bin}
for exe in knnserve-shard knnserve-router; do
  [[ -x $bin/$exe ]] || { echo "up.sh: $bin/$exe not found (build it, or set KNNSERVE_BIN)" >&2; exit 1; }
done
if [[ ! $niceness =~ ^-?[0-9]+$ ]]; then
  echo "up.sh: -n wants an integer niceness, not '$niceness'" >&2
  exit 2
fi
[[ -f $index_dir/manifest.json ]] || { echo "up.sh: $index_dir/manifest.json not found" >&2; exit 1; }
source "$repo/deploy/local/processes.sh"
if [[ -s $run_dir/pids ]]; then
  if [[ -n $(running_processes "$run_dir/pids") ]]; then
    echo "up.sh: a cluster is running from $run_dir (deploy/local/down.sh -d $run_dir)" >&2
    exit 1
  fi
  echo "up.sh: $run_dir/pids lists no running server (left by a cluster that ended): starting over" >&2
fi
shards=$(/usr/bin/python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["shards"]))' \
  "$index_dir/manifest.json")
mkdir -p "$run_dir/logs"
: > "$run_dir/pids"
# Until every server serves, a failure or an interruption stops the ones already started.
trap '"$repo/deploy/local/down.sh" -d "$run_dir" >&2 || true' EXIT
: > "$run_dir/shards.txt"

logs=(); pids=()
for ((s = 0; s < shards; s++)); do
  line="$s"
  for ((r = 0; r < replicas; r++)); do
    port=$((base_port + 10 + 2 * (s * replicas + r)))
    log=$run_dir/logs/shard-$s-$r.log
    nice -n "$niceness" "$bin/knnserve-shard" --index "$index_dir" --shard "$s" \
      --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$((port + 1))" \
      "${shard_flags[@]}" > "$log" 2>&1 &
    record_process $! "$run_dir/pids"
    pids+=($!)
    logs+=("$log")
    line="$line 127.0.0.1:$port"
  done
  echo "$line" >> "$run_dir/shards.txt"
done
router_log=$run_dir/logs/router.log
nice -n "$niceness" "$bin/knnserve-router" --shards "$run_dir/shards.txt" \
  --listen "127.0.0.1:$base_port" --metrics-listen "127.0.0.1:$((base_port + 1))" \
  "${router_flags[@]}" > "$router_log" 2>&1 &
record_process $! "$run_dir/pids"
pids+=($!)
logs+=("$router_log")

# Every process logs {"msg":"serving"} once it serves (the router once every shard answers). One
# that exited (a bad flag, a crash) or logged an error will not.
deadline=$((SECONDS + ${KNNSERVE_UP_TIMEOUT:-600}))
for i in "${!logs[@]}"; do
  log=${logs[i]}
  until grep -q '"msg":"serving"' "$log"; do
    if ! kill -0 "${pids[i]}" 2>/dev/null || grep -q '"level":"error"' "$log" ||
      ((SECONDS > deadline)); then
      kill -0 "${pids[i]}" 2>/dev/null || echo "up.sh: process ${pids[i]} exited" >&2
      echo "up.sh: not serving: $log" >&2
      tail -5 "$log" >&2
      exit 1
    fi
    sleep 0.2
  done
done
trap - EXIT
echo "127.0.0.1:$base_port"
