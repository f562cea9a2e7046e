// SentencePiece subword tokenizer: training from a parallel TSV and encode/decode.
//
// Special ids follow fairseq's dictionary convention, so that our models and fairseq models
// agree: <s>=0, <pad>=1, </s>=2, <unk>=3. Models trained here use the SentencePiece ids
// directly; converted fairseq models carry their dictionaries (a Vocabulary) and the tokenizer
// maps pieces to those ids.
#ifndef KNNSERVE_CLIENT_TOKENIZER_TOKENIZER_H_
#define KNNSERVE_CLIENT_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace knnserve::spm_shim {
class Processor;
}

namespace knnserve {

struct TokenizerTrainOptions {
  std::string tsv_path;      // source<TAB>target lines
  std::string model_prefix;  // writes <prefix>.model and <prefix>.vocab (no spaces)
  int vocab_size = 8000;
  std::string model_type = "unigram";  // unigram | bpe
  // Joint model over both sides of this many randomly sampled lines (<= 0: all lines).
  int64_t sample_lines = 200000;
  uint64_t seed = 1;
  double character_coverage = 0.9999;
  // false lets SentencePiece stop below vocab_size on tiny corpora (tests).
  bool hard_vocab_limit = true;
  int threads = 2;
};

// Trains a joint source/target SentencePiece model.
absl::Status TrainTokenizer(const TokenizerTrainOptions& options);

// The symbols of a model's source and target ids when they are not the SentencePiece ids
// (fairseq dictionaries, which start with <s> <pad> </s> <unk>). Empty: SentencePiece ids.
struct Vocabulary {
  std::vector<std::string> source;
  std::vector<std::string> target;
  bool empty() const { return source.empty() && target.empty(); }
};

// Thread-safe: all methods are const after creation.
class Tokenizer {
 public:
  // `path` is a SentencePiece .model file.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  // `serialized` is the content of a .model file (as embedded in checkpoints); `vocab` maps
  // pieces to model ids (Encode uses the source symbols, Decode the target symbols).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromSerialized(std::string serialized,
                                                                   Vocabulary vocab = {});
  ~Tokenizer();

  // Source-side model ids of `text`, without BOS/EOS (unknown pieces map to <unk>).
  absl::StatusOr<std::vector<int>> Encode(absl::string_view text) const;
  // Detokenized text of target-side model ids; special ids (pad, bos, eos) are skipped.
  absl::StatusOr<std::string> Decode(absl::Span<const int> ids) const;
  // The target-side symbol of `id`.
  std::string IdToPiece(int id) const;

  // Number of target-side ids.
  int vocab_size() const;
  int pad_id() const { return kPad; }
  int bos_id() const { return kBos; }
  int eos_id() const { return kEos; }
  int unk_id() const { return kUnk; }
  // The .model bytes, for embedding in a checkpoint.
  const std::string& serialized() const { return serialized_; }

  static constexpr int kBos = 0;
  static constexpr int kPad = 1;
  static constexpr int kEos = 2;
  static constexpr int kUnk = 3;

 private:
  Tokenizer(std::string serialized, std::unique_ptr<spm_shim::Processor> processor,
            Vocabulary vocab);

  const std::string serialized_;
  const std::unique_ptr<spm_shim::Processor> processor_;
  const Vocabulary vocab_;
  std::unordered_map<std::string, int> source_ids_;  // piece -> id, when vocab_ is set
};

}  // namespace knnserve

#endif  // KNNSERVE_CLIENT_TOKENIZER_TOKENIZER_H_
