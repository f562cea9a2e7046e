#!/usr/bin/env bash
# One-command set-up on a fresh Debian 12 machine: installs the packages knnserve needs
# (idempotent; root or sudo), then configures and builds into build/ (Release, ccache when
# present). Executables land in build/bin/.
#
#   scripts/setup.sh                 # install + build
#   KNNSERVE_SKIP_APT=1 scripts/setup.sh      # build only
#   KNNSERVE_CMAKE_ARGS="-DKNNSERVE_WITH_CUDA=ON" scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

readonly PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache git ca-certificates
  libfaiss-dev libopenblas-dev libopenblas0-openmp
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libhdf5-dev libabsl-dev libtorch-dev libsentencepiece-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libssl-dev
  python3 python3-numpy python3-h5py python3-grpcio python3-grpc-tools python3-torch
  python3-faiss python3-yaml
)

as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    echo "setup: all ${#PACKAGES[@]} packages present"
  else
    echo "setup: installing ${#missing[@]} packages: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "${missing[@]}"
  fi
  scripts/select-openblas.sh
}

build() {
  local build_dir=${KNNSERVE_BUILD_DIR:-build}
  local jobs
  jobs=${KNNSERVE_JOBS:-$(nproc)}
  local launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  # shellcheck disable=SC2086
  # Defaults first so that KNNSERVE_CMAKE_ARGS overrides them, and a build directory configured
  # earlier with other options (CMake keeps them in its cache) is brought back to the full
  # build: tests and benchmarks on, no sanitizer, no CUDA.
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKNNSERVE_WITH_TORCH=ON \
    -DKNNSERVE_BUILD_TESTS=ON -DKNNSERVE_BUILD_BENCHMARKS=ON -DKNNSERVE_SANITIZE= \
    -DKNNSERVE_WITH_CUDA=OFF "${launcher[@]}" ${KNNSERVE_CMAKE_ARGS:-}
  cmake --build "$build_dir" -j "$jobs"
  echo "setup: built into $build_dir/ (executables in $build_dir/bin/)"
}

[[ ${KNNSERVE_SKIP_APT:-0} == 1 ]] || install_packages
build
