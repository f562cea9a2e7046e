#include "shard/log.h"

#include <cstdio>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace knnserve {
namespace {

struct LogConfig {
  std::string component = "knnserve";
  LogLevel min_level = LogLevel::kInfo;
};

LogConfig& Config() {
  static LogConfig config;
  return config;
}

absl::Mutex& OutputMutex() {
  static absl::Mutex mu(absl::kConstInit);
  return mu;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

}  // namespace

void InitLog(absl::string_view component, LogLevel min_level) {
  Config().component = std::string(component);
  Config().min_level = min_level;
}

void Log(LogLevel level, absl::string_view msg, const nlohmann::json& fields) {
  if (level < Config().min_level) return;
  nlohmann::json line = {
      {"ts", absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone())},
      {"level", LevelName(level)},
      {"component", Config().component},
      {"msg", std::string(msg)},
  };
  if (fields.is_object()) line.update(fields);
  const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  absl::MutexLock lock(&OutputMutex());
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

}  // namespace knnserve
