// GoogleTest matchers for absl::Status and absl::StatusOr (absl 20220623 has none).
//
//   EXPECT_THAT(Load(dir), IsOk());
//   EXPECT_THAT(Parse(bad), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
//   ASSERT_OK_AND_ASSIGN(auto index, Load(dir));
#ifndef KNNSERVE_COMMON_STATUS_MATCHERS_H_
#define KNNSERVE_COMMON_STATUS_MATCHERS_H_

#include <ostream>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnserve::testing {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& status = GetStatus(arg);
  if (!status.ok()) *result_listener << "status is " << status;
  return status.ok();
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + absl::StatusCodeToString(code) + " and a message that " +
               ::testing::DescribeMatcher<std::string>(message_matcher)) {
  const absl::Status& status = GetStatus(arg);
  *result_listener << "status is " << status;
  return status.code() == code &&
         ::testing::ExplainMatchResult(message_matcher, std::string(status.message()),
                                       result_listener);
}

}  // namespace knnserve::testing

#define ASSERT_OK(expr) ASSERT_THAT((expr), ::knnserve::testing::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::knnserve::testing::IsOk())

#define ASSERT_OK_AND_ASSIGN(lhs, rexpr)                                                  \
  KNNSERVE_ASSERT_OK_AND_ASSIGN_IMPL_(KNNSERVE_CONCAT_(knnserve_statusor_, __LINE__), lhs, \
                                      rexpr)
#define KNNSERVE_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                         \
  ASSERT_OK(statusor.status());                                    \
  lhs = std::move(statusor).value()

#endif  // KNNSERVE_COMMON_STATUS_MATCHERS_H_
