// Process-wide settings every knnserve executable applies first thing in main().
#ifndef KNNSERVE_COMMON_PROCESS_INIT_H_
#define KNNSERVE_COMMON_PROCESS_INIT_H_

namespace knnserve {

// Turns off absl::Mutex deadlock detection. Debian's abseil is built without NDEBUG, which
// leaves the detection on: every lock of every absl::Mutex — gRPC's own locks included —
// then updates one global lock-order graph under one global lock.
// REQUIRES: called before any thread is started.
void InitProcess();

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_PROCESS_INIT_H_
