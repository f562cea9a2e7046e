// Structured logs: one JSON object per line on stderr, e.g.
//   {"ts":"2026-11-29T16:00:00.123Z","level":"info","component":"shard","msg":"serving",
//    "address":"127.0.0.1:50051"}
// Thread-safe: lines from different threads never interleave.
#ifndef KNNSERVE_SHARD_LOG_H_
#define KNNSERVE_SHARD_LOG_H_

#include <string>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace knnserve {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

// Set once at startup (before threads start): the component name stamped on every line and the
// least severe level written.
void InitLog(absl::string_view component, LogLevel min_level);

// `fields` must be a JSON object (or null); its members are added to the line.
void Log(LogLevel level, absl::string_view msg, const nlohmann::json& fields = nullptr);

}  // namespace knnserve

#endif  // KNNSERVE_SHARD_LOG_H_
