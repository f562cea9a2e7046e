#!/usr/bin/env bash
# Decoding speed of base MT vs kNN-MT (embedded and through the router) vs subset kNN-MT, with
# the demo model and the office datastore that scripts/demo.sh built, at several batch sizes.
# Prints a Markdown table (tokens/s, ratio to base, share of time in retrieval); every run's
# JSON report stays in OUT. Runs the modes of one batch size back to back, ROUNDS times over, and
# keeps each mode's fastest round: the ratios then compare runs made under the same machine load,
# and a drift of the machine's speed during one run weighs on no mode more than on the others.
#
#   bench/knn_speed.sh [SENTENCES]       (default 200 office test sentences)
#
# Environment: BUILD (build), DEMO_DIR (runs/knn-demo), BATCHES ("1 16 64"), ROUNDS (2), BEAM (5),
# THREADS (2), REMOTE_THREADS (THREADS), SERVER_NICE (19), PORT (6450), KNN_PARAMS
# (scripts/demo-knn.json), NPROBE (8). The router and the shards run on the same machine as the
# decoder, at niceness SERVER_NICE: the decoder's model threads go first and the servers take
# the time they leave (the decoder interleaves two batches, the default with --router, so that
# one batch's retrieval runs while the model computes the other's step).
set -euo pipefail
cd "$(dirname "$0")/.."
SENTENCES=${1:-200}
BUILD=${BUILD:-build}
DEMO_DIR=${DEMO_DIR:-runs/knn-demo}
BATCHES=${BATCHES:-1 16 64}
ROUNDS=${ROUNDS:-2}
BEAM=${BEAM:-5}
THREADS=${THREADS:-2}
REMOTE_THREADS=${REMOTE_THREADS:-$THREADS}
SERVER_NICE=${SERVER_NICE:-19}
PORT=${PORT:-6450}
KNN_PARAMS=${KNN_PARAMS:-scripts/demo-knn.json}
NPROBE=${NPROBE:-8}
MODEL=${MODEL:-models/demo/model.pt}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
KNNSERVE=$BUILD/bin/knnserve
DATASTORE=$DEMO_DIR/datastore
OUT=$DEMO_DIR/bench
[[ -f $DATASTORE/index/manifest.json ]] || { echo "run scripts/demo.sh first" >&2; exit 1; }
mkdir -p "$OUT"
head -n "$SENTENCES" "$DEMO_DIR/test.tsv" > "$OUT/input.tsv"

CLUSTER=$OUT/cluster
trap 'deploy/local/down.sh -d "$CLUSTER" >&2 || true' EXIT
address=$(KNNSERVE_BIN=$BUILD/bin deploy/local/up.sh "$DATASTORE/index" -p "$PORT" -d "$CLUSTER" \
  -n "$SERVER_NICE")

run() {  # name batch threads flags...
  local name=$1 batch=$2 threads=$3; shift 3
  echo "bench: $name batch $batch round $round" >&2
  "$KNNSERVE" translate --model "$MODEL" --input "$OUT/input.tsv" --output "$OUT/$name-$batch.txt" \
    --beam "$BEAM" --batch-size "$batch" --threads "$threads" \
    --stats-json "$OUT/$name-$batch-$round.json" "$@" 2>> "$OUT/log.txt"
}
KNN=(--knn-config "$KNN_PARAMS" --knn-nprobe "$NPROBE")
for batch in $BATCHES; do
  for round in $(seq "$ROUNDS"); do
    run base "$batch" "$THREADS" --mode base
    run knn-embedded "$batch" "$THREADS" --mode knn --datastore "$DATASTORE" "${KNN[@]}"
    run knn-remote "$batch" "$REMOTE_THREADS" --mode knn --datastore "$DATASTORE" \
      --router "$address" "${KNN[@]}"
    run subset-embedded "$batch" "$THREADS" --mode subset-knn --datastore "$DATASTORE" "${KNN[@]}"
    run subset-remote "$batch" "$REMOTE_THREADS" --mode subset-knn --datastore "$DATASTORE" \
      --router "$address" "${KNN[@]}"
  done
done

/usr/bin/python3 - "$OUT" "$BATCHES" "$SENTENCES" "$BEAM" "$ROUNDS" "$THREADS" "$REMOTE_THREADS" \
  <<'EOF'
import json, statistics, sys
out, batches, sentences, beam = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4]
rounds, threads, remote_threads = int(sys.argv[5]), sys.argv[6], sys.argv[7]
names = ["base", "knn-embedded", "knn-remote", "subset-embedded", "subset-remote"]
print(f"\n{sentences} office test sentences, beam {beam}; tokens/s of each mode's fastest of "
      f"{rounds} interleaved rounds (ratio to base; retrieval share); decoder threads "
      f"{threads}, remote modes {remote_threads}\n")
# reports[b][n]: mode n's run reports at batch size b, one per round.
reports = {b: {n: [json.load(open(f"{out}/{n}-{b}-{r}.json")) for r in range(1, rounds + 1)]
               for n in names} for b in batches}
tokens_per_second = lambda run: run["tokens"] / run["seconds"]
print("| batch | " + " | ".join(names) + " |")
print("|---" * (len(names) + 1) + "|")
for b in batches:
    cells, base = [], None
    for n in names:
        s = max(reports[b][n], key=tokens_per_second)
        tps = tokens_per_second(s)
        base = base or tps
        share = 100 * (s["retrieval_seconds"] + s["select_seconds"]) / s["seconds"]
        cells.append(f"{tps:.0f}" if n == "base" else f"{tps:.0f} ({tps / base:.2f}x; {share:.0f}%)")
    print(f"| {b} | " + " | ".join(cells) + " |")

# Paired view: each round runs the modes back to back, so a mode's tokens/s over base MT's in the
# same round compares runs made under the same machine load. The median over rounds (with the
# range) does not pick each mode's luckiest round as the table above does.
print(f"\nratio to base MT within each round: median (lowest-highest) of {rounds} rounds\n")
print("| batch | " + " | ".join(names[1:]) + " |")
print("|---" * len(names) + "|")
for b in batches:
    cells = []
    for n in names[1:]:
        ratios = sorted(tokens_per_second(run) / tokens_per_second(base)
                        for run, base in zip(reports[b][n], reports[b]["base"]))
        cells.append(f"{statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})")
    print(f"| {b} | " + " | ".join(cells) + " |")
EOF
