// knnserve: the command-line tool for building datastores and indexes, training and running
// the NMT model, and translating with kNN-MT. Servers are separate executables
// (knnserve-shard, knnserve-router) that never link LibTorch.
#include <cstdio>

#include "CLI/CLI.hpp"
#include "client/cli/commands.h"
#include "common/process_init.h"

#ifndef KNNSERVE_VERSION
#define KNNSERVE_VERSION "unknown"
#endif

int main(int argc, char** argv) {
  knnserve::InitProcess(argv);
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
  // What a command printed to stdout (a table, search results, JSON) must have arrived: a
  // full disk or a closed pipe fails the command.
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fputs("knnserve: writing standard output failed\n", stderr);
    return 1;
  }
  return 0;
}
