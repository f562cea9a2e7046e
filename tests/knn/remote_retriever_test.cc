// RemoteRetriever against a router stand-in that misbehaves on purpose.
#include "client/knn/remote_retriever.h"

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/matrix.h"
#include "common/search_types.h"
#include "common/status_matchers.h"
#include "common/wire.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "knnserve/v1/retrieval.grpc.pb.h"
#include "tests/server/flat_engine.h"
#include "tests/server/test_cluster.h"

namespace knnserve::knn {
namespace {

constexpr int kDim = 4;

// Answers every step (all neighbours missing) but, once the client is done writing, keeps the
// call open until the client cancels it or 20 s pass: a router that stalled between two steps.
class StallingRouter final : public v1::Retrieval::Service {
 public:
  grpc::Status Info(grpc::ServerContext*, const v1::InfoRequest*,
                    v1::InfoResponse* response) override {
    response->set_dim(kDim);
    response->set_metric(v1::METRIC_L2);
    response->set_total_vectors(10);
    return grpc::Status::OK;
  }

  grpc::Status SearchStream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::SearchResponse, v1::StreamRequest>* stream) override {
    {
      absl::MutexLock lock(&mu_);
      ++streams_;
    }
    v1::StreamRequest message;
    while (stream->Read(&message)) {
      v1::SearchResponse response;
      EncodeNeighbors(Neighbors::Missing(message.step().queries().rows(),
                                         message.step().params().k(), Metric::kL2,
                                         /*with_values=*/true),
                      &response);
      stream->Write(response);
    }
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (!context->IsCancelled() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
    absl::MutexLock lock(&mu_);
    ++ended_;
    cancelled_ += context->IsCancelled();
    return grpc::Status::OK;
  }

  // Waits (up to 30 s) until every stream opened has ended; returns how many the client
  // cancelled, and sets *streams to how many were opened.
  int WaitForStreamsToEnd(int* streams) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](StallingRouter* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
                               return r->streams_ > 0 && r->ended_ == r->streams_;
                             },
                             this),
                         absl::Seconds(30));
    *streams = streams_;
    return cancelled_;
  }

 private:
  absl::Mutex mu_;
  int streams_ ABSL_GUARDED_BY(mu_) = 0;
  int ended_ ABSL_GUARDED_BY(mu_) = 0;
  int cancelled_ ABSL_GUARDED_BY(mu_) = 0;
};

// A session's end waits for the router to end the stream; a stalled router never does, and the
// decoder would wait with it. The step deadline bounds that wait too: the stream is cancelled.
TEST(RemoteRetriever, ClosingAStreamTheRouterNeverEndsIsBoundedByTheStepDeadline) {
  StallingRouter router;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&router);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);

  RemoteRetrieverOptions options;
  options.address = "127.0.0.1:" + std::to_string(port);
  options.step_deadline = absl::Seconds(2);  // the step itself takes milliseconds
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteRetriever> retriever,
                       RemoteRetriever::Create(options));
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<RetrievalSession> session, retriever->StartSession({}));
    const Matrix<float> queries(2, kDim);
    SearchParams params;
    params.k = 3;
    ASSERT_OK_AND_ASSIGN(const Neighbors neighbors, session->Search(queries.view(), {}, params));
    EXPECT_EQ(neighbors.rows, 2);
  }  // the session ends: its stream is closed
  int streams = 0;
  const int cancelled = router.WaitForStreamsToEnd(&streams);
  EXPECT_EQ(streams, 1) << "the step was retried: the test did not test the close";
  EXPECT_EQ(cancelled, 1) << "the client waited for the router instead of cancelling";
  server->Shutdown();
}

// A server ends a stream whose client paused longer than its idle timeout; the session opens
// another, with its setup (the step's row_group names the setup's groups), at its next step
// and answers as before, without spending a retry (none are allowed here).
TEST(RemoteRetriever, ASessionReopensAStreamTheServerEndedAsIdle) {
  testing::TestShardOptions shard_options;
  shard_options.service.stream_idle_timeout = absl::Seconds(1);
  testing::TestShard shard(
      0, std::make_unique<testing::FlatEngine>(testing::MakeDatastore(40, kDim, 5, 3), 0, 40),
      shard_options);
  RemoteRetrieverOptions options;
  options.address = shard.address();
  options.max_retries = 0;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteRetriever> retriever,
                       RemoteRetriever::Create(options));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RetrievalSession> session,
                       retriever->StartSession(SubsetGroups{{3, 7, 11}}));
  const Matrix<float> queries = testing::RandomQueries(2, kDim, 8);
  SearchParams params;
  params.k = 4;
  ASSERT_OK_AND_ASSIGN(const Neighbors before, session->Search(queries.view(), {0, 0}, params));
  const std::string ended = "knnserve_idle_streams_ended_total 1\n";
  for (int i = 0; i < 1000 && !absl::StrContains(shard.metrics().RenderText(), ended); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_THAT(shard.metrics().RenderText(), ::testing::HasSubstr(ended));
  ASSERT_OK_AND_ASSIGN(const Neighbors after, session->Search(queries.view(), {0, 0}, params));
  EXPECT_EQ(after.ids, before.ids);
  EXPECT_EQ(after.distances, before.distances);
}

}  // namespace
}  // namespace knnserve::knn
