#include "client/decode/search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/memory/memory.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/progress.h"
#include "common/status_macros.h"

namespace knnserve::decode {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Per-row token limits: min(a * source_len + b, max_target_positions - 1).
std::vector<int64_t> MaxLengths(const model::TransformerModel& model,
                                const torch::Tensor& src_tokens, const SearchOptions& options) {
  torch::Tensor lengths = src_tokens.ne(model->config().pad_id).sum(1).cpu();
  std::vector<int64_t> max_len(lengths.size(0));
  for (int64_t i = 0; i < lengths.size(0); ++i) {
    const int64_t by_source =
        static_cast<int64_t>(
            std::floor(options.max_len_a * static_cast<double>(lengths[i].item<int64_t>()))) +
        options.max_len_b;
    max_len[i] = std::max<int64_t>(
        1, std::min<int64_t>(by_source, model->config().max_target_positions - 1));
  }
  return max_len;
}

// The model's log-probabilities for every live row at `step`: the decoder step, BeginStep with
// its features (a processor may start work that runs while the output projection does), then
// the projection and softmax. context.log_probs holds the result; FinishLogProbs finishes it.
absl::Status StartLogProbs(model::TransformerModel& model, const model::EncoderOutput& encoder_out,
                           model::DecoderState& state, const torch::Tensor& last,
                           const std::vector<int64_t>& row_sentence, std::vector<int64_t> live_rows,
                           int64_t step, LogitsProcessor* processor, StepContext& context) {
  model::DecoderOutput out = model->DecodeStep(last, encoder_out, state, /*with_logits=*/false);
  context = StepContext();
  context.step = step;
  context.features = out.features.squeeze(1);
  context.ffn_in = out.ffn_in.squeeze(1);
  context.sentence = torch::tensor(row_sentence, torch::kLong);
  context.live_rows = std::move(live_rows);
  if (processor != nullptr) RETURN_IF_ERROR(processor->BeginStep(context));
  context.log_probs = torch::log_softmax(model->Logits(context.features).to(torch::kFloat), -1);
  return absl::OkStatus();
}

// The step's final log-probabilities: after the processor, with padding blocked, EOS blocked
// before min_len and forced once a row reaches its max length.
absl::StatusOr<torch::Tensor> FinishLogProbs(const model::TransformerConfig& config,
                                             const std::vector<int64_t>& row_sentence,
                                             const std::vector<int64_t>& max_len,
                                             const SearchOptions& options,
                                             LogitsProcessor* processor, StepContext& context) {
  const int64_t step = context.step;
  const auto expected_shape = context.log_probs.sizes().vec();
  if (processor != nullptr) {
    RETURN_IF_ERROR(processor->Process(context));
    if (context.log_probs.sizes().vec() != expected_shape) {
      return absl::InternalError("a logits processor changed the shape of the log-probabilities");
    }
  }
  torch::Tensor lp = context.log_probs.contiguous();
  const int64_t eos = config.eos_id;
  lp.select(1, config.pad_id).fill_(kNegInf);
  if (step < options.min_len) lp.select(1, eos).fill_(kNegInf);
  std::vector<uint8_t> force(row_sentence.size());
  bool any_forced = false;
  for (size_t r = 0; r < row_sentence.size(); ++r) {
    force[r] = step >= max_len[row_sentence[r]];
    any_forced |= force[r] != 0;
  }
  if (any_forced) {
    torch::Tensor eos_lp = lp.select(1, eos).clone();
    torch::Tensor rows =
        torch::tensor(std::vector<int64_t>(force.begin(), force.end())).to(torch::kBool);
    lp.masked_fill_(rows.unsqueeze(1), kNegInf);
    lp.select(1, eos).copy_(torch::where(rows, eos_lp, lp.select(1, eos)));
  }
  return lp;
}

// Both halves of one step at once (greedy search, which keeps one batch in flight).
absl::StatusOr<torch::Tensor> StepLogProbs(model::TransformerModel& model,
                                           const model::EncoderOutput& encoder_out,
                                           model::DecoderState& state, const torch::Tensor& last,
                                           const std::vector<int64_t>& row_sentence,
                                           const std::vector<int64_t>& max_len, int64_t step,
                                           const SearchOptions& options) {
  StepContext context;
  std::vector<int64_t> every_row(row_sentence.size());
  std::iota(every_row.begin(), every_row.end(), 0);
  RETURN_IF_ERROR(StartLogProbs(model, encoder_out, state, last, row_sentence, std::move(every_row),
                                step, options.processor, context));
  return FinishLogProbs(model->config(), row_sentence, max_len, options, options.processor,
                        context);
}

double Normalize(double score, size_t length_with_eos, double length_penalty) {
  return score / std::pow(static_cast<double>(length_with_eos), length_penalty);
}

template <typename Fn>
auto CatchTorch(Fn fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("decoding failed: ", e.what_without_backtrace()));
  }
}

