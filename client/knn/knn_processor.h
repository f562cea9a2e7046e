// kNN-MT in the decoder: a decode::LogitsProcessor that, at every step, sends the features of
// all live hypotheses of the batch as one query to a Retriever and interpolates
//
//   p_kNN(y) ∝ Σ_{i ≤ k} 1[y = v_i] · exp(−d_i / τ)        (scatter-add over the vocabulary)
//   P(y)     = λ · p_kNN(y) + (1 − λ) · p_MT(y)             (computed in log space)
//
// For subset kNN-MT a SubsetSelector picks, per source sentence, the datastore sentences its
// hypotheses may match; they are declared once per batch (the session's setup), and every step
// then searches only those sentences' tokens.
#ifndef KNNSERVE_CLIENT_KNN_KNN_PROCESSOR_H_
#define KNNSERVE_CLIENT_KNN_KNN_PROCESSOR_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/decode/search.h"
#include "client/knn/retriever.h"
#include "client/knn/worker_thread.h"
#include "common/search_types.h"

namespace knnserve::knn {

// The knobs, named as knn-seq names its flags.
struct KnnOptions {
  int k = 16;               // --knn-topk: neighbours per query
  double temperature = 10;  // --knn-temperature τ, in the index's distance units
  double weight = 0.5;      // --knn-weight λ in [0, 1]
  int nprobe = 0;           // --knn-nprobe: IVF lists probed (0: the index's default)
  double threshold = 0;     // --knn-threshold: neighbours with distance > threshold are
                            // ignored (0: off); a row left without any keeps p_MT
  // Whether a step's search starts at BeginStep, on the processor's worker thread, and runs
  // while the model computes the log-probabilities; otherwise Process searches.
  bool overlap_search = true;
  // Whether that worker (the searches and the batch setup) runs at idle CPU priority
  // (WorkerPriority::kIdle): on cores the model's threads also use, it takes only the time they
  // leave.
  bool background_search = false;
};

// The temperatures ValidateKnnOptions accepts.
inline constexpr double kMinTemperature = 1e-30;
inline constexpr double kMaxTemperature = 1e30;

// INVALID_ARGUMENT naming the bad knob.
absl::Status ValidateKnnOptions(const KnnOptions& options);

// Interpolates one step, in place. log_probs [rows, V] float (p_MT, log space); neighbours
// rows x k with values (token ids < V; id -1 = missing), squared-L2 distances. log_probs becomes
// [rows, V]: log of λ p_kNN + (1 − λ) p_MT, never NaN or -inf: where both terms are zero (λ = 1,
// a token no neighbour votes for) it is -1e9, so decoding constraints keep a finite choice. Rows
// without usable neighbours are left unchanged, and λ = 0 leaves log_probs as it is. A CPU
// float32 contiguous tensor is rewritten in its own storage (no allocation); any other is
// replaced by its interpolated copy on the same device. A neighbour's score is −d/τ for squared
// L2 distances and +d/τ for inner products. REQUIRES: valid options.
absl::Status InterpolateKnn(const Neighbors& neighbors, Metric metric, const KnnOptions& options,
                            torch::Tensor& log_probs);
// The same where the neighbours answer for some rows only: neighbours row i for log_probs row
// rows[i] (distinct, in range); the other rows keep p_MT.
absl::Status InterpolateKnn(const Neighbors& neighbors, absl::Span<const int64_t> rows,
                            Metric metric, const KnnOptions& options, torch::Tensor& log_probs);

// Picks the datastore sentences of subset kNN-MT for a batch.
class SubsetSelector {
 public:
  virtual ~SubsetSelector() = default;
  // One group of distinct datastore sentence ids per source sentence (row of src_tokens
  // [batch, src_len]); encoder_out is the batch's encoder output. Called on the processors'
  // worker threads: with two batches in flight, from two threads at once.
  virtual absl::StatusOr<SubsetGroups> Select(const torch::Tensor& src_tokens,
                                              const model::EncoderOutput& encoder_out) = 0;
};

// Where the time of a translation went, for the report.
struct KnnStats {
  int64_t batches = 0;
  int64_t steps = 0;
  int64_t query_rows = 0;
  int64_t subset_sentences = 0;     // sum of group sizes declared
  absl::Duration select_time;       // subset selection (sentence search)
  absl::Duration retrieval_time;    // the decoder waiting for the steps' neighbours
  absl::Duration search_time;       // the Search calls themselves (network or in-process
                                    // engine), from BeginStep on, partly while the model ran
  absl::Duration interpolate_time;  // p_kNN and the interpolation

