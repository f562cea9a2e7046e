// Subcommands of the `knnserve` tool. Each module registers its own commands; the callbacks
// return the process exit code through CLI11's CLI::RuntimeError.
#ifndef KNNSERVE_CLIENT_CLI_COMMANDS_H_
#define KNNSERVE_CLIENT_CLI_COMMANDS_H_

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace knnserve::cli {

// Every Register* function adds one subcommand (with its own subcommands) to `app`.
// (Modules append their declarations here.)
// index build|search|info (client/cli/index_commands.cc).
void RegisterIndexCommands(CLI::App& app);
// tokenizer, train, evaluate, model (client/cli/model_commands.cc).
void RegisterModelCommands(CLI::App& app);
// translate --mode base|knn|subset-knn, tune (client/cli/knn_commands.cc).
void RegisterKnnCommands(CLI::App& app);
// datastore values|keys|sentence-keys|build (client/cli/datastore_commands.cc).
void RegisterDatastoreCommands(CLI::App& app);

// Shared by the command modules (client/cli/commands.cc).
// Prints a failed status as "error: <message>" and ends the command with exit code 1 (a
// CLI::RuntimeError that CLI11_PARSE turns into the exit code). Does nothing for OK.
void ExitOnError(const absl::Status& status);
// The value, or ExitOnError(its status).
template <typename T>
T ValueOrExit(absl::StatusOr<T> value) {
  ExitOnError(value.status());
  return *std::move(value);
}
// libgomp reads OMP_WAIT_POLICY when it is loaded, before main(): commands that run OpenMP
// work can only advise setting it (prints a note when it is unset).
void AdviseWaitPolicy();
// For commands that train or decode with LibTorch: glibc then serves the main thread's
// allocations from the heap and keeps freed memory (mallopt). Each training step allocates
// logits and their gradients of tokens x vocabulary floats (80 MB at 2,500 x 8,000); glibc's
// defaults unmap such chunks when freed and trim the heap, and the next step page-faults it all
// in again (7 million faults in 100 s of training on a 2-core VM, most of its time). The price:
// the process keeps its peak memory. Not for the index and datastore builds, whose multi-GB
// buffers would stay resident and fragment the heap. Each parameter the environment sets
// (GLIBC_TUNABLES, MALLOC_*_) is left as the user set it (SetMallocParameter).
void KeepFreedMemory();

}  // namespace knnserve::cli

#endif  // KNNSERVE_CLIENT_CLI_COMMANDS_H_
