// The router's shard map: for each shard id, the addresses of its replicas. Read from the
// --shards file, one shard per line:
//
//   # shard_id replica_address [replica_address ...]
//   0 127.0.0.1:7001 127.0.0.1:7002
//   1 127.0.0.1:7003
//
// Blank lines and text after '#' are ignored. Shard ids are distinct and non-negative.
#ifndef KNNSERVE_SERVER_SHARD_MAP_H_
#define KNNSERVE_SERVER_SHARD_MAP_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace knnserve {

using ShardMap = std::map<int32_t, std::vector<std::string>>;

// `source` names the text in error messages (a file name).
absl::StatusOr<ShardMap> ParseShardMap(absl::string_view text, absl::string_view source);
absl::StatusOr<ShardMap> ReadShardMap(const std::string& path);
std::string FormatShardMap(const ShardMap& map);

}  // namespace knnserve

#endif  // KNNSERVE_SERVER_SHARD_MAP_H_
