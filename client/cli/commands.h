// Subcommands of the `knnserve` tool. Each module registers its own commands; the callbacks
// return the process exit code through CLI11's CLI::RuntimeError.
#ifndef KNNSERVE_CLIENT_CLI_COMMANDS_H_
#define KNNSERVE_CLIENT_CLI_COMMANDS_H_

#include "CLI/CLI.hpp"

namespace knnserve::cli {

// Every Register* function adds one subcommand (with its own subcommands) to `app`.
// (Modules append their declarations here.)
// index build|search|info (client/cli/index_commands.cc).
void RegisterIndexCommands(CLI::App& app);
// tokenizer, train, translate, evaluate, model (client/cli/model_commands.cc).
void RegisterModelCommands(CLI::App& app);
// translate --mode base|knn|subset-knn, tune (client/cli/knn_commands.cc); after the above.
void RegisterKnnCommands(CLI::App& app);
// datastore values|keys|sentence-keys|build (client/cli/datastore_commands.cc).
void RegisterDatastoreCommands(CLI::App& app);

}  // namespace knnserve::cli

#endif  // KNNSERVE_CLIENT_CLI_COMMANDS_H_