struct Row {
  std::vector<int> tokens;
  std::vector<float> log_probs;
  double score = 0;
};

absl::StatusOr<std::vector<Hypothesis>> GreedyImpl(model::TransformerModel& model,
                                                   const torch::Tensor& src_tokens,
                                                   const SearchOptions& options) {
  const int64_t batch = src_tokens.size(0);
  const int64_t eos = model->config().eos_id;
  const std::vector<int64_t> max_len = MaxLengths(model, src_tokens, options);
  model::EncoderOutput encoder_out = model->Encode(src_tokens);
  if (options.processor != nullptr) {
    RETURN_IF_ERROR(options.processor->BeginBatch(src_tokens, encoder_out));
  }
  model::DecoderState state = model->InitDecoderState(encoder_out);
  std::vector<Hypothesis> result(batch);
  std::vector<int64_t> alive(batch);
  std::iota(alive.begin(), alive.end(), 0);
  torch::Tensor last = torch::full({batch}, eos, torch::kLong);
  for (int64_t step = 0; !alive.empty(); ++step) {
    ASSIGN_OR_RETURN(torch::Tensor lp,
                     StepLogProbs(model, encoder_out, state, last, alive, max_len, step, options));
    auto [best_lp, best] = lp.max(1);
    auto best_a = best.accessor<int64_t, 1>();
    auto best_lp_a = best_lp.accessor<float, 1>();
    std::vector<int64_t> keep_rows, keep_sentences;
    for (size_t r = 0; r < alive.size(); ++r) {
      Hypothesis& hyp = result[alive[r]];
      hyp.token_log_probs.push_back(best_lp_a[r]);
      hyp.score += best_lp_a[r];
      if (best_a[r] == eos) {
        hyp.score = Normalize(hyp.score, hyp.tokens.size() + 1, options.length_penalty);
      } else {
        hyp.tokens.push_back(static_cast<int>(best_a[r]));
        keep_rows.push_back(static_cast<int64_t>(r));
        keep_sentences.push_back(alive[r]);
      }
    }
    if (keep_rows.size() != alive.size() && !keep_rows.empty()) {
      torch::Tensor index = torch::tensor(keep_rows, torch::kLong);
      model::ReorderDecoderState(state, index);
      last = best.index_select(0, index);
    } else {
      last = best;
    }
    alive = std::move(keep_sentences);
  }
  return result;
}

// Beam search of one batch, a step at a time. StartStep runs the decoder up to the step's
// log-probabilities (the processor's BeginStep sees the features); FinishStep runs the processor
// and picks the next hypotheses. Between the two, another batch's steps may run: that is how
// BeamSearchBatches keeps one batch's retrieval going while the model works on the other.
// Thread-compatible.
class BeamBatch {
 public:
  // Encodes src_tokens [batch, src_len] and begins the processor's batch. `processor` may be
  // null; `model` and `processor` must outlive the object.
  static absl::StatusOr<std::unique_ptr<BeamBatch>> Start(model::TransformerModel& model,
                                                          const torch::Tensor& src_tokens,
                                                          const SearchOptions& options,
                                                          LogitsProcessor* processor) {
    auto batch = absl::WrapUnique(new BeamBatch(model, src_tokens, options, processor));
    if (processor != nullptr) {
      RETURN_IF_ERROR(processor->BeginBatch(src_tokens, batch->encoder_out_));
    }
    return batch;
  }

