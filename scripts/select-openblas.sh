#!/usr/bin/env bash
# Selects OpenBLAS's OpenMP build for libblas.so.3, liblapack.so.3 and libopenblas.so.0 (where it
# is installed). OpenBLAS's pthread build fights faiss's OpenMP threads (k-means 3x slower, see
# docs/build.md), and LibTorch links libopenblas.so.0 directly: left on the pthread build, its
# idle threads spun in sched_yield for ~30% of a translation's CPU time and two OpenBLAS copies
# shared a process. Used by scripts/setup.sh and by the container images (deploy/docker).
set -euo pipefail
as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
for lib in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
  alt=/usr/lib/${arch}/openblas-openmp/${lib}
  # Only when it changes anything: a user without root then needs no sudo on every run.
  if [[ -e $alt && $(readlink -f "/etc/alternatives/${lib}-${arch}") != "$(readlink -f "$alt")" ]]; then
    as_root update-alternatives --set "${lib}-${arch}" "$alt" >/dev/null
  fi
done
