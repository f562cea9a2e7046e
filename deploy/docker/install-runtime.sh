#!/usr/bin/env bash
# Runtime stage of the images (deploy/docker/Dockerfile): installs the packages listed in FILE
# (runtime-packages.sh wrote it in the build stage), selects OpenBLAS's OpenMP build, and
# leaves no apt lists behind.
#
#   install-runtime.sh FILE
set -euo pipefail
apt-get update -qq
xargs -a "$1" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends
"$(dirname "$0")/select-openblas.sh"
ldconfig
rm -rf /var/lib/apt/lists/* "$1"
