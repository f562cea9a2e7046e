#include "common/adc/packed_lines.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <new>

namespace knnserve::adc_internal {
namespace {

size_t RoundUp(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

}  // namespace

// Huge allocations get a mapping of their own rather than heap memory: advice given to heap
// memory outlives the allocation. Once freed, glibc handed those advised ranges to LibTorch's
// tensors (this process keeps freed memory, KeepFreedMemory), and on this project's VMs the
// decoder's steps then ran ~20% slower (embedded kNN-MT with the search switched off, batch 64,
// one thread: 3.7 s of model time against 3.2 s for base MT, and 3.2 s without the advice).
void* AllocatePackedMemory(size_t bytes) {
  if (bytes < kHugePageBytes) {
    void* memory = nullptr;
    if (posix_memalign(&memory, alignof(PackedLine), RoundUp(bytes, alignof(PackedLine))) != 0) {
      throw std::bad_alloc();
    }
    return memory;
  }
  // Over-map by one huge page, then unmap what lies outside the aligned range.
  const size_t size = RoundUp(bytes, kHugePageBytes);
  void* mapped = mmap(nullptr, size + kHugePageBytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) throw std::bad_alloc();
  char* const start = static_cast<char*>(mapped);
  char* const aligned =
      reinterpret_cast<char*>(RoundUp(reinterpret_cast<uintptr_t>(start), kHugePageBytes));
  if (aligned > start) munmap(start, aligned - start);
  munmap(aligned + size, start + kHugePageBytes - aligned);
  // Advice, not a requirement: where transparent huge pages are off this fails harmlessly.
  madvise(aligned, size, MADV_HUGEPAGE);
  return aligned;
}

void FreePackedMemory(void* memory, size_t bytes) noexcept {
  if (memory == nullptr) return;
  if (bytes < kHugePageBytes) {
    std::free(memory);
  } else {
    munmap(memory, RoundUp(bytes, kHugePageBytes));
  }
}

}  // namespace knnserve::adc_internal
