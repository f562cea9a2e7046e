// KNNSERVE_CHECK: aborts with file, line and message when a programming contract (a REQUIRES:)
// is broken. absl 20220623 has no absl/log; errors a caller can cause return absl::Status.
#ifndef KNNSERVE_COMMON_CHECK_H_
#define KNNSERVE_COMMON_CHECK_H_

#include <cstdio>
#include <cstdlib>

#include "absl/base/optimization.h"

#define KNNSERVE_CHECK(condition, message)                                              \
  do {                                                                                  \
    if (ABSL_PREDICT_FALSE(!(condition))) {                                             \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #condition, \
                   message);                                                            \
      std::abort();                                                                     \
    }                                                                                   \
  } while (false)

#endif  // KNNSERVE_COMMON_CHECK_H_
