#include "shard/process.h"

#include <signal.h>
#include <unistd.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "common/cli_checks.h"
#include "shard/log.h"

namespace knnserve {
namespace {

sigset_t TerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  return signals;
}

}  // namespace

void BlockTerminationSignals() {
  const sigset_t signals = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

int WaitForTerminationSignal() {
  const sigset_t signals = TerminationSignals();
  int signal = 0;
  sigwait(&signals, &signal);
  return signal;
}

void RequestTermination() { kill(getpid(), SIGTERM); }

void ServerFlags::Register(CLI::App& app, const std::string& default_listen) {
  listen = default_listen;
  app.add_option("--listen", listen, "host:port to serve gRPC on (port 0 picks one)")
      ->check(HostPort())
      ->capture_default_str();
  app.add_option("--tls-cert", tls.cert, "PEM certificate chain: serve (and call) over TLS");
  app.add_option("--tls-key", tls.key, "PEM private key of --tls-cert");
  app.add_option("--tls-ca", tls.ca,
                 "PEM CA bundle: require and verify client certificates (mTLS), and verify "
                 "the servers this process calls");
  app.add_option("--metrics-listen", metrics_listen,
                 "host:port serving Prometheus metrics over HTTP at /metrics (off if empty)")
      ->check(HostPort());
  app.add_option("--log-level", log_level, "debug, info, warning or error")
      ->capture_default_str()
      ->check(CLI::IsMember({"debug", "info", "warning", "error"}));
  app.add_option("--drain-seconds", drain_seconds,
                 "on SIGTERM, how long calls in flight may take to finish")
      ->check(FiniteRange(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--max-k", limits.max_k, "largest k a request may ask for")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--max-nprobe", limits.max_nprobe,
                 "most IVF lists a request may probe per query row")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  app.add_option("--max-ef-search", limits.max_ef_search,
                 "largest HNSW ef_search a request may ask for")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--max-rows", limits.max_rows, "most query rows per request")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  app.add_option("--max-subset-sentences", limits.max_subset_sentences,
                 "most sentences per subset group")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--subset-session-sentences", service.subset_session_sentences,
                 "most sentence ids kept, over all subset sessions, for requests that name "
                 "their subset by a subset_session token (least recently used ones go first; "
                 "a session counts 32 ids more and each of its groups 4, for their bookkeeping)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option_function<int64_t>(
         "--max-undelivered-mib",
         [this](int64_t mib) { service.max_undelivered_answer_bytes = mib << 20; },
         "MiB of answers admitted and not yet delivered (a client that does not read its "
         "answers keeps them in memory); beyond, requests are answered UNAVAILABLE "
         "(overloaded) at once")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->default_str(std::to_string(service.max_undelivered_answer_bytes >> 20));
  app.add_option_function<int64_t>(
         "--max-stream-groups-mib",
         [this](int64_t mib) { service.max_stream_group_bytes = mib << 20; },
         "MiB of subset groups that open streams declared at setup (8 bytes per sentence id, "
         "held while the stream lasts); beyond, a setup is answered UNAVAILABLE (overloaded)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->default_str(std::to_string(service.max_stream_group_bytes >> 20));
  app.add_option_function<double>(
         "--stream-idle-seconds",
         [this](double seconds) { service.stream_idle_timeout = absl::Seconds(seconds); },
         "end a stream whose client sends nothing for this long (UNAVAILABLE: clients open "
         "another); 0: never")
      ->check(FiniteRange(0.0, 0.0) |
              FiniteRange(absl::ToDoubleSeconds(IdleStreams::kMinTimeout), 7 * 86400.0))
      ->default_str(absl::StrCat(absl::ToDoubleSeconds(service.stream_idle_timeout)));
}

void ServerFlags::InitLogging(const std::string& component) const {
  static const std::map<std::string, LogLevel> kLevels = {{"debug", LogLevel::kDebug},
                                                          {"info", LogLevel::kInfo},
                                                          {"warning", LogLevel::kWarning},
                                                          {"error", LogLevel::kError}};
  InitLog(component, kLevels.at(log_level));
}

}  // namespace knnserve
