#include "common/status_macros.h"

#include "absl/strings/str_cat.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnserve {
namespace {

using ::knnserve::testing::IsOk;
using ::knnserve::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError(absl::StrCat(x, " is odd"));
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(half, Half(half));  // assigns to an existing variable too
  return half;
}

absl::Status CheckEven(int x) {
  RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusMacros, AssignOrReturnPassesValuesAndErrors) {
  ASSERT_OK_AND_ASSIGN(int q, Quarter(12));
  EXPECT_EQ(q, 3);
  EXPECT_THAT(Quarter(6), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("3 is odd")));
}

TEST(StatusMacros, ReturnIfErrorStopsAtTheFirstError) {
  EXPECT_THAT(CheckEven(4), IsOk());
  EXPECT_THAT(CheckEven(5), Not(IsOk()));
  EXPECT_THAT(CheckEven(5), StatusIs(absl::StatusCode::kInvalidArgument, "5 is odd"));
}

}  // namespace
}  // namespace knnserve