  bool done() const { return alive_.empty(); }

  // REQUIRES: !done(), and every earlier StartStep was followed by FinishStep.
  absl::Status StartStep() {
    row_sentence_.resize(rows_.size());
    std::vector<int64_t> live_rows;
    for (size_t r = 0; r < rows_.size(); ++r) {
      row_sentence_[r] = alive_[r / beam_];
      if (rows_[r].score != kNegInf) live_rows.push_back(static_cast<int64_t>(r));
    }
    return StartLogProbs(model_, encoder_out_, state_, last_, row_sentence_, std::move(live_rows),
                         step_, processor_, context_);
  }

  // REQUIRES: StartStep came before.
  absl::Status FinishStep() {
    ASSIGN_OR_RETURN(torch::Tensor lp, FinishLogProbs(model_->config(), row_sentence_, max_len_,
                                                      options_, processor_, context_));
    context_ = StepContext();  // releases the step's tensors
    SelectNext(lp);
    ++step_;
    return absl::OkStatus();
  }

  // options.nbest hypotheses per sentence, best first. REQUIRES: done().
  std::vector<std::vector<Hypothesis>> TakeHypotheses() {
    for (auto& done : finished_) {
      std::stable_sort(done.begin(), done.end(),
                       [](const Hypothesis& a, const Hypothesis& b) { return a.score > b.score; });
      if (static_cast<int>(done.size()) > options_.nbest) done.resize(options_.nbest);
    }
    return std::move(finished_);
  }

 private:
  BeamBatch(model::TransformerModel& model, const torch::Tensor& src_tokens,
            const SearchOptions& options, LogitsProcessor* processor)
      : model_(model),
        options_(options),
        processor_(processor),
        beam_(options.beam_size),
        max_len_(MaxLengths(model, src_tokens, options)),
        encoder_out_(model->Encode(src_tokens)),
        state_(model->InitDecoderState(encoder_out_)) {
    const int64_t batch = src_tokens.size(0);
    finished_.resize(batch);
    alive_.resize(batch);
    std::iota(alive_.begin(), alive_.end(), 0);
    rows_.resize(batch * beam_);
    for (size_t r = 0; r < rows_.size(); ++r) rows_[r].score = r % beam_ == 0 ? 0.0 : kNegInf;
    last_ = torch::full({batch * beam_}, model->config().eos_id, torch::kLong);
  }

