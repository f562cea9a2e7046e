#include "common/progress.h"

#include <cstdio>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnserve {
namespace {

using ::testing::HasSubstr;

// Captures what the bar writes, with a clock the test advances.
class ProgressBarTest : public ::testing::Test {
 protected:
  void SetUp() override { out_ = open_memstream(&buffer_, &size_); }
  void TearDown() override {
    if (out_ != nullptr) std::fclose(out_);
    std::free(buffer_);
  }

  std::string Output() {
    std::fflush(out_);
    return std::string(buffer_, size_);
  }
  std::string Close() {
    std::fclose(out_);
    out_ = nullptr;
    return std::string(buffer_, size_);
  }

  ProgressBar::Options Opts(int interactive) {
    ProgressBar::Options o;
    o.out = out_;
    o.interactive = interactive;
    o.unit = "keys";
    o.now = [this] { return now_; };
    return o;
  }

  std::FILE* out_ = nullptr;
  char* buffer_ = nullptr;
  size_t size_ = 0;
  absl::Time now_ = absl::UnixEpoch();
};

TEST_F(ProgressBarTest, QuietModePrintsOneLinePerTenPercentAndASummary) {
  {
    ProgressBar bar("compute keys", 1000, Opts(0));
    for (int i = 0; i < 100; ++i) {
      now_ += absl::Milliseconds(10);
      bar.Add(10);
    }
  }
  const std::string out = Close();
  int lines = 0;
  for (char c : out) lines += c == '\n';
  EXPECT_EQ(lines, 10);  // 10%, 20%, ..., 90%, then the summary
  EXPECT_THAT(out, HasSubstr("compute keys  50% 500/1.00k keys 1.00k keys/s ETA 0:00\n"));
  EXPECT_THAT(out, HasSubstr("compute keys: 1.00k keys in 1.0 s (1.00k keys/s)\n"));
  EXPECT_EQ(out.find('\r'), std::string::npos);
}

TEST_F(ProgressBarTest, InteractiveModeRedrawsInPlaceAtMostTenTimesASecond) {
  ProgressBar bar("train", 100, Opts(1));
  for (int i = 0; i < 50; ++i) {
    now_ += absl::Milliseconds(10);  // 0.5 s in 50 calls: about 5 redraws
    bar.Add(1);
  }
  const std::string out = Output();
  int redraws = 0;
  for (char c : out) redraws += c == '\r';
  EXPECT_GE(redraws, 4);
  EXPECT_LE(redraws, 5);
  EXPECT_THAT(out, HasSubstr("train [############............]  50% 50/100"));
  EXPECT_THAT(out, HasSubstr("ETA 0:00"));
  bar.Finish();
  EXPECT_THAT(Output(), HasSubstr("train: 50 keys in 0.5 s (100 keys/s)\n"));
}

TEST_F(ProgressBarTest, UnknownTotalPrintsEveryThirtySeconds) {
  ProgressBar bar("scan", 0, Opts(0));
  now_ += absl::Seconds(10);
  bar.Add(5);
  EXPECT_EQ(Output(), "");
  now_ += absl::Seconds(25);
  bar.Add(5);
  EXPECT_THAT(Output(), HasSubstr("scan 10 keys"));
}

TEST_F(ProgressBarTest, AddAfterFinishIsIgnored) {
  ProgressBar bar("x", 10, Opts(0));
  bar.Add(3);
  bar.Finish();
  bar.Add(3);
  EXPECT_EQ(bar.done(), 3);
}

TEST(ProgressBarFormat, HumanCountsAndDurations) {
  EXPECT_EQ(ProgressBar::HumanCount(999), "999");
  EXPECT_EQ(ProgressBar::HumanCount(1234), "1.23k");
  EXPECT_EQ(ProgressBar::HumanCount(56789), "56.8k");
  EXPECT_EQ(ProgressBar::HumanCount(4.2e9), "4.20G");
  EXPECT_EQ(ProgressBar::HumanDuration(absl::Seconds(125)), "2:05");
  EXPECT_EQ(ProgressBar::HumanDuration(absl::Seconds(3723)), "1:02:03");
}

}  // namespace
}  // namespace knnserve
