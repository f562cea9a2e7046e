#!/usr/bin/env bash
# Makes the demo corpus (English->German software localization, see scripts/build_corpus.sh)
# available in OUTDIR (default data/corpus): links ../shared/corpus when this machine has it,
# otherwise rebuilds it from Debian 12 packages (apt-get download; ~2 GB, ~6 minutes on 2 cores;
# needs an up-to-date apt index). Same package versions give byte-identical files.
#
#   scripts/fetch-corpus.sh [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-data/corpus}
SHARED=${SHARED_CORPUS:-../shared/corpus}
FILES="train.tsv datastore.tsv dev.tsv test.tsv"

have_all() { for f in $FILES; do [ -s "$1/$f" ] || return 1; done; }

if have_all "$OUT"; then
  echo "corpus already in $OUT"
elif have_all "$SHARED"; then
  mkdir -p "$(dirname "$OUT")"
  ln -sfn "$(cd "$SHARED" && pwd)" "$OUT"
  echo "linked $OUT -> $SHARED"
else
  echo "no corpus at $SHARED: rebuilding from Debian packages into $OUT" >&2
  scripts/build_corpus.sh "$OUT"
fi
wc -l $(for f in $FILES; do echo "$OUT/$f"; done)
