#!/usr/bin/env bash
# The knnserve demo: domain adaptation of a general-domain English->German model to the office
# domain (LibreOffice UI and help) with kNN-MT, through a sharded retrieval service on loopback.
#
#   scripts/demo.sh              # set up, build the office datastore + 2-shard index, start
#                                # 2 shards + router, translate test.tsv with base MT, kNN-MT and
#                                # subset kNN-MT, print BLEU / chrF / tokens/s, stop the servers
#   scripts/demo.sh --embedded   # the same without servers: the index is searched in-process
#
# Steps (each reuses what an earlier run built):
#   1. scripts/setup.sh (packages + build into build/)        KNNSERVE_SKIP_SETUP=1 skips it
#   2. corpus: ../shared/corpus when present, else scripts/fetch-corpus.sh rebuilds it
#   3. demo model: models/demo/model.pt (scripts/train-demo-model.sh made it)
#   4. datastore of datastore.tsv (office, 58k pairs): values, keys, sentence keys, a 2-shard
#      IVF-PQ token index with subset codes, a sentence index   (knnserve datastore build)
#   5. k / temperature / weight: scripts/demo-knn.json (tuned on dev.tsv by `knnserve tune`);
#      when it is missing, or with DEMO_TUNE=1, the demo tunes on the first 200 dev sentences
#      into runs/knn-demo/knn-tuned.json
#   6. deploy/local/up.sh: 2 shard servers + a router on 127.0.0.1 (not with --embedded)
#   7. translate test.tsv three ways, score with `knnserve evaluate`, print the table and five
#      sentences where kNN-MT changed the translation; stop the servers
#
# Environment: BUILD (default $KNNSERVE_BUILD_DIR, else build), DEMO_DIR (runs/knn-demo), DEMO_SENTENCES (test sentences,
# default all 1000), THREADS (2), REMOTE_THREADS (decoder threads of kNN-MT through the router,
# default THREADS), SERVER_NICE (the servers' niceness, 19: the decoder on this machine goes
# first), BEAM (5), BATCH (64), PORT (router port, 6400).
set -euo pipefail
cd "$(dirname "$0")/.."

EMBEDDED=0
for arg in "$@"; do
  case $arg in
    --embedded) EMBEDDED=1 ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo: unknown argument $arg (try --help)" >&2; exit 2 ;;
  esac
done

BUILD=${BUILD:-${KNNSERVE_BUILD_DIR:-build}}
export KNNSERVE_BUILD_DIR=$BUILD  # where scripts/setup.sh builds
DEMO_DIR=${DEMO_DIR:-runs/knn-demo}
THREADS=${THREADS:-2}
REMOTE_THREADS=${REMOTE_THREADS:-$THREADS}
SERVER_NICE=${SERVER_NICE:-19}
BEAM=${BEAM:-5}
BATCH=${BATCH:-64}
PORT=${PORT:-6400}
MODEL=${MODEL:-models/demo/model.pt}
KNN_PARAMS=${KNN_PARAMS:-scripts/demo-knn.json}
FACTORY=${FACTORY:-IVF1024,PQ32np}  # np: no polysemous training (minutes for nothing here)
NPROBE=${NPROBE:-8}  # of 1024 lists: dev BLEU as at 32, 2.4x less retrieval time (docs/knn.md)
SUBSET_SENTENCES=${SUBSET_SENTENCES:-512}
# libgomp's default busy-waiting burns the CPU of an oversubscribed 2-core machine (the model
# and faiss threads share it): passive waiting is several times faster there (docs/model.md).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
KNNSERVE=$BUILD/bin/knnserve
PY=/usr/bin/python3
start=$SECONDS

