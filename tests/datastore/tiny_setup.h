// A tokenizer trained on tests/client/testdata/pairs50.tsv and two tiny seeded transformer
// checkpoints (the tokenizer embedded) shared by the model-based datastore tests. Built once
// per test binary run.
#ifndef KNNSERVE_TESTS_DATASTORE_TINY_SETUP_H_
#define KNNSERVE_TESTS_DATASTORE_TINY_SETUP_H_

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "client/model/checkpoint.h"
#include "client/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/client/test_models.h"
#include "tests/testing/temp_dir.h"

namespace knnserve::testing {

inline const char kPairs50[] = KNNSERVE_CLIENT_TESTDATA "/pairs50.tsv";

struct TinySetup {
  std::string tokenizer_path;
  std::string model_path;        // seed 7
  std::string other_model_path;  // seed 8: another model, same tokenizer
  std::unique_ptr<Tokenizer> tokenizer;
};

// Builds the shared setup on first use; a failure fails the calling test.
inline const TinySetup& Tiny() {
  static TinySetup* setup = [] {
    auto* s = new TinySetup;
    const std::filesystem::path dir = FreshTempDir("datastore_tiny");
    TokenizerTrainOptions options;
    options.tsv_path = kPairs50;
    options.model_prefix = (dir / "spm").string();
    options.vocab_size = 120;
    options.hard_vocab_limit = false;
    options.threads = 1;
    if (absl::Status st = TrainTokenizer(options); !st.ok()) {
      ADD_FAILURE() << st;
      return s;
    }
    s->tokenizer_path = options.model_prefix + ".model";
    s->tokenizer = *Tokenizer::Load(s->tokenizer_path);
    for (const uint64_t seed : {7, 8}) {
      model::TransformerConfig config = TinyConfig();
      config.src_vocab_size = config.tgt_vocab_size = s->tokenizer->vocab_size();
      torch::manual_seed(seed);
      model::TransformerModel model(config);
      model->eval();
      const std::string path = (dir / ("model" + std::to_string(seed) + ".pt")).string();
      if (absl::Status st =
              model::SaveCheckpoint(path, model, s->tokenizer->serialized(), nullptr);
          !st.ok()) {
        ADD_FAILURE() << st;
      }
      (seed == 7 ? s->model_path : s->other_model_path) = path;
    }
    return s;
  }();
  return *setup;
}

// Runs argv[0] with the arguments and returns the wait status.
inline int RunProcess(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  if (::posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), environ) != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

}  // namespace knnserve::testing

#endif  // KNNSERVE_TESTS_DATASTORE_TINY_SETUP_H_
