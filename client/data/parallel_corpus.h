// Parallel text in the project's TSV format: one "source<TAB>target" pair per line (the demo
// corpus in ../shared/corpus uses it), or plain text with one source sentence per line.
#ifndef KNNSERVE_CLIENT_DATA_PARALLEL_CORPUS_H_
#define KNNSERVE_CLIENT_DATA_PARALLEL_CORPUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace knnserve::data {

struct SentencePair {
  std::string source;
  std::string target;
};

// Reads up to `max_lines` pairs (<= 0: all). Every line must hold exactly one TAB; the error
// names the file and the 1-based line otherwise.
absl::StatusOr<std::vector<SentencePair>> ReadTsv(const std::string& path, int64_t max_lines = 0);

// Reads source sentences: the first column of a TSV line, or the whole line of plain text
// (lines without a TAB). Target columns, when present, are returned in `targets` (may be null).
absl::StatusOr<std::vector<std::string>> ReadSources(const std::string& path,
                                                     std::vector<std::string>* targets);

// Reads every line (without the newline) of a text file.
absl::StatusOr<std::vector<std::string>> ReadLines(const std::string& path);

}  // namespace knnserve::data

#endif  // KNNSERVE_CLIENT_DATA_PARALLEL_CORPUS_H_
