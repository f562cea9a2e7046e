#include "common/datastore/values_builder.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/datastore/hdf5_file.h"
#include "common/files.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

// One kept sentence while the corpus is read: 24 bytes.
struct SentenceRecord {
  int64_t line;
  int64_t spill_offset;  // in int32 elements: target tokens, then source tokens
  int32_t target_len;
  int32_t source_len;
};

// Token ids of kept sentences in corpus order, in a temporary file removed on destruction.
class SpillFile {
 public:
  static absl::StatusOr<std::unique_ptr<SpillFile>> Create(std::string path) {
    std::FILE* file = std::fopen(path.c_str(), "w+b");
    if (file == nullptr) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", path));
    }
    return std::unique_ptr<SpillFile>(new SpillFile(std::move(path), file));
  }
  ~SpillFile() {
    std::fclose(file_);
    std::remove(path_.c_str());
  }

  int64_t size() const { return size_; }
  absl::Status Append(const std::vector<int32_t>& ids) {
    if (std::fwrite(ids.data(), sizeof(int32_t), ids.size(), file_) != ids.size()) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path_));
    }
    size_ += static_cast<int64_t>(ids.size());
    return absl::OkStatus();
  }
  absl::Status FinishWriting() {
    if (std::fflush(file_) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("flush ", path_));
    return absl::OkStatus();
  }
  absl::Status Read(int64_t offset, int64_t n, int32_t* out) const {
    const size_t bytes = static_cast<size_t>(n) * sizeof(int32_t);
    const ssize_t got = ::pread(fileno(file_), out, bytes,
                                static_cast<off_t>(offset * static_cast<int64_t>(sizeof(int32_t))));
    if (got != static_cast<ssize_t>(bytes)) {
      return absl::DataLossError(absl::StrCat("short read from ", path_));
    }
    return absl::OkStatus();
  }

 private:
  SpillFile(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  const std::string path_;
  std::FILE* file_;
  int64_t size_ = 0;
};

// One corpus line after classification and tokenization.
struct TokenizedLine {
  absl::Status error;  // the tokenizer failed (not a corpus problem: fatal)
  bool bad = false;
  BadLineKind kind = BadLineKind::kMissingTab;
  std::vector<int32_t> target;  // ids + EOS
  std::vector<int32_t> source;
};

absl::StatusOr<std::vector<int32_t>> EncodeWithEos(const TokenizeFn& tokenize,
                                                   absl::string_view text, int64_t eos) {
  ASSIGN_OR_RETURN(std::vector<int> ids, tokenize(text));
  std::vector<int32_t> out(ids.begin(), ids.end());
  out.push_back(static_cast<int32_t>(eos));
  return out;
}

void TokenizeLine(const std::string& line, const ValuesBuildOptions& options,
                  const TokenizeFn& tokenize, TokenizedLine& out) {
  absl::StatusOr<std::pair<absl::string_view, absl::string_view>> sides =
      SplitCorpusLine(line, options.max_tokens * 64, &out.kind);
  if (!sides.ok()) {
    out.bad = true;
    return;
  }
  absl::StatusOr<std::vector<int32_t>> source =
      EncodeWithEos(tokenize, sides->first, options.tokenizer.eos_id);
  absl::StatusOr<std::vector<int32_t>> target =
      EncodeWithEos(tokenize, sides->second, options.tokenizer.eos_id);
  if (!source.ok() || !target.ok()) {
    out.error = source.ok() ? target.status() : source.status();
    return;
  }
  // A side of non-breaking spaces, zero-width or control characters passes the blank check
  // but normalizes to no token: its keys would teach "EOS first".
  if (source->size() == 1 || target->size() == 1) {
    out.bad = true;
    out.kind = BadLineKind::kEmptySide;
    return;
  }
  if (static_cast<int64_t>(source->size()) > options.max_tokens ||
      static_cast<int64_t>(target->size()) > options.max_tokens) {
    out.bad = true;
    out.kind = BadLineKind::kOverLong;
    return;
  }
  out.source = *std::move(source);
  out.target = *std::move(target);
}

