// SearchStream: a decoding session's setup once, then steps answered in order, per-step errors
// without ending the stream, and streams through the router: the subset sent to each shard
// once, and kept answering through a replica's death, a shard's restart and a hedge.
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_matchers.h"
#include "common/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/flat_engine.h"
#include "tests/server/test_cluster.h"

namespace knnserve::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kDim = 16;

class Session {
 public:
  explicit Session(v1::Retrieval::Stub* stub) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    stream_ = stub->SearchStream(&context_);
  }

  void Setup(const SubsetGroups& groups, int default_k) {
    v1::StreamRequest request;
    for (const auto& group : groups) {
      request.mutable_setup()->add_subset_groups()->mutable_sentence_ids()->Assign(group.begin(),
                                                                                   group.end());
    }
    request.mutable_setup()->mutable_default_params()->set_k(default_k);
    ASSERT_TRUE(stream_->Write(request));
  }

  v1::SearchResponse Step(const v1::SearchRequest& step) {
    v1::StreamRequest request;
    *request.mutable_step() = step;
    v1::SearchResponse response;
    EXPECT_TRUE(stream_->Write(request));
    EXPECT_TRUE(stream_->Read(&response));
    return response;
  }

  grpc::Status Close() {
    stream_->WritesDone();
    return stream_->Finish();
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StreamRequest, v1::SearchResponse>> stream_;
};

v1::SearchRequest SubsetStep(const Matrix<float>& queries, const std::vector<int32_t>& rows) {
  v1::SearchRequest step;
  EncodeMatrix(queries.view(), v1::DTYPE_FP16, step.mutable_queries());
  step.mutable_row_group()->Assign(rows.begin(), rows.end());
  return step;
}

// fp16 on the wire: the expected answer searches the rounded queries.
Matrix<float> RoundTripFp16(const Matrix<float>& m) {
  v1::Matrix packed;
  EncodeMatrix(m.view(), v1::DTYPE_FP16, &packed);
  return *DecodeMatrix(packed, "m");
}

struct Fixture {
  explicit Fixture(int shards, int replicas)
      : data(MakeDatastore(200, kDim, 5, 3)), num_shards(shards) {
    for (int r = 0; r < replicas; ++r) {
      auto engines = MakeShardEngines(data, shards);
      for (int s = 0; s < shards; ++s) {
        servers.push_back(std::make_unique<TestShard>(s, std::move(engines[s])));
        map[s].push_back(servers.back()->address());
      }
    }
  }

  // Kills servers[i] and starts a new one for its shard on its address: all it knew is gone.
  void Restart(int i) {
    const std::string address = servers[i]->address();
    const int shard = i % num_shards;
    servers[i].reset();
    servers[i] =
        std::make_unique<TestShard>(shard, std::move(MakeShardEngines(data, num_shards)[shard]),
                                    TestShardOptions{.listen = address});
  }

  Neighbors Expected(const Matrix<float>& queries, const SubsetGroups& groups,
                     const std::vector<int32_t>& rows, int k) const {
    FlatEngine all(data, 0, data->num_sentences());
    SearchQuery query;
    query.queries = RoundTripFp16(queries);
    query.params.k = k;
    query.subset_groups = std::make_shared<const SubsetGroups>(groups);
    query.row_group = rows;
    return all.Search(query)->neighbors;
  }

  std::shared_ptr<const Datastore> data;
  const int num_shards;
  std::vector<std::unique_ptr<TestShard>> servers;
  ShardMap map;
};

// A counter's value in `metrics`' text rendering; `series` is its name and labels.
int64_t CounterValue(MetricsRegistry& metrics, const std::string& series) {
  const std::string text = metrics.RenderText();
  const size_t at = text.find(series + " ");
  if (at == std::string::npos) return 0;
  return std::stoll(text.substr(at + series.size() + 1));
}

