#include "common/datastore/values_file.h"

#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/datastore/hdf5_file.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

absl::Status CheckIds(const std::vector<int32_t>& tokens, int64_t vocab_size, const char* dataset) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          dataset, "[", i, "] = ", tokens[i], " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Validate(const ValuesFile& values) {
  RETURN_IF_ERROR(values.target.Validate());
  RETURN_IF_ERROR(values.source.Validate());
  const int64_t sentences = values.num_sentences();
  if (values.source.num_sentences() != sentences ||
      static_cast<int64_t>(values.order.size()) != sentences) {
    return absl::InvalidArgumentError(
        absl::StrCat("/offsets has ", sentences, " sentences, /src_offsets ",
                     values.source.num_sentences(), ", /order ", values.order.size()));
  }
  absl::flat_hash_set<int64_t> lines;
  for (const int64_t line : values.order) {
    if (line < 0 || !lines.insert(line).second) {
      return absl::InvalidArgumentError(absl::StrCat("/order holds line ", line, " twice"));
    }
  }
  RETURN_IF_ERROR(CheckIds(values.target.tokens, values.tokenizer.vocab_size, "/tokens"));
  return CheckIds(values.source.tokens, values.tokenizer.vocab_size, "/src_tokens");
}

}  // namespace

absl::StatusOr<ValuesFile> ReadValuesFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<Hdf5File> file, Hdf5File::Open(path, Hdf5File::Mode::kReadOnly));
  ASSIGN_OR_RETURN(const std::string format, file->GetStringAttribute("format"));
  if (format != kValuesFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": format is \"", format, "\", expected \"", kValuesFormat, "\""));
  }
  ValuesFile values;
  ASSIGN_OR_RETURN(values.target.tokens, file->ReadInt32("/tokens"));
  ASSIGN_OR_RETURN(values.target.offsets, file->ReadInt64("/offsets"));
  ASSIGN_OR_RETURN(values.source.tokens, file->ReadInt32("/src_tokens"));
  ASSIGN_OR_RETURN(values.source.offsets, file->ReadInt64("/src_offsets"));
  ASSIGN_OR_RETURN(values.order, file->ReadInt64("/order"));
  TokenizerInfo& t = values.tokenizer;
  ASSIGN_OR_RETURN(t.vocab_size, file->GetIntAttribute("vocab_size"));
  ASSIGN_OR_RETURN(t.bos_id, file->GetIntAttribute("bos_id"));
  ASSIGN_OR_RETURN(t.pad_id, file->GetIntAttribute("pad_id"));
  ASSIGN_OR_RETURN(t.eos_id, file->GetIntAttribute("eos_id"));
  ASSIGN_OR_RETURN(t.unk_id, file->GetIntAttribute("unk_id"));
  ASSIGN_OR_RETURN(t.sha256, file->GetStringAttribute("tokenizer_sha256"));
  ASSIGN_OR_RETURN(values.corpus_sha256, file->GetStringAttribute("corpus_sha256"));
  ASSIGN_OR_RETURN(values.corpus_lines, file->GetIntAttribute("corpus_lines"));
  ASSIGN_OR_RETURN(values.bad_lines, file->GetIntAttribute("bad_lines"));
  if (absl::Status s = Validate(values); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return values;
}

}  // namespace knnserve