  // The next live rows from the step's log-probabilities lp [rows, V].
  void SelectNext(const torch::Tensor& lp) {
    const int64_t k = beam_;
    const int64_t eos = model_->config().eos_id;
    const int64_t vocab = lp.size(1);
    std::vector<double> scores(rows_.size());
    for (size_t r = 0; r < rows_.size(); ++r) scores[r] = rows_[r].score;
    torch::Tensor cand = (lp + torch::tensor(scores, torch::kDouble).to(torch::kFloat).unsqueeze(1))
                             .view({static_cast<int64_t>(alive_.size()), k * vocab});
    auto [top_values, top_index] = cand.topk(std::min<int64_t>(2 * k, k * vocab), 1);
    auto values = top_values.accessor<float, 2>();
    auto index = top_index.accessor<int64_t, 2>();

    std::vector<Row> next_rows;
    std::vector<int64_t> source_rows, next_tokens, next_alive;
    std::vector<int64_t> kept;  // the positions in alive_ of next_alive's sentences
    for (size_t s = 0; s < alive_.size(); ++s) {
      const int64_t sentence = alive_[s];
      std::vector<Hypothesis>& done = finished_[sentence];
      int64_t chosen = 0;
      for (int64_t j = 0; j < top_values.size(1) && chosen < k; ++j) {
        const float value = values[s][j];
        if (value == kNegInf) break;
        const int64_t src_row = static_cast<int64_t>(s) * k + index[s][j] / vocab;
        const int64_t token = index[s][j] % vocab;
        const Row& from = rows_[src_row];
        const float token_lp = static_cast<float>(value - from.score);
        if (token == eos) {
          // As fairseq: only EOS among the top-k candidates finishes a hypothesis.
          if (j >= k || static_cast<int64_t>(done.size()) >= k) continue;
          Hypothesis hyp{from.tokens, from.log_probs, 0};
          hyp.token_log_probs.push_back(token_lp);
          hyp.score = Normalize(value, from.tokens.size() + 1, options_.length_penalty);
          done.push_back(std::move(hyp));
          continue;
        }
        Row row{from.tokens, from.log_probs, value};
        row.tokens.push_back(static_cast<int>(token));
        row.log_probs.push_back(token_lp);
        next_rows.push_back(std::move(row));
        source_rows.push_back(src_row);
        next_tokens.push_back(token);
        ++chosen;
      }
      if (static_cast<int64_t>(done.size()) >= k || chosen == 0) {
        next_rows.resize(next_rows.size() - chosen);  // sentence finished: drop its rows
        source_rows.resize(source_rows.size() - chosen);
        next_tokens.resize(next_tokens.size() - chosen);
        continue;
      }
      for (; chosen < k; ++chosen) {  // fewer live candidates than beams: dead filler rows
        Row filler = next_rows.back();
        filler.score = kNegInf;
        next_rows.push_back(std::move(filler));
        source_rows.push_back(source_rows.back());
        next_tokens.push_back(next_tokens.back());
      }
      next_alive.push_back(sentence);
      kept.push_back(static_cast<int64_t>(s));
    }
    if (next_alive.empty()) {
      alive_.clear();
      return;
    }
    // Hypotheses move only within their sentence, whose beam shares one copy of its encoder
    // states: those are selected only when a sentence has left the batch.
    model::ReorderSelfAttentionState(state_, torch::tensor(source_rows, torch::kLong));
    if (next_alive.size() != alive_.size()) {
      model::SelectEncoderStates(state_, torch::tensor(kept, torch::kLong));
    }
    rows_ = std::move(next_rows);
    last_ = torch::tensor(next_tokens, torch::kLong);
    alive_ = std::move(next_alive);
  }

  model::TransformerModel& model_;
  const SearchOptions& options_;
  LogitsProcessor* const processor_;
  const int64_t beam_;
  const std::vector<int64_t> max_len_;
  const model::EncoderOutput encoder_out_;
  model::DecoderState state_;
  std::vector<std::vector<Hypothesis>> finished_;
  std::vector<int64_t> alive_;  // sentences with live rows; row r belongs to alive_[r / beam_]
  std::vector<Row> rows_;
  torch::Tensor last_;  // [rows] the tokens the next step feeds
  int64_t step_ = 0;
  std::vector<int64_t> row_sentence_;  // of the step in flight
  StepContext context_;                // of the step in flight
};

torch::Tensor PadBatch(const std::vector<const std::vector<int>*>& rows, int64_t pad_id) {
  size_t longest = 1;
  for (const auto* row : rows) longest = std::max(longest, row->size());
  torch::Tensor batch = torch::full(
      {static_cast<int64_t>(rows.size()), static_cast<int64_t>(longest)}, pad_id, torch::kLong);
  auto a = batch.accessor<int64_t, 2>();
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t j = 0; j < rows[r]->size(); ++j) a[r][j] = (*rows[r])[j];
  }
  return batch;
}

