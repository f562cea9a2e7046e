// Storage of packed code blocks, which the quantized scans stream through: a block is m lines of
// kAdcBlock code bytes, one line per sub-quantizer. Internal to common/adc.
#ifndef KNNSERVE_COMMON_ADC_PACKED_LINES_H_
#define KNNSERVE_COMMON_ADC_PACKED_LINES_H_

#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/adc/adc_kernels.h"

namespace knnserve::adc_internal {

// One sub-quantizer's kAdcBlock code bytes of a packed block.
struct alignas(64) PackedLine {
  uint8_t bytes[kAdcBlock];
};

// Memory of at least `bytes` bytes, aligned to 64 bytes; from kHugePageBytes on, a mapping of its
// own, aligned to and advised for transparent huge pages. With 4 KiB pages a block of 64 lines is a
// page of its own, and the hardware prefetcher stops at every page boundary: huge pages let a scan
// of a subset larger than the caches read 14 GB/s instead of 12 (one thread, 256 MiB). Throws
// std::bad_alloc. Release with FreePackedMemory, passing the same `bytes`.
void* AllocatePackedMemory(size_t bytes);
void FreePackedMemory(void* memory, size_t bytes) noexcept;
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

template <typename T>
struct PackedAllocator {
  using value_type = T;
  PackedAllocator() = default;
  template <typename U>
  PackedAllocator(const PackedAllocator<U>&) {}  // NOLINT: rebinding converts implicitly
  T* allocate(size_t n) { return static_cast<T*>(AllocatePackedMemory(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { FreePackedMemory(p, n * sizeof(T)); }
  // Packed lines are written in full by the packing before anything reads them: resize leaves
  // them unset, where value-initialising them cost a memset of every packed subset (and the page
  // faults of its first touch, before the packing's own). Everything else is value-initialised.
  template <typename U>
  void construct(U* p) {
    if constexpr (std::is_same_v<U, PackedLine>) {
      ::new (static_cast<void*>(p)) U;
    } else {
      ::new (static_cast<void*>(p)) U();
    }
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <typename U>
  bool operator==(const PackedAllocator<U>&) const {
    return true;
  }
};

using PackedLines = std::vector<PackedLine, PackedAllocator<PackedLine>>;

// Scratch that SIMD kernels read or write 64 bytes at a time (lookup tables, biases): aligned,
// so that no access straddles two cache lines. The scan loads a table's four 64-byte quarters
// per sub-quantizer and block; at an address 16 bytes past a line every load took two, and the
// IVF-PQ scan ran 1.4x slower (59 vs 42 ms for 64 rows of a 1M x 512 index) on whichever
// thread's allocator happened to place its table so.
template <typename T>
using AlignedVector = std::vector<T, PackedAllocator<T>>;

}  // namespace knnserve::adc_internal

#endif  // KNNSERVE_COMMON_ADC_PACKED_LINES_H_
