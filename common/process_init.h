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
// 3. Makes glibc's malloc keep freed memory for reuse (KeepFreedMemoryForReuse) unless
//    GLIBC_TUNABLES sets malloc tunables of its own.
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

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_PROCESS_INIT_H_