absl::StatusOr<std::vector<std::vector<int>>> EncodeAll(const Tokenizer& tokenizer,
                                                        const std::vector<std::string>& texts,
                                                        int64_t max_len, int64_t eos_id,
                                                        int64_t* cut = nullptr) {
  std::vector<std::vector<int>> encoded;
  encoded.reserve(texts.size());
  for (const std::string& text : texts) {
    ASSIGN_OR_RETURN(std::vector<int> ids, tokenizer.Encode(text));
    if (static_cast<int64_t>(ids.size()) >= max_len) {
      ids.resize(max_len - 1);
      if (cut != nullptr) ++*cut;
    }
    ids.push_back(static_cast<int>(eos_id));
    encoded.push_back(std::move(ids));
  }
  return encoded;
}

// BeamSearchBatches without the checks: two batches in flight with options.second_processor,
// one otherwise, their steps alternating (see BeamBatch).
absl::StatusOr<std::vector<std::vector<std::vector<Hypothesis>>>> SearchBatches(
    model::TransformerModel& model, const std::vector<torch::Tensor>& batches,
    const SearchOptions& options, ProgressBar* progress) {
  struct Lane {
    LogitsProcessor* processor = nullptr;
    std::unique_ptr<BeamBatch> batch;  // null when idle
    size_t index = 0;                  // of the batch in `batches`
  };
  std::vector<Lane> lanes(options.second_processor != nullptr ? 2 : 1);
  lanes[0].processor = options.processor;
  if (lanes.size() == 2) lanes[1].processor = options.second_processor;
  std::vector<std::vector<std::vector<Hypothesis>>> result(batches.size());
  size_t next = 0;
  // Starts the lane's next batch and its first step; leaves the lane idle when none is left.
  auto start = [&](Lane& lane) -> absl::Status {
    lane.batch.reset();
    if (next == batches.size()) return absl::OkStatus();
    lane.index = next++;
    ASSIGN_OR_RETURN(lane.batch,
                     BeamBatch::Start(model, batches[lane.index], options, lane.processor));
    return lane.batch->StartStep();
  };
  for (Lane& lane : lanes) RETURN_IF_ERROR(start(lane));
  for (bool busy = true; busy;) {
    busy = false;
    for (Lane& lane : lanes) {
      if (lane.batch == nullptr) continue;
      busy = true;
      RETURN_IF_ERROR(lane.batch->FinishStep());
      if (!lane.batch->done()) {
        RETURN_IF_ERROR(lane.batch->StartStep());
        continue;
      }
      result[lane.index] = lane.batch->TakeHypotheses();
      if (progress != nullptr) progress->Add(static_cast<int64_t>(result[lane.index].size()));
      RETURN_IF_ERROR(start(lane));
    }
  }
  return result;
}

}  // namespace

