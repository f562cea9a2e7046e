#include "common/adc/packed_lines.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace knnserve::adc_internal {
namespace {

size_t RoundUp(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

}  // namespace

void* AllocatePackedMemory(size_t bytes) {
  const bool huge = bytes >= kHugePageBytes;
  const size_t alignment = huge ? kHugePageBytes : alignof(PackedLine);
  const size_t size = RoundUp(bytes, alignment);
  void* memory = nullptr;
  if (posix_memalign(&memory, alignment, size) != 0) throw std::bad_alloc();
  // Advice, not a requirement: where transparent huge pages are off this fails harmlessly.
  if (huge) madvise(memory, size, MADV_HUGEPAGE);
  return memory;
}

void FreePackedMemory(void* memory) noexcept { std::free(memory); }

}  // namespace knnserve::adc_internal
