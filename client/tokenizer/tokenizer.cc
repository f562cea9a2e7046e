#include "client/tokenizer/tokenizer.h"

#include <dlfcn.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "client/data/parallel_corpus.h"
#include "client/tokenizer/sentencepiece_shim.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open tokenizer model ", path));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Where a helper file (the module, the training tool) may be: $<env_var>, next to the
// executable, ../lib of the executable, then where the build put it (`built`).
std::vector<std::string> HelperCandidates(const char* env_var, const std::string& name,
                                          const char* built) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv(env_var); env != nullptr && *env != 0) {
    candidates.push_back(env);
  }
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    candidates.push_back((exe.parent_path() / name).string());
    candidates.push_back((exe.parent_path().parent_path() / "lib" / name).string());
  }
  candidates.push_back(built);
  return candidates;
}

absl::StatusOr<std::string> FindTrainTool() {
  for (const std::string& path :
       HelperCandidates("KNNSERVE_SPM_TRAIN", "knnserve-spm-train", KNNSERVE_SPM_TRAIN_PATH)) {
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return absl::FailedPreconditionError(
      "cannot find the knnserve-spm-train tool (set KNNSERVE_SPM_TRAIN)");
}

// Runs `argv` and waits; an error unless it exits with status 0.
absl::Status RunTool(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  if (const int rc = ::posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), environ);
      rc != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": error ", rc));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return absl::InternalError(absl::StrCat("waitpid failed for ", argv[0]));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(argv[0], " failed (wait status ", status, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<const spm_shim::Library*> OpenLibrary() {
  std::string errors;
  for (const std::string& path :
       HelperCandidates("KNNSERVE_SPM_MODULE", "libknnserve_spm.so", KNNSERVE_SPM_MODULE_PATH)) {
    if (!std::filesystem::exists(path)) continue;
    // RTLD_DEEPBIND: SentencePiece must bind to its own bundled protobuf (see the shim header).
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle == nullptr) {
      absl::StrAppend(&errors, " ", ::dlerror());
      continue;
    }
    auto get =
        reinterpret_cast<spm_shim::GetLibraryFn>(::dlsym(handle, spm_shim::kGetLibrarySymbol));
    if (get == nullptr) {
      absl::StrAppend(&errors, " ", path, " lacks ", spm_shim::kGetLibrarySymbol);
      continue;
    }
    return get();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot load the SentencePiece module libknnserve_spm.so (set KNNSERVE_SPM_MODULE)", errors));
}

// Loaded once per process and never unloaded.
absl::StatusOr<const spm_shim::Library*> Library() {
  static const absl::StatusOr<const spm_shim::Library*> library = OpenLibrary();
  return library;
}

}  // namespace

absl::Status TrainTokenizer(const TokenizerTrainOptions& options) {
  if (options.model_prefix.empty() ||
      options.model_prefix.find_first_of(" \t") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer model prefix must be non-empty without spaces: '", options.model_prefix, "'"));
  }
  if (options.vocab_size < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab size must be >= 8, got ", options.vocab_size));
  }
  if (options.model_type != "unigram" && options.model_type != "bpe") {
    return absl::InvalidArgumentError(
        absl::StrCat("model type must be unigram or bpe, got ", options.model_type));
  }
  ASSIGN_OR_RETURN(std::vector<data::SentencePair> pairs, data::ReadTsv(options.tsv_path));
  if (pairs.empty()) return absl::InvalidArgumentError(absl::StrCat(options.tsv_path, " is empty"));
  std::vector<size_t> order(pairs.size());
  std::iota(order.begin(), order.end(), 0);
  if (options.sample_lines > 0 && static_cast<size_t>(options.sample_lines) < pairs.size()) {
    std::mt19937_64 rng(options.seed);
    std::shuffle(order.begin(), order.end(), rng);
    order.resize(options.sample_lines);
  }
  ASSIGN_OR_RETURN(const std::string tool, FindTrainTool());
  // Both sides of the sampled lines, one sentence per line, for the training tool.
  const std::string input_path = absl::StrCat(options.model_prefix, ".input.tmp");
  {
    std::ofstream input(input_path, std::ios::trunc);
    if (!input) return absl::InternalError(absl::StrCat("cannot write ", input_path));
    for (size_t i : order) input << pairs[i].source << "\n" << pairs[i].target << "\n";
    if (!input.flush()) return absl::InternalError(absl::StrCat("cannot write ", input_path));
  }
  const absl::Status status = RunTool(
      {tool, "--input=" + input_path, "--model_prefix=" + options.model_prefix,
       absl::StrCat("--vocab_size=", options.vocab_size), "--model_type=" + options.model_type,
       absl::StrCat("--character_coverage=", options.character_coverage),
       absl::StrCat("--bos_id=", Tokenizer::kBos), absl::StrCat("--pad_id=", Tokenizer::kPad),
       absl::StrCat("--eos_id=", Tokenizer::kEos), absl::StrCat("--unk_id=", Tokenizer::kUnk),
       absl::StrCat("--num_threads=", options.threads),
       absl::StrCat("--hard_vocab_limit=", options.hard_vocab_limit ? "true" : "false"),
       "--input_sentence_size=0", "--minloglevel=1"});
  std::filesystem::remove(input_path);
  RETURN_IF_ERROR(status);
  return absl::OkStatus();
}