step() { printf '\n== [%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

step "1/7 set-up (packages, build into $BUILD)"
if [[ ${KNNSERVE_SKIP_SETUP:-0} != 1 ]]; then
  scripts/setup.sh
fi
for exe in knnserve knnserve-shard knnserve-router; do
  [[ -x $BUILD/bin/$exe ]] || { echo "demo: $BUILD/bin/$exe missing (run scripts/setup.sh)" >&2; exit 1; }
done
after_setup=$SECONDS

step "2/7 corpus"
if [[ -s ../shared/corpus/test.tsv ]]; then
  CORPUS=../shared/corpus
else
  CORPUS=data/corpus
  scripts/fetch-corpus.sh "$CORPUS"
fi
echo "corpus: $CORPUS" >&2

step "3/7 demo model"
if [[ ! -s $MODEL ]]; then
  echo "demo: $MODEL not found: scripts/train-demo-model.sh trains it (about 100 minutes)" >&2
  exit 1
fi
"$KNNSERVE" model info --checkpoint "$MODEL" | head -3 >&2

mkdir -p "$DEMO_DIR/out"
TEST=$DEMO_DIR/test.tsv
if [[ -n ${DEMO_SENTENCES:-} ]]; then
  head -n "$DEMO_SENTENCES" "$CORPUS/test.tsv" > "$TEST"
else
  cp "$CORPUS/test.tsv" "$TEST"
fi

step "4/7 office datastore + 2-shard index ($FACTORY) + sentence index"
DATASTORE=$DEMO_DIR/datastore
"$KNNSERVE" datastore build --corpus "$CORPUS/datastore.tsv" --model "$MODEL" \
  --out "$DATASTORE" --factory "$FACTORY" --shards 2 --train-size 200000 --threads "$THREADS"

step "5/7 kNN-MT parameters"
if [[ ${DEMO_TUNE:-0} == 1 || ! -s $KNN_PARAMS ]]; then
  echo "tuning k / temperature / weight on dev.tsv (never on test)" >&2
  KNN_PARAMS=$DEMO_DIR/knn-tuned.json
  "$KNNSERVE" tune --model "$MODEL" --datastore "$DATASTORE" --dev "$CORPUS/dev.tsv" \
    --sentences 200 --beam 1 --knn-nprobe "$NPROBE" --threads "$THREADS" --out "$KNN_PARAMS"
fi
cat "$KNN_PARAMS" >&2

ROUTER=()
if [[ $EMBEDDED == 1 ]]; then
  step "6/7 embedded mode: no servers, the index is searched in-process"
  WHERE=(--datastore "$DATASTORE" --threads "$THREADS")
else
  step "6/7 2 shard servers + router on 127.0.0.1:$PORT"
  CLUSTER=$DEMO_DIR/cluster
  if [[ -s $CLUSTER/pids ]]; then deploy/local/down.sh -d "$CLUSTER" >&2 || true; fi
  trap 'deploy/local/down.sh -d "$CLUSTER" >&2 || true' EXIT
  address=$(KNNSERVE_BIN=$BUILD/bin deploy/local/up.sh "$DATASTORE/index" -p "$PORT" \
    -d "$CLUSTER" -n "$SERVER_NICE")
  # The decoder interleaves two batches (one's retrieval runs while the model computes the
  # other's step); up to batch 16 its model leaves the servers a core, beyond it the servers
  # run in the time the model's threads leave (docs/knn.md).
  WHERE=(--datastore "$DATASTORE" --router "$address" --threads "$REMOTE_THREADS")
  ROUTER=(router "$address")
fi

step "7/7 translate $(wc -l < "$TEST") office test sentences: base, kNN-MT, subset kNN-MT"
COMMON=(--model "$MODEL" --input "$TEST" --beam "$BEAM" --batch-size "$BATCH")
KNN=(--knn-config "$KNN_PARAMS" --knn-nprobe "$NPROBE")
"$KNNSERVE" translate "${COMMON[@]}" --mode base --threads "$THREADS" \
  --output "$DEMO_DIR/out/base.txt" --stats-json "$DEMO_DIR/out/base.json"
"$KNNSERVE" translate "${COMMON[@]}" --mode knn "${WHERE[@]}" "${KNN[@]}" \
  --output "$DEMO_DIR/out/knn.txt" --stats-json "$DEMO_DIR/out/knn.json"
"$KNNSERVE" translate "${COMMON[@]}" --mode subset-knn "${WHERE[@]}" "${KNN[@]}" \
  --subset-sentences "$SUBSET_SENTENCES" \
  --output "$DEMO_DIR/out/subset.txt" --stats-json "$DEMO_DIR/out/subset.json"
for mode in base knn subset; do
  "$KNNSERVE" evaluate --hyp "$DEMO_DIR/out/$mode.txt" --ref "$TEST" > "$DEMO_DIR/out/$mode.score"
done

"$PY" - "$DEMO_DIR/out" "$TEST" "$EMBEDDED" <<'EOF'
import json, re, sys
out, test, embedded = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
pairs = [l.rstrip("\n").split("\t") for l in open(test, encoding="utf-8")]
rows, hyps = [], {}
names = {"base": "base MT", "knn": "kNN-MT", "subset": "subset kNN-MT"}
for mode in ("base", "knn", "subset"):
    score = open(f"{out}/{mode}.score").read()
    bleu = float(re.search(r"BLEU = ([0-9.]+)", score).group(1))
    chrf = float(re.search(r"chrF2 = ([0-9.]+)", score).group(1))
    stats = json.load(open(f"{out}/{mode}.json"))
    tps = stats["tokens"] / stats["seconds"]
    share = 100 * (stats["retrieval_seconds"] + stats["select_seconds"]) / stats["seconds"]
    rows.append((names[mode], bleu, chrf, tps, share))
    hyps[mode] = open(f"{out}/{mode}.txt", encoding="utf-8").read().split("\n")
where = "embedded (in-process index)" if embedded else "2 shards + router on loopback"
print(f"\nOffice-domain test set, {len(pairs)} sentences, retrieval: {where}\n")
print(f"| {'system':<14} | {'BLEU':>6} | {'chrF':>6} | {'tokens/s':>8} | {'vs base':>7} | {'retrieval':>9} |")
print(f"|{'-'*16}|{'-'*8}|{'-'*8}|{'-'*10}|{'-'*9}|{'-'*11}|")
base_tps = rows[0][3]
for name, bleu, chrf, tps, share in rows:
    print(f"| {name:<14} | {bleu:6.2f} | {chrf:6.2f} | {tps:8.1f} | {tps / base_tps:6.2f}x | {share:8.0f}% |")
print("\nFive sentences where kNN-MT changed the translation (largest gain in reference-word overlap first):")
def overlap(h, r):
    h, r = h.split(), r.split()
    return sum(min(h.count(w), r.count(w)) for w in set(h)) / max(len(r), 1)
changed = [i for i, (b, k) in enumerate(zip(hyps["base"], hyps["knn"])) if b != k and i < len(pairs)]
changed.sort(key=lambda i: overlap(hyps["base"][i], pairs[i][1]) - overlap(hyps["knn"][i], pairs[i][1]))
for i in changed[:5]:
    print(f"\n  source:    {pairs[i][0]}\n  reference: {pairs[i][1]}\n  base MT:   {hyps['base'][i]}\n  kNN-MT:    {hyps['knn'][i]}")
print(f"\n{len(changed)} of {len(pairs)} translations changed by kNN-MT.")
EOF

if [[ $EMBEDDED == 0 ]]; then
  deploy/local/down.sh -d "$CLUSTER" >&2
  trap - EXIT
fi
echo "demo: $((SECONDS - after_setup)) s after set-up ($((SECONDS - start)) s in all); outputs in $DEMO_DIR/out" >&2