// How many requests a shard server got that named a subset_session, by what they did with
// it: "declared" (came with groups), "reused" (used kept groups), "unknown".
int64_t SessionRequests(TestShard& shard, const std::string& event) {
  return CounterValue(
      shard.metrics(),
      absl::StrCat("knnserve_subset_session_requests_total{event=\"", event, "\"}"));
}

int64_t SubsetResends(TestRouter& router, int shard) {
  return CounterValue(router.metrics(),
                      absl::StrCat("knnserve_subset_resends_total{shard=\"", shard, "\"}"));
}

void ExpectSameNeighbors(const v1::SearchResponse& response, const Neighbors& expected) {
  ASSERT_EQ(response.error_code(), 0) << response.error_message();
  ASSERT_OK_AND_ASSIGN(Neighbors got, DecodeNeighbors(response));
  EXPECT_EQ(got.ids, expected.ids);
  EXPECT_EQ(got.distances, expected.distances);
}

TEST(StreamTest, ShardAnswersStepsInOrderAndSurvivesABadStep) {
  Fixture fixture(1, 1);
  auto stub = Connect(fixture.servers[0]->address());
  const SubsetGroups groups = {{1, 2, 3}, {50, 60}};
  Session session(stub.get());
  session.Setup(groups, 4);
  for (int step = 0; step < 3; ++step) {
    const Matrix<float> queries = RandomQueries(3, kDim, step);
    v1::SearchRequest request = SubsetStep(queries, {0, 1, 1});
    request.set_request_id(absl::StrCat("step-", step));
    const v1::SearchResponse response = session.Step(request);
    ExpectSameNeighbors(response, fixture.Expected(queries, groups, {0, 1, 1}, 4));
    EXPECT_EQ(response.request_id(), absl::StrCat("step-", step));
  }
  // A bad step: answered with its error, the stream goes on.
  const v1::SearchResponse bad = session.Step(SubsetStep(RandomQueries(2, kDim, 1), {0, 2}));
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("row_group[1] = 2"));
  const Matrix<float> queries = RandomQueries(1, kDim, 9);
  ExpectSameNeighbors(session.Step(SubsetStep(queries, {1})),
                      fixture.Expected(queries, groups, {1}, 4));
  EXPECT_TRUE(session.Close().ok());
}

TEST(StreamTest, StepReferringToGroupsWithoutSetupIsFailedPrecondition) {
  Fixture fixture(1, 1);
  auto stub = Connect(fixture.servers[0]->address());
  Session session(stub.get());
  v1::SearchRequest step = SubsetStep(RandomQueries(1, kDim, 1), {0});
  step.mutable_params()->set_k(3);
  const v1::SearchResponse response = session.Step(step);
  EXPECT_EQ(response.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // A full-search step on the same stream works.
  step.clear_row_group();
  EXPECT_EQ(session.Step(step).error_code(), 0);
  EXPECT_TRUE(session.Close().ok());
}

TEST(StreamTest, SecondSetupEndsTheStream) {
  Fixture fixture(1, 1);
  auto stub = Connect(fixture.servers[0]->address());
  Session session(stub.get());
  session.Setup({{1}}, 2);
  session.Setup({{2}}, 2);
  const grpc::Status status = session.Close();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("at most one setup"));
}

TEST(StreamTest, RouterStreamSurvivesAKilledReplica) {
  Fixture fixture(2, 2);
  TestRouter router(fixture.map, FastRouterOptions());
  auto stub = Connect(router.address());
  const SubsetGroups groups = {{5, 20, 120}, {130, 199}, {0}};
  Session session(stub.get());
  session.Setup(groups, 6);
  constexpr int kSteps = 40;
  std::thread killer;
  for (int step = 0; step < kSteps; ++step) {
    if (step == kSteps / 4) {
      // Kill shard 1's first replica while steps keep coming.
      killer = std::thread([&] { fixture.servers[1]->Kill(); });
    }
    const Matrix<float> queries = RandomQueries(4, kDim, 100 + step);
    const std::vector<int32_t> rows = {0, 1, 2, 1};
    const v1::SearchResponse response = session.Step(SubsetStep(queries, rows));
    ExpectSameNeighbors(response, fixture.Expected(queries, groups, rows, 6));
    EXPECT_EQ(response.coverage().shards_answered(), 2) << "step " << step;
  }
  killer.join();
  EXPECT_TRUE(session.Close().ok());
  // The surviving replica of shard 1 got the groups once, whenever it first served the stream.
  EXPECT_EQ(SessionRequests(*fixture.servers[3], "declared"), 1);
}

