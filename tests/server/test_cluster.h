// Test support: in-process shard and router servers on 127.0.0.1 (picked ports), an engine
// decorator that injects delays and blocks, and small client helpers. Every wait is bounded.
#ifndef KNNSERVE_TESTS_SERVER_TEST_CLUSTER_H_
#define KNNSERVE_TESTS_SERVER_TEST_CLUSTER_H_

#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/search_engine.h"
#include "knnserve/v1/retrieval.grpc.pb.h"
#include "server/router.h"
#include "shard/retrieval_service.h"
#include "shard/rpc_server.h"
#include "shard/shard_backend.h"

namespace knnserve::testing {

// Fault injection around an engine: a fixed delay per call, or a gate that holds calls until
// opened. Thread-safe.
class ControlledEngine : public SearchEngine {
 public:
  explicit ControlledEngine(std::unique_ptr<SearchEngine> inner);
  ~ControlledEngine() override;  // opens the gate

  const EngineInfo& info() const override { return inner_->info(); }
  absl::StatusOr<EngineResult> Search(const SearchQuery& query) const override;

  void set_delay(absl::Duration delay);
  void CloseGate();
  void OpenGate();
  // Engine calls started (the warm-up query included) and calls waiting at the gate.
  int calls() const;
  bool WaitForCallsAtGate(int n, absl::Duration timeout) const;

 private:
  const std::unique_ptr<SearchEngine> inner_;
  mutable absl::Mutex mu_;
  absl::Duration delay_ ABSL_GUARDED_BY(mu_);
  bool gate_closed_ ABSL_GUARDED_BY(mu_) = false;
  mutable int calls_ ABSL_GUARDED_BY(mu_) = 0;
  mutable int at_gate_ ABSL_GUARDED_BY(mu_) = 0;
};

// Limits small enough that an oversized message is cheap to send (a few MB).
RequestLimits TestLimits();

struct TestShardOptions {
  BatcherOptions batcher;
  TlsFiles tls;
  bool load = true;                    // false: start serving "loading" until Load()
  std::string listen = "127.0.0.1:0";  // a killed shard's address: the shard restarted
  RequestLimits limits = TestLimits();
  RetrievalServiceOptions service;
};

// A shard server on 127.0.0.1. Thread-safe.
class TestShard {
 public:
  TestShard(int32_t shard_id, std::unique_ptr<SearchEngine> engine, TestShardOptions options = {});
  ~TestShard();

  std::string address() const { return server_->address(); }
  ControlledEngine* engine() const { return engine_; }
  MetricsRegistry& metrics() { return metrics_; }
  RpcServer& server() { return *server_; }
  // Installs the engine (warm-up included) and reports SERVING.
  void Load();
  // Stops the server at once (in-flight calls are cancelled), like a killed process.
  void Kill() { server_->Shutdown(absl::ZeroDuration()); }

 private:
  MetricsRegistry metrics_;
  ShardBackend backend_;
  RetrievalService service_;
  std::unique_ptr<RpcServer> server_;
  std::unique_ptr<ControlledEngine> pending_engine_;
  ControlledEngine* engine_;
};

// A router server on 127.0.0.1; the constructor returns once the router serves (every shard
// answered Info), or fails the test after 10 s.
class TestRouter {
 public:
  // Waits (up to 10 s) until the router knows what its shards serve, unless `wait` is false.
  TestRouter(const ShardMap& map, RouterOptions options = {}, TlsFiles tls = {}, bool wait = true);
  ~TestRouter();

  std::string address() const { return server_->address(); }
  Router& router() { return *router_; }
  MetricsRegistry& metrics() { return metrics_; }

 private:
  MetricsRegistry metrics_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<RetrievalService> service_;
  std::unique_ptr<RpcServer> server_;
};

// Router options for tests: TestLimits, quick probes, hedging off unless a test turns it on.
RouterOptions FastRouterOptions();

std::unique_ptr<v1::Retrieval::Stub> Connect(const std::string& address, const TlsFiles& tls = {});
Matrix<float> RandomQueries(int64_t rows, int dim, uint32_t seed);
v1::SearchRequest MakeRequest(const Matrix<float>& queries, int k);
// A unary Search with a 10 s deadline (or `timeout`).
grpc::Status CallSearch(v1::Retrieval::Stub* stub, const v1::SearchRequest& request,
                        v1::SearchResponse* response, absl::Duration timeout = absl::Seconds(10));
// grpc.health.v1.Health/Check through a generic stub (the health proto ships without C++
// stubs): SERVING = 1, NOT_SERVING = 2.
absl::StatusOr<int> CheckHealth(const std::string& address, const std::string& service = "");

// Sends every kind of malformed request (wrong dims, dtype, byte length, k = 0 or too large,
// NaN, unknown sentence ids, oversized message) and expects INVALID_ARGUMENT with a reason
// (RESOURCE_EXHAUSTED for the oversized one, gRPC's own check), then a valid request to work.
void ExpectMalformedRequestsRejected(v1::Retrieval::Stub* stub, int dim);

}  // namespace knnserve::testing

#endif  // KNNSERVE_TESTS_SERVER_TEST_CLUSTER_H_
