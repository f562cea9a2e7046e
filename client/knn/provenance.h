// Provenance of a kNN-MT translation: for every output token, the datastore tokens its decoder
// state retrieved, as (sentence, position) in the datastore, their value token and distance.
// knn-seq prints only sentence ids; positions show which target word of which datastore
// sentence was copied.
#ifndef KNNSERVE_CLIENT_KNN_PROVENANCE_H_
#define KNNSERVE_CLIENT_KNN_PROVENANCE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/knn/knn_processor.h"
#include "client/model/transformer.h"
#include "client/tokenizer/tokenizer.h"

namespace knnserve::knn {

// Thread-compatible.
class ProvenancePrinter {
 public:
  // `values_path`: the datastore's values.h5, to map global token ids to the stored sentence
  // (length-sorted; the id subset searches name), its line in the datastore corpus (1-based) and
  // the position in it: "s=56049 line=6105:0"; empty prints global token ids only.
  static absl::StatusOr<std::unique_ptr<ProvenancePrinter>> Create(const std::string& values_path);

  // One line per token of `hypothesis` (re-encoded with `tokenizer`, plus EOS): the token and
  // its `print_k` nearest datastore tokens, found from the decoder state of a teacher-forced
  // pass over (source, hypothesis) with the processor's k and nprobe (full search).
  absl::StatusOr<std::string> Explain(model::TransformerModel& model, const Tokenizer& tokenizer,
                                      const std::string& source, const std::string& hypothesis,
                                      KnnLogitsProcessor& processor, int print_k) const;

 private:
  ProvenancePrinter(std::vector<int64_t> offsets, std::vector<int64_t> lines)
      : offsets_(std::move(offsets)), lines_(std::move(lines)) {}

  const std::vector<int64_t> offsets_;  // sentence s = tokens [offsets[s], offsets[s + 1])
  const std::vector<int64_t> lines_;    // sentence s = corpus line lines_[s] (0-based)
};

}  // namespace knnserve::knn

#endif  // KNNSERVE_CLIENT_KNN_PROVENANCE_H_
