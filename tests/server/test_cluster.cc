#include "tests/server/test_cluster.h"

#include <functional>
#include <limits>
#include <random>
#include <utility>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/wire.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"

namespace knnserve::testing {

ControlledEngine::ControlledEngine(std::unique_ptr<SearchEngine> inner)
    : inner_(std::move(inner)) {}

ControlledEngine::~ControlledEngine() { OpenGate(); }

absl::StatusOr<EngineResult> ControlledEngine::Search(const SearchQuery& query) const {
  absl::Duration delay;
  {
    absl::MutexLock lock(&mu_);
    ++calls_;
    ++at_gate_;
    mu_.Await(absl::Condition(
        +[](bool* closed) { return !*closed; }, const_cast<bool*>(&gate_closed_)));
    --at_gate_;
    delay = delay_;
  }
  absl::SleepFor(delay);
  return inner_->Search(query);
}

void ControlledEngine::set_delay(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  delay_ = delay;
}

void ControlledEngine::CloseGate() {
  absl::MutexLock lock(&mu_);
  gate_closed_ = true;
}

void ControlledEngine::OpenGate() {
  absl::MutexLock lock(&mu_);
  gate_closed_ = false;
}

int ControlledEngine::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

bool ControlledEngine::WaitForCallsAtGate(int n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  struct Arg {
    const int* at_gate;
    int n;
  } arg{&at_gate_, n};
  return mu_.AwaitWithTimeout(absl::Condition(
                                  +[](Arg* a) { return *a->at_gate >= a->n; }, &arg),
                              timeout);
}

TestShard::TestShard(int32_t shard_id, std::unique_ptr<SearchEngine> engine,
                     TestShardOptions options)
    : backend_(shard_id, options.batcher, &metrics_),
      service_(&backend_, options.limits, &metrics_, options.service),
      pending_engine_(std::make_unique<ControlledEngine>(std::move(engine))),
      engine_(pending_engine_.get()) {
  RpcServerOptions server_options;
  server_options.listen = options.listen;
  server_options.tls = options.tls;
  server_options.max_message_bytes = options.limits.MaxMessageBytes(engine_->info().dim);
  absl::StatusOr<std::unique_ptr<RpcServer>> server = RpcServer::Start(server_options, &service_);
  KNNSERVE_CHECK(server.ok(), std::string(server.status().message()).c_str());
  server_ = *std::move(server);
  if (options.load) Load();
}

TestShard::~TestShard() {
  engine_->OpenGate();
  server_->Shutdown(absl::ZeroDuration());
}

void TestShard::Load() {
  const absl::Status status = backend_.SetEngine(std::move(pending_engine_));
  KNNSERVE_CHECK(status.ok(), std::string(status.message()).c_str());
  server_->SetServing(true);
}

RequestLimits TestLimits() {
  RequestLimits limits;
  limits.max_k = 256;
  limits.max_rows = 256;
  limits.max_subset_sentences = 1024;
  return limits;
}

RouterOptions FastRouterOptions() {
  RouterOptions options;
  options.limits = TestLimits();
  options.probe_interval = absl::Milliseconds(100);
  options.probe_timeout = absl::Milliseconds(500);
  options.hedge.enabled = false;
  return options;
}

TestRouter::TestRouter(const ShardMap& map, RouterOptions options, TlsFiles tls, bool wait) {
  const RequestLimits limits = options.limits;
  absl::StatusOr<std::unique_ptr<Router>> router =
      Router::Create(map, std::move(options), &metrics_, nullptr);
  KNNSERVE_CHECK(router.ok(), std::string(router.status().message()).c_str());
  router_ = *std::move(router);
  router_->StartProbing();
  service_ = std::make_unique<RetrievalService>(router_.get(), limits, &metrics_);
  RpcServerOptions server_options;
  server_options.tls = std::move(tls);
  server_options.max_message_bytes = limits.MaxMessageBytes(4096);
  absl::StatusOr<std::unique_ptr<RpcServer>> server =
      RpcServer::Start(server_options, service_.get());
  KNNSERVE_CHECK(server.ok(), std::string(server.status().message()).c_str());
  server_ = *std::move(server);
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  if (wait) {
    while (!router_->Shape().ok() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(10));
    EXPECT_TRUE(router_->Shape().ok()) << router_->Shape().status();
  }
  server_->SetServing(true);
}

TestRouter::~TestRouter() { server_->Shutdown(absl::ZeroDuration()); }

std::unique_ptr<v1::Retrieval::Stub> Connect(const std::string& address, const TlsFiles& tls) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(tls);
  KNNSERVE_CHECK(credentials.ok(), "channel credentials");
  return v1::Retrieval::NewStub(
      grpc::CreateCustomChannel(address, *credentials,
                                MakeChannelArguments(RequestLimits().MaxMessageBytes(4096),
                                                     tls.enabled() ? "localhost" : "")));
}

