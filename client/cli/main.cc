// knnserve: the command-line tool for building datastores and indexes, training and running
// the NMT model, and translating with kNN-MT. Servers are separate executables
// (knnserve-shard, knnserve-router) that never link LibTorch.
#include <malloc.h>

#include <cstdio>

#include "CLI/CLI.hpp"
#include "client/cli/commands.h"

#ifndef KNNSERVE_VERSION
#define KNNSERVE_VERSION "unknown"
#endif

// Training and decoding allocate and free tensors of megabytes at every step (logits and their
// gradients: 80 MB at 2,500 tokens x 8,000 types; log-probabilities; reordered caches). With
// glibc's defaults the largest are mmap'ed and unmapped, the rest trimmed off the heap, and the
// next step page-faults all of it in again: 7 million faults in 100 s of training on the 2-core
// VM, about two thirds of its time. Serve every allocation from the heap and keep what is freed.
void KeepFreedMemory() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
}

int main(int argc, char** argv) {
  KeepFreedMemory();
  CLI::App app{"knnserve " KNNSERVE_VERSION
               ": kNN machine translation with a sharded retrieval service"};
  app.set_version_flag("--version", KNNSERVE_VERSION);
  app.require_subcommand(1);
  // Modules register their subcommands here, one call each.
  knnserve::cli::RegisterIndexCommands(app);
  knnserve::cli::RegisterModelCommands(app);
  knnserve::cli::RegisterKnnCommands(app);
  knnserve::cli::RegisterDatastoreCommands(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
