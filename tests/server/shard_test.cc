// knnserve-shard's service in process: answers, Info, health, validation, drain, metrics.
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "common/status_matchers.h"
#include "common/wire.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/server/flat_engine.h"
#include "tests/server/test_cluster.h"
#include "tests/testing/temp_dir.h"

namespace knnserve::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kDim = 16;

std::unique_ptr<SearchEngine> SmallEngine() {
  return std::make_unique<FlatEngine>(MakeDatastore(100, kDim, 6, 7), 20, 80);
}

// Waits up to 10 s for `line` among the shard's metrics: a server updates its gauges when a
// call's last callback runs, which may be just after the client saw the call end.
void WaitForMetricLine(TestShard& shard, const std::string& line) {
  for (int i = 0; i < 1000 && !absl::StrContains(shard.metrics().RenderText(), line + "\n"); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
}

TEST(ShardTest, AnswersLikeTheEngineWithCoverage) {
  TestShard shard(3, SmallEngine());
  auto stub = Connect(shard.address());
  const Matrix<float> queries = RandomQueries(5, kDim, 11);
  v1::SearchRequest request = MakeRequest(queries, 7);
  request.set_request_id("abc");
  v1::SearchResponse response;
  ASSERT_TRUE(CallSearch(stub.get(), request, &response).ok());

  SearchQuery query;
  query.queries = queries;
  query.params.k = 7;
  ASSERT_OK_AND_ASSIGN(EngineResult expected, shard.engine()->Search(query));
  ASSERT_OK_AND_ASSIGN(Neighbors got, DecodeNeighbors(response));
  EXPECT_EQ(got.ids, expected.neighbors.ids);
  EXPECT_EQ(got.distances, expected.neighbors.distances);
  EXPECT_EQ(got.values, expected.neighbors.values);
  EXPECT_EQ(response.request_id(), "abc");
  const EngineInfo& info = shard.engine()->info();
  EXPECT_EQ(response.coverage().shards_asked(), 1);
  EXPECT_EQ(response.coverage().shards_answered(), 1);
  EXPECT_EQ(response.coverage().vectors_searched(), info.id_end - info.id_begin);
  EXPECT_EQ(response.coverage().vectors_total(), info.id_end - info.id_begin);
}

// A shard on a unix socket reports the socket's address (as logged and dialled), not "unix:1".
TEST(ShardTest, ServesOnAUnixSocketAndReportsItsAddress) {
  const std::string listen =
      "unix:" + testing::FreshTempDir("unix_socket").string() + "/shard.sock";
  TestShard shard(0, SmallEngine(), {.listen = listen});
  EXPECT_EQ(shard.address(), listen);
  auto stub = Connect(shard.address());
  v1::SearchResponse response;
  EXPECT_TRUE(CallSearch(stub.get(), MakeRequest(RandomQueries(2, kDim, 4), 3), &response).ok());
  EXPECT_EQ(response.rows(), 2);
}

TEST(ShardTest, InfoDescribesTheSliceAndLimits) {
  TestShard shard(3, SmallEngine());
  auto stub = Connect(shard.address());
  grpc::ClientContext context;
  v1::InfoResponse info;
  ASSERT_TRUE(stub->Info(&context, v1::InfoRequest(), &info).ok());
  const EngineInfo& engine = shard.engine()->info();
  EXPECT_EQ(info.dim(), kDim);
  EXPECT_EQ(info.metric(), v1::METRIC_L2);
  EXPECT_EQ(info.factory(), "Flat");
  EXPECT_EQ(info.total_vectors(), engine.total_vectors);
  EXPECT_EQ(info.num_sentences(), 100);
  EXPECT_TRUE(info.supports_subset());
  ASSERT_EQ(info.shards_size(), 1);
  EXPECT_EQ(info.shards(0).shard_id(), 3);
  EXPECT_EQ(info.shards(0).id_begin(), engine.id_begin);
  EXPECT_EQ(info.shards(0).sentence_begin(), 20);
  EXPECT_EQ(info.shards(0).sentence_end(), 80);
  EXPECT_EQ(info.limits().max_k(), TestLimits().max_k);
  EXPECT_EQ(info.limits().max_message_bytes(), TestLimits().MaxMessageBytes(kDim));
  EXPECT_FALSE(info.version().empty());
}

TEST(ShardTest, NotServingUntilLoadedAndWarmedUp) {
  TestShard shard(0, SmallEngine(), {.load = false});
  EXPECT_EQ(CheckHealth(shard.address()).value_or(-1), 2);
  EXPECT_EQ(CheckHealth(shard.address(), "knnserve.v1.Retrieval").value_or(-1), 2);
  auto stub = Connect(shard.address());
  v1::SearchResponse response;
  const grpc::Status loading =
      CallSearch(stub.get(), MakeRequest(RandomQueries(1, kDim, 1), 3), &response);
  EXPECT_EQ(loading.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(loading.error_message(), HasSubstr("loading"));
  EXPECT_EQ(shard.engine()->calls(), 0);

  shard.Load();
  EXPECT_EQ(shard.engine()->calls(), 1);  // the warm-up query
  EXPECT_EQ(CheckHealth(shard.address()).value_or(-1), 1);
  EXPECT_EQ(CheckHealth(shard.address(), "knnserve.v1.Retrieval").value_or(-1), 1);
  EXPECT_TRUE(CallSearch(stub.get(), MakeRequest(RandomQueries(1, kDim, 1), 3), &response).ok());
}

TEST(ShardTest, RejectsMalformedRequestsAndKeepsServing) {
  TestShard shard(0, SmallEngine());
  auto stub = Connect(shard.address());
  ExpectMalformedRequestsRejected(stub.get(), kDim);
}

TEST(ShardTest, DrainFinishesCallsInFlight) {
  TestShard shard(0, SmallEngine());
  auto stub = Connect(shard.address());
  shard.engine()->CloseGate();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  const v1::SearchRequest request = MakeRequest(RandomQueries(1, kDim, 1), 3);
  v1::SearchResponse response;
  grpc::Status status;
  absl::Notification done;
  stub->async()->Search(&context, &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  ASSERT_TRUE(shard.engine()->WaitForCallsAtGate(1, absl::Seconds(10)));
  std::thread drain([&] { shard.server().Shutdown(absl::Seconds(20)); });
  // Draining: health says NOT_SERVING at once, the call in flight still completes.
  absl::SleepFor(absl::Milliseconds(50));
  shard.engine()->OpenGate();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.rows(), 1);
  drain.join();
}

// Answers admitted and not yet delivered are bounded (a client that does not read its answers
// would keep them in the server's memory): a call beyond --max-undelivered-mib is refused as
// overloaded while another answer is held, and admitted again once it is delivered. A stream
// gives its step's answer back once written, and keeps answering after a refused step.
TEST(ShardTest, RefusesCallsBeyondTheUndeliveredAnswerBudget) {
  TestShardOptions options;
  const Matrix<float> queries = RandomQueries(4, kDim, 5);
  const v1::SearchRequest request = MakeRequest(queries, 8);
  const int64_t answer_bytes = 4 * 8 * (4 + 8 + 4);
  options.service.max_undelivered_answer_bytes = answer_bytes * 3 / 2;  // one answer at a time
  TestShard shard(0, SmallEngine(), options);
  auto stub = Connect(shard.address());
  grpc::ClientContext stream_context;
  auto stream = stub->SearchStream(&stream_context);
  const auto step = [&stream, &request] {
    v1::StreamRequest message;
    *message.mutable_step() = request;
    v1::SearchResponse response;
    EXPECT_TRUE(stream->Write(message));
    EXPECT_TRUE(stream->Read(&response));
    return response;
  };
  // The server gives an answer's bytes back once the answer is written, which may be just
  // after the client has read it.
  const auto wait_until_delivered = [&shard] {
    WaitForMetricLine(shard, "knnserve_undelivered_answer_bytes 0");
  };
  EXPECT_EQ(step().error_code(), 0);
  wait_until_delivered();

  shard.engine()->CloseGate();
  std::thread held([&] {
    v1::SearchResponse response;
    EXPECT_TRUE(CallSearch(stub.get(), request, &response).ok());
  });
  ASSERT_TRUE(shard.engine()->WaitForCallsAtGate(1, absl::Seconds(10)));
  v1::SearchResponse refused;
  const grpc::Status status = CallSearch(stub.get(), request, &refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("shard overloaded"));
  EXPECT_THAT(status.error_message(), HasSubstr("MiB of undelivered answers held"));
  const v1::SearchResponse refused_step = step();
  EXPECT_EQ(refused_step.error_code(), grpc::StatusCode::UNAVAILABLE);
  shard.engine()->OpenGate();
  held.join();
  wait_until_delivered();

  v1::SearchResponse again;
  EXPECT_TRUE(CallSearch(stub.get(), request, &again).ok());
  wait_until_delivered();  // or the step below could find `again`'s bytes still held
  EXPECT_EQ(step().error_code(), 0);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_THAT(shard.metrics().RenderText(),
              HasSubstr("knnserve_refused_total{reason=\"undelivered_answers\"} 2"));
}

// The subset groups open streams declared at setup are bounded too: a setup beyond
// --max-stream-groups-mib ends its stream UNAVAILABLE while other streams hold groups, and the
// groups of a closed stream are given back.
TEST(ShardTest, RefusesStreamSetupsBeyondTheStreamGroupBudget) {
  TestShardOptions options;
  options.service.max_stream_group_bytes = 100 * 8;
  TestShard shard(0, SmallEngine(), options);
  auto stub = Connect(shard.address());
  struct Stream {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::StreamRequest, v1::SearchResponse>> stream;
  };
  const auto open = [&stub](int sentences) {
    auto s = std::make_unique<Stream>();
    s->stream = stub->SearchStream(&s->context);
    v1::StreamRequest setup;
    v1::SubsetGroup* group = setup.mutable_setup()->add_subset_groups();
    for (int id = 0; id < sentences; ++id) group->add_sentence_ids(id);
    EXPECT_TRUE(s->stream->Write(setup));
    return s;
  };
  const auto close = [](Stream& s) {
    s.stream->WritesDone();
    return s.stream->Finish();
  };
  std::unique_ptr<Stream> first = open(60);
  WaitForMetricLine(shard, "knnserve_stream_group_bytes 480");
  std::unique_ptr<Stream> second = open(60);
  const grpc::Status refused = close(*second);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(), HasSubstr("MiB of stream subset groups held"));
  EXPECT_TRUE(close(*first).ok());
  WaitForMetricLine(shard, "knnserve_stream_group_bytes 0");
  std::unique_ptr<Stream> third = open(60);
  EXPECT_TRUE(close(*third).ok());
}

// A stream whose client sends nothing for --stream-idle-seconds is ended UNAVAILABLE, naming
// the flag, and gives its subset groups back; a stream that keeps stepping stays open however
// long it lasts.
TEST(ShardTest, EndsStreamsWhoseClientSendsNothingForTheIdleTimeout) {
  TestShardOptions options;
  options.service.stream_idle_timeout = absl::Seconds(2);  // 40 times the busy stream's gaps
  TestShard shard(0, SmallEngine(), options);
  auto stub = Connect(shard.address());
  grpc::ClientContext idle_context;
  auto idle = stub->SearchStream(&idle_context);
  v1::StreamRequest setup;
  v1::SubsetGroup* group = setup.mutable_setup()->add_subset_groups();
  for (int id = 0; id < 60; ++id) group->add_sentence_ids(id);
  ASSERT_TRUE(idle->Write(setup));
  WaitForMetricLine(shard, "knnserve_stream_group_bytes 480");

  grpc::ClientContext busy_context;
  auto busy = stub->SearchStream(&busy_context);
  v1::StreamRequest step;
  *step.mutable_step() = MakeRequest(RandomQueries(2, kDim, 6), 4);
  const absl::Time start = absl::Now();
  int steps = 0;
  // Steps 20 times a second until the idle stream has ended and at least 4 s have passed.
  while (
      absl::Now() - start < absl::Seconds(4) ||
      !absl::StrContains(shard.metrics().RenderText(), "knnserve_idle_streams_ended_total 1\n")) {
    ASSERT_LT(absl::Now() - start, absl::Seconds(20)) << "the idle stream was not ended";
    v1::SearchResponse response;
    ASSERT_TRUE(busy->Write(step));
    ASSERT_TRUE(busy->Read(&response)) << "the busy stream ended after " << steps << " steps";
    EXPECT_EQ(response.error_code(), 0);
    ++steps;
    absl::SleepFor(absl::Milliseconds(50));
  }
  const grpc::Status ended = idle->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(ended.error_message(), HasSubstr("--stream-idle-seconds"));
  WaitForMetricLine(shard, "knnserve_stream_group_bytes 0");
  EXPECT_THAT(shard.metrics().RenderText(), HasSubstr("knnserve_stream_group_bytes 0\n"));
  busy->WritesDone();
  EXPECT_TRUE(busy->Finish().ok());
  EXPECT_THAT(shard.metrics().RenderText(), HasSubstr("knnserve_idle_streams_ended_total 1\n"));
}

TEST(ShardTest, CountsRequestsInMetrics) {
  TestShard shard(0, SmallEngine());
  auto stub = Connect(shard.address());
  v1::SearchResponse response;
  ASSERT_TRUE(CallSearch(stub.get(), MakeRequest(RandomQueries(2, kDim, 1), 3), &response).ok());
  const std::string text = shard.metrics().RenderText();
  EXPECT_THAT(text, HasSubstr("knnserve_requests_total{method=\"Search\",result=\"ok\"} 1"));
  EXPECT_THAT(text, HasSubstr("knnserve_batch_rows_count 1"));
  EXPECT_THAT(text, HasSubstr("knnserve_request_seconds_bucket{method=\"Search\""));
}

// One ServerReflectionInfo exchange through a generic stub (no reflection stubs ship for
// C++ clients): list_services, hand-encoded.
class ListServices : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit ListServices(const std::string& address)
      : stub_(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    const std::string request("\x3a\x00", 2);  // field 7 (list_services) = ""
    grpc::Slice slice(request);
    request_ = grpc::ByteBuffer(&slice, 1);
    stub_.PrepareBidiStreamingCall(&context_,
                                   "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                   grpc::StubOptions(), this);
    StartWrite(&request_);
    StartRead(&response_);
    StartCall();
  }
  void OnWriteDone(bool) override { StartWritesDone(); }
  void OnReadDone(bool ok) override {
    if (ok) {
      std::vector<grpc::Slice> slices;
      (void)response_.Dump(&slices);
      for (const grpc::Slice& s : slices) {
        reply_.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }
  std::string Wait() {
    EXPECT_TRUE(done_.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_TRUE(status_.ok()) << status_.error_message();
    return reply_;
  }

 private:
  grpc::GenericStub stub_;
  grpc::ClientContext context_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  std::string reply_;
  grpc::Status status_;
  absl::Notification done_;
};

TEST(ShardTest, ServesReflection) {
  TestShard shard(0, SmallEngine());
  ListServices call(shard.address());
  const std::string reply = call.Wait();
  EXPECT_THAT(reply, HasSubstr("knnserve.v1.Retrieval"));
  EXPECT_THAT(reply, HasSubstr("grpc.health.v1.Health"));
}

// gRPC's default SO_REUSEPORT would let the second server bind too and take a share of the
// first one's connections.
TEST(ShardTest, ASecondServerOnAPortInUseFailsToStart) {
  TestShard shard(0, SmallEngine());
  RpcServerOptions options;
  options.listen = shard.address();
  grpc::Service service;
  absl::StatusOr<std::unique_ptr<RpcServer>> second = RpcServer::Start(options, &service);
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kUnavailable, HasSubstr(shard.address())));
}

}  // namespace
}  // namespace knnserve::testing
