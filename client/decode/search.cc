#include "client/decode/search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

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

// One decoder step for every live row: log-probabilities after the processor, with padding
// blocked, EOS blocked before min_len and forced once a row reaches its max length.
absl::StatusOr<torch::Tensor> StepLogProbs(model::TransformerModel& model,
                                           const model::EncoderOutput& encoder_out,
                                           model::DecoderState& state, const torch::Tensor& last,
                                           const std::vector<int64_t>& row_sentence,
                                           const std::vector<int64_t>& max_len, int64_t step,
                                           const SearchOptions& options) {
  model::DecoderOutput out = model->DecodeStep(last, encoder_out, state, /*with_logits=*/false);
  StepContext context;
  context.step = step;
  context.features = out.features.squeeze(1);
  context.ffn_in = out.ffn_in.squeeze(1);
  context.sentence = torch::tensor(row_sentence, torch::kLong);
  if (options.processor != nullptr) RETURN_IF_ERROR(options.processor->BeginStep(context));
  context.log_probs = torch::log_softmax(model->Logits(context.features).to(torch::kFloat), -1);
  const auto expected_shape = context.log_probs.sizes().vec();
  if (options.processor != nullptr) {
    RETURN_IF_ERROR(options.processor->Process(context));
    if (context.log_probs.sizes().vec() != expected_shape) {
      return absl::InternalError("a logits processor changed the shape of the log-probabilities");
    }
  }
  torch::Tensor lp = context.log_probs.contiguous();
  const int64_t eos = model->config().eos_id;
  lp.select(1, model->config().pad_id).fill_(kNegInf);
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

absl::StatusOr<std::vector<std::vector<Hypothesis>>> BeamImpl(model::TransformerModel& model,
                                                              const torch::Tensor& src_tokens,
                                                              const SearchOptions& options) {
  const int64_t batch = src_tokens.size(0);
  const int64_t k = options.beam_size;
  const int64_t eos = model->config().eos_id;
  const std::vector<int64_t> max_len = MaxLengths(model, src_tokens, options);
  model::EncoderOutput encoder_out = model->Encode(src_tokens);
  if (options.processor != nullptr) {
    RETURN_IF_ERROR(options.processor->BeginBatch(src_tokens, encoder_out));
  }
  model::DecoderState state = model->InitDecoderState(encoder_out);
  model::ReorderDecoderState(state, torch::arange(batch, torch::kLong).repeat_interleave(k));

  std::vector<std::vector<Hypothesis>> finished(batch);
  std::vector<int64_t> alive(batch);  // sentences with live rows; row r belongs to alive[r / k]
  std::iota(alive.begin(), alive.end(), 0);
  std::vector<Row> rows(batch * k);
  for (size_t r = 0; r < rows.size(); ++r) rows[r].score = r % k == 0 ? 0.0 : kNegInf;
  torch::Tensor last = torch::full({batch * k}, eos, torch::kLong);

  for (int64_t step = 0; !alive.empty(); ++step) {
    std::vector<int64_t> row_sentence(rows.size());
    for (size_t r = 0; r < rows.size(); ++r) row_sentence[r] = alive[r / k];
    ASSIGN_OR_RETURN(torch::Tensor lp, StepLogProbs(model, encoder_out, state, last, row_sentence,
                                                    max_len, step, options));
    const int64_t vocab = lp.size(1);
    std::vector<double> scores(rows.size());
    for (size_t r = 0; r < rows.size(); ++r) scores[r] = rows[r].score;
    torch::Tensor cand = (lp + torch::tensor(scores, torch::kDouble).to(torch::kFloat).unsqueeze(1))
                             .view({static_cast<int64_t>(alive.size()), k * vocab});
    auto [top_values, top_index] = cand.topk(std::min<int64_t>(2 * k, k * vocab), 1);
    auto values = top_values.accessor<float, 2>();
    auto index = top_index.accessor<int64_t, 2>();

    std::vector<Row> next_rows;
    std::vector<int64_t> source_rows, next_tokens, next_alive;
    for (size_t s = 0; s < alive.size(); ++s) {
      const int64_t sentence = alive[s];
      std::vector<Hypothesis>& done = finished[sentence];
      int64_t chosen = 0;
      for (int64_t j = 0; j < top_values.size(1) && chosen < k; ++j) {
        const float value = values[s][j];
        if (value == kNegInf) break;
        const int64_t src_row = static_cast<int64_t>(s) * k + index[s][j] / vocab;
        const int64_t token = index[s][j] % vocab;
        const Row& from = rows[src_row];
        const float token_lp = static_cast<float>(value - from.score);
        if (token == eos) {
          // As fairseq: only EOS among the top-k candidates finishes a hypothesis.
          if (j >= k || static_cast<int64_t>(done.size()) >= k) continue;
          Hypothesis hyp{from.tokens, from.log_probs, 0};
          hyp.token_log_probs.push_back(token_lp);
          hyp.score = Normalize(value, from.tokens.size() + 1, options.length_penalty);
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
    }
    if (next_alive.empty()) break;
    // Hypotheses move only within their sentence, whose rows share the encoder states: those
    // are copied only when a sentence has left the batch.
    const torch::Tensor reorder = torch::tensor(source_rows, torch::kLong);
    if (next_alive.size() == alive.size()) {
      model::ReorderSelfAttentionState(state, reorder);
    } else {
      model::ReorderDecoderState(state, reorder);
    }
    rows = std::move(next_rows);
    last = torch::tensor(next_tokens, torch::kLong);
    alive = std::move(next_alive);
  }

  for (auto& done : finished) {
    std::stable_sort(done.begin(), done.end(),
                     [](const Hypothesis& a, const Hypothesis& b) { return a.score > b.score; });
    if (static_cast<int>(done.size()) > options.nbest) done.resize(options.nbest);
  }
  return finished;
}

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
                                                        int64_t max_len, int64_t eos_id) {
  std::vector<std::vector<int>> encoded;
  encoded.reserve(texts.size());
  for (const std::string& text : texts) {
    ASSIGN_OR_RETURN(std::vector<int> ids, tokenizer.Encode(text));
    if (static_cast<int64_t>(ids.size()) >= max_len) ids.resize(max_len - 1);
    ids.push_back(static_cast<int>(eos_id));
    encoded.push_back(std::move(ids));
  }
  return encoded;
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
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<Hypothesis>>> BeamSearch(model::TransformerModel& model,
                                                                const torch::Tensor& src_tokens,
                                                                const SearchOptions& options) {
  RETURN_IF_ERROR(ValidateSearchOptions(options));
  torch::NoGradGuard no_grad;
  return CatchTorch([&] { return BeamImpl(model, src_tokens, options); });
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
  ASSIGN_OR_RETURN(auto encoded,
                   EncodeAll(tokenizer, texts, config.max_source_positions, config.eos_id));
  std::vector<size_t> order(texts.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return encoded[a].size() > encoded[b].size(); });
  std::vector<std::string> output(texts.size());
  TranslateStats local;
  for (size_t begin = 0; begin < order.size(); begin += batch_size) {
    const size_t end = std::min(order.size(), begin + static_cast<size_t>(batch_size));
    std::vector<const std::vector<int>*> rows;
    for (size_t i = begin; i < end; ++i) rows.push_back(&encoded[order[i]]);
    torch::Tensor src = PadBatch(rows, config.pad_id);
    std::vector<std::vector<int>> best(rows.size());
    if (options.beam_size == 1) {
      ASSIGN_OR_RETURN(std::vector<Hypothesis> hyps, GreedySearch(model, src, options));
      for (size_t r = 0; r < hyps.size(); ++r) best[r] = std::move(hyps[r].tokens);
    } else {
      ASSIGN_OR_RETURN(auto nbest, BeamSearch(model, src, options));
      for (size_t r = 0; r < nbest.size(); ++r) {
        if (!nbest[r].empty()) best[r] = std::move(nbest[r][0].tokens);
      }
    }
    for (size_t r = 0; r < best.size(); ++r) {
      ASSIGN_OR_RETURN(output[order[begin + r]], tokenizer.Decode(best[r]));
      local.generated_tokens += static_cast<int64_t>(best[r].size());
    }
    local.sentences += static_cast<int64_t>(rows.size());
    if (progress != nullptr) progress->Add(static_cast<int64_t>(rows.size()));
  }
  if (stats != nullptr) *stats = local;
  return output;
}

}  // namespace knnserve::decode
