// knnserve-router in process, over in-process shards: exact answers, subset routing, coverage,
// partial results, failover, hedging, deadlines, validation, health.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status_matchers.h"
#include "common/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/flat_engine.h"
#include "tests/server/test_cluster.h"

namespace knnserve::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kDim = 16;

// S shards x R replicas over one datastore, and the unsharded engine to compare with.
class Cluster {
 public:
  Cluster(int num_shards, int replicas, Metric metric = Metric::kL2,
          TestShardOptions shard_options = {})
      : data_(MakeDatastore(240, kDim, 6, 21, metric)),
        unsharded_(data_, 0, data_->num_sentences()) {
    for (int r = 0; r < replicas; ++r) {
      std::vector<std::unique_ptr<SearchEngine>> engines = MakeShardEngines(data_, num_shards);
      for (int s = 0; s < num_shards; ++s) {
        shards_.push_back(std::make_unique<TestShard>(s, std::move(engines[s]), shard_options));
        map_[s].push_back(shards_.back()->address());
      }
    }
  }

  // Replica r of shard s.
  TestShard& shard(int s, int r = 0) { return *shards_[r * map_.size() + s]; }
  const ShardMap& map() const { return map_; }
  const FlatEngine& unsharded() const { return unsharded_; }

  EngineResult Expected(const SearchQuery& query) const {
    absl::StatusOr<EngineResult> result = unsharded_.Search(query);
    KNNSERVE_CHECK(result.ok(), "unsharded search");
    return *std::move(result);
  }

 private:
  std::shared_ptr<const Datastore> data_;
  FlatEngine unsharded_;
  std::vector<std::unique_ptr<TestShard>> shards_;
  ShardMap map_;
};

SearchQuery FullQuery(const Matrix<float>& queries, int k) {
  SearchQuery query;
  query.queries = queries;
  query.params.k = k;
  return query;
}

void ExpectSameNeighbors(const v1::SearchResponse& response, const Neighbors& expected) {
  ASSERT_OK_AND_ASSIGN(Neighbors got, DecodeNeighbors(response));
  EXPECT_EQ(got.ids, expected.ids);
  EXPECT_EQ(got.distances, expected.distances);
  EXPECT_EQ(got.values, expected.values);
}

class RouterMetricTest : public ::testing::TestWithParam<Metric> {};

TEST_P(RouterMetricTest, AnswerEqualsUnshardedSearch) {
  Cluster cluster(3, 1, GetParam());
  TestRouter router(cluster.map(), FastRouterOptions());
  auto stub = Connect(router.address());
  const Matrix<float> queries = RandomQueries(20, kDim, 5);
  v1::SearchResponse response;
  ASSERT_TRUE(CallSearch(stub.get(), MakeRequest(queries, 10), &response).ok());
  ExpectSameNeighbors(response, cluster.Expected(FullQuery(queries, 10)).neighbors);
  const v1::Coverage& coverage = response.coverage();
  EXPECT_EQ(coverage.shards_asked(), 3);
  EXPECT_EQ(coverage.shards_answered(), 3);
  EXPECT_EQ(coverage.vectors_total(), cluster.unsharded().info().total_vectors);
  EXPECT_EQ(coverage.vectors_searched(), coverage.vectors_total());
  EXPECT_EQ(coverage.degraded_size(), 0);
}

INSTANTIATE_TEST_SUITE_P(Metrics, RouterMetricTest,
                         ::testing::Values(Metric::kL2, Metric::kInnerProduct));

