#include "client/train/trainer.h"

#include <ATen/autocast_mode.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/data/parallel_corpus.h"
#include "client/decode/search.h"
#include "client/eval/bleu.h"
#include "client/model/checkpoint.h"
#include "client/model/transformer.h"
#include "client/tokenizer/tokenizer.h"
#include "client/train/batching.h"
#include "common/progress.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace knnserve::train {
namespace {

std::atomic<bool> g_stop_requested{false};

void RequestStop(int /*signal*/) { g_stop_requested.store(true); }

// Appends to <out_dir>/train.log and mirrors to stderr.
class TrainLog {
 public:
  explicit TrainLog(const std::string& path) : file_(path, std::ios::app) {}
  void Line(const std::string& line) {
    std::fprintf(stderr, "%s\n", line.c_str());
    file_ << line << "\n";
    file_.flush();
  }

 private:
  std::ofstream file_;
};

struct Position {
  int64_t epoch = 0;
  int64_t batch_in_epoch = 0;
  int64_t tokens_seen = 0;
};

// Enables CPU autocast to bfloat16 for its lifetime (when `enabled`).
class ScopedBf16Autocast {
 public:
  explicit ScopedBf16Autocast(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(true);
  }
  ~ScopedBf16Autocast() {
    if (!enabled_) return;
    at::autocast::set_cpu_enabled(false);
    at::autocast::clear_cache();
  }
  ScopedBf16Autocast(const ScopedBf16Autocast&) = delete;
  ScopedBf16Autocast& operator=(const ScopedBf16Autocast&) = delete;

 private:
  const bool enabled_;
};

std::string PositionJson(const Position& p, int64_t step) {
  nlohmann::json j;
  j["step"] = step;
  j["epoch"] = p.epoch;
  j["batch_in_epoch"] = p.batch_in_epoch;
  j["tokens_seen"] = p.tokens_seen;
  return j.dump();
}

absl::StatusOr<std::pair<Position, int64_t>> ParsePosition(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("step") || !j.contains("epoch") ||
      !j.contains("batch_in_epoch")) {
    return absl::InvalidArgumentError("checkpoint trainer state is not valid JSON");
  }
  Position p;
  p.epoch = j["epoch"].get<int64_t>();
  p.batch_in_epoch = j["batch_in_epoch"].get<int64_t>();
  p.tokens_seen = j.value("tokens_seen", int64_t{0});
  return std::make_pair(p, j["step"].get<int64_t>());
}

absl::StatusOr<std::vector<Example>> LoadExamples(const std::string& path,
                                                  const Tokenizer& tokenizer,
                                                  const TrainOptions& options, TrainLog& log,
                                                  std::vector<data::SentencePair>* pairs_out) {
  ASSIGN_OR_RETURN(std::vector<data::SentencePair> pairs, data::ReadTsv(path));
  EncodeStats stats;
  ASSIGN_OR_RETURN(std::vector<Example> examples,
                   EncodePairs(tokenizer, pairs, options.max_len, options.threads, &stats));
  log.Line(absl::StrCat(path, ": ", pairs.size(), " pairs, kept ", stats.kept, ", dropped ",
                        stats.dropped_too_long, " longer than ", options.max_len,
                        " tokens and ", stats.dropped_empty, " with an empty side"));
  if (pairs_out != nullptr) *pairs_out = std::move(pairs);
  return examples;
}

// Mean validation NLL in bits per target token.
double ValidNllBits(model::TransformerModel& model, const std::vector<Example>& valid,
                    const TrainOptions& options) {
  torch::NoGradGuard no_grad;
  model->eval();
  double nll = 0;
  int64_t tokens = 0;
  for (const auto& indices : MakeBatches(valid, options.max_tokens, /*seed=*/0)) {
    TensorBatch batch = Collate(valid, indices, model->config().pad_id, model->config().eos_id);
    model::DecoderOutput out = model->Decode(batch.prev_tokens, model->Encode(batch.src));
    nll += LabelSmoothedLoss(out.logits, batch.target, model->config().pad_id, 0.0)
               .nll.item<double>();
    tokens += batch.target_tokens;
  }
  model->train();
  return tokens > 0 ? nll / static_cast<double>(tokens) / std::log(2.0) : 0.0;
}

