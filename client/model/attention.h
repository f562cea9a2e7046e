// Attention of a few queries per row over cached keys and values, the shape of incremental
// decoding (one query per hypothesis over its own cache; a beam's queries over their sentence's
// encoder states), computed on the CPU without a GEMM per (row, head).
//
// torch::matmul over [rows, heads, 1, k_len] runs one BLAS call per (row, head) — 1,280 of them
// per product for a beam of 5 over 64 sentences with 4 heads — each packing its operands first,
// for a product of 64 x k_len multiply-adds. This kernel reads each key and value once, in place
// (any strides but the innermost), and writes the result already merged across heads.
#ifndef KNNSERVE_CLIENT_MODEL_ATTENTION_H_
#define KNNSERVE_CLIENT_MODEL_ATTENTION_H_

#include <torch/torch.h>

#include <cstdint>

namespace knnserve::model {

// The most queries per row AttendFewQueries takes (beam sizes); beyond, GEMMs pay for themselves.
inline constexpr int64_t kMaxFewQueries = 16;

// Whether AttendFewQueries computes this attention: CPU float32 tensors that need no gradient;
// q [B, Lq, H, dh] with 1 <= Lq <= kMaxFewQueries; k and v [B, H, Lk, dh] with Lk >= 1 and unit
// stride along dh; key_padding_mask undefined or [B, Lk] bool.
bool CanAttendFewQueries(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const torch::Tensor& key_padding_mask);

// softmax(q kᵀ) v for every row, head and query, keys where key_padding_mask is true left out:
// q [B, Lq, H, dh] (already scaled), k and v [B, H, Lk, dh]. Returns [B, Lq, H * dh] (heads
// merged, as the output projection reads them). Equal to the matmul form up to float rounding; a
// query whose keys are all masked gets NaN, as softmax over −inf gives. Every output is computed
// from its own row in a fixed order: the same whatever the other rows and the thread count.
// REQUIRES: CanAttendFewQueries(q, k, v, key_padding_mask).
torch::Tensor AttendFewQueries(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& key_padding_mask);

}  // namespace knnserve::model

#endif  // KNNSERVE_CLIENT_MODEL_ATTENTION_H_