void TokenizeBlock(const std::vector<std::string>& lines, const ValuesBuildOptions& options,
                   const TokenizeFn& tokenize, std::vector<TokenizedLine>& out) {
  out.assign(lines.size(), TokenizedLine());
  const int threads = std::max(1, std::min<int>(options.threads, static_cast<int>(lines.size())));
  auto work = [&](int t) {
    for (size_t i = t; i < lines.size(); i += threads) {
      TokenizeLine(lines[i], options, tokenize, out[i]);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& thread : pool) thread.join();
}

struct Pass1 {
  std::vector<SentenceRecord> records;
  int64_t lines = 0;
  BadLineReport bad;
};

// Reads, checks and tokenizes the corpus; kept sentences go to `spill`.
absl::StatusOr<Pass1> ReadCorpus(const ValuesBuildOptions& options, const TokenizeFn& tokenize,
                                 SpillFile& spill) {
  std::ifstream in(options.corpus_path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open corpus ", options.corpus_path));
  std::error_code ec;
  const auto file_bytes = std::filesystem::file_size(options.corpus_path, ec);
  ProgressBar progress("values: tokenize", ec ? 0 : static_cast<int64_t>(file_bytes), [&] {
    ProgressBar::Options o = options.progress;
    o.unit = "B";
    return o;
  }());
  Pass1 pass;
  std::vector<std::string> block;
  std::vector<TokenizedLine> tokenized;
  bool more = true;
  while (more) {
    block.clear();
    std::string line;
    int64_t block_bytes = 0;
    while (static_cast<int64_t>(block.size()) < options.block_lines) {
      if (!std::getline(in, line)) {
        more = false;
        break;
      }
      block_bytes += static_cast<int64_t>(line.size()) + 1;
      block.push_back(std::move(line));
    }
    if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", options.corpus_path));
    TokenizeBlock(block, options, tokenize, tokenized);
    for (size_t i = 0; i < block.size(); ++i, ++pass.lines) {
      TokenizedLine& t = tokenized[i];
      RETURN_IF_ERROR(t.error);
      if (t.bad) {
        const std::string what =
            absl::StrCat("line ", pass.lines + 1, ": ", BadLineKindName(t.kind));
        if (options.strict) {
          return absl::InvalidArgumentError(
              absl::StrCat(options.corpus_path, ": ", what, " (--strict)"));
        }
        ++pass.bad.counts[static_cast<int>(t.kind)];
        if (pass.bad.examples.size() < BadLineReport::kMaxExamples) {
          pass.bad.examples.push_back(what);
        }
        continue;
      }
      pass.records.push_back({pass.lines, spill.size(), static_cast<int32_t>(t.target.size()),
                              static_cast<int32_t>(t.source.size())});
      RETURN_IF_ERROR(spill.Append(t.target));
      RETURN_IF_ERROR(spill.Append(t.source));
    }
    progress.Add(block_bytes);
  }
  progress.Finish();
  RETURN_IF_ERROR(spill.FinishWriting());
  return pass;
}

// Buffers appends to one growing dataset and writes them a chunk at a time.
template <typename T>
class BufferedVector {
 public:
  BufferedVector(Hdf5File& file, std::string name, int64_t chunk)
      : file_(file), name_(std::move(name)), chunk_(chunk) {
    buffer_.reserve(static_cast<size_t>(chunk));
  }
  absl::Status Add(absl::Span<const T> data) {
    for (const T& v : data) buffer_.push_back(v);
    return static_cast<int64_t>(buffer_.size()) >= chunk_ ? Flush() : absl::OkStatus();
  }
  absl::Status Add(T value) { return Add(absl::Span<const T>(&value, 1)); }
  absl::Status Flush() {
    if (buffer_.empty()) return absl::OkStatus();
    absl::Status status;
    if constexpr (std::is_same_v<T, int32_t>) {
      status = file_.AppendInt32(name_, buffer_);
    } else {
      status = file_.AppendInt64(name_, buffer_);
    }
    buffer_.clear();
    return status;
  }

 private:
  Hdf5File& file_;
  const std::string name_;
  const int64_t chunk_;
  std::vector<T> buffer_;
};

absl::Status WriteAttributes(Hdf5File& file, const ValuesBuildOptions& options,
                             const std::string& corpus_sha256, const Pass1& pass) {
  const TokenizerInfo& t = options.tokenizer;
  RETURN_IF_ERROR(file.SetAttribute("format", absl::string_view(kValuesFormat)));
  RETURN_IF_ERROR(file.SetAttribute("version", kValuesVersion));
  RETURN_IF_ERROR(file.SetAttribute("vocab_size", t.vocab_size));
  RETURN_IF_ERROR(file.SetAttribute("bos_id", t.bos_id));
  RETURN_IF_ERROR(file.SetAttribute("pad_id", t.pad_id));
  RETURN_IF_ERROR(file.SetAttribute("eos_id", t.eos_id));
  RETURN_IF_ERROR(file.SetAttribute("unk_id", t.unk_id));
  RETURN_IF_ERROR(file.SetAttribute("tokenizer_sha256", absl::string_view(t.sha256)));
  RETURN_IF_ERROR(file.SetAttribute("corpus_sha256", absl::string_view(corpus_sha256)));
  RETURN_IF_ERROR(file.SetAttribute("corpus_lines", pass.lines));
  return file.SetAttribute("bad_lines", pass.bad.total());
}

// Writes the sentences sorted by length into `path`; fills the token counts of `report`.
absl::Status WriteSorted(const ValuesBuildOptions& options, const std::string& corpus_sha256,
                         Pass1& pass, const SpillFile& spill, const std::string& path,
                         ValuesReport& report) {
  std::sort(pass.records.begin(), pass.records.end(),
            [](const SentenceRecord& a, const SentenceRecord& b) {
              return std::tie(a.target_len, a.source_len, a.line) <
                     std::tie(b.target_len, b.source_len, b.line);
            });
  // A disk that fills while HDF5 writes leaves a file it can neither close nor forget
  // (Hdf5File::Close): the process then crashes as it exits. So the step fails first, with a
  // clear message, when the arrays would not fit uncompressed (what compression saves is not
  // known in advance; 4 bytes a token, far below the keys' that follow), plus what deflate can
  // add to incompressible chunks and room for HDF5's metadata.
  constexpr int64_t kHdf5OverheadBytes = int64_t{32} << 10;
  int64_t tokens_total = 0;
  for (const SentenceRecord& r : pass.records) tokens_total += r.target_len + r.source_len;
  const int64_t sentences = static_cast<int64_t>(pass.records.size());
  RETURN_IF_ERROR(CheckRoomFor(
      path, 4 * tokens_total + 8 * (3 * sentences + 2) + tokens_total / 64 + kHdf5OverheadBytes));
  ASSIGN_OR_RETURN(std::unique_ptr<Hdf5File> file, Hdf5File::Open(path, Hdf5File::Mode::kCreate));
  const int64_t chunk = options.chunk;
  for (const char* name : {"/tokens", "/src_tokens"}) {
    RETURN_IF_ERROR(file->CreateVector(name, Hdf5Type::kInt32, chunk, options.compress));
  }
  for (const char* name : {"/offsets", "/src_offsets", "/order"}) {
    RETURN_IF_ERROR(file->CreateVector(name, Hdf5Type::kInt64, chunk, options.compress));
  }
  BufferedVector<int32_t> tokens(*file, "/tokens", chunk), src_tokens(*file, "/src_tokens", chunk);
  BufferedVector<int64_t> offsets(*file, "/offsets", chunk),
      src_offsets(*file, "/src_offsets", chunk), order(*file, "/order", chunk);
  int64_t target_end = 0, source_end = 0;
  RETURN_IF_ERROR(offsets.Add(target_end));
  RETURN_IF_ERROR(src_offsets.Add(source_end));
  ProgressBar progress("values: write", static_cast<int64_t>(pass.records.size()), [&] {
    ProgressBar::Options o = options.progress;
    o.unit = "sentences";
    return o;
  }());
  std::vector<int32_t> ids;
  for (const SentenceRecord& r : pass.records) {
    ids.resize(r.target_len + r.source_len);
    RETURN_IF_ERROR(spill.Read(r.spill_offset, static_cast<int64_t>(ids.size()), ids.data()));
    const absl::Span<const int32_t> all(ids);
    RETURN_IF_ERROR(tokens.Add(all.subspan(0, r.target_len)));
    RETURN_IF_ERROR(src_tokens.Add(all.subspan(r.target_len)));
    target_end += r.target_len;
    source_end += r.source_len;
    RETURN_IF_ERROR(offsets.Add(target_end));
    RETURN_IF_ERROR(src_offsets.Add(source_end));
    RETURN_IF_ERROR(order.Add(r.line));
    progress.Add(1);
  }
  progress.Finish();
  RETURN_IF_ERROR(tokens.Flush());
  RETURN_IF_ERROR(src_tokens.Flush());
  for (BufferedVector<int64_t>* v : {&offsets, &src_offsets, &order}) {
    RETURN_IF_ERROR(v->Flush());
  }
  RETURN_IF_ERROR(WriteAttributes(*file, options, corpus_sha256, pass));
  RETURN_IF_ERROR(file->Close());
  report.target_tokens = target_end;
  report.source_tokens = source_end;
  return absl::OkStatus();
}

}  // namespace

const char* BadLineKindName(BadLineKind kind) {
  switch (kind) {
    case BadLineKind::kMissingTab:
      return "missing tab";
    case BadLineKind::kExtraTab:
      return "more than one tab";
    case BadLineKind::kEmptySide:
      return "empty side";
    case BadLineKind::kInvalidUtf8:
      return "invalid UTF-8";
    case BadLineKind::kOverLong:
      return "over-long";
  }
  return "?";
}

bool IsValidUtf8(absl::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

absl::StatusOr<std::pair<absl::string_view, absl::string_view>> SplitCorpusLine(
    absl::string_view line, int64_t max_bytes, BadLineKind* kind) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  auto bad = [&](BadLineKind k) {
    *kind = k;
    return absl::InvalidArgumentError(BadLineKindName(k));
  };
  const size_t tab = line.find('\t');
  if (tab == absl::string_view::npos) return bad(BadLineKind::kMissingTab);
  if (line.find('\t', tab + 1) != absl::string_view::npos) return bad(BadLineKind::kExtraTab);
  if (!IsValidUtf8(line)) return bad(BadLineKind::kInvalidUtf8);
  if (static_cast<int64_t>(line.size()) > max_bytes) return bad(BadLineKind::kOverLong);
  absl::string_view source = line.substr(0, tab);
  absl::string_view target = line.substr(tab + 1);
  auto blank = [](absl::string_view s) {
    return s.find_first_not_of(" \t\r\n\f\v") == absl::string_view::npos;
  };
  if (blank(source) || blank(target)) return bad(BadLineKind::kEmptySide);
  return std::make_pair(source, target);
}

int64_t BadLineReport::total() const {
  int64_t sum = 0;
  for (const int64_t c : counts) sum += c;
  return sum;
}

std::string BadLineReport::Summary() const {
  if (total() == 0) return "no bad lines";
  std::vector<std::string> parts;
  for (int k = 0; k < kNumBadLineKinds; ++k) {
    if (counts[k] > 0) {
      parts.push_back(absl::StrCat(BadLineKindName(static_cast<BadLineKind>(k)), " ", counts[k]));
    }
  }
  return absl::StrCat(total(), " bad lines skipped (", absl::StrJoin(parts, ", "),
                      "); first: ", absl::StrJoin(examples, "; "));
}

absl::StatusOr<ValuesReport> BuildValues(const ValuesBuildOptions& options,
                                         const TokenizeFn& tokenize) {
  if (options.tokenizer.vocab_size <= 0 || options.tokenizer.sha256.empty()) {
    return absl::InvalidArgumentError("values: the tokenizer's vocab size and sha256 are needed");
  }
  if (options.max_tokens < 2) return absl::InvalidArgumentError("values: max_tokens must be >= 2");
  ASSIGN_OR_RETURN(const FileDigest corpus, DigestFile(options.corpus_path));
  const std::string partial = PartialPath(options.out_path);
  ASSIGN_OR_RETURN(std::unique_ptr<SpillFile> spill,
                   SpillFile::Create(TemporaryPath(options.out_path + ".spill")));
  ASSIGN_OR_RETURN(Pass1 pass, ReadCorpus(options, tokenize, *spill));
  if (pass.records.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.corpus_path, ": no usable sentence pair (", pass.bad.Summary(), ")"));
  }
  ValuesReport report;
  report.corpus_lines = pass.lines;
  report.sentences = static_cast<int64_t>(pass.records.size());
  report.bad = pass.bad;
  RETURN_IF_ERROR(WriteSorted(options, corpus.sha256, pass, *spill, partial, report));
  RETURN_IF_ERROR(PublishFile(partial, options.out_path));
  ASSIGN_OR_RETURN(report.digest, DigestFile(options.out_path));
  return report;
}

}  // namespace knnserve
