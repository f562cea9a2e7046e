// `knnserve tokenizer|train|evaluate|model`: the NMT side of the tool.
#include <ATen/Parallel.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/cli/commands.h"
#include "client/data/parallel_corpus.h"
#include "client/decode/search.h"
#include "client/eval/bleu.h"
#include "client/model/checkpoint.h"
#include "client/tokenizer/tokenizer.h"
#include "client/train/batching.h"
#include "client/train/trainer.h"
#include "common/progress.h"
#include "common/status_macros.h"

namespace knnserve::cli {
namespace {

void RegisterTokenizer(CLI::App& app) {
  CLI::App* tokenizer = app.add_subcommand("tokenizer", "SentencePiece tokenizer");
  tokenizer->require_subcommand(1);
  auto options = std::make_shared<TokenizerTrainOptions>();
  CLI::App* train = tokenizer->add_subcommand("train", "train a joint model from a TSV");
  train->add_option("--tsv", options->tsv_path, "source<TAB>target training file")->required();
  train->add_option("--out-prefix", options->model_prefix, "writes PREFIX.model, PREFIX.vocab")
      ->required();
  train->add_option("--vocab-size", options->vocab_size, "vocabulary size")->capture_default_str();
  train->add_option("--model-type", options->model_type, "unigram | bpe")->capture_default_str();
  train->add_option("--sample-lines", options->sample_lines, "random lines used (<= 0: all)")
      ->capture_default_str();
  train->add_option("--seed", options->seed)->check(CLI::NonNegativeNumber)->capture_default_str();
  train->add_option("--threads", options->threads)
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  train->callback([options] {
    ExitOnError(TrainTokenizer(*options));
    std::fprintf(stderr, "wrote %s.model and %s.vocab\n", options->model_prefix.c_str(),
                 options->model_prefix.c_str());
  });
}

void RegisterTrain(CLI::App& app) {
  auto o = std::make_shared<train::TrainOptions>();
  o->model.d_model = 256;
  o->model.encoder_layers = o->model.decoder_layers = 3;
  o->model.encoder_heads = o->model.decoder_heads = 4;
  o->model.encoder_ffn_dim = o->model.decoder_ffn_dim = 1024;
  auto heads = std::make_shared<int64_t>(4);
  auto ffn = std::make_shared<int64_t>(1024);
  auto pre_norm = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("train", "train the reference transformer (resumable)");
  cmd->add_option("--train", o->train_tsv, "source<TAB>target training file")->required();
  cmd->add_option("--valid", o->valid_tsv, "validation TSV (loss and greedy BLEU)");
  cmd->add_option("--tokenizer", o->tokenizer_path, "SentencePiece .model")->required();
  cmd->add_option("--out", o->out_dir, "checkpoint directory (resumes from it)")->required();
  cmd->add_option("--d-model", o->model.d_model)->capture_default_str();
  cmd->add_option("--encoder-layers", o->model.encoder_layers)->capture_default_str();
  cmd->add_option("--decoder-layers", o->model.decoder_layers)->capture_default_str();
  cmd->add_option("--heads", *heads, "attention heads (encoder and decoder)")
      ->capture_default_str();
  cmd->add_option("--ffn-dim", *ffn, "FFN inner size (encoder and decoder)")->capture_default_str();
  cmd->add_flag("--pre-norm", *pre_norm, "pre-norm layers (default post-norm)");
  cmd->add_flag("--learned-positions", o->model.learned_positions);
  cmd->add_option("--dropout", o->model.dropout)
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();
  cmd->add_option("--attention-dropout", o->model.attention_dropout)
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();
  cmd->add_option("--lr", o->adam.lr, "peak learning rate")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--warmup", o->adam.warmup_steps)->capture_default_str();
  cmd->add_option("--label-smoothing", o->label_smoothing)
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();
  cmd->add_option("--clip-norm", o->clip_norm)->capture_default_str();
  cmd->add_option("--max-tokens", o->max_tokens, "tokens per batch")->capture_default_str();
  cmd->add_option("--max-len", o->max_len, "drop longer pairs")->capture_default_str();
  cmd->add_option("--max-steps", o->max_steps)->capture_default_str();
  cmd->add_option("--max-epochs", o->max_epochs)->capture_default_str();
  cmd->add_option("--max-minutes", o->max_minutes, "wall-clock budget of this run")
      ->capture_default_str();
  cmd->add_option("--save-every-minutes", o->save_every_minutes)->capture_default_str();
  cmd->add_option("--valid-every", o->valid_every_steps)->capture_default_str();
  cmd->add_option("--valid-bleu-sentences", o->valid_bleu_sentences)->capture_default_str();
  cmd->add_option("--log-every", o->log_every_steps)->capture_default_str();
  cmd->add_flag("--bf16", o->bf16, "bfloat16 autocast for forward passes (fp32 master weights)");
  cmd->add_option("--seed", o->seed)->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--threads", o->threads)->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->callback([o, heads, ffn, pre_norm] {
    o->model.encoder_heads = o->model.decoder_heads = *heads;
    o->model.encoder_ffn_dim = o->model.decoder_ffn_dim = *ffn;
    o->model.encoder_normalize_before = o->model.decoder_normalize_before = *pre_norm;
    AdviseWaitPolicy();
    KeepFreedMemory();
    ExitOnError(train::Train(*o));
  });
}

