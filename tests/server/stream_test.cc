// SearchStream: a decoding session's setup once, then steps answered in order, per-step errors
// without ending the stream, and a stream through the router that survives a replica's death.
#include <thread>

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
  explicit Fixture(int shards, int replicas) : data(MakeDatastore(200, kDim, 5, 3)) {
    for (int r = 0; r < replicas; ++r) {
      auto engines = MakeShardEngines(data, shards);
      for (int s = 0; s < shards; ++s) {
        servers.push_back(std::make_unique<TestShard>(s, std::move(engines[s])));
        map[s].push_back(servers.back()->address());
      }
    }
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
  std::vector<std::unique_ptr<TestShard>> servers;
  ShardMap map;
};

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
}

}  // namespace
}  // namespace knnserve::testing
