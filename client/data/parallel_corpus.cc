#include "client/data/parallel_corpus.h"

#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace knnserve::data {

absl::StatusOr<std::vector<std::string>> ReadLines(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("read error in ", path));
  return lines;
}

absl::StatusOr<std::vector<SentencePair>> ReadTsv(const std::string& path, int64_t max_lines) {
  ASSIGN_OR_RETURN(std::vector<std::string> lines, ReadLines(path));
  if (max_lines > 0 && static_cast<int64_t>(lines.size()) > max_lines) lines.resize(max_lines);
  std::vector<SentencePair> pairs;
  pairs.reserve(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    const size_t tab = line.find('\t');
    if (tab == std::string::npos || line.find('\t', tab + 1) != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", i + 1, ": expected exactly one TAB (source<TAB>target), got: ", line));
    }
    pairs.push_back({line.substr(0, tab), line.substr(tab + 1)});
  }
  return pairs;
}

absl::StatusOr<std::vector<std::string>> ReadSources(const std::string& path,
                                                     std::vector<std::string>* targets) {
  ASSIGN_OR_RETURN(std::vector<std::string> lines, ReadLines(path));
  std::vector<std::string> sources;
  sources.reserve(lines.size());
  for (std::string& line : lines) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) {
      sources.push_back(std::move(line));
      if (targets != nullptr) targets->emplace_back();
    } else {
      sources.push_back(line.substr(0, tab));
      if (targets != nullptr) targets->push_back(line.substr(tab + 1));
    }
  }
  return sources;
}

}  // namespace knnserve::data
