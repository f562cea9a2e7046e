// Model checkpoints: one file, written with torch::pickle_save (a zip that Python's torch.load
// reads as a dict, and that the fairseq converter writes with torch.save):
//
//   {"format": "knnserve.transformer", "version": 1,
//    "config": <TransformerConfig JSON>,
//    "tokenizer": uint8 tensor (the SentencePiece .model bytes; may be empty),
//    "model": {fairseq parameter name: tensor} (a shared tensor is stored once, under its
//              first name, e.g. encoder.embed_tokens.weight),
//    "trainer": {"state": <JSON>, "tensors": {name: tensor}}   (training checkpoints only),
//    "vocab": {"source": [symbols], "target": [symbols]}        (converted fairseq models only)}
//
// Files are written atomically (temp file, fsync, rename, fsync of the directory): a crash
// leaves the previous checkpoint intact, never a half-written one.
#ifndef KNNSERVE_CLIENT_MODEL_CHECKPOINT_H_
#define KNNSERVE_CLIENT_MODEL_CHECKPOINT_H_

#include <torch/torch.h>

#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/model/transformer.h"
#include "client/tokenizer/tokenizer.h"

namespace knnserve::model {

// What a trainer needs to resume: free-form JSON (step, epoch, position) and named tensors
// (optimizer moments).
struct TrainerState {
  std::string json;
  std::map<std::string, torch::Tensor> tensors;
};

struct LoadedModel {
  TransformerModel model{nullptr};  // float32, CPU, eval mode
  std::string tokenizer;            // serialized SentencePiece model, "" if none stored
  Vocabulary vocab;                 // empty unless the model's ids are a fairseq dictionary's
  std::optional<TrainerState> trainer;
};

// The tokenizer stored with the model, mapping to the model's ids.
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const LoadedModel& loaded);

// Saves `model`'s parameters converted to `dtype` (kFloat or kHalf); `trainer` may be null.
absl::Status SaveCheckpoint(const std::string& path, TransformerModel& model,
                            const std::string& tokenizer, const TrainerState* trainer,
                            torch::Dtype dtype = torch::kFloat, const Vocabulary& vocab = {});

// Loads a checkpoint; every model parameter must be present with the right shape, and no
// unknown parameter may be present (the error names it).
absl::StatusOr<LoadedModel> LoadCheckpoint(const std::string& path);

}  // namespace knnserve::model

#endif  // KNNSERVE_CLIENT_MODEL_CHECKPOINT_H_
