// Process plumbing shared by knnserve-shard and knnserve-router: termination signals and the
// flags every server takes (listen address, TLS, metrics, logs, limits).
#ifndef KNNSERVE_SHARD_PROCESS_H_
#define KNNSERVE_SHARD_PROCESS_H_

#include <string>

#include "CLI/CLI.hpp"
#include "common/request.h"
#include "shard/retrieval_service.h"
#include "shard/rpc_server.h"

namespace knnserve {

// Blocks SIGTERM and SIGINT in the calling thread and every thread it starts afterwards: call
// first thing in main, then WaitForTerminationSignal() once the server runs.
void BlockTerminationSignals();
// Returns the signal number once SIGTERM or SIGINT arrives.
int WaitForTerminationSignal();
// Makes WaitForTerminationSignal() return (a fatal error on another thread).
void RequestTermination();

struct ServerFlags {
  std::string listen;
  TlsFiles tls;
  std::string metrics_listen;
  std::string log_level = "info";
  double drain_seconds = 30;
  RequestLimits limits;
  RetrievalServiceOptions service;

  // Registers the flags on `app`; `default_listen` is the --listen default.
  void Register(CLI::App& app, const std::string& default_listen);
  // InitLog with `component` and --log-level.
  void InitLogging(const std::string& component) const;
};

}  // namespace knnserve

#endif  // KNNSERVE_SHARD_PROCESS_H_