// The wire contract a router relies on, over unary calls: groups sent with a token are kept
// under it, a later request names the token alone, and a token the shard does not hold is
// FAILED_PRECONDITION "unknown subset_session".
TEST(StreamTest, ShardKeepsTheGroupsOfASubsetSessionForLaterRequests) {
  Fixture fixture(1, 1);
  auto stub = Connect(fixture.servers[0]->address());
  const SubsetGroups groups = {{4, 9}, {150}};
  const Matrix<float> queries = RandomQueries(2, kDim, 600);
  v1::SearchRequest request = SubsetStep(queries, {1, 0});
  request.mutable_params()->set_k(3);
  request.set_subset_session("session-a");
  v1::SearchResponse response;
  grpc::Status status = CallSearch(stub.get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), ::testing::StartsWith("unknown subset_session"));

  v1::SearchRequest declare = request;
  for (const auto& group : groups) {
    declare.add_subset_groups()->mutable_sentence_ids()->Assign(group.begin(), group.end());
  }
  ASSERT_TRUE(CallSearch(stub.get(), declare, &response).ok());
  ExpectSameNeighbors(response, fixture.Expected(queries, groups, {1, 0}, 3));
  status = CallSearch(stub.get(), request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ExpectSameNeighbors(response, fixture.Expected(queries, groups, {1, 0}, 3));
  EXPECT_EQ(SessionRequests(*fixture.servers[0], "unknown"), 1);
  EXPECT_EQ(SessionRequests(*fixture.servers[0], "declared"), 1);
  EXPECT_EQ(SessionRequests(*fixture.servers[0], "reused"), 1);
}

// A request that brings groups with a token its shards already hold other groups under: the
// router passes the new groups on, and the shards search them (and keep them under the token).
TEST(StreamTest, RouterPassesOnGroupsThatReplaceThoseOfTheirToken) {
  Fixture fixture(2, 1);
  TestRouter router(fixture.map, FastRouterOptions());
  auto stub = Connect(router.address());
  const Matrix<float> queries = RandomQueries(2, kDim, 700);
  for (const SubsetGroups& groups :
       {SubsetGroups{{5, 20, 120}, {130, 199}}, SubsetGroups{{0, 1}, {150, 160, 170}}}) {
    v1::SearchRequest request = SubsetStep(queries, {1, 0});
    request.mutable_params()->set_k(3);
    request.set_subset_session("session-b");
    for (const auto& group : groups) {
      request.add_subset_groups()->mutable_sentence_ids()->Assign(group.begin(), group.end());
    }
    v1::SearchResponse response;
    ASSERT_TRUE(CallSearch(stub.get(), request, &response).ok());
    ExpectSameNeighbors(response, fixture.Expected(queries, groups, {1, 0}, 3));
    request.clear_subset_groups();  // the token alone: the groups just declared
    ASSERT_TRUE(CallSearch(stub.get(), request, &response).ok());
    ExpectSameNeighbors(response, fixture.Expected(queries, groups, {1, 0}, 3));
  }
}