TEST(RouterTest, SubsetSearchGoesOnlyToOwningShards) {
  Cluster cluster(3, 1);
  TestRouter router(cluster.map(), FastRouterOptions());
  auto stub = Connect(router.address());
  // Shards own sentences [0, 80), [80, 160), [160, 240): these groups touch shards 0 and 1.
  const SubsetGroups groups = {{3, 10, 95}, {150, 151}, {7}};
  const Matrix<float> queries = RandomQueries(4, kDim, 8);
  v1::SearchRequest request = MakeRequest(queries, 5);
  for (const auto& group : groups) {
    request.add_subset_groups()->mutable_sentence_ids()->Assign(group.begin(), group.end());
  }
  for (int g : {0, 1, 2, 0}) request.add_row_group(g);
  const int calls_before = cluster.shard(2).engine()->calls();
  v1::SearchResponse response;
  ASSERT_TRUE(CallSearch(stub.get(), request, &response).ok());

  SearchQuery query = FullQuery(queries, 5);
  query.subset_groups = std::make_shared<const SubsetGroups>(groups);
  query.row_group = {0, 1, 2, 0};
  const EngineResult expected = cluster.Expected(query);
  ExpectSameNeighbors(response, expected.neighbors);
  EXPECT_EQ(response.coverage().shards_asked(), 2);
  EXPECT_EQ(response.coverage().shards_answered(), 2);
  EXPECT_EQ(response.coverage().vectors_searched(), expected.vectors_searched);
  EXPECT_EQ(cluster.shard(2).engine()->calls(), calls_before);
}

TEST(RouterTest, MissingShardFailsOrDegradesPerRequestPolicy) {
  Cluster cluster(3, 1);
  TestRouter router(cluster.map(), FastRouterOptions());
  auto stub = Connect(router.address());
  cluster.shard(1).Kill();
  const Matrix<float> queries = RandomQueries(3, kDim, 9);
  v1::SearchRequest request = MakeRequest(queries, 6);
  v1::SearchResponse response;
  const grpc::Status status = CallSearch(stub.get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("1 of 3 shards missing: shard 1"));

  request.set_allow_partial(true);
  ASSERT_TRUE(CallSearch(stub.get(), request, &response).ok());
  const v1::Coverage& coverage = response.coverage();
  const EngineInfo& missing = cluster.shard(1).engine()->info();
  EXPECT_EQ(coverage.shards_asked(), 3);
  EXPECT_EQ(coverage.shards_answered(), 2);
  EXPECT_EQ(coverage.vectors_total(), cluster.unsharded().info().total_vectors);
  EXPECT_EQ(coverage.vectors_total() - coverage.vectors_searched(),
            missing.id_end - missing.id_begin);
  ASSERT_EQ(coverage.degraded_size(), 1);
  EXPECT_EQ(coverage.degraded(0).shard_id(), 1);
  EXPECT_EQ(coverage.degraded(0).reason(), v1::DEGRADED_REASON_SHARD_DOWN);
  for (int64_t id : response.ids()) {
    EXPECT_TRUE(id < missing.id_begin || id >= missing.id_end) << id;
  }
  // Router health follows: shard 1 has no replica left.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (router.router().healthy() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_FALSE(router.router().healthy());
}

// Stands in for a replica: forwards to a real one, and spoils its answers (one row short).
class SpoilingReplica final : public v1::Retrieval::Service {
 public:
  explicit SpoilingReplica(const std::string& target) : stub_(Connect(target)) {}
  grpc::Status Info(grpc::ServerContext*, const v1::InfoRequest* request,
                    v1::InfoResponse* response) override {
    grpc::ClientContext context;
    return stub_->Info(&context, *request, response);
  }
  grpc::Status Search(grpc::ServerContext*, const v1::SearchRequest* request,
                      v1::SearchResponse* response) override {
    grpc::ClientContext context;
    const grpc::Status status = stub_->Search(&context, *request, response);
    response->set_rows(response->rows() - 1);  // the arrays keep every row
    return status;
  }

 private:
  std::unique_ptr<v1::Retrieval::Stub> stub_;
};