struct EvaluateFlags {
  std::string hyp;
  std::vector<std::string> refs;
};

void RunEvaluate(const EvaluateFlags& flags) {
  absl::StatusOr<std::vector<std::string>> hyps = data::ReadLines(flags.hyp);
  ExitOnError(hyps.status());
  std::vector<std::vector<std::string>> refs;
  for (const std::string& path : flags.refs) {
    // A TSV reference contributes its target column.
    std::vector<std::string> targets;
    absl::StatusOr<std::vector<std::string>> sources = data::ReadSources(path, &targets);
    ExitOnError(sources.status());
    const bool is_tsv = !targets.empty() && !targets.front().empty();
    refs.push_back(is_tsv ? targets : *sources);
  }
  absl::StatusOr<eval::BleuScore> bleu = eval::CorpusBleu(*hyps, refs);
  ExitOnError(bleu.status());
  absl::StatusOr<double> chrf = eval::CorpusChrf(*hyps, refs);
  ExitOnError(chrf.status());
  const int nrefs = static_cast<int>(refs.size());
  std::printf("%s\n", bleu->Format().c_str());
  std::printf("BLEU signature: %s\n", eval::BleuSignature({}, nrefs).c_str());
  std::printf("chrF2 = %.2f\n", *chrf);
  std::printf("chrF signature: %s\n", eval::ChrfSignature({}, nrefs).c_str());
}

void RegisterEvaluate(CLI::App& app) {
  auto flags = std::make_shared<EvaluateFlags>();
  CLI::App* cmd = app.add_subcommand("evaluate", "corpus BLEU (sacreBLEU 13a) and chrF");
  cmd->add_option("--hyp", flags->hyp, "hypotheses, one per line")->required();
  cmd->add_option("--ref", flags->refs, "references (plain or TSV target column); repeatable")
      ->required();
  cmd->callback([flags] { RunEvaluate(*flags); });
}

struct BenchFlags {
  std::string model_path;
  std::string tsv;
  int64_t sentences = 200;
  std::vector<int64_t> batch_sizes = {1, 16, 64};
  int beam = 5;
  int64_t feature_max_tokens = 4096;
  int threads = 2;
};

