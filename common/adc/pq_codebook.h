// The codebook of an 8-bit product quantizer: what the subset ADC engine needs from the
// quantizer faiss trained (faiss::ProductQuantizer's centroid layout, without faiss).
#ifndef KNNSERVE_COMMON_ADC_PQ_CODEBOOK_H_
#define KNNSERVE_COMMON_ADC_PQ_CODEBOOK_H_

#include <cstdint>
#include <vector>

namespace knnserve {

struct PqCodebook {
  static constexpr int kCentroids = 256;  // 8-bit codes

  int m = 0;     // sub-quantizers = code bytes per vector
  int dsub = 0;  // dimensions per sub-vector; the quantized dimension is m * dsub
  // m x kCentroids x dsub, row-major (faiss's ProductQuantizer::centroids layout).
  std::vector<float> centroids;

  int dim() const { return m * dsub; }
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_ADC_PQ_CODEBOOK_H_