  void Add(const KnnStats& other);
};

// With options.overlap_search, each step's search starts at BeginStep on a worker thread and
// runs while the model computes the step's log-probabilities; Process waits for it and
// interpolates.
// Thread-compatible: one decoding thread at a time, as decode::SearchOptions requires.
class KnnLogitsProcessor : public decode::LogitsProcessor {
 public:
  ~KnnLogitsProcessor() override;

  // `retriever` (and `selector`, when not null: subset kNN-MT) must outlive the processor.
  static absl::StatusOr<std::unique_ptr<KnnLogitsProcessor>> Create(Retriever* retriever,
                                                                    const KnnOptions& options,
                                                                    SubsetSelector* selector);

  // Ends the previous batch's session and starts this batch's (declaring its subset). Both,
  // and the subset selection, run on the worker ahead of the batch's first search: with two
  // batches in flight they overlap the other batch's steps. Their errors are returned by the
  // batch's first Process.
  absl::Status BeginBatch(const torch::Tensor& src_tokens,
                          const model::EncoderOutput& encoder_out) override;
  // With overlap_search, starts the step's search with context.features (and, for subset
  // kNN-MT, context.sentence) of context.live_rows; the dead rows keep p_MT.
  absl::Status BeginStep(const decode::StepContext& context) override;
  // Waits for the search BeginStep started, or searches (on this thread) when none was
  // started, and interpolates context.log_probs in place.
  absl::Status Process(decode::StepContext& context) override;

  // Searches `features` [rows, d] with a full (not subset) search outside any decoding batch
  // (provenance printing, tuning); same k and nprobe.
  absl::StatusOr<Neighbors> SearchOnce(const torch::Tensor& features);

  const KnnStats& stats() const { return stats_; }
  const KnnOptions& options() const { return options_; }

 private:
  struct PendingStep;  // a search started by BeginStep, with its query and answer

  KnnLogitsProcessor(Retriever* retriever, const KnnOptions& options, SubsetSelector* selector);
  SearchParams StepParams() const;
  // The step's query rows, copied out of the tensors.
  absl::StatusOr<std::unique_ptr<PendingStep>> PrepareStep(
      const decode::StepContext& context) const;
  void RunSearch(PendingStep& step) const;
  // Waits for a search whose step failed before Process, and drops it.
  void DiscardPendingStep();
  // On the worker: the batch's subset selection and session (session_, setup_).
  void SetUpBatch(const torch::Tensor& src_tokens, const model::EncoderOutput& encoder_out);
  // After WorkerThread::Wait: adds the setup's selection to stats_ (once) and returns its status.
  absl::Status CollectSetup();

  // What SetUpBatch did; written by the worker, read after WorkerThread::Wait.
  struct BatchSetup {
    absl::Status status;
    absl::Duration select_time;
    int64_t sentences = 0;
    bool collected = true;  // already added to stats_
  };

  Retriever* const retriever_;
  const KnnOptions options_;
  SubsetSelector* const selector_;
  std::unique_ptr<RetrievalSession> session_;  // used on the worker, or after Wait
  BatchSetup setup_;
  bool batch_begun_ = false;
  KnnStats stats_;
  // The worker's jobs use session_, setup_ and *pending_: declared last, it is destroyed
  // (joined) first.
  std::unique_ptr<PendingStep> pending_;
  WorkerThread worker_;
};

}  // namespace knnserve::knn

#endif  // KNNSERVE_CLIENT_KNN_KNN_PROCESSOR_H_
