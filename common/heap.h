// The process's heap memory, where a loaded index's footprint depends on it.
#ifndef KNNSERVE_COMMON_HEAP_H_
#define KNNSERVE_COMMON_HEAP_H_

#include <vector>

namespace knnserve {

// Frees `v`'s buffer now (`v = {}` or clear() would keep its capacity allocated).
template <typename T>
void FreeVector(std::vector<T>& v) {
  std::vector<T>().swap(v);
}

// Returns the free memory of malloc's heaps to the system (glibc's malloc_trim). glibc gives back
// only the top of a heap, so memory freed below stays resident: loading a shard frees faiss's
// inverted lists one by one as they are repacked elsewhere, and without this the shard would
// hold twice its size (the CLI, which keeps freed memory for the model's tensors, even more).
// Costs a walk over the heaps' free chunks: call it after freeing tens of MiB, not per list.
void ReturnFreedHeapMemory();

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_HEAP_H_
