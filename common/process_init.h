// Process-wide settings every knnserve executable applies first thing in main().
#ifndef KNNSERVE_COMMON_PROCESS_INIT_H_
#define KNNSERVE_COMMON_PROCESS_INIT_H_

namespace knnserve {

// 1. Turns off absl::Mutex deadlock detection. Debian's abseil is built without NDEBUG, which
//    leaves the detection on: every lock of every absl::Mutex — gRPC's own locks included —
//    then updates one global lock-order graph under one global lock.
// 2. Where OpenBLAS did not recognise this CPU and fell back to its SSE3 ("Prescott") kernels
//    although the CPU has AVX2 or AVX-512, re-executes the program (same pid, same arguments)
//    with OPENBLAS_CORETYPE naming the kernels the CPU can run (OpenBlasCoreFor). OpenBLAS
//    reads the variable only while it is loaded, before main. A user's own OPENBLAS_CORETYPE
//    is left alone, and so is the process if the re-execution fails.
// REQUIRES: called before any thread is started; argv is main's (null-terminated).
void InitProcess(char** argv);

// The OPENBLAS_CORETYPE to run OpenBLAS with instead of `detected` (openblas_get_corename())
// on a CPU with these features, or nullptr to keep it: only the Prescott fallback is replaced,
// by SkylakeX (AVX-512 F/CD/BW/DQ/VL) or Haswell (AVX2 and FMA).
struct CpuVectorFeatures {
  bool avx2_fma = false;
  bool avx512 = false;  // F, CD, BW, DQ and VL
};
const char* OpenBlasCoreFor(const char* detected, CpuVectorFeatures cpu);

// The glibc malloc parameters knnserve sets (mallopt's M_MMAP_THRESHOLD, M_MMAP_MAX,
// M_TRIM_THRESHOLD, M_TOP_PAD).
enum class MallocParameter { kMmapThreshold, kMmapMax, kTrimThreshold, kTopPad };

// Whether the environment sets `parameter`: `glibc_tunables` (GLIBC_TUNABLES' value, a
// colon-separated list of name=value; may be null) names glibc.malloc.mmap_threshold,
// .mmap_max, .trim_threshold or .top_pad, or `legacy_value` (the value of glibc's older
// variable, MALLOC_MMAP_THRESHOLD_ etc.; may be null) is set.
bool MallocParameterConfigured(MallocParameter parameter, const char* glibc_tunables,
                               const char* legacy_value);

// mallopt(parameter, value), unless this process's environment sets the parameter: a setting
// of the user's wins. The first mallopt of a process turns glibc's dynamic mmap and trim
// thresholds off for good.
void SetMallocParameter(MallocParameter parameter, int value);

// For the servers and the benchmarks that host them: blocks of up to 32 MiB are taken from the
// heaps and freed memory is given back only beyond 64 MiB free at a heap's top, so that the
// blocks a request moves are not faulted in again on every request. The cost: up to 64 MiB
// of freed memory kept per heap (glibc makes up to 8 per core). Not for the index and datastore
// builds, whose multi-GB buffers would fragment the heaps.
// REQUIRES: called before any thread is started.
void KeepServedBlocksOnTheHeap();

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_PROCESS_INIT_H_
