#include "common/process_init.h"

#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

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

struct MallocParameterNames {
  int mallopt_param;
  const char* tunable;  // in GLIBC_TUNABLES
  const char* legacy;   // glibc's older environment variable for it
};

MallocParameterNames NamesOf(MallocParameter parameter) {
  switch (parameter) {
    case MallocParameter::kMmapThreshold:
      return {M_MMAP_THRESHOLD, "glibc.malloc.mmap_threshold", "MALLOC_MMAP_THRESHOLD_"};
    case MallocParameter::kMmapMax:
      return {M_MMAP_MAX, "glibc.malloc.mmap_max", "MALLOC_MMAP_MAX_"};
    case MallocParameter::kTrimThreshold:
      return {M_TRIM_THRESHOLD, "glibc.malloc.trim_threshold", "MALLOC_TRIM_THRESHOLD_"};
    case MallocParameter::kTopPad:
      return {M_TOP_PAD, "glibc.malloc.top_pad", "MALLOC_TOP_PAD_"};
  }
  return {};
}

}  // namespace

const char* OpenBlasCoreFor(const char* detected, CpuVectorFeatures cpu) {
  if (detected == nullptr || std::strcmp(detected, "Prescott") != 0) return nullptr;
  if (cpu.avx512) return "SkylakeX";
  if (cpu.avx2_fma) return "Haswell";
  return nullptr;
}

bool MallocParameterConfigured(MallocParameter parameter, const char* glibc_tunables,
                               const char* legacy_value) {
  if (legacy_value != nullptr) return true;
  if (glibc_tunables == nullptr) return false;
  const std::string_view name = NamesOf(parameter).tunable;
  // GLIBC_TUNABLES is a colon-separated list of name=value.
  for (std::string_view rest = glibc_tunables; !rest.empty();) {
    const size_t end = std::min(rest.find(':'), rest.size());
    const std::string_view entry = rest.substr(0, end);
    if (entry.substr(0, entry.find('=')) == name) return true;
    rest.remove_prefix(std::min(end + 1, rest.size()));
  }
  return false;
}

void SetMallocParameter(MallocParameter parameter, int value) {
  const MallocParameterNames names = NamesOf(parameter);
  if (MallocParameterConfigured(parameter, std::getenv("GLIBC_TUNABLES"),
                                std::getenv(names.legacy))) {
    return;
  }
  // Fails only under an allocator that is not glibc's (sanitizers): no tuning then.
  mallopt(names.mallopt_param, value);
}

// With its dynamic thresholds (the state until the first mallopt) glibc serves a block with a
// mapping of its own only beyond the largest such block freed so far, and gives the free top of
// a thread's heap back to the kernel (madvise(MADV_DONTNEED)) once more than about twice that
// is free. A served request moves a few blocks of 128 KiB and more (a batch of 64 fp32 queries
// of dimension 512 on every hop) through the gRPC threads' heaps, so those tops were given back
// and faulted in again on every request: 1,285 madvise calls in one service-alone run of
// service_bench (part s), ~45 page faults per request through a router and a shard, against
// ~1.5 with these settings; that request's p50 fell from 1.13 to 0.89 ms (medians of 6
// alternated runs, docs/service.md run 16). Both thresholds are set because setting either
// fixes the other at its default: the trim threshold alone left the mmap threshold at 128 KiB,
// below such a block, and each request mapped and unmapped its blocks instead (288 munmap calls
// in a run of the same part). The cost is freed memory kept: up to 64 MiB free at the top of each
// heap, and glibc makes up to 8 heaps (arenas) per core for threads that allocate at once.
void KeepServedBlocksOnTheHeap() {
  SetMallocParameter(MallocParameter::kMmapThreshold, 32 << 20);  // glibc's largest
  SetMallocParameter(MallocParameter::kTrimThreshold, 64 << 20);
}

void InitProcess(char** argv) {
  UseFasterOpenBlasKernels(argv);
  // The detection costs a graph update per lock; a served step takes a few dozen locks in
  // gRPC alone (2% of the router's samples went to GraphCycles::GetId).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace knnserve
