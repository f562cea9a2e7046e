#include "server/shard_map.h"

#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnserve {
namespace {

using ::knnserve::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ShardMapTest, ParsesShardsReplicasAndComments) {
  ASSERT_OK_AND_ASSIGN(ShardMap map, ParseShardMap("# shards\n"
                                                   "0 127.0.0.1:7001 127.0.0.1:7002\n"
                                                   "\n"
                                                   "1\t127.0.0.1:7003  # one replica\n",
                                                   "map.txt"));
  ASSERT_EQ(map.size(), 2u);
  EXPECT_THAT(map[0], ElementsAre("127.0.0.1:7001", "127.0.0.1:7002"));
  EXPECT_THAT(map[1], ElementsAre("127.0.0.1:7003"));
  EXPECT_EQ(FormatShardMap(map), "0 127.0.0.1:7001 127.0.0.1:7002\n1 127.0.0.1:7003\n");
}

TEST(ShardMapTest, RejectsBadLinesWithTheirNumber) {
  EXPECT_THAT(
      ParseShardMap("0 a:1\n0 b:2\n", "m"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("m:2: shard 0 is listed twice")));
  EXPECT_THAT(ParseShardMap("x a:1\n", "m"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a shard id")));
  EXPECT_THAT(ParseShardMap("3\n", "m"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no replica")));
  EXPECT_THAT(ParseShardMap("# nothing\n", "m"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no shards")));
}

// gRPC would dial port 99999 modulo 65536 (another port than the one written) and port 0 is
// no server's; a replica listed twice would count as two.
TEST(ShardMapTest, RejectsAddressesGrpcWouldDialWrongly) {
  EXPECT_THAT(ParseShardMap("0 127.0.0.1:99999\n", "m"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("m:1: shard 0: '127.0.0.1:99999' is not host:port with a port "
                                 "in [1, 65535]")));
  for (const char* bad : {"0 127.0.0.1:0\n", "0 127.0.0.1\n", "0 h:p\n"}) {
    EXPECT_THAT(ParseShardMap(bad, "m"),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not host:port")))
        << bad;
  }
  EXPECT_THAT(ParseShardMap("0 a:1 b:2 a:1\n", "m"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("m:1: shard 0 lists replica a:1 twice")));
  ASSERT_OK_AND_ASSIGN(ShardMap map,
                       ParseShardMap("0 unix:/run/s0.sock dns:///shard-1.svc:7000\n", "m"));
  EXPECT_THAT(map[0], ElementsAre("unix:/run/s0.sock", "dns:///shard-1.svc:7000"));
}

}  // namespace
}  // namespace knnserve
