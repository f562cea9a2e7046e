#!/bin/bash
# The GPU check of the CUDA code, in two halves:
#   scripts/cuda-device-check.sh stage   here (any x86-64 Debian machine with nvcc): builds the
#       CUDA test and benchmark in build-cuda/ and stages them with the shared libraries they
#       need (those of a plain glibc excepted) in .devrun/;
#   .devrun/cuda-device-check.sh run [adc_cuda_bench flags]   on the GPU machine (which has none
#       of the project's dependencies): CudaSubsetAdc against SubsetAdc (cuda_test), the
#       GPU/CPU benchmark, then compute-sanitizer's memcheck and racecheck when present.
#       Logs go to $OUT (or .devrun/out).
set -euo pipefail
mode=${1:-}
shift || true
case $mode in
  stage)
    cd "$(dirname "$0")/.."
    cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DKNNSERVE_WITH_CUDA=ON \
      -DKNNSERVE_WITH_TORCH=OFF -DKNNSERVE_BUILD_TESTS=ON -DKNNSERVE_BUILD_BENCHMARKS=ON > /dev/null
    cmake --build build-cuda --target cuda_test adc_cuda_bench
    rm -rf .devrun && mkdir -p .devrun/lib
    cp build-cuda/tests/cuda_test build-cuda/bin/adc_cuda_bench scripts/cuda-device-check.sh .devrun/
    for binary in .devrun/cuda_test .devrun/adc_cuda_bench; do
      ldd "$binary" | awk '$3 ~ /^\// {print $3}'
    done | grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt)\.so' | sort -u |
      xargs -I{} cp -L {} .devrun/lib/
    # Compressed: OpenBLAS alone is 35 MB, and what travels to the GPU machine is limited.
    tar -C .devrun -cJf .devrun/lib.tar.xz lib && rm -r .devrun/lib
    echo "staged $(du -sh .devrun | cut -f1) in .devrun/: run .devrun/cuda-device-check.sh run there"
    ;;
  run)
    cd "$(dirname "$0")"
    out=${OUT:-$PWD/out}
    mkdir -p "$out"
    [[ -d lib ]] || tar -xJf lib.tar.xz
    export PATH=$PATH:/usr/local/cuda/bin
    export LD_LIBRARY_PATH=$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    nvidia-smi -L || true
    ./cuda_test 2>&1 | tee "$out/test.log" | tail -6
    ./adc_cuda_bench "$@" 2>&1 | tee "$out/bench.log"
    if command -v compute-sanitizer > /dev/null; then
      timeout 150 compute-sanitizer --tool memcheck ./cuda_test 2>&1 | tail -2 | tee "$out/memcheck.log"
      timeout 60 compute-sanitizer --tool racecheck ./cuda_test --gtest_filter='*Concurrent*' 2>&1 |
        tail -1 | tee "$out/racecheck.log"
    fi
    ;;
  *)
    echo "usage: $0 stage | run [adc_cuda_bench flags]" >&2
    exit 2
    ;;
esac