// Greedy BLEU on the first `n` validation pairs.
absl::StatusOr<double> ValidBleu(model::TransformerModel& model, const Tokenizer& tokenizer,
                                 const std::vector<data::SentencePair>& valid_pairs, int64_t n) {
  std::vector<std::string> sources, references;
  for (int64_t i = 0; i < n && i < static_cast<int64_t>(valid_pairs.size()); ++i) {
    sources.push_back(valid_pairs[i].source);
    references.push_back(valid_pairs[i].target);
  }
  model->eval();
  decode::SearchOptions search;
  search.beam_size = 1;
  absl::StatusOr<std::vector<std::string>> hyps =
      decode::TranslateTexts(model, tokenizer, sources, search, /*batch_size=*/32);
  model->train();
  if (!hyps.ok()) return hyps.status();
  ASSIGN_OR_RETURN(eval::BleuScore bleu, eval::CorpusBleu(*hyps, {references}));
  return bleu.score;
}

}  // namespace

absl::Status Train(const TrainOptions& options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("train: --out is required");
  if (options.max_tokens <= 0) return absl::InvalidArgumentError("train: --max-tokens must be > 0");
  at::set_num_threads(options.threads);  // LibTorch defaults to 1 OpenMP thread here
  torch::manual_seed(options.seed);
  std::filesystem::create_directories(options.out_dir);
  TrainLog log(options.out_dir + "/train.log");
  const std::string checkpoint_path = options.out_dir + "/checkpoint_last.pt";

  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Load(options.tokenizer_path));
  ASSIGN_OR_RETURN(std::vector<Example> train_set,
                   LoadExamples(options.train_tsv, *tokenizer, options, log, nullptr));
  if (train_set.empty()) return absl::InvalidArgumentError("train: no usable training pairs");
  std::vector<Example> valid_set;
  std::vector<data::SentencePair> valid_pairs;
  if (!options.valid_tsv.empty()) {
    ASSIGN_OR_RETURN(valid_set,
                     LoadExamples(options.valid_tsv, *tokenizer, options, log, &valid_pairs));
  }

  model::TransformerModel model{nullptr};
  Position position;
  int64_t start_step = 0;
  std::optional<model::TrainerState> resumed;
  if (std::filesystem::exists(checkpoint_path)) {
    ASSIGN_OR_RETURN(model::LoadedModel loaded, model::LoadCheckpoint(checkpoint_path));
    if (!loaded.trainer) {
      return absl::InvalidArgumentError(
          absl::StrCat(checkpoint_path, " has no trainer state: cannot resume from it"));
    }
    model = loaded.model;
    ASSIGN_OR_RETURN(auto parsed, ParsePosition(loaded.trainer->json));
    std::tie(position, start_step) = parsed;
    resumed = std::move(loaded.trainer);
    log.Line(absl::StrCat("resuming from ", checkpoint_path, " at step ", start_step, ", epoch ",
                          position.epoch, ", batch ", position.batch_in_epoch));
  } else {
    model::TransformerConfig config = options.model;
    config.src_vocab_size = config.tgt_vocab_size = tokenizer->vocab_size();
    config.pad_id = tokenizer->pad_id();
    config.eos_id = tokenizer->eos_id();
    RETURN_IF_ERROR(config.Validate());
    model = model::TransformerModel(config);
  }
  model->train();
  const auto named_params = model->UniqueNamedParameters();
  std::vector<torch::Tensor> params;
  int64_t num_params = 0;
  for (const auto& [name, p] : named_params) {
    params.push_back(p);
    num_params += p.numel();
  }
  Adam adam(named_params, options.adam);
  if (resumed) RETURN_IF_ERROR(adam.LoadState(resumed->tensors, start_step));
  log.Line(absl::StrCat("model: ", num_params, " parameters; config ",
                        nlohmann::json::parse(model->config().ToJson()).dump()));

  auto save = [&]() -> absl::Status {
    model::TrainerState state{PositionJson(position, adam.step()), adam.StateTensors()};
    RETURN_IF_ERROR(model::SaveCheckpoint(checkpoint_path, model, tokenizer->serialized(), &state));
    log.Line(absl::StrCat("saved ", checkpoint_path, " at step ", adam.step()));
    return absl::OkStatus();
  };
  auto validate = [&]() -> absl::Status {
    if (valid_set.empty()) return absl::OkStatus();
    const double nll = ValidNllBits(model, valid_set, options);
    std::string line = absl::StrFormat("valid | step %d | nll %.3f | ppl %.2f", adam.step(), nll,
                                       std::exp2(nll));
    if (options.valid_bleu_sentences > 0) {
      ASSIGN_OR_RETURN(double bleu,
                       ValidBleu(model, *tokenizer, valid_pairs, options.valid_bleu_sentences));
      absl::StrAppend(&line, absl::StrFormat(" | greedy BLEU (%d sents) %.2f",
                                             std::min<int64_t>(options.valid_bleu_sentences,
                                                               valid_pairs.size()),
                                             bleu));
    }
    log.Line(line);
    return absl::OkStatus();
  };

  std::signal(SIGINT, RequestStop);
  std::signal(SIGTERM, RequestStop);
  const absl::Time start = absl::Now();
  absl::Time last_save = start;
  absl::Time window_start = start;
  int64_t window_tokens = 0;
  double window_loss = 0, window_nll = 0, window_gnorm = 0;
  int64_t window_steps = 0;
  ProgressBar::Options bar_options;
  bar_options.unit = "tok";
  ProgressBar bar("train", -1, bar_options);

  auto out_of_budget = [&]() {
    if (g_stop_requested.load()) return true;
    if (options.max_steps > 0 && adam.step() >= options.max_steps) return true;
    if (options.max_minutes > 0 && absl::ToDoubleMinutes(absl::Now() - start) >= options.max_minutes)
      return true;
    return false;
  };

  while (!out_of_budget() && (options.max_epochs <= 0 || position.epoch < options.max_epochs)) {
    const auto batches = MakeBatches(train_set, options.max_tokens, options.seed + position.epoch);
    for (; position.batch_in_epoch < static_cast<int64_t>(batches.size()) && !out_of_budget();
         ++position.batch_in_epoch) {
      TensorBatch batch = Collate(train_set, batches[position.batch_in_epoch],
                                  model->config().pad_id, model->config().eos_id);
      adam.ZeroGrad();
      LossSums sums;
      {
        ScopedBf16Autocast autocast(options.bf16);
        model::DecoderOutput out = model->Decode(batch.prev_tokens, model->Encode(batch.src));
        sums = LabelSmoothedLoss(out.logits, batch.target, model->config().pad_id,
                                 options.label_smoothing);
      }
      (sums.loss / static_cast<double>(batch.target_tokens)).backward();
      double gnorm = 0;
      if (options.clip_norm > 0) {
        gnorm = torch::nn::utils::clip_grad_norm_(params, options.clip_norm);
      }
      const double lr = adam.Step();
      position.tokens_seen += batch.target_tokens;
      bar.Add(batch.target_tokens);
      window_tokens += batch.target_tokens;
      window_loss += sums.loss.item<double>();
      window_nll += sums.nll.item<double>();
      window_gnorm += gnorm;
      ++window_steps;

      if (adam.step() % options.log_every_steps == 0) {
        const double seconds = absl::ToDoubleSeconds(absl::Now() - window_start);
        const double nll_bits = window_nll / window_tokens / std::log(2.0);
        log.Line(absl::StrFormat(
            "train | step %d | epoch %d | loss %.3f | nll %.3f | ppl %.2f | lr %.3g | gnorm %.2f"
            " | tok/s %.0f | elapsed %s",
            adam.step(), position.epoch + 1, window_loss / window_tokens / std::log(2.0),
            nll_bits, std::exp2(nll_bits), lr, window_gnorm / window_steps,
            window_tokens / std::max(seconds, 1e-9),
            ProgressBar::HumanDuration(absl::Now() - start)));
        window_start = absl::Now();
        window_tokens = window_steps = 0;
        window_loss = window_nll = window_gnorm = 0;
      }
      if (options.valid_every_steps > 0 && adam.step() % options.valid_every_steps == 0) {
        RETURN_IF_ERROR(validate());
      }
      if (absl::ToDoubleMinutes(absl::Now() - last_save) >= options.save_every_minutes) {
        ++position.batch_in_epoch;  // this batch is done
        RETURN_IF_ERROR(save());
        --position.batch_in_epoch;
        last_save = absl::Now();
      }
    }
    if (position.batch_in_epoch >= static_cast<int64_t>(batches.size())) {
      ++position.epoch;
      position.batch_in_epoch = 0;
      log.Line(absl::StrCat("finished epoch ", position.epoch));
    }
  }
  bar.Finish();
  if (g_stop_requested.load()) log.Line("stop requested by signal");
  RETURN_IF_ERROR(validate());
  return save();
}

}  // namespace knnserve::train