// Decoding speed at several batch sizes and teacher-forced feature extraction speed, printed
// as a Markdown table (docs/model.md).
void RunBench(const BenchFlags& flags) {
  AdviseWaitPolicy();
  KeepFreedMemory();
  at::set_num_threads(flags.threads);  // LibTorch defaults to 1 thread on these machines
  absl::StatusOr<model::LoadedModel> loaded = model::LoadCheckpoint(flags.model_path);
  ExitOnError(loaded.status());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = model::MakeTokenizer(*loaded);
  ExitOnError(tokenizer.status());
  absl::StatusOr<std::vector<data::SentencePair>> pairs = data::ReadTsv(flags.tsv, flags.sentences);
  ExitOnError(pairs.status());
  std::vector<std::string> sources;
  for (const auto& p : *pairs) sources.push_back(p.source);

  std::printf("| what | batch | beam | sentences | sentences/s | tokens/s |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (int64_t batch : flags.batch_sizes) {
    decode::SearchOptions search;
    search.beam_size = flags.beam;
    decode::TranslateStats stats;
    const absl::Time start = absl::Now();
    ExitOnError(decode::TranslateTexts(loaded->model, **tokenizer, sources, search, batch, &stats)
                    .status());
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    std::printf("| decode | %lld | %d | %lld | %.2f | %.1f |\n", static_cast<long long>(batch),
                flags.beam, static_cast<long long>(stats.sentences), stats.sentences / seconds,
                stats.generated_tokens / seconds);
    std::fflush(stdout);
  }
  absl::StatusOr<std::vector<train::Example>> examples = train::EncodePairs(
      **tokenizer, *pairs, loaded->model->config().max_target_positions - 1, 1, nullptr);
  ExitOnError(examples.status());
  torch::NoGradGuard no_grad;
  int64_t tokens = 0;
  const absl::Time start = absl::Now();
  for (const auto& indices : train::MakeBatches(*examples, flags.feature_max_tokens, 0)) {
    train::TensorBatch batch = train::Collate(*examples, indices, loaded->model->config().pad_id,
                                              loaded->model->config().eos_id);
    loaded->model->Decode(batch.prev_tokens, loaded->model->Encode(batch.src));
    tokens += batch.target_tokens;
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("| features (teacher-forced) | <=%lld tokens | - | %zu | %.2f | %.1f |\n",
              static_cast<long long>(flags.feature_max_tokens), examples->size(),
              examples->size() / seconds, tokens / seconds);
}

void RegisterBench(CLI::App& model) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* cmd = model.add_subcommand(
      "bench", "decoding tokens/s at several batch sizes and feature extraction tokens/s");
  cmd->add_option("--model", flags->model_path, "checkpoint (.pt)")->required();
  cmd->add_option("--tsv", flags->tsv, "source<TAB>target pairs")->required();
  cmd->add_option("--sentences", flags->sentences, "first N pairs")->capture_default_str();
  cmd->add_option("--batch-sizes", flags->batch_sizes)
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--beam", flags->beam)->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--feature-max-tokens", flags->feature_max_tokens, "tokens per feature batch")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--threads", flags->threads)->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->callback([flags] { RunBench(*flags); });
}

void RegisterModel(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("model", "inspect and export checkpoints");
  cmd->require_subcommand(1);
  auto in = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto fp16 = std::make_shared<bool>(false);
  CLI::App* export_cmd =
      cmd->add_subcommand("export", "write an inference checkpoint without trainer state");
  export_cmd->add_option("--checkpoint", *in)->required();
  export_cmd->add_option("--out", *out)->required();
  export_cmd->add_flag("--fp16", *fp16, "store parameters as float16");
  export_cmd->callback([in, out, fp16] {
    absl::StatusOr<model::LoadedModel> loaded = model::LoadCheckpoint(*in);
    ExitOnError(loaded.status());
    ExitOnError(model::SaveCheckpoint(*out, loaded->model, loaded->tokenizer, nullptr,
                                      *fp16 ? torch::kHalf : torch::kFloat, loaded->vocab));
  });
  RegisterBench(*cmd);
  CLI::App* info = cmd->add_subcommand("info", "print a checkpoint's config and sizes");
  info->add_option("--checkpoint", *in)->required();
  info->callback([in] {
    absl::StatusOr<model::LoadedModel> loaded = model::LoadCheckpoint(*in);
    ExitOnError(loaded.status());
    int64_t params = 0;
    for (const auto& [name, p] : loaded->model->UniqueNamedParameters()) params += p.numel();
    std::printf("%s\nparameters: %lld\ntokenizer: %zu bytes\ntrainer state: %s\n",
                loaded->model->config().ToJson().c_str(), static_cast<long long>(params),
                loaded->tokenizer.size(), loaded->trainer ? loaded->trainer->json.c_str() : "none");
  });
}

}  // namespace

void RegisterModelCommands(CLI::App& app) {
  RegisterTokenizer(app);
  RegisterTrain(app);
  RegisterEvaluate(app);
  RegisterModel(app);
}

}  // namespace knnserve::cli
