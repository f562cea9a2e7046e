#include "common/heap.h"

#include <malloc.h>

namespace knnserve {

void ReturnFreedHeapMemory() { malloc_trim(0); }

}  // namespace knnserve
