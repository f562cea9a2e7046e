// Adam (fairseq's variant: bias-corrected step size, eps added to sqrt(v)) with fairseq's
// inverse-square-root schedule, and the label-smoothed cross-entropy criterion.
#ifndef KNNSERVE_CLIENT_TRAIN_OPTIMIZER_H_
#define KNNSERVE_CLIENT_TRAIN_OPTIMIZER_H_

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace knnserve::train {

struct AdamOptions {
  double lr = 7e-4;           // peak learning rate
  int64_t warmup_steps = 4000;
  double warmup_init_lr = 1e-7;
  double beta1 = 0.9;
  double beta2 = 0.98;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// lr(step): linear warm-up from warmup_init_lr to lr, then lr * sqrt(warmup / step).
double InverseSqrtLr(const AdamOptions& options, int64_t step);

// Thread-compatible. Parameters are identified by name (for checkpoints).
class Adam {
 public:
  Adam(std::vector<std::pair<std::string, torch::Tensor>> params, AdamOptions options);

  // One update with the gradients currently in the parameters; returns the lr used.
  double Step();
  void ZeroGrad();
  int64_t step() const { return step_; }

  // Moments as "exp_avg.<name>" / "exp_avg_sq.<name>" tensors.
  std::map<std::string, torch::Tensor> StateTensors() const;
  // Restores moments saved by StateTensors(); every parameter's moments must be present.
  absl::Status LoadState(const std::map<std::string, torch::Tensor>& tensors, int64_t step);

 private:
  struct Slot {
    std::string name;
    torch::Tensor param, exp_avg, exp_avg_sq;
  };
  std::vector<Slot> slots_;
  AdamOptions options_;
  int64_t step_ = 0;
};

struct LossSums {
  torch::Tensor loss;  // scalar: label-smoothed loss summed over non-pad tokens (nats)
  torch::Tensor nll;   // scalar: negative log-likelihood summed over non-pad tokens (nats)
};

// fairseq's label_smoothed_cross_entropy. logits [batch, len, V], target [batch, len].
LossSums LabelSmoothedLoss(const torch::Tensor& logits, const torch::Tensor& target,
                           int64_t pad_id, double epsilon);

}  // namespace knnserve::train

#endif  // KNNSERVE_CLIENT_TRAIN_OPTIMIZER_H_
