#include "client/model/attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace knnserve::model {
namespace {

// Independent partial sums, so that the compiler vectorizes the dot product without reordering
// a single sum (which it may not do for floats).
constexpr int64_t kLanes = 16;

float Dot(const float* a, const float* b, int64_t n) {
  float partial[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) partial[l] += a[i + l] * b[i + l];
  }
  for (int64_t l = 0; i < n; ++i, ++l) partial[l] += a[i] * b[i];
  float sum = 0.0f;
  for (const float p : partial) sum += p;
  return sum;
}

bool IsCpuFloat(const torch::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat &&
         !t.requires_grad();
}

}  // namespace

bool CanAttendFewQueries(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const torch::Tensor& key_padding_mask) {
  if (!IsCpuFloat(q) || !IsCpuFloat(k) || !IsCpuFloat(v)) return false;
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
  const int64_t batch = q.size(0), heads = q.size(2), head_dim = q.size(3);
  if (q.size(1) < 1 || q.size(1) > kMaxFewQueries) return false;
  if (k.sizes() != v.sizes() || k.size(0) != batch || k.size(1) != heads || k.size(2) < 1 ||
      k.size(3) != head_dim || k.stride(3) != 1 || v.stride(3) != 1) {
    return false;
  }
  if (key_padding_mask.defined()) {
    if (!key_padding_mask.device().is_cpu() || key_padding_mask.scalar_type() != torch::kBool ||
        key_padding_mask.dim() != 2 || key_padding_mask.size(0) != batch ||
        key_padding_mask.size(1) != k.size(2)) {
      return false;
    }
  }
  return true;
}

torch::Tensor AttendFewQueries(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& key_padding_mask) {
  const int64_t batch = q.size(0), queries = q.size(1), heads = q.size(2), head_dim = q.size(3);
  const int64_t keys = k.size(2);
  const torch::Tensor q_dense = q.contiguous();
  const torch::Tensor mask =
      key_padding_mask.defined() ? key_padding_mask.contiguous() : key_padding_mask;
  torch::Tensor out = torch::empty({batch, queries, heads * head_dim}, q.options());
  const float* q_data = q_dense.data_ptr<float>();
  const float* k_data = k.data_ptr<float>();
  const float* v_data = v.data_ptr<float>();
  const bool* padding = mask.defined() ? mask.data_ptr<bool>() : nullptr;
  float* out_data = out.data_ptr<float>();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // One task per (row, head): its keys and values stay in the caches for all its queries.
  at::parallel_for(0, batch * heads, /*grain_size=*/16, [&](int64_t begin, int64_t end) {
    std::vector<float> weights(keys);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / heads, h = task % heads;
      const float* row_k = k_data + b * k.stride(0) + h * k.stride(1);
      const float* row_v = v_data + b * v.stride(0) + h * v.stride(1);
      const bool* row_padding = padding != nullptr ? padding + b * keys : nullptr;
      for (int64_t i = 0; i < queries; ++i) {
        const float* query = q_data + ((b * queries + i) * heads + h) * head_dim;
        float top = kNegInf;
        for (int64_t j = 0; j < keys; ++j) {
          const bool masked = row_padding != nullptr && row_padding[j];
          weights[j] = masked ? kNegInf : Dot(query, row_k + j * k.stride(2), head_dim);
          top = std::max(top, weights[j]);
        }
        float total = 0.0f;
        for (int64_t j = 0; j < keys; ++j) {
          weights[j] = std::exp(weights[j] - top);
          total += weights[j];
        }
        float* result = out_data + (b * queries + i) * heads * head_dim + h * head_dim;
        std::fill(result, result + head_dim, 0.0f);
        for (int64_t j = 0; j < keys; ++j) {
          if (row_padding != nullptr && row_padding[j]) continue;
          const float w = weights[j];
          const float* value = row_v + j * v.stride(2);
          for (int64_t c = 0; c < head_dim; ++c) result[c] += w * value[c];
        }
        const float inverse = 1.0f / total;
        for (int64_t c = 0; c < head_dim; ++c) result[c] *= inverse;
      }
    }
  });
  return out;
}

}  // namespace knnserve::model
