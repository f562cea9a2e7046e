// `knnserve train`: trains the reference transformer on a parallel TSV.
//
// Label-smoothed cross-entropy, Adam with inverse-sqrt warm-up, token-bucketed batches,
// gradient clipping, periodic validation loss (and greedy BLEU on the first sentences of the
// validation set), atomic checkpoints every few minutes and at the end, and resumption from
// <out_dir>/checkpoint_last.pt (model, optimizer moments, step, epoch and position in the epoch;
// the dropout RNG is not restored). SIGINT/SIGTERM save a checkpoint before exiting.
#ifndef KNNSERVE_CLIENT_TRAIN_TRAINER_H_
#define KNNSERVE_CLIENT_TRAIN_TRAINER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "client/model/transformer_config.h"
#include "client/train/optimizer.h"

namespace knnserve::train {

struct TrainOptions {
  std::string train_tsv;
  std::string valid_tsv;       // optional
  std::string tokenizer_path;  // SentencePiece .model (embedded into every checkpoint)
  std::string out_dir;         // checkpoint_last.pt, train.log
  // Vocabulary sizes and special ids are taken from the tokenizer.
  model::TransformerConfig model;
  AdamOptions adam;
  double label_smoothing = 0.1;
  double clip_norm = 1.0;  // 0: no clipping
  int64_t max_tokens = 4096;
  int64_t max_len = 128;  // longer pairs are dropped
  int64_t max_steps = 0;  // 0: unlimited
  int64_t max_epochs = 0;
  double max_minutes = 0;  // wall-clock budget of this run; 0: unlimited
  double save_every_minutes = 5;
  int64_t valid_every_steps = 500;
  int64_t valid_bleu_sentences = 200;  // greedy BLEU on this many validation lines; 0: off
  int64_t log_every_steps = 50;
  // Forward passes under CPU autocast to bfloat16 (matmuls in bf16, master weights, loss and
  // optimizer in fp32): ~2-3x faster on CPUs with AVX512-BF16.
  bool bf16 = false;
  uint64_t seed = 1;
  int threads = 2;
};

// Trains until a limit is hit (or a signal arrives), then writes checkpoint_last.pt.
absl::Status Train(const TrainOptions& options);

}  // namespace knnserve::train

#endif  // KNNSERVE_CLIENT_TRAIN_TRAINER_H_
