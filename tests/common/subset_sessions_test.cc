#include "common/subset_sessions.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace knnserve {
namespace {

std::shared_ptr<const SubsetGroups> Groups(int sentences) {
  SubsetGroups groups(1);
  for (int i = 0; i < sentences; ++i) groups[0].push_back(i);
  return std::make_shared<const SubsetGroups>(std::move(groups));
}

TEST(SubsetSessions, GetReturnsWhatPutKeptAndNullForOtherTokens) {
  SubsetSessions sessions(100);
  const auto groups = Groups(3);
  sessions.Put("a", groups);
  EXPECT_EQ(sessions.Get("a"), groups);
  EXPECT_EQ(sessions.Get("b"), nullptr);
  EXPECT_EQ(sessions.sentences(), 3);
}

TEST(SubsetSessions, PutReplacesTheGroupsOfAToken) {
  SubsetSessions sessions(100);
  sessions.Put("a", Groups(3));
  const auto replacement = Groups(5);
  sessions.Put("a", replacement);
  EXPECT_EQ(sessions.Get("a"), replacement);
  EXPECT_EQ(sessions.sentences(), 5);
}

TEST(SubsetSessions, EvictsTheLeastRecentlyUsedUntilTheIdsFit) {
  SubsetSessions sessions(10);
  sessions.Put("a", Groups(4));
  sessions.Put("b", Groups(4));
  ASSERT_NE(sessions.Get("a"), nullptr);  // now b is the least recently used
  sessions.Put("c", Groups(4));
  EXPECT_NE(sessions.Get("a"), nullptr);
  EXPECT_EQ(sessions.Get("b"), nullptr);
  EXPECT_NE(sessions.Get("c"), nullptr);
  EXPECT_EQ(sessions.sentences(), 8);
}

TEST(SubsetSessions, GroupsLargerThanTheBoundAreNotKept) {
  SubsetSessions sessions(10);
  sessions.Put("a", Groups(4));
  sessions.Put("a", Groups(11));
  sessions.Put("b", Groups(11));
  EXPECT_EQ(sessions.Get("a"), nullptr);
  EXPECT_EQ(sessions.Get("b"), nullptr);
  EXPECT_EQ(sessions.sentences(), 0);
}

TEST(SubsetSessions, StaysWithinTheBoundUnderConcurrentUse) {
  SubsetSessions sessions(50);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&sessions, t] {
      for (int i = 0; i < 500; ++i) {
        const std::string token = absl::StrCat(t, "/", i % 7);
        if (auto groups = sessions.Get(token)) {
          EXPECT_EQ((*groups)[0].size(), static_cast<size_t>(1 + i % 7));
        } else {
          sessions.Put(token, Groups(1 + i % 7));
        }
        EXPECT_LE(sessions.sentences(), 50);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace
}  // namespace knnserve
