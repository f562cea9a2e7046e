#include "client/cli/commands.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/process_init.h"

namespace knnserve::cli {

void ExitOnError(const absl::Status& status) {
  if (status.ok()) return;
  std::fprintf(stderr, "error: %s\n", std::string(status.message()).c_str());
  throw CLI::RuntimeError(1);
}

void AdviseWaitPolicy() {
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    std::fprintf(stderr,
                 "note: OMP_WAIT_POLICY is unset; on a shared or busy machine "
                 "OMP_WAIT_POLICY=PASSIVE is several times faster (docs/model.md)\n");
  }
}

void KeepFreedMemory() {
  // Threads' arenas still map chunks beyond their 64 MiB heaps.
  SetMallocParameter(MallocParameter::kMmapMax, 0);
  SetMallocParameter(MallocParameter::kTrimThreshold, 1 << 30);
  SetMallocParameter(MallocParameter::kTopPad, 64 << 20);
}

}  // namespace knnserve::cli
