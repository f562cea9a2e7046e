#include "server/shard_map.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/address.h"

namespace knnserve {

absl::StatusOr<ShardMap> ParseShardMap(absl::string_view text, absl::string_view source) {
  ShardMap map;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = line.substr(0, line.find('#'));
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    const std::string where = absl::StrCat(source, ":", line_number, ": ");
    int32_t shard_id = -1;
    if (!absl::SimpleAtoi(fields[0], &shard_id) || shard_id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "'", fields[0], "' is not a shard id (an integer >= 0)"));
    }
    if (fields.size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "shard ", shard_id, " lists no replica address"));
    }
    auto [it, inserted] = map.try_emplace(shard_id);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "shard ", shard_id, " is listed twice"));
    }
    for (size_t i = 1; i < fields.size(); ++i) {
      if (absl::Status status = CheckAddress(fields[i], /*min_port=*/1); !status.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "shard ", shard_id, ": ", status.message()));
      }
      if (std::find(it->second.begin(), it->second.end(), fields[i]) != it->second.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "shard ", shard_id, " lists replica ", fields[i], " twice"));
      }
      it->second.emplace_back(fields[i]);
    }
  }
  if (map.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": no shards"));
  }
  return map;
}

absl::StatusOr<ShardMap> ReadShardMap(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read shard map '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return ParseShardMap(text.str(), path);
}

std::string FormatShardMap(const ShardMap& map) {
  std::string out;
  for (const auto& [shard_id, replicas] : map) {
    absl::StrAppend(&out, shard_id, " ", absl::StrJoin(replicas, " "), "\n");
  }
  return out;
}

}  // namespace knnserve