Tokenizer::Tokenizer(std::string serialized, std::unique_ptr<spm_shim::Processor> processor,
                     Vocabulary vocab)
    : serialized_(std::move(serialized)),
      processor_(std::move(processor)),
      vocab_(std::move(vocab)) {
  for (size_t i = 0; i < vocab_.source.size(); ++i) {
    source_ids_.emplace(vocab_.source[i], static_cast<int>(i));  // first occurrence wins
  }
}

Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  ASSIGN_OR_RETURN(std::string serialized, ReadFile(path));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = FromSerialized(std::move(serialized));
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat("tokenizer ", path, ": ", tokenizer.status().message()));
  }
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromSerialized(std::string serialized,
                                                                     Vocabulary vocab) {
  ASSIGN_OR_RETURN(const spm_shim::Library* library, Library());
  std::unique_ptr<spm_shim::Processor> processor = library->NewProcessor();
  const std::string error = processor->LoadFromSerialized(serialized);
  if (!error.empty()) return absl::InvalidArgumentError(error);
  if (!vocab.empty()) {
    for (const auto* symbols : {&vocab.source, &vocab.target}) {
      if (symbols->size() < 4 || (*symbols)[kBos] != "<s>" || (*symbols)[kPad] != "<pad>" ||
          (*symbols)[kEos] != "</s>" || (*symbols)[kUnk] != "<unk>") {
        return absl::InvalidArgumentError(
            "model vocabulary must start with <s> <pad> </s> <unk> (fairseq's dictionary order)");
      }
    }
  } else if (processor->bos_id() != kBos || processor->pad_id() != kPad ||
             processor->eos_id() != kEos || processor->unk_id() != kUnk) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer special ids must be bos=0 pad=1 eos=2 unk=3 (fairseq's order), got bos=",
        processor->bos_id(), " pad=", processor->pad_id(), " eos=", processor->eos_id(),
        " unk=", processor->unk_id()));
  }
  return std::unique_ptr<Tokenizer>(
      new Tokenizer(std::move(serialized), std::move(processor), std::move(vocab)));
}

absl::StatusOr<std::vector<int>> Tokenizer::Encode(absl::string_view text) const {
  std::vector<int> ids;
  if (vocab_.empty()) {
    const std::string error = processor_->Encode(std::string(text), &ids);
    if (!error.empty()) return absl::InvalidArgumentError(error);
    return ids;
  }
  std::vector<std::string> pieces;
  const std::string error = processor_->EncodePieces(std::string(text), &pieces);
  if (!error.empty()) return absl::InvalidArgumentError(error);
  for (const std::string& piece : pieces) {
    auto it = source_ids_.find(piece);
    ids.push_back(it == source_ids_.end() ? kUnk : it->second);
  }
  return ids;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int> ids) const {
  std::vector<int> kept;
  kept.reserve(ids.size());
  for (int id : ids) {
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")"));
    }
    if (id != kPad && id != kBos && id != kEos) kept.push_back(id);
  }
  std::string text;
  std::string error;
  if (vocab_.empty()) {
    error = processor_->Decode(kept, &text);
  } else {
    std::vector<std::string> pieces;
    for (int id : kept) pieces.push_back(vocab_.target[id]);
    error = processor_->DecodePieces(pieces, &text);
  }
  if (!error.empty()) return absl::InvalidArgumentError(error);
  return text;
}

std::string Tokenizer::IdToPiece(int id) const {
  return vocab_.empty() ? processor_->IdToPiece(id) : vocab_.target.at(id);
}

int Tokenizer::vocab_size() const {
  return vocab_.empty() ? processor_->PieceSize() : static_cast<int>(vocab_.target.size());
}

}  // namespace knnserve