Matrix<float> RandomQueries(int64_t rows, int dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Matrix<float> queries(rows, dim);
  for (int64_t i = 0; i < queries.size(); ++i) queries.data()[i] = normal(rng);
  return queries;
}

v1::SearchRequest MakeRequest(const Matrix<float>& queries, int k) {
  SearchParams params;
  params.k = k;
  v1::SearchRequest request;
  EncodeSearchRequest(queries.view(), v1::DTYPE_FP32, params, &request);
  return request;
}

grpc::Status CallSearch(v1::Retrieval::Stub* stub, const v1::SearchRequest& request,
                        v1::SearchResponse* response, absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return stub->Search(&context, request, response);
}

absl::StatusOr<int> CheckHealth(const std::string& address, const std::string& service) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  std::string bytes;
  if (!service.empty()) {
    bytes.push_back(0x0a);  // field 1, length-delimited (names here are < 128 bytes)
    bytes.push_back(static_cast<char>(service.size()));
    bytes += service;
  }
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return FromGrpcStatus(status);
  std::vector<grpc::Slice> slices;
  (void)response.Dump(&slices);
  std::string reply;
  for (const grpc::Slice& s : slices)
    reply.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse{status = 1 (varint)}; an empty message means UNKNOWN (0).
  return reply.size() == 2 && reply[0] == 0x08 ? static_cast<int>(reply[1]) : 0;
}

void ExpectMalformedRequestsRejected(v1::Retrieval::Stub* stub, int dim) {
  const v1::SearchRequest valid = MakeRequest(RandomQueries(2, dim, 5), 4);
  struct Case {
    std::string name;
    std::function<void(v1::SearchRequest*)> mutate;
    std::string reason;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Case> cases = {
      {"wrong dims", [&](auto* r) { *r = MakeRequest(RandomQueries(2, dim + 1, 1), 4); },
       "columns"},
      {"no queries", [](auto* r) { r->clear_queries(); }, "queries: missing"},
      {"dtype", [](auto* r) { r->mutable_queries()->set_dtype(v1::DTYPE_UNSPECIFIED); }, "dtype"},
      {"byte length", [](auto* r) { r->mutable_queries()->mutable_data()->pop_back(); }, "bytes"},
      {"k = 0", [](auto* r) { r->mutable_params()->set_k(0); }, "params.k = 0"},
      {"k too large", [](auto* r) { r->mutable_params()->set_k(100000); }, "params.k = 100000"},
      {"NaN",
       [&](auto* r) {
         Matrix<float> q = RandomQueries(2, dim, 1);
         q.at(1, 2) = nan;
         *r = MakeRequest(q, 4);
       },
       "queries[1][2]"},
      {"unknown sentence id",
       [](auto* r) {
         r->add_subset_groups()->add_sentence_ids(1 << 30);
         r->add_row_group(0);
         r->add_row_group(0);
       },
       "sentence id"},
      {"row_group without groups", [](auto* r) { r->add_row_group(0); }, "row_group"},
  };
  for (const Case& c : cases) {
    v1::SearchRequest request = valid;
    c.mutate(&request);
    v1::SearchResponse response;
    const grpc::Status status = CallSearch(stub, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_THAT(status.error_message(), ::testing::HasSubstr(c.reason)) << c.name;
  }
  // Larger than max_message_bytes: refused by gRPC's own size check.
  v1::SearchRequest oversized = valid;
  oversized.set_request_id(std::string(TestLimits().MaxMessageBytes(4096) + 1, 'x'));
  v1::SearchResponse response;
  EXPECT_EQ(CallSearch(stub, oversized, &response).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Still serving.
  const grpc::Status status = CallSearch(stub, valid, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.rows(), 2);
}

}  // namespace knnserve::testing
