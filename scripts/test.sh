#!/usr/bin/env bash
# Runs every test: installs packages and builds first when needed (scripts/setup.sh is
# idempotent and incremental), then ctest over build/.
#
#   scripts/test.sh                 # everything
#   scripts/test.sh -R TopKMerge    # extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir "${KNNSERVE_BUILD_DIR:-build}" --output-on-failure --no-tests=error -j "$(nproc)" "$@"