// A malformed shard answer is the shard's fault: a gap (UNAVAILABLE naming the shard, or with
// allow_partial an answer without it), never INVALID_ARGUMENT as if the caller had erred.
TEST(RouterTest, AMalformedShardAnswerIsAGapNotTheCallersFault) {
  Cluster cluster(2, 1);
  SpoilingReplica spoiling(cluster.shard(1).address());
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&spoiling);
  const std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ShardMap map = cluster.map();
  map[1] = {absl::StrCat("127.0.0.1:", port)};
  TestRouter router(map, FastRouterOptions());
  auto stub = Connect(router.address());
  v1::SearchRequest request = MakeRequest(RandomQueries(3, kDim, 11), 5);
  v1::SearchResponse response;
  const grpc::Status status = CallSearch(stub.get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), AllOf(HasSubstr("shard 1"), HasSubstr("malformed answer")));

  request.set_allow_partial(true);
  ASSERT_TRUE(CallSearch(stub.get(), request, &response).ok());
  EXPECT_EQ(response.coverage().shards_answered(), 1);
  ASSERT_EQ(response.coverage().degraded_size(), 1);
  EXPECT_EQ(response.coverage().degraded(0).shard_id(), 1);
  EXPECT_EQ(response.coverage().degraded(0).reason(), v1::DEGRADED_REASON_ERROR);
  server->Shutdown();
}

