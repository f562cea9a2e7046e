#include "client/train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace knnserve::train {

double InverseSqrtLr(const AdamOptions& o, int64_t step) {
  step = std::max<int64_t>(step, 1);
  if (step < o.warmup_steps) {
    return o.warmup_init_lr + (o.lr - o.warmup_init_lr) * static_cast<double>(step) /
                                  static_cast<double>(o.warmup_steps);
  }
  return o.lr * std::sqrt(static_cast<double>(std::max<int64_t>(o.warmup_steps, 1)) /
                          static_cast<double>(step));
}

Adam::Adam(std::vector<std::pair<std::string, torch::Tensor>> params, AdamOptions options)
    : options_(options) {
  for (auto& [name, param] : params) {
    slots_.push_back({name, param, torch::zeros_like(param), torch::zeros_like(param)});
  }
}

double Adam::Step() {
  torch::NoGradGuard no_grad;
  ++step_;
  const double lr = InverseSqrtLr(options_, step_);
  const double bias1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step_));
  const double bias2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step_));
  const double step_size = lr * std::sqrt(bias2) / bias1;
  for (Slot& slot : slots_) {
    const torch::Tensor& grad = slot.param.grad();
    if (!grad.defined()) continue;
    slot.exp_avg.mul_(options_.beta1).add_(grad, 1.0 - options_.beta1);
    slot.exp_avg_sq.mul_(options_.beta2).addcmul_(grad, grad, 1.0 - options_.beta2);
    if (options_.weight_decay != 0.0) slot.param.add_(slot.param, -options_.weight_decay * lr);
    slot.param.addcdiv_(slot.exp_avg, slot.exp_avg_sq.sqrt().add_(options_.eps), -step_size);
  }
  return lr;
}

void Adam::ZeroGrad() {
  for (Slot& slot : slots_) {
    if (slot.param.grad().defined()) slot.param.mutable_grad().zero_();
  }
}

std::map<std::string, torch::Tensor> Adam::StateTensors() const {
  std::map<std::string, torch::Tensor> tensors;
  for (const Slot& slot : slots_) {
    tensors["exp_avg." + slot.name] = slot.exp_avg;
    tensors["exp_avg_sq." + slot.name] = slot.exp_avg_sq;
  }
  return tensors;
}

absl::Status Adam::LoadState(const std::map<std::string, torch::Tensor>& tensors, int64_t step) {
  torch::NoGradGuard no_grad;
  for (Slot& slot : slots_) {
    for (auto [prefix, target] : {std::pair{"exp_avg.", &slot.exp_avg},
                                  std::pair{"exp_avg_sq.", &slot.exp_avg_sq}}) {
      auto it = tensors.find(prefix + slot.name);
      if (it == tensors.end() || it->second.sizes() != target->sizes()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer state lacks ", prefix, slot.name, " or has the wrong shape"));
      }
      target->copy_(it->second);
    }
  }
  step_ = step;
  return absl::OkStatus();
}

LossSums LabelSmoothedLoss(const torch::Tensor& logits, const torch::Tensor& target,
                           int64_t pad_id, double epsilon) {
  torch::Tensor lprobs = torch::log_softmax(logits.to(torch::kFloat), -1);
  const int64_t vocab = lprobs.size(-1);
  torch::Tensor mask = target.ne(pad_id);
  torch::Tensor nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1);
  torch::Tensor smooth = -lprobs.sum(-1);
  nll = nll.masked_fill(~mask, 0.0).sum();
  smooth = smooth.masked_fill(~mask, 0.0).sum();
  const double eps_i = epsilon / static_cast<double>(vocab - 1);
  return {(1.0 - epsilon - eps_i) * nll + eps_i * smooth, nll};
}

}  // namespace knnserve::train