// Both replicas of a shard hold other groups under the client's token (declared to each
// directly), and groups that replace them through the router reach only the replica that
// request went to: every later request naming the token alone still searches the new groups,
// on whichever replica it lands (the router names them to its shards by a token of their own).
TEST(StreamTest, ReplacedGroupsAreSearchedOnEveryReplica) {
  Fixture fixture(1, 2);
  const SubsetGroups old_groups = {{5, 20, 120}, {130, 199}};
  const SubsetGroups new_groups = {{0, 1}, {150, 160, 170}};
  const Matrix<float> queries = RandomQueries(2, kDim, 701);
  auto request_for = [&](const SubsetGroups* groups) {
    v1::SearchRequest request = SubsetStep(queries, {1, 0});
    request.mutable_params()->set_k(3);
    request.set_subset_session("session-c");
    if (groups == nullptr) return request;
    for (const auto& group : *groups) {
      request.add_subset_groups()->mutable_sentence_ids()->Assign(group.begin(), group.end());
    }
    return request;
  };
  v1::SearchResponse response;
  for (const auto& server : fixture.servers) {
    auto replica = Connect(server->address());
    ASSERT_TRUE(CallSearch(replica.get(), request_for(&old_groups), &response).ok());
  }
  TestRouter router(fixture.map, FastRouterOptions());
  auto stub = Connect(router.address());
  const int calls_before = fixture.servers[0]->engine()->calls();
  ASSERT_TRUE(CallSearch(stub.get(), request_for(&new_groups), &response).ok());
  const Neighbors expected = fixture.Expected(queries, new_groups, {1, 0}, 3);
  ExpectSameNeighbors(response, expected);
  // The replica that got the new groups goes: the token alone now reaches the other one.
  fixture.servers[fixture.servers[0]->engine()->calls() > calls_before ? 0 : 1]->Kill();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(CallSearch(stub.get(), request_for(nullptr), &response).ok());
    ExpectSameNeighbors(response, expected);
  }
}

// Each shard gets a stream's groups once: the first step names the stream's subset_session,
// the shard does not know it, and the router sends that request again with the groups; every
// later step names the session alone. The answers are those of an in-process search.
TEST(StreamTest, RouterSendsTheSubsetToEachShardOncePerStream) {
  Fixture fixture(2, 1);
  TestRouter router(fixture.map, FastRouterOptions());
  auto stub = Connect(router.address());
  const SubsetGroups groups = {{5, 20, 120}, {130, 199}, {0}};  // both shards
  constexpr int kSteps = 20;
  for (int stream = 1; stream <= 2; ++stream) {
    Session session(stub.get());
    session.Setup(groups, 6);
    for (int step = 0; step < kSteps; ++step) {
      const Matrix<float> queries = RandomQueries(4, kDim, 200 + step);
      const std::vector<int32_t> rows = {0, 1, 2, 1};
      const v1::SearchResponse response = session.Step(SubsetStep(queries, rows));
      ExpectSameNeighbors(response, fixture.Expected(queries, groups, rows, 6));
      EXPECT_EQ(response.coverage().shards_answered(), 2) << "step " << step;
    }
    EXPECT_TRUE(session.Close().ok());
    // A second stream is a session of its own, declared once more.
    for (int s = 0; s < 2; ++s) {
      EXPECT_EQ(SessionRequests(*fixture.servers[s], "declared"), stream) << "shard " << s;
      EXPECT_EQ(SessionRequests(*fixture.servers[s], "unknown"), stream) << "shard " << s;
      EXPECT_EQ(SessionRequests(*fixture.servers[s], "reused"), stream * (kSteps - 1))
          << "shard " << s;
      EXPECT_EQ(SubsetResends(router, s), stream) << "shard " << s;
    }
  }
}