TEST(RouterTest, FailsOverToAnotherReplica) {
  Cluster cluster(2, 2);
  TestRouter router(cluster.map(), FastRouterOptions());
  auto stub = Connect(router.address());
  cluster.shard(0, 0).Kill();
  const Matrix<float> queries = RandomQueries(2, kDim, 4);
  const EngineResult expected = cluster.Expected(FullQuery(queries, 4));
  for (int i = 0; i < 6; ++i) {
    v1::SearchResponse response;
    const grpc::Status status = CallSearch(stub.get(), MakeRequest(queries, 4), &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ExpectSameNeighbors(response, expected.neighbors);
  }
  EXPECT_TRUE(router.router().healthy());
}

TEST(RouterTest, HedgeAnswersWithoutWaitingForTheStuckReplica) {
  Cluster cluster(1, 2);
  RouterOptions options = FastRouterOptions();
  options.hedge.enabled = true;
  options.hedge.delay = absl::Milliseconds(20);
  TestRouter router(cluster.map(), options);
  auto stub = Connect(router.address());
  // The router's first choice (the first replica: no latency known yet) never answers until
  // the test ends; the hedge to the second replica must answer.
  cluster.shard(0, 0).engine()->CloseGate();
  const int fast_calls = cluster.shard(0, 1).engine()->calls();
  const Matrix<float> queries = RandomQueries(2, kDim, 4);
  v1::SearchResponse response;
  const grpc::Status status =
      CallSearch(stub.get(), MakeRequest(queries, 4), &response, absl::Seconds(30));
  ASSERT_TRUE(status.ok()) << status.error_message();
  ExpectSameNeighbors(response, cluster.Expected(FullQuery(queries, 4)).neighbors);
  EXPECT_TRUE(cluster.shard(0, 0).engine()->WaitForCallsAtGate(1, absl::Seconds(1)));
  EXPECT_EQ(cluster.shard(0, 1).engine()->calls(), fast_calls + 1);
  const std::string metrics = router.metrics().RenderText();
  EXPECT_THAT(metrics, HasSubstr("knnserve_hedges_sent_total{shard=\"0\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("knnserve_hedges_won_total{shard=\"0\"} 1"));
  // The loser was cancelled: its latency now counts against it, so the next request goes to
  // the answering replica first and needs no hedge.
  ASSERT_TRUE(CallSearch(stub.get(), MakeRequest(queries, 4), &response).ok());
  EXPECT_THAT(router.metrics().RenderText(),
              HasSubstr("knnserve_hedges_sent_total{shard=\"0\"} 1"));
}

// One hedge at any time, then at most max_ratio of the shard's requests: 5% over 100
// requests is 5 hedges, not 5 + 1 per shard.
TEST(RouterTest, HedgeBudgetIsOneThenTheRatioOfRequests) {
  MetricsRegistry metrics;
  ShardGroup group(0, {}, &metrics);
  EXPECT_TRUE(group.TakeHedge(0.05));
  EXPECT_FALSE(group.TakeHedge(0.05));
  int hedges = 1;
  for (int request = 0; request < 100; ++request) {
    group.CountRequest();
    while (group.TakeHedge(0.05)) ++hedges;
  }
  EXPECT_EQ(hedges, 5);
}

TEST(RouterTest, DeadlineCancelsTheShardCall) {
  Cluster cluster(2, 1, Metric::kL2, {.batcher = {absl::Milliseconds(1), 1024, 1}});
  TestRouter router(cluster.map(), FastRouterOptions());
  auto router_stub = Connect(router.address());
  // Hold shard 1's only engine thread with a direct call, so the router's call queues there.
  ControlledEngine* engine = cluster.shard(1).engine();
  engine->CloseGate();
  auto shard_stub = Connect(cluster.shard(1).address());
  grpc::ClientContext blocker_context;
  const v1::SearchRequest blocker = MakeRequest(RandomQueries(1, kDim, 1), 2);
  v1::SearchResponse blocker_response;
  absl::Notification blocker_done;
  shard_stub->async()->Search(&blocker_context, &blocker, &blocker_response,
                              [&](grpc::Status) { blocker_done.Notify(); });
  ASSERT_TRUE(engine->WaitForCallsAtGate(1, absl::Seconds(10)));
  const int calls = engine->calls();

  v1::SearchResponse response;
  const grpc::Status status =
      CallSearch(router_stub.get(), MakeRequest(RandomQueries(1, kDim, 2), 3), &response,
                 absl::Milliseconds(300));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The shard's copy of the deadline can be a few ms later than the caller's (grpc-timeout
  // rounds up): give it time to pass before freeing the engine. Then the queued call must be
  // dropped without searching.
  absl::SleepFor(absl::Milliseconds(200));
  engine->OpenGate();
  ASSERT_TRUE(blocker_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  std::string metrics;
  while (absl::Now() < give_up) {
    metrics = cluster.shard(1).metrics().RenderText();
    if (absl::StrContains(metrics, "knnserve_dropped_total{reason=\"cancelled\"} 1") ||
        absl::StrContains(metrics, "knnserve_dropped_total{reason=\"deadline\"} 1")) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_THAT(metrics,
              ::testing::AnyOf(HasSubstr("knnserve_dropped_total{reason=\"cancelled\"} 1"),
                               HasSubstr("knnserve_dropped_total{reason=\"deadline\"} 1")));
  EXPECT_EQ(engine->calls(), calls);
}

// With allow_partial the caller gets what was searched even when its own deadline is the one
// that ends the wait for a stuck shard (the router's timeout is far later).
TEST(RouterTest, PartialAnswerArrivesBeforeTheCallersDeadline) {
  Cluster cluster(2, 1);
  TestRouter router(cluster.map(), FastRouterOptions());
  auto stub = Connect(router.address());
  cluster.shard(1).engine()->CloseGate();
  v1::SearchRequest request = MakeRequest(RandomQueries(2, kDim, 6), 3);
  request.set_allow_partial(true);
  v1::SearchResponse response;
  const grpc::Status status = CallSearch(stub.get(), request, &response, absl::Seconds(2));
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.coverage().shards_answered(), 1);
  ASSERT_EQ(response.coverage().degraded_size(), 1);
  EXPECT_EQ(response.coverage().degraded(0).shard_id(), 1);
  EXPECT_EQ(response.coverage().degraded(0).reason(), v1::DEGRADED_REASON_TIMEOUT);
  cluster.shard(1).engine()->OpenGate();
}

TEST(RouterTest, RejectsMalformedRequestsAndKeepsServing) {
  Cluster cluster(2, 1);
  TestRouter router(cluster.map(), FastRouterOptions());
  auto stub = Connect(router.address());
  ExpectMalformedRequestsRejected(stub.get(), kDim);
}

// A router over `map` does not serve, and its Info fails with UNAVAILABLE naming `reason` and
// the shard map.
void ExpectRefused(const ShardMap& map, const std::string& reason) {
  TestRouter router(map, FastRouterOptions(), {}, /*wait=*/false);
  router.router().ProbeOnce();
  EXPECT_FALSE(router.router().healthy());
  auto stub = Connect(router.address());
  grpc::ClientContext context;
  v1::InfoResponse info;
  const grpc::Status status = stub->Info(&context, v1::InfoRequest(), &info);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr(reason));
  EXPECT_THAT(status.error_message(), HasSubstr("check the shard map"));
}

// A shard map that does not list every shard once, by its own id, is refused with the reason,
// instead of answering from the wrong vectors (or from the same ones twice).
TEST(RouterTest, RefusesAShardMapThatDoesNotCoverTheIndexOnce) {
  Cluster cluster(3, 1);
  const std::string a = cluster.shard(0).address();
  const std::string b = cluster.shard(1).address();
  const std::string c = cluster.shard(2).address();
  const struct {
    ShardMap map;
    std::string reason;
  } cases[] = {
      {{{1, {b}}, {2, {c}}}, "ids [0, "},                                   // shard 0 left out
      {{{0, {a}}, {1, {b}}, {2, {c}}, {3, {a}}}, "no replica of shard 3"},  // a server twice
      {{{0, {a, b}}, {2, {c}}}, "are in no shard of the map"},  // shard 1 as a replica of 0
  };
  for (const auto& [map, reason] : cases) {
    SCOPED_TRACE(reason);
    ExpectRefused(map, reason);
  }
}

// A replica whose Info shows another index than its shard's first replica gets no calls; listed
// first, it makes the router refuse to serve rather than mix two indexes.
TEST(RouterTest, AReplicaOfAnotherIndexGetsNoCalls) {
  Cluster cluster(3, 1);
  std::vector<std::unique_ptr<SearchEngine>> others =
      MakeShardEngines(MakeDatastore(90, kDim, 5, 33), 3);
  TestShard other(0, std::move(others[0]));
  ShardMap map = cluster.map();
  map[0].push_back(other.address());
  {
    TestRouter router(map, FastRouterOptions());
    router.router().ProbeOnce();
    EXPECT_TRUE(router.router().healthy());
    auto stub = Connect(router.address());
    const Matrix<float> queries = RandomQueries(2, kDim, 5);
    const EngineResult expected = cluster.Expected(FullQuery(queries, 4));
    for (int i = 0; i < 20; ++i) {
      v1::SearchResponse response;
      ASSERT_TRUE(CallSearch(stub.get(), MakeRequest(queries, 4), &response).ok());
      ExpectSameNeighbors(response, expected.neighbors);
    }
  }
  std::reverse(map[0].begin(), map[0].end());
  ExpectRefused(map, "serves a different index");
}

// A server that completes the HTTP/2 handshake (its SETTINGS, and the ACK of the client's) and
// then never answers: calls to it hang until their deadline, as to a wedged replica. (A socket
// that only listens fails at once here: the router's channels give a connection attempt 100 ms.)
class Unresponsive {
 public:
  Unresponsive() : listen_fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    KNNSERVE_CHECK(
        ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
            ::listen(listen_fd_, 16) == 0,
        "unresponsive server socket");
    socklen_t length = sizeof(address);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
    address_ = absl::StrCat("127.0.0.1:", ntohs(address.sin_port));
    thread_ = std::thread([this] {
      // An empty SETTINGS frame, then a SETTINGS ACK (9-byte frame headers, stream 0).
      static constexpr unsigned char kFrames[18] = {0, 0, 0, 4, 0, 0, 0, 0, 0,
                                                    0, 0, 0, 4, 1, 0, 0, 0, 0};
      while (true) {
        const int fd = ::accept(listen_fd_, nullptr, nullptr);
        if (fd < 0) return;  // the listening socket was shut down
        ::send(fd, kFrames, sizeof(kFrames), MSG_NOSIGNAL);
        connections_.push_back(fd);  // kept open, never read: the calls on it wait
      }
    });
  }
  ~Unresponsive() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    ::close(listen_fd_);
    for (const int fd : connections_) ::close(fd);
  }
  const std::string& address() const { return address_; }

 private:
  const int listen_fd_;
  std::string address_;
  std::vector<int> connections_;  // touched by thread_ only until it is joined
  std::thread thread_;
};

// Every replica is probed at once: three replicas that never answer cost a probe round one
// probe timeout, not three (asked one after another, they delayed every health update by the
// sum), and the shard's answering replica keeps it serving.
TEST(RouterTest, ProbesEveryReplicaAtOnce) {
  Cluster cluster(1, 1);
  Unresponsive wedged[3];
  ShardMap map = cluster.map();
  for (const Unresponsive& replica : wedged) map[0].push_back(replica.address());
  RouterOptions options = FastRouterOptions();
  options.probe_interval = absl::Hours(1);  // only the rounds this test runs
  options.probe_timeout = absl::Seconds(3);
  TestRouter router(map, options, {}, /*wait=*/false);
  const absl::Time start = absl::Now();
  router.router().ProbeOnce();
  EXPECT_LT(absl::Now() - start, 2 * options.probe_timeout);  // one after another: 3 timeouts
  EXPECT_TRUE(router.router().healthy());
}

// Clients size their requests by Info's limits (RemoteRetriever splits steps by max_rows): a
// router allowing more than its shards advertises what the shards take.
TEST(RouterTest, InfoAdvertisesTheShardsLimitsWhenTheyAreTighter) {
  Cluster cluster(2, 1);
  RouterOptions options = FastRouterOptions();
  options.limits.max_k = 4 * TestLimits().max_k;
  options.limits.max_rows = TestLimits().max_rows / 2;
  TestRouter router(cluster.map(), options);
  auto stub = Connect(router.address());
  grpc::ClientContext context;
  v1::InfoResponse info;
  ASSERT_TRUE(stub->Info(&context, v1::InfoRequest(), &info).ok());
  EXPECT_EQ(info.limits().max_k(), TestLimits().max_k);            // the shards'
  EXPECT_EQ(info.limits().max_rows(), TestLimits().max_rows / 2);  // the router's
}

// Beyond kRouterMaxDim the router's channels take smaller messages than its shards do: Info
// advertises the limit the router enforces.
TEST(RouterTest, InfoAdvertisesTheMessageLimitOfItsChannelsBeyondTheirDimension) {
  constexpr int kWideDim = kRouterMaxDim + 1;
  std::vector<std::unique_ptr<SearchEngine>> engines =
      MakeShardEngines(MakeDatastore(6, kWideDim, 3, 2), 1);
  TestShard shard(0, std::move(engines[0]));
  RouterOptions options = FastRouterOptions();
  options.limits = TestLimits();  // the shard's: only the dimension differs
  TestRouter router({{0, {shard.address()}}}, options);
  auto stub = Connect(router.address());
  grpc::ClientContext context;
  v1::InfoResponse info;
  ASSERT_TRUE(stub->Info(&context, v1::InfoRequest(), &info).ok());
  EXPECT_EQ(info.dim(), kWideDim);
  EXPECT_EQ(info.limits().max_message_bytes(), TestLimits().MaxMessageBytes(kRouterMaxDim));
  EXPECT_LT(info.limits().max_message_bytes(), TestLimits().MaxMessageBytes(kWideDim));
}

TEST(RouterTest, InfoAggregatesTheShards) {
  Cluster cluster(2, 2);
  TestRouter router(cluster.map(), FastRouterOptions());
  auto stub = Connect(router.address());
  grpc::ClientContext context;
  v1::InfoResponse info;
  ASSERT_TRUE(stub->Info(&context, v1::InfoRequest(), &info).ok());
  EXPECT_EQ(info.dim(), kDim);
  EXPECT_EQ(info.total_vectors(), cluster.unsharded().info().total_vectors);
  ASSERT_EQ(info.shards_size(), 2);
  for (int s = 0; s < 2; ++s) {
    const EngineInfo& engine = cluster.shard(s).engine()->info();
    EXPECT_EQ(info.shards(s).shard_id(), s);
    EXPECT_EQ(info.shards(s).id_begin(), engine.id_begin);
    EXPECT_EQ(info.shards(s).id_end(), engine.id_end);
    EXPECT_THAT(info.shards(s).replicas(), ::testing::ElementsAre(cluster.shard(s, 0).address(),
                                                                  cluster.shard(s, 1).address()));
  }
  EXPECT_EQ(CheckHealth(router.address()).value_or(-1), 1);
}

}  // namespace
}  // namespace knnserve::testing
