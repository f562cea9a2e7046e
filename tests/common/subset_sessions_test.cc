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
  return ShareGroups(std::move(groups));
}

// What a session of one group of `sentences` ids is charged.
constexpr int64_t Charge(int sentences) {
  return SubsetSessions::kSessionOverhead + SubsetSessions::kGroupOverhead + sentences;
}

TEST(NewSubsetSession, IsSixteenBytesAndFresh) {
  const std::string a = NewSubsetSession();
  EXPECT_EQ(a.size(), 16u);
  EXPECT_NE(a, NewSubsetSession());
}

TEST(SubsetSessions, GetReturnsWhatPutKeptAndNullForOtherTokens) {
  SubsetSessions sessions(100);
  const auto groups = Groups(3);
  const std::string forward_token = sessions.Put("a", groups);
  EXPECT_EQ(sessions.Get("a").groups, groups);
  EXPECT_EQ(sessions.Get("a").forward_token, forward_token);
  EXPECT_EQ(sessions.Get("b").groups, nullptr);
  EXPECT_EQ(sessions.charged(), Charge(3));
}

// A replacement gets a forwarding token of its own: a replica that kept the old groups under the
// old token cannot take them for the new ones.
TEST(SubsetSessions, PutReplacesTheGroupsOfATokenUnderANewForwardingToken) {
  SubsetSessions sessions(100);
  const std::string old_token = sessions.Put("a", Groups(3));
  const auto replacement = Groups(5);
  const std::string new_token = sessions.Put("a", replacement);
  EXPECT_NE(new_token, old_token);
  EXPECT_EQ(sessions.Get("a").groups, replacement);
  EXPECT_EQ(sessions.Get("a").forward_token, new_token);
  EXPECT_EQ(sessions.charged(), Charge(5));
}

// Equal groups sent again keep their forwarding token: the replicas keep one copy.
TEST(SubsetSessions, PutOfEqualGroupsKeepsTheForwardingToken) {
  SubsetSessions sessions(100);
  const std::string first = sessions.Put("a", Groups(3));
  EXPECT_EQ(sessions.Put("a", Groups(3)), first);
  EXPECT_NE(sessions.Put("b", Groups(3)), first);  // another client token
}

TEST(SubsetSessions, EvictsTheLeastRecentlyUsedUntilTheIdsFit) {
  SubsetSessions sessions(2 * Charge(4) + 2);
  sessions.Put("a", Groups(4));
  sessions.Put("b", Groups(4));
  ASSERT_NE(sessions.Get("a").groups, nullptr);  // now b is the least recently used
  sessions.Put("c", Groups(4));
  EXPECT_NE(sessions.Get("a").groups, nullptr);
  EXPECT_EQ(sessions.Get("b").groups, nullptr);
  EXPECT_NE(sessions.Get("c").groups, nullptr);
  EXPECT_EQ(sessions.charged(), 2 * Charge(4));
}

TEST(SubsetSessions, GroupsLargerThanTheBoundAreNotKept) {
  SubsetSessions sessions(Charge(10));
  sessions.Put("a", Groups(4));
  sessions.Put("a", Groups(11));
  sessions.Put("b", Groups(11));
  EXPECT_EQ(sessions.Get("a").groups, nullptr);
  EXPECT_EQ(sessions.Get("b").groups, nullptr);
  EXPECT_EQ(sessions.charged(), 0);
}

// Many sessions of one id each are charged their bookkeeping, not one id each.
TEST(SubsetSessions, SessionsOfFewIdsAreChargedTheirBookkeeping) {
  SubsetSessions sessions(10 * Charge(1));
  for (int i = 0; i < 1000; ++i) sessions.Put(absl::StrCat("token-", i), Groups(1));
  EXPECT_EQ(sessions.charged(), 10 * Charge(1));
  EXPECT_EQ(sessions.Get("token-989").groups, nullptr);
  EXPECT_NE(sessions.Get("token-990").groups, nullptr);
}

TEST(SubsetSessions, StaysWithinTheBoundUnderConcurrentUse) {
  SubsetSessions sessions(50 + 4 * Charge(0));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&sessions, t] {
      for (int i = 0; i < 500; ++i) {
        const std::string token = absl::StrCat(t, "/", i % 7);
        if (auto groups = sessions.Get(token).groups) {
          EXPECT_EQ((*groups)[0].size(), static_cast<size_t>(1 + i % 7));
        } else {
          sessions.Put(token, Groups(1 + i % 7));
        }
        EXPECT_LE(sessions.charged(), 50 + 4 * Charge(0));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace
}  // namespace knnserve