// Shards that predate subset_session: every step carries its groups, as before.
TEST(StreamTest, RouterWithoutSubsetSessionsSendsTheGroupsWithEveryStep) {
  Fixture fixture(2, 1);
  RouterOptions options = FastRouterOptions();
  options.subset_sessions = false;
  TestRouter router(fixture.map, options);
  auto stub = Connect(router.address());
  const SubsetGroups groups = {{5, 20, 120}, {130, 199}};
  Session session(stub.get());
  session.Setup(groups, 3);
  for (int step = 0; step < 3; ++step) {
    const Matrix<float> queries = RandomQueries(2, kDim, 300 + step);
    ExpectSameNeighbors(session.Step(SubsetStep(queries, {0, 1})),
                        fixture.Expected(queries, groups, {0, 1}, 3));
  }
  EXPECT_TRUE(session.Close().ok());
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(SessionRequests(*fixture.servers[s], "declared"), 0);
    EXPECT_EQ(SessionRequests(*fixture.servers[s], "reused"), 0);
  }
  EXPECT_EQ(SubsetResends(router, 0), 0);
}

// A shard restarted mid-stream has forgotten the session: it says so, gets the groups again,
// and the stream's answers stay exact.
TEST(StreamTest, RouterStreamSurvivesAShardRestartThatForgotTheSubset) {
  Fixture fixture(2, 1);
  TestRouter router(fixture.map, FastRouterOptions());
  auto stub = Connect(router.address());
  const SubsetGroups groups = {{5, 20, 120}, {130, 199}, {0}};
  const std::vector<int32_t> rows = {2, 1, 0};
  Session session(stub.get());
  session.Setup(groups, 5);
  constexpr int kSteps = 10;
  for (int step = 0; step < kSteps; ++step) {
    if (step == kSteps / 2) fixture.Restart(1);
    const Matrix<float> queries = RandomQueries(3, kDim, 400 + step);
    v1::SearchResponse response = session.Step(SubsetStep(queries, rows));
    // Until the router's channel has reconnected to the new process, steps may find shard 1
    // unavailable (in-band errors; the stream goes on).
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (response.error_code() == grpc::StatusCode::UNAVAILABLE && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(50));
      response = session.Step(SubsetStep(queries, rows));
    }
    ExpectSameNeighbors(response, fixture.Expected(queries, groups, rows, 5));
  }
  EXPECT_TRUE(session.Close().ok());
  TestShard& restarted = *fixture.servers[1];
  EXPECT_EQ(SessionRequests(restarted, "unknown"), 1);
  EXPECT_EQ(SessionRequests(restarted, "declared"), 1);
  EXPECT_EQ(SessionRequests(restarted, "reused"), kSteps / 2 - 1);
  EXPECT_EQ(SubsetResends(router, 1), 2);  // the first step, and the first after the restart
}

// A hedge to a replica that never saw the session: that replica is sent the groups within the
// same call, and the hedge answers while the first replica is stuck.
TEST(StreamTest, HedgeToAReplicaThatNeverSawTheSubsetAnswers) {
  Fixture fixture(1, 2);
  RouterOptions options = FastRouterOptions();
  options.hedge.enabled = true;
  options.hedge.delay = absl::Milliseconds(20);
  TestRouter router(fixture.map, options);
  auto stub = Connect(router.address());
  // The router's first choice (the first replica: no latency known yet) learns the session,
  // then never answers until the test ends.
  fixture.servers[0]->engine()->CloseGate();
  const SubsetGroups groups = {{5, 20, 120}, {130, 199}};
  Session session(stub.get());
  session.Setup(groups, 4);
  const Matrix<float> queries = RandomQueries(2, kDim, 500);
  ExpectSameNeighbors(session.Step(SubsetStep(queries, {1, 0})),
                      fixture.Expected(queries, groups, {1, 0}, 4));
  EXPECT_EQ(SessionRequests(*fixture.servers[0], "declared"), 1);
  EXPECT_EQ(SessionRequests(*fixture.servers[1], "declared"), 1);
  EXPECT_EQ(SubsetResends(router, 0), 2);
  EXPECT_EQ(CounterValue(router.metrics(), "knnserve_hedges_won_total{shard=\"0\"}"), 1);
  EXPECT_TRUE(session.Close().ok());
}

}  // namespace
}  // namespace knnserve::testing
