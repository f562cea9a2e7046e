// A full disk, simulated portably (no tmpfs or root needed).
#ifndef KNNSERVE_TESTS_TESTING_FILE_SIZE_LIMIT_H_
#define KNNSERVE_TESTS_TESTING_FILE_SIZE_LIMIT_H_

#include <sys/resource.h>

#include <csignal>

#include "gtest/gtest.h"

namespace knnserve::testing {

// Lowers this process's file size limit (RLIMIT_FSIZE) for its lifetime: writes past it fail
// with EFBIG, as on a full disk. SIGXFSZ is ignored meanwhile so the write fails instead of the
// process.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    previous_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit limited = saved_;
    limited.rlim_cur = bytes;
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, previous_handler_);
  }

 private:
  rlimit saved_{};
  void (*previous_handler_)(int) = nullptr;
};

}  // namespace knnserve::testing

#endif  // KNNSERVE_TESTS_TESTING_FILE_SIZE_LIMIT_H_
