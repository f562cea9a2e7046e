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
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/datastore/key_source.h"

namespace knnserve {

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

// Reads and validates a whole values.h5 (both sides have the same sentence count, order is a
// set of distinct lines, every token id < vocab_size); errors name the file and what is wrong.
absl::StatusOr<ValuesFile> ReadValuesFile(const std::string& path);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_DATASTORE_VALUES_FILE_H_
