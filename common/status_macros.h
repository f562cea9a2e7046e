// Status propagation macros (absl 20220623 ships none).
//
//   RETURN_IF_ERROR(DoThing());
//   ASSIGN_OR_RETURN(auto index, LoadIndex(dir));
//   ASSIGN_OR_RETURN(std::unique_ptr<Foo> foo, Foo::Create(opts));
#ifndef KNNSERVE_COMMON_STATUS_MACROS_H_
#define KNNSERVE_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KNNSERVE_CONCAT_INNER_(a, b) a##b
#define KNNSERVE_CONCAT_(a, b) KNNSERVE_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function if not ok.
#define RETURN_IF_ERROR(expr)                                        \
  do {                                                               \
    ::absl::Status knnserve_status_ = (expr);                        \
    if (ABSL_PREDICT_FALSE(!knnserve_status_.ok())) return knnserve_status_; \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, otherwise moves the
// value into `lhs` (a declaration or an existing lvalue).
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  KNNSERVE_ASSIGN_OR_RETURN_IMPL_(KNNSERVE_CONCAT_(knnserve_statusor_, __LINE__), lhs, rexpr)

#define KNNSERVE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr)       \
  auto statusor = (rexpr);                                           \
  if (ABSL_PREDICT_FALSE(!statusor.ok())) return statusor.status(); \
  lhs = std::move(statusor).value()

#endif  // KNNSERVE_COMMON_STATUS_MACROS_H_
