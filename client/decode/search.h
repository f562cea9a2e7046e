// Greedy and batched beam search over the reference transformer with incremental decoding,
// and a per-step hook that may rewrite the log-probabilities from the step's decoder features
// (kNN-MT interpolation plugs in there, like CTranslate2's LogitsProcessor).
#ifndef KNNSERVE_CLIENT_DECODE_SEARCH_H_
#define KNNSERVE_CLIENT_DECODE_SEARCH_H_

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/model/transformer.h"
#include "client/tokenizer/tokenizer.h"

namespace knnserve {
class ProgressBar;
}

namespace knnserve::decode {

// What a LogitsProcessor sees at one decoding step. Rows are the live hypotheses
// (sentences x beams, finished sentences removed).
struct StepContext {
  int64_t step = 0;         // 0-based index of the token being chosen
  torch::Tensor features;   // [rows, d]: decoder output features (the kNN-MT query)
  torch::Tensor ffn_in;     // [rows, d]: input of the last decoder FFN
  torch::Tensor sentence;   // [rows] int64: index of each row's sentence in the input batch
  torch::Tensor log_probs;  // [rows, V] float: model log-probabilities; may be replaced
  // The rows the search may extend, ascending. The others are dead (score -inf: beam search's
  // rows beyond each sentence's first at step 0, filler rows of a sentence with fewer live
  // candidates than beams): nothing reads their log_probs, so a processor may skip them.
  std::vector<int64_t> live_rows;
};

// At every step the search calls BeginStep as soon as the decoder features exist, then
// computes the model's log-probabilities (the output projection and softmax, a large share of a
// step), then calls Process, before special-token constraints and hypothesis selection.
// Implementations must keep log_probs' shape; they are called from one thread at a time.
class LogitsProcessor {
 public:
  virtual ~LogitsProcessor() = default;
  // Called once per batch after the encoder ran, before the first step: src_tokens
  // [batch, src_len], the batch's encoder output. StepContext::sentence indexes this batch.
  // (Subset kNN-MT picks each sentence's datastore subset here.)
  virtual absl::Status BeginBatch(const torch::Tensor& /*src_tokens*/,
                                  const model::EncoderOutput& /*encoder_out*/) {
    return absl::OkStatus();
  }
  // context.log_probs is still undefined. Work that needs only the features may start here and
  // run while the model computes the log-probabilities (kNN-MT sends its query). Every
  // BeginStep is followed by this step's Process unless the search fails in between.
  virtual absl::Status BeginStep(const StepContext& /*context*/) { return absl::OkStatus(); }
  virtual absl::Status Process(StepContext& context) = 0;
};

struct SearchOptions {
  int beam_size = 5;            // 1 is greedy
  double length_penalty = 1.0;  // final score = sum log p / (length incl. EOS)^length_penalty
  double max_len_a = 1.2;       // at most max_len_a * source_len + max_len_b tokens (+ EOS)
  int64_t max_len_b = 10;
  int64_t min_len = 1;                   // EOS is blocked before this many tokens
  int nbest = 1;                         // hypotheses returned per sentence (<= beam_size)
  LogitsProcessor* processor = nullptr;  // not owned; may be null
  // BeamSearchBatches (and TranslateTexts with beam search): when set, two batches are
  // decoded at a time, the second with this processor. Not owned; may be null; when set,
  // processor must be set too, and to another object (a processor follows one batch).
  LogitsProcessor* second_processor = nullptr;
};

struct Hypothesis {
  std::vector<int> tokens;             // without EOS
  std::vector<float> token_log_probs;  // per token, including the final EOS
  double score = 0;                    // length-normalized log-probability
};

// Validates options (positive beam, nbest <= beam, max_len_b >= 0, ...).
absl::Status ValidateSearchOptions(const SearchOptions& options);

// Beam search for a batch. src_tokens [batch, src_len] int64, rows ending with EOS then padding.
// Returns options.nbest hypotheses per sentence, best first. Eval mode is the caller's job.
absl::StatusOr<std::vector<std::vector<Hypothesis>>> BeamSearch(model::TransformerModel& model,
                                                                const torch::Tensor& src_tokens,
                                                                const SearchOptions& options);

// Beam search of several batches (each [batch_i, src_len_i] as for BeamSearch): result[i] is
// what BeamSearch finds for batches[i] alone. With options.second_processor two batches are in
// flight, the second with that processor, and their steps alternate, so that one batch's
// retrieval (started in BeginStep) runs while the model computes the other batch's step.
// `progress` (may be null) counts finished sentences.
absl::StatusOr<std::vector<std::vector<std::vector<Hypothesis>>>> BeamSearchBatches(
    model::TransformerModel& model, const std::vector<torch::Tensor>& batches,
    const SearchOptions& options, ProgressBar* progress = nullptr);

// Greedy search (argmax each step) for a batch; one hypothesis per sentence.
absl::StatusOr<std::vector<Hypothesis>> GreedySearch(model::TransformerModel& model,
                                                     const torch::Tensor& src_tokens,
                                                     const SearchOptions& options);

// Encodes texts (+EOS, truncated to the model's source positions) into [batch, len] padded.
absl::StatusOr<torch::Tensor> EncodeSources(const Tokenizer& tokenizer,
                                            const std::vector<std::string>& texts, int64_t max_len,
                                            int64_t pad_id, int64_t eos_id);

struct TranslateStats {
  int64_t sentences = 0;
  int64_t generated_tokens = 0;  // subword tokens of the best hypotheses, without EOS
  // Sources longer than the model reads: only their first max_source_positions - 1 tokens (and
  // EOS) were translated.
  int64_t cut_sources = 0;
};

// Translates texts in length-sorted batches of `batch_size` (greedy when beam_size == 1) and
// returns the detokenized best hypothesis of each, in input order; an empty or blank text gets an
// empty translation without running the model. `progress` may be null.
absl::StatusOr<std::vector<std::string>> TranslateTexts(
    model::TransformerModel& model, const Tokenizer& tokenizer,
    const std::vector<std::string>& texts, const SearchOptions& options, int64_t batch_size,
    TranslateStats* stats = nullptr, ProgressBar* progress = nullptr);

}  // namespace knnserve::decode

#endif  // KNNSERVE_CLIENT_DECODE_SEARCH_H_
