#include "shard/rpc_server.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/memory/memory.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace knnserve {
namespace {

// The PEM text of `path`. gRPC reports a file that holds no PEM block only as a failure to
// listen (or to connect), without naming the file: such a file is refused here.
absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read '", path, "'"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", path, "' holds no PEM block (-----BEGIN ...-----)"));
  }
  return text.str();
}

absl::Status CheckPair(const TlsFiles& tls) {
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key must be given together");
  }
  return absl::OkStatus();
}

// The address a client on this machine dials to reach a server listening on `listen`, bound
// to `port`: a unix socket's own name, else the host (loopback for a wildcard) and the port.
std::string DialAddress(const std::string& listen, int port) {
  if (IsUnixSocketAddress(listen)) return listen;
  const size_t colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  if (host.empty() || host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  return absl::StrCat(host, ":", port);
}

// gRPC takes int sizes, and protobuf cannot parse messages of 2 GiB or more.
int ClampMessageBytes(int64_t bytes) {
  return static_cast<int>(std::min<int64_t>(bytes, std::numeric_limits<int32_t>::max()));
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  if (auto status = CheckPair(tls); !status.ok()) return status;
  if (tls.cert.empty()) {
    return absl::InvalidArgumentError("a TLS server needs --tls-cert and --tls-key");
  }
  grpc::SslServerCredentialsOptions options(
      tls.ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                     : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  auto key = ReadPem(tls.key, "--tls-key");
  if (!key.ok()) return key.status();
  auto cert = ReadPem(tls.cert, "--tls-cert");
  if (!cert.ok()) return cert.status();
  pair.private_key = *std::move(key);
  pair.cert_chain = *std::move(cert);
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!tls.ca.empty()) {
    auto ca = ReadPem(tls.ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  if (auto status = CheckPair(tls); !status.ok()) return status;
  grpc::SslCredentialsOptions options;
  if (!tls.ca.empty()) {
    auto ca = ReadPem(tls.ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
  }
  if (!tls.cert.empty()) {
    auto key = ReadPem(tls.key, "--tls-key");
    if (!key.ok()) return key.status();
    auto cert = ReadPem(tls.cert, "--tls-cert");
    if (!cert.ok()) return cert.status();
    options.pem_private_key = *std::move(key);
    options.pem_cert_chain = *std::move(cert);
  }
  return grpc::SslCredentials(options);
}

grpc::ChannelArguments MakeChannelArguments(int64_t max_message_bytes,
                                            const std::string& tls_server_name) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(ClampMessageBytes(max_message_bytes));
  args.SetMaxSendMessageSize(ClampMessageBytes(max_message_bytes));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Every channel gets its own connection: replicas of one address are separate backends.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (!tls_server_name.empty()) args.SetSslTargetNameOverride(tls_server_name);
  return args;
}

absl::StatusOr<std::unique_ptr<RpcServer>> RpcServer::Start(const RpcServerOptions& options,
                                                            grpc::Service* service) {
  auto credentials = MakeServerCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, *credentials, &port);
  builder.SetMaxReceiveMessageSize(ClampMessageBytes(options.max_message_bytes));
  builder.SetMaxSendMessageSize(ClampMessageBytes(options.max_message_bytes));
  // gRPC sets SO_REUSEPORT by default: a second server started on a port in use would bind too
  // and silently take a share of the connections (a shard of another index answering, seen as
  // a flaky test when two test processes met on one port). The port must be ours alone.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  auto rpc_server =
      absl::WrapUnique(new RpcServer(std::move(server), DialAddress(options.listen, port), port));
  rpc_server->SetServing(false);
  return rpc_server;
}

RpcServer::RpcServer(std::unique_ptr<grpc::Server> server, std::string address, int port)
    : server_(std::move(server)), address_(std::move(address)), port_(port) {}

RpcServer::~RpcServer() { Shutdown(absl::ZeroDuration()); }

void RpcServer::SetServing(bool serving) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus("", serving);
  health->SetServingStatus(kServiceName, serving);
}

void RpcServer::Shutdown(absl::Duration grace) {
  if (shut_down_.exchange(true)) return;
  SetServing(false);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

}  // namespace knnserve
