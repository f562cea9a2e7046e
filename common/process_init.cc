#include "common/process_init.h"

#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/synchronization/mutex.h"

namespace knnserve {
namespace {

CpuVectorFeatures ThisCpu() {
  __builtin_cpu_init();
  CpuVectorFeatures cpu;
  cpu.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  cpu.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vl");
  return cpu;
}

// OpenBLAS 0.3.21 (Debian 12's) does not know CPUs released after it, e.g. Intel Xeons of
// model 207 (Emerald Rapids), and runs them on its SSE3 kernels: there sgemm took 57% of base
// MT's samples and base MT ran at 0.41x the speed it has with the AVX-512 kernels (docs/build.md).
// Looked up at run time: OpenBLAS is what libblas.so.3 resolves to here, but not necessarily
// everywhere.
void UseFasterOpenBlasKernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  using CoreNameFn = char* (*)();
  const auto core_name = reinterpret_cast<CoreNameFn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (core_name == nullptr) return;
  const char* core = OpenBlasCoreFor(core_name(), ThisCpu());
  if (core == nullptr) return;
  setenv("OPENBLAS_CORETYPE", core, /*overwrite=*/1);
  execv("/proc/self/exe", argv);
  // Still here: run on as we are, with the variable unset again for our children.
  std::fprintf(stderr, "warning: could not re-execute with OPENBLAS_CORETYPE=%s (%s)\n", core,
               std::strerror(errno));
  unsetenv("OPENBLAS_CORETYPE");
}

// glibc gives the top of a heap back to the kernel once more than the trim threshold is free
// there, and serves blocks above the mmap threshold with fresh mappings; both thresholds
// start near 128 KiB and grow only with the largest block freed so far. A served request moves
// a few such blocks (a batch of 64 fp32 queries of dimension 512 is 128 KiB, on every hop),
// so every request faulted its pages in again and unmapped them after, with a TLB shootdown
// on the other cores: ~45 page faults per request through a router and a shard, ~1.5 with
// these settings, and the p50 of that request with an engine that answers at once fell from
// 1.13 to 0.89 ms (medians of 6 alternated runs, docs/service.md run 16). The cost is freed memory
// kept: up to the trim threshold per heap, blocks of up to 32 MiB (glibc's largest mmap threshold)
// taken from the heaps.
void KeepFreedMemoryForReuse() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) return;
  constexpr int kMmapThreshold = 32 << 20;
  constexpr int kTrimThreshold = 64 << 20;
  // Either call fails only under an allocator that is not glibc's (sanitizers): no tuning then.
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  mallopt(M_TRIM_THRESHOLD, kTrimThreshold);
}

}  // namespace

const char* OpenBlasCoreFor(const char* detected, CpuVectorFeatures cpu) {
  if (detected == nullptr || std::strcmp(detected, "Prescott") != 0) return nullptr;
  if (cpu.avx512) return "SkylakeX";
  if (cpu.avx2_fma) return "Haswell";
  return nullptr;
}

void InitProcess(char** argv) {
  UseFasterOpenBlasKernels(argv);
  // The detection costs a graph update per lock; a served step takes a few dozen locks in
  // gRPC alone (2% of the router's samples went to GraphCycles::GetId).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  KeepFreedMemoryForReuse();
}

}  // namespace knnserve
