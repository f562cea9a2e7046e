#include "common/process_init.h"

#include "absl/synchronization/mutex.h"

namespace knnserve {

void InitProcess() {
  // The detection costs a graph update per lock; a served step takes a few dozen locks in
  // gRPC alone (2% of the router's samples went to GraphCycles::GetId).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace knnserve
