// What every knnserve gRPC server process shares: listening address, TLS/mTLS credentials,
// explicit max message sizes, grpc.health.v1 (NOT_SERVING until the owner says otherwise),
// server reflection, and graceful drain.
#ifndef KNNSERVE_SHARD_RPC_SERVER_H_
#define KNNSERVE_SHARD_RPC_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace knnserve {

// PEM file paths. Empty cert/key: plaintext. With ca: the peer's certificate is required and
// verified against it (mTLS on a server; server verification on a client).
struct TlsFiles {
  std::string cert;
  std::string key;
  std::string ca;

  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& tls);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& tls);

// Channel arguments for calls to a knnserve server: message limits, quick reconnects (a
// restarted replica is used again within about a second), and `tls_server_name` (when not
// empty) as the name its certificate must carry.
grpc::ChannelArguments MakeChannelArguments(int64_t max_message_bytes,
                                            const std::string& tls_server_name = "");

struct RpcServerOptions {
  std::string listen = "127.0.0.1:0";  // port 0 picks a free port
  TlsFiles tls;
  int64_t max_message_bytes = 4 << 20;
};

// A started gRPC server. Thread-safe.
class RpcServer {
 public:
  // Health service names set by SetServing: "" (the whole server) and this service.
  static constexpr const char* kServiceName = "knnserve.v1.Retrieval";

  // Starts serving `service` (which must outlive the server) with health NOT_SERVING.
  static absl::StatusOr<std::unique_ptr<RpcServer>> Start(const RpcServerOptions& options,
                                                          grpc::Service* service);
  ~RpcServer();

  int port() const { return port_; }  // bound port; 1 for a unix socket (gRPC's report)
  // What a client on this machine dials: host:port (127.0.0.1 for a wildcard host) or the
  // unix socket's address as given.
  const std::string& address() const { return address_; }

  void SetServing(bool serving);
  // Drain: health NOT_SERVING, stop accepting calls, let in-flight calls finish until `grace`
  // has passed (then they are cancelled), return when the server has stopped. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  RpcServer(std::unique_ptr<grpc::Server> server, std::string address, int port);

  std::unique_ptr<grpc::Server> server_;
  const std::string address_;
  const int port_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace knnserve

#endif  // KNNSERVE_SHARD_RPC_SERVER_H_
