// values.h5 as the datastore pipeline writes and reads it (DESIGN.md "Datastore on disk"):
//   /tokens int32 [N]      target tokens (the kNN values), sentence after sentence, each
//                          sentence = tokenizer(target) + EOS
//   /offsets int64 [S + 1] sentence s holds tokens [offsets[s], offsets[s + 1])
//   /src_tokens int32, /src_offsets int64 [S + 1]   the source side, tokenizer(source) + EOS
//   /order int64 [S]       the 0-based corpus line of each stored sentence
// Sentences are stored sorted by (target length, source length, corpus line).
// Root attributes: format "knnserve-values", version, vocab_size, bos_id, pad_id, eos_id,
// unk_id, tokenizer_sha256 (of the SentencePiece .model bytes), corpus_sha256, corpus_lines,
// bad_lines.
#ifndef KNNSERVE_COMMON_DATASTORE_VALUES_FILE_H_
#define KNNSERVE_COMMON_DATASTORE_VALUES_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/datastore/key_source.h"

namespace knnserve {

class Hdf5File;

inline constexpr char kValuesFileName[] = "values.h5";
inline constexpr char kKeysFileName[] = "keys.h5";
inline constexpr char kSentenceKeysFileName[] = "sentence_keys.h5";
inline constexpr char kValuesFormat[] = "knnserve-values";
inline constexpr int64_t kValuesVersion = 1;

// What the values were tokenized with: the ids every later step must agree on.
struct TokenizerInfo {
  int64_t vocab_size = 0;
  int64_t bos_id = 0;
  int64_t pad_id = 1;
  int64_t eos_id = 2;
  int64_t unk_id = 3;
  std::string sha256;  // of the serialized tokenizer model
};

// A whole values.h5 in memory (4 bytes per token per side): for tests, benchmarks and small
// datastores. The keys and sentence-keys steps stream through ValuesReader instead.
struct ValuesFile {
  DatastoreValues target;  // /tokens, /offsets
  DatastoreValues source;  // /src_tokens, /src_offsets
  std::vector<int64_t> order;
  TokenizerInfo tokenizer;
  std::string corpus_sha256;
  int64_t corpus_lines = 0;
  int64_t bad_lines = 0;

  int64_t num_sentences() const { return target.num_sentences(); }
};

// Reads and validates a whole values.h5 (ValuesReader::Open's checks, then every token id of both
// sides < vocab_size); errors name the file and what is wrong.
absl::StatusOr<ValuesFile> ReadValuesFile(const std::string& path);

enum class ValuesSide {
  kTarget,  // /tokens, /offsets
  kSource,  // /src_tokens, /src_offsets
};

// values.h5 opened for streaming: the tokens stay on disk and are read one contiguous sentence
// range at a time (the key computation reads windows of consecutive batches: sentences are stored
// length-sorted, so batches and windows are ranges).
//
// Memory: Open holds what is per sentence only, both offsets arrays and /order (24 bytes per
// sentence) plus the attributes; never a token. ReadSentences returns the tokens of its range
// only, which the caller owns. So a pass over the corpus in ranges holds O(sentences + largest
// range) memory, not O(tokens).
//
// Thread-compatible: use one reader from one thread at a time, const methods included
// (ReadSentences reads the file, and the HDF5 library is built serial).
class ValuesReader {
 public:
  // Opens `path` and validates all that needs no token: the format, the attributes, both offsets
  // arrays (start at 0, never decrease, end at the size of their tokens dataset), the same
  // sentence count on both sides and in /order, /order distinct non-negative lines. Token ids are
  // checked by ReadSentences, range by range. Errors name the file.
  static absl::StatusOr<std::unique_ptr<ValuesReader>> Open(const std::string& path);
  ~ValuesReader();
  ValuesReader(const ValuesReader&) = delete;
  ValuesReader& operator=(const ValuesReader&) = delete;

  const std::string& path() const;
  int64_t num_sentences() const { return static_cast<int64_t>(target_offsets_.size()) - 1; }
  // num_sentences() + 1 entries: sentence s of `side` holds its tokens [o[s], o[s + 1]).
  const std::vector<int64_t>& offsets(ValuesSide side) const;
  // Tokens of sentence s of `side`. REQUIRES: 0 <= s < num_sentences().
  int64_t Length(ValuesSide side, int64_t s) const {
    return offsets(side)[s + 1] - offsets(side)[s];
  }
  int64_t num_tokens(ValuesSide side) const { return offsets(side).back(); }
  // The 0-based corpus line of each stored sentence.
  const std::vector<int64_t>& order() const { return order_; }
  const TokenizerInfo& tokenizer() const { return tokenizer_; }
  const std::string& corpus_sha256() const { return corpus_sha256_; }
  int64_t corpus_lines() const { return corpus_lines_; }
  int64_t bad_lines() const { return bad_lines_; }

  // The sentences [begin, end) of `side` with one HDF5 read: tokens of those sentences and their
  // offsets rebased to start at 0 (end - begin + 1 entries). INVALID_ARGUMENT naming the file and
  // the sentence when a token id is outside [0, vocab_size); OUT_OF_RANGE unless
  // 0 <= begin <= end <= num_sentences().
  absl::StatusOr<DatastoreValues> ReadSentences(ValuesSide side, int64_t begin, int64_t end) const;
  // The tokens [begin, end) of `side` (any range, sentence boundaries or not) into out
  // (end - begin int32s) with one HDF5 read; the same errors as ReadSentences, for token indices.
  absl::Status ReadTokens(ValuesSide side, int64_t begin, int64_t end, int32_t* out) const;
  // All of `side` in memory (4 bytes per token): ReadSentences(side, 0, num_sentences()).
  absl::StatusOr<DatastoreValues> ReadAll(ValuesSide side) const {
    return ReadSentences(side, 0, num_sentences());
  }

 private:
  ValuesReader(std::unique_ptr<Hdf5File> file, std::vector<int64_t> target_offsets,
               std::vector<int64_t> source_offsets, std::vector<int64_t> order);
  absl::Status ReadAttributes();
  absl::Status Validate() const;
  absl::Status CheckIds(ValuesSide side, int64_t token_begin,
                        absl::Span<const int32_t> tokens) const;

  const std::unique_ptr<Hdf5File> file_;
  const std::vector<int64_t> target_offsets_;
  const std::vector<int64_t> source_offsets_;
  const std::vector<int64_t> order_;
  TokenizerInfo tokenizer_;
  std::string corpus_sha256_;
  int64_t corpus_lines_ = 0;
  int64_t bad_lines_ = 0;
};

// The target side of an open values.h5 for an index build: offsets() is the reader's (already
// in memory), Read is ReadTokens(kTarget, ...), token ids checked. Borrows `reader`, which must
// outlive it; thread-compatible like the reader.
class TargetValueSource : public ValueSource {
 public:
  explicit TargetValueSource(const ValuesReader& reader) : reader_(reader) {}
  absl::Span<const int64_t> offsets() const override {
    return reader_.offsets(ValuesSide::kTarget);
  }
  int64_t num_tokens() const override { return reader_.num_tokens(ValuesSide::kTarget); }
  absl::Status Read(int64_t begin, int64_t end, int32_t* out) const override {
    return reader_.ReadTokens(ValuesSide::kTarget, begin, end, out);
  }

 private:
  const ValuesReader& reader_;
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_DATASTORE_VALUES_FILE_H_