absl::Status ValidateSearchOptions(const SearchOptions& options) {
  if (options.beam_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("beam size must be >= 1, got ", options.beam_size));
  }
  if (options.nbest < 1 || options.nbest > options.beam_size) {
    return absl::InvalidArgumentError(absl::StrCat("nbest must be in [1, beam size ",
                                                   options.beam_size, "], got ", options.nbest));
  }
  if (options.max_len_a < 0 || options.max_len_b < 0) {
    return absl::InvalidArgumentError("max length coefficients must be >= 0");
  }
  if (options.min_len < 0) return absl::InvalidArgumentError("min length must be >= 0");
  if (options.second_processor != nullptr &&
      (options.processor == nullptr || options.second_processor == options.processor)) {
    return absl::InvalidArgumentError(
        "a second logits processor needs a first one, and a different one (one per batch)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<Hypothesis>>> BeamSearch(model::TransformerModel& model,
                                                                const torch::Tensor& src_tokens,
                                                                const SearchOptions& options) {
  ASSIGN_OR_RETURN(auto nbest, BeamSearchBatches(model, {src_tokens}, options));
  return std::move(nbest[0]);
}

absl::StatusOr<std::vector<std::vector<std::vector<Hypothesis>>>> BeamSearchBatches(
    model::TransformerModel& model, const std::vector<torch::Tensor>& batches,
    const SearchOptions& options, ProgressBar* progress) {
  RETURN_IF_ERROR(ValidateSearchOptions(options));
  torch::NoGradGuard no_grad;
  return CatchTorch([&] { return SearchBatches(model, batches, options, progress); });
}

absl::StatusOr<std::vector<Hypothesis>> GreedySearch(model::TransformerModel& model,
                                                     const torch::Tensor& src_tokens,
                                                     const SearchOptions& options) {
  RETURN_IF_ERROR(ValidateSearchOptions(options));
  torch::NoGradGuard no_grad;
  return CatchTorch([&] { return GreedyImpl(model, src_tokens, options); });
}

absl::StatusOr<torch::Tensor> EncodeSources(const Tokenizer& tokenizer,
                                            const std::vector<std::string>& texts, int64_t max_len,
                                            int64_t pad_id, int64_t eos_id) {
  ASSIGN_OR_RETURN(auto encoded, EncodeAll(tokenizer, texts, max_len, eos_id));
  std::vector<const std::vector<int>*> rows;
  for (const auto& e : encoded) rows.push_back(&e);
  return PadBatch(rows, pad_id);
}

absl::StatusOr<std::vector<std::string>> TranslateTexts(model::TransformerModel& model,
                                                        const Tokenizer& tokenizer,
                                                        const std::vector<std::string>& texts,
                                                        const SearchOptions& options,
                                                        int64_t batch_size, TranslateStats* stats,
                                                        ProgressBar* progress) {
  if (batch_size < 1) return absl::InvalidArgumentError("batch size must be >= 1");
  RETURN_IF_ERROR(ValidateSearchOptions(options));
  const model::TransformerConfig& config = model->config();
  TranslateStats local;
  ASSIGN_OR_RETURN(auto encoded, EncodeAll(tokenizer, texts, config.max_source_positions,
                                           config.eos_id, &local.cut_sources));
  // An empty (or blank) line translates to an empty line: the model would make up a sentence.
  std::vector<size_t> order;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (!absl::StripAsciiWhitespace(texts[i]).empty()) order.push_back(i);
  }
  if (progress != nullptr) progress->Add(static_cast<int64_t>(texts.size() - order.size()));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return encoded[a].size() > encoded[b].size(); });
  std::vector<torch::Tensor> batches;
  for (size_t begin = 0; begin < order.size(); begin += batch_size) {
    const size_t end = std::min(order.size(), begin + static_cast<size_t>(batch_size));
    std::vector<const std::vector<int>*> rows;
    for (size_t i = begin; i < end; ++i) rows.push_back(&encoded[order[i]]);
    batches.push_back(PadBatch(rows, config.pad_id));
  }
  // best[i]: the best hypothesis of the i-th sentence in `order`.
  std::vector<std::vector<int>> best;
  if (options.beam_size == 1) {
    for (const torch::Tensor& batch : batches) {
      ASSIGN_OR_RETURN(std::vector<Hypothesis> hyps, GreedySearch(model, batch, options));
      for (Hypothesis& hyp : hyps) best.push_back(std::move(hyp.tokens));
      if (progress != nullptr) progress->Add(static_cast<int64_t>(hyps.size()));
    }
  } else {
    ASSIGN_OR_RETURN(auto nbest, BeamSearchBatches(model, batches, options, progress));
    for (auto& batch : nbest) {
      for (auto& hyps : batch) best.push_back(hyps.empty() ? std::vector<int>() : hyps[0].tokens);
    }
  }
  std::vector<std::string> output(texts.size());
  for (size_t i = 0; i < best.size(); ++i) {
    ASSIGN_OR_RETURN(output[order[i]], tokenizer.Decode(best[i]));
    local.generated_tokens += static_cast<int64_t>(best[i].size());
  }
  local.sentences = static_cast<int64_t>(texts.size());
  if (stats != nullptr) *stats = local;
  return output;
}

}  // namespace knnserve::decode
