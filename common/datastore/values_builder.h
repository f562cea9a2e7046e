// The values step: a parallel corpus (TSV, "source<TAB>target" per line) -> values.h5
// (values_file.h), streamed. Pass 1 reads the corpus in blocks, tokenizes them on `threads`
// threads and spills the token ids to a temporary file next to the output, keeping 24 bytes per
// sentence in memory (lengths, corpus line, spill offset); pass 2 sorts the sentences by length
// and copies their tokens from the spill file into chunked, compressed HDF5 datasets. Memory is
// O(sentences + block), never O(tokens).
//
// Bad lines (no TAB, more than one TAB, an empty side, invalid UTF-8, a side longer than
// max_tokens tokens with its EOS) are counted per kind and the first few reported with their
// line numbers; with `strict` the first one is an error. The output is written to
// "<out>.partial" and renamed into place when complete.
#ifndef KNNSERVE_COMMON_DATASTORE_VALUES_BUILDER_H_
#define KNNSERVE_COMMON_DATASTORE_VALUES_BUILDER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/datastore/values_file.h"
#include "common/files.h"
#include "common/progress.h"

namespace knnserve {

// Text -> subword ids without BOS/EOS. Must be safe to call from several threads at once.
using TokenizeFn = std::function<absl::StatusOr<std::vector<int>>(absl::string_view)>;

enum class BadLineKind { kMissingTab = 0, kExtraTab, kEmptySide, kInvalidUtf8, kOverLong };
inline constexpr int kNumBadLineKinds = 5;
const char* BadLineKindName(BadLineKind kind);

// Classifies one corpus line (without its newline; a trailing CR is ignored) before
// tokenization: kOverLong here means more than `max_bytes` bytes. On success `source` and
// `target` view the two sides.
absl::StatusOr<std::pair<absl::string_view, absl::string_view>> SplitCorpusLine(
    absl::string_view line, int64_t max_bytes, BadLineKind* kind);

// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or code points above
// U+10FFFF).
bool IsValidUtf8(absl::string_view text);

struct BadLineReport {
  std::array<int64_t, kNumBadLineKinds> counts{};
  std::vector<std::string> examples;  // "line 17: missing tab", the first kMaxExamples

  static constexpr int kMaxExamples = 10;
  int64_t total() const;
  // "3 bad lines skipped (missing tab 2, empty side 1); first: line 17: missing tab, ..."
  std::string Summary() const;
};

struct ValuesBuildOptions {
  std::string corpus_path;
  std::string out_path;  // values.h5
  TokenizerInfo tokenizer;
  int64_t max_tokens = 1024;  // per side, EOS included; longer lines are bad lines
  bool strict = false;
  int threads = 1;
  int64_t block_lines = 16384;  // lines tokenized per parallel step
  int64_t chunk = 1 << 18;      // HDF5 chunk, elements
  bool compress = true;         // deflate + shuffle (int32 ids compress ~2-3x)
  ProgressBar::Options progress;
};

struct ValuesReport {
  int64_t corpus_lines = 0;
  int64_t sentences = 0;
  int64_t target_tokens = 0;  // EOS included
  int64_t source_tokens = 0;
  BadLineReport bad;
  FileDigest digest;  // of the written values.h5
};

absl::StatusOr<ValuesReport> BuildValues(const ValuesBuildOptions& options,
                                         const TokenizeFn& tokenize);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_DATASTORE_VALUES_BUILDER_H_
