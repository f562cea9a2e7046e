#include "common/datastore/values_file.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/datastore/hdf5_file.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

const char* TokensName(ValuesSide side) {
  return side == ValuesSide::kTarget ? "/tokens" : "/src_tokens";
}

const char* OffsetsName(ValuesSide side) {
  return side == ValuesSide::kTarget ? "/offsets" : "/src_offsets";
}

// Errors of the validation, which knows no file, name it here.
absl::Status WithPath(const std::string& path, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
}

absl::StatusOr<std::vector<int64_t>> ReadOffsets(const Hdf5File& file, ValuesSide side) {
  ASSIGN_OR_RETURN(std::vector<int64_t> offsets, file.ReadInt64(OffsetsName(side)));
  // The tokens' count from the dataset's shape: the tokens themselves stay on disk.
  ASSIGN_OR_RETURN(const auto shape, file.Shape(TokensName(side)));
  RETURN_IF_ERROR(WithPath(
      file.path(), ValidateOffsets(offsets, shape.first, OffsetsName(side), TokensName(side))));
  return offsets;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ValuesReader>> ValuesReader::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<Hdf5File> file, Hdf5File::Open(path, Hdf5File::Mode::kReadOnly));
  ASSIGN_OR_RETURN(const std::string format, file->GetStringAttribute("format"));
  if (format != kValuesFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": format is \"", format, "\", expected \"", kValuesFormat, "\""));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> target, ReadOffsets(*file, ValuesSide::kTarget));
  ASSIGN_OR_RETURN(std::vector<int64_t> source, ReadOffsets(*file, ValuesSide::kSource));
  ASSIGN_OR_RETURN(std::vector<int64_t> order, file->ReadInt64("/order"));
  std::unique_ptr<ValuesReader> reader(
      new ValuesReader(std::move(file), std::move(target), std::move(source), std::move(order)));
  RETURN_IF_ERROR(reader->ReadAttributes());
  RETURN_IF_ERROR(WithPath(path, reader->Validate()));
  return reader;
}

ValuesReader::ValuesReader(std::unique_ptr<Hdf5File> file, std::vector<int64_t> target_offsets,
                           std::vector<int64_t> source_offsets, std::vector<int64_t> order)
    : file_(std::move(file)),
      target_offsets_(std::move(target_offsets)),
      source_offsets_(std::move(source_offsets)),
      order_(std::move(order)) {}

ValuesReader::~ValuesReader() = default;

const std::string& ValuesReader::path() const { return file_->path(); }

const std::vector<int64_t>& ValuesReader::offsets(ValuesSide side) const {
  return side == ValuesSide::kTarget ? target_offsets_ : source_offsets_;
}

absl::Status ValuesReader::ReadAttributes() {
  ASSIGN_OR_RETURN(tokenizer_.vocab_size, file_->GetIntAttribute("vocab_size"));
  ASSIGN_OR_RETURN(tokenizer_.bos_id, file_->GetIntAttribute("bos_id"));
  ASSIGN_OR_RETURN(tokenizer_.pad_id, file_->GetIntAttribute("pad_id"));
  ASSIGN_OR_RETURN(tokenizer_.eos_id, file_->GetIntAttribute("eos_id"));
  ASSIGN_OR_RETURN(tokenizer_.unk_id, file_->GetIntAttribute("unk_id"));
  ASSIGN_OR_RETURN(tokenizer_.sha256, file_->GetStringAttribute("tokenizer_sha256"));
  ASSIGN_OR_RETURN(corpus_sha256_, file_->GetStringAttribute("corpus_sha256"));
  ASSIGN_OR_RETURN(corpus_lines_, file_->GetIntAttribute("corpus_lines"));
  ASSIGN_OR_RETURN(bad_lines_, file_->GetIntAttribute("bad_lines"));
  return absl::OkStatus();
}

absl::Status ValuesReader::Validate() const {
  const int64_t source_sentences = static_cast<int64_t>(source_offsets_.size()) - 1;
  if (source_sentences != num_sentences() ||
      static_cast<int64_t>(order_.size()) != num_sentences()) {
    return absl::InvalidArgumentError(absl::StrCat("/offsets has ", num_sentences(),
                                                   " sentences, /src_offsets ", source_sentences,
                                                   ", /order ", order_.size()));
  }
  absl::flat_hash_set<int64_t> lines;
  lines.reserve(order_.size());
  for (const int64_t line : order_) {
    if (line < 0) return absl::InvalidArgumentError(absl::StrCat("/order holds line ", line));
    if (!lines.insert(line).second) {
      return absl::InvalidArgumentError(absl::StrCat("/order holds line ", line, " twice"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DatastoreValues> ValuesReader::ReadSentences(ValuesSide side, int64_t begin,
                                                            int64_t end) const {
  if (begin < 0 || end < begin || end > num_sentences()) {
    return absl::OutOfRangeError(absl::StrCat(path(), ": sentences [", begin, ", ", end,
                                              ") are not within [0, ", num_sentences(), ")"));
  }
  const std::vector<int64_t>& all = offsets(side);
  DatastoreValues values;
  ASSIGN_OR_RETURN(values.tokens, file_->ReadInt32(TokensName(side), all[begin], all[end]));
  values.offsets.assign(all.begin() + begin, all.begin() + end + 1);
  for (int64_t& o : values.offsets) o -= all[begin];
  RETURN_IF_ERROR(CheckIds(side, all[begin], values.tokens));
  return values;
}

absl::Status ValuesReader::ReadTokens(ValuesSide side, int64_t begin, int64_t end,
                                      int32_t* out) const {
  ASSIGN_OR_RETURN(const std::vector<int32_t> tokens,
                   file_->ReadInt32(TokensName(side), begin, end));
  RETURN_IF_ERROR(CheckIds(side, begin, tokens));
  std::copy(tokens.begin(), tokens.end(), out);
  return absl::OkStatus();
}

// Only the tokens just read are checked: a streamed pass validates each range as it reads it.
absl::Status ValuesReader::CheckIds(ValuesSide side, int64_t token_begin,
                                    absl::Span<const int32_t> tokens) const {
  const int64_t vocab_size = tokenizer_.vocab_size;
  const auto bad = std::find_if(tokens.begin(), tokens.end(),
                                [&](int32_t id) { return id < 0 || id >= vocab_size; });
  if (bad == tokens.end()) return absl::OkStatus();
  const int64_t i = token_begin + (bad - tokens.begin());
  // The sentence holding token i: the last one whose offset is <= i.
  const std::vector<int64_t>& all = offsets(side);
  const int64_t s = std::upper_bound(all.begin(), all.end(), i) - all.begin() - 1;
  return absl::InvalidArgumentError(
      absl::StrCat(path(), ": ", TokensName(side), " of sentence ", s, " (corpus line ",
                   order_[s] + 1, ") holds token id ", *bad, " at position ", i - all[s],
                   ", outside the vocabulary [0, ", vocab_size, ")"));
}

absl::StatusOr<ValuesFile> ReadValuesFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::unique_ptr<ValuesReader> reader, ValuesReader::Open(path));
  ValuesFile values;
  ASSIGN_OR_RETURN(values.target, reader->ReadAll(ValuesSide::kTarget));
  ASSIGN_OR_RETURN(values.source, reader->ReadAll(ValuesSide::kSource));
  values.order = reader->order();
  values.tokenizer = reader->tokenizer();
  values.corpus_sha256 = reader->corpus_sha256();
  values.corpus_lines = reader->corpus_lines();
  values.bad_lines = reader->bad_lines();
  return values;
}

}  // namespace knnserve
