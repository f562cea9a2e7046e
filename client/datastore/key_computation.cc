#include "client/datastore/key_computation.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/datastore/batch_plan.h"
#include "common/datastore/keys_file.h"
#include "common/files.h"
#include "common/status_macros.h"

namespace knnserve::datastore {
namespace {

constexpr ValuesSide kSource = ValuesSide::kSource;
constexpr ValuesSide kTarget = ValuesSide::kTarget;

// Padded length each sentence needs in a batch of `kind`.
std::vector<int64_t> BatchLengths(const ValuesReader& values, KeyKind kind) {
  std::vector<int64_t> lengths(values.num_sentences());
  for (int64_t s = 0; s < values.num_sentences(); ++s) {
    lengths[s] = kind == KeyKind::kSentences
                     ? values.Length(kSource, s)
                     : std::max(values.Length(kSource, s), values.Length(kTarget, s));
  }
  return lengths;
}

std::vector<int64_t> Lengths(const ValuesReader& values, ValuesSide side) {
  std::vector<int64_t> lengths(values.num_sentences());
  for (int64_t s = 0; s < values.num_sentences(); ++s) lengths[s] = values.Length(side, s);
  return lengths;
}

absl::Status CheckLengths(const ValuesReader& values, const FeatureExtractor& extractor) {
  for (int64_t s = 0; s < values.num_sentences(); ++s) {
    const int64_t source = values.Length(kSource, s);
    const int64_t target = values.Length(kTarget, s);
    if (source > extractor.max_source_length() || target > extractor.max_target_length()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sentence ", s, " (corpus line ", values.order()[s] + 1, ") has ", source,
                       " source and ", target, " target tokens; the model accepts at most ",
                       extractor.max_source_length(), " and ", extractor.max_target_length(),
                       " (rebuild the values with a lower --max-tokens)"));
    }
  }
  return absl::OkStatus();
}

// First row of every batch, and the batch that starts at `row` (DATA_LOSS if none does).
absl::StatusOr<size_t> BatchStartingAt(const std::vector<Batch>& batches,
                                       const std::vector<int64_t>& first_row, int64_t row,
                                       int64_t total_rows) {
  if (row == total_rows) return batches.size();
  auto it = std::lower_bound(first_row.begin(), first_row.end(), row);
  if (it == first_row.end() || *it != row) {
    return absl::DataLossError(
        absl::StrCat("the partial key file's rows_completed ", row,
                     " is not at a batch boundary of this run's batch plan"));
  }
  return static_cast<size_t>(it - first_row.begin());
}

// Serves the batches of a plan from windows of consecutive batches read from values.h5, one read
// per side per window. Reading each batch alone would inflate a whole compressed HDF5 chunk (2^18
// tokens by default) per batch and side, as Hdf5File keeps no dataset, and so no chunk cache,
// open between reads: with h5py on such a 20M-token dataset, 4096-token reads that reopen the
// dataset took ~6 ms each, 30x the whole dataset's read time in total.
class WindowedBatches {
 public:
  WindowedBatches(const ValuesReader& values, const std::vector<Batch>& batches,
                  int64_t window_tokens)
      : values_(values), batches_(batches), window_tokens_(window_tokens) {}

  // Batch b of the plan; its spans point into the current window (valid until the next call).
  absl::StatusOr<SentenceBatch> Get(size_t b) {
    if (batches_[b].begin < begin_ || batches_[b].end > end_) RETURN_IF_ERROR(ReadWindow(b));
    std::vector<int64_t> ids(batches_[b].end - batches_[b].begin);
    std::iota(ids.begin(), ids.end(), batches_[b].begin - begin_);
    return BatchOf(source_, target_, ids);
  }

 private:
  // The window from batch b on: whole batches, at least one, while both sides stay within
  // window_tokens_ tokens. A failed read leaves the window empty.
  absl::Status ReadWindow(size_t b) {
    end_ = begin_;
    const int64_t begin = batches_[b].begin;
    auto fits = [&](int64_t end) {
      for (const ValuesSide side : {kSource, kTarget}) {
        if (values_.offsets(side)[end] - values_.offsets(side)[begin] > window_tokens_) {
          return false;
        }
      }
      return true;
    };
    int64_t end = batches_[b].end;
    for (size_t next = b + 1; next < batches_.size() && fits(batches_[next].end); ++next) {
      end = batches_[next].end;
    }
    ASSIGN_OR_RETURN(source_, values_.ReadSentences(kSource, begin, end));
    ASSIGN_OR_RETURN(target_, values_.ReadSentences(kTarget, begin, end));
    begin_ = begin;
    end_ = end;
    return absl::OkStatus();
  }

  const ValuesReader& values_;
  const std::vector<Batch>& batches_;
  const int64_t window_tokens_;
  int64_t begin_ = 0;  // the window's sentences [begin_, end_)
  int64_t end_ = 0;
  DatastoreValues source_;
  DatastoreValues target_;
};

}  // namespace

SentenceBatch BatchOf(const DatastoreValues& source, const DatastoreValues& target,
                      absl::Span<const int64_t> ids) {
  SentenceBatch batch;
  auto span = [](const DatastoreValues& side, int64_t s) {
    return absl::Span<const int32_t>(side.tokens.data() + side.offsets[s],
                                     static_cast<size_t>(side.offsets[s + 1] - side.offsets[s]));
  };
  for (const int64_t s : ids) {
    batch.sources.push_back(span(source, s));
    batch.targets.push_back(span(target, s));
  }
  return batch;
}

// The keys file `options` asks for (its layout aside).
KeysFileSpec KeysSpec(const ValuesReader& values, const FeatureExtractor& extractor,
                      const KeysOptions& options, std::map<std::string, std::string> identity) {
  KeysFileSpec spec;
  spec.rows =
      options.kind == KeyKind::kTokens ? values.num_tokens(kTarget) : values.num_sentences();
  spec.dim = extractor.dim();
  spec.fp16 = options.fp16;
  spec.identity = std::move(identity);
  return spec;
}

absl::StatusOr<KeysReport> ComputeKeys(const ValuesReader& values, FeatureExtractor& extractor,
                                       const KeysOptions& options,
                                       std::map<std::string, std::string> identity,
                                       const std::string& out_path) {
  RETURN_IF_ERROR(CheckLengths(values, extractor));
  const bool tokens = options.kind == KeyKind::kTokens;
  const std::vector<int64_t> lengths = BatchLengths(values, options.kind);
  const std::vector<Batch> batches =
      PlanBatches(lengths, options.max_tokens, options.max_sentences);
  std::vector<int64_t> first_row;
  for (const Batch& b : batches) {
    first_row.push_back(tokens ? values.offsets(kTarget)[b.begin] : b.begin);
  }
  KeysFileSpec spec = KeysSpec(values, extractor, options, std::move(identity));
  // The batch plan decides the bytes: a resumed run must use the same one.
  spec.layout["batching"] =
      absl::StrCat("max_tokens=", options.max_tokens, ",max_sentences=", options.max_sentences);
  ASSIGN_OR_RETURN(std::unique_ptr<KeysFileWriter> writer,
                   KeysFileWriter::CreateOrResume(out_path, spec));
  KeysReport report;
  report.rows = spec.rows;
  report.dim = spec.dim;
  report.batches = static_cast<int64_t>(batches.size());
  report.resumed_from = writer->rows_completed();
  report.padding_fraction =
      tokens ? PaddingFraction(batches, Lengths(values, kSource), Lengths(values, kTarget))
             : PaddingFraction(batches, Lengths(values, kSource),
                               std::vector<int64_t>(lengths.size(), 0));
  ASSIGN_OR_RETURN(const size_t start,
                   BatchStartingAt(batches, first_row, writer->rows_completed(), spec.rows));

  ProgressBar::Options progress_options = options.progress;
  progress_options.unit = tokens ? "tokens" : "sentences";
  ProgressBar progress(tokens ? "keys" : "sentence keys", spec.rows - writer->rows_completed(),
                       progress_options);
  const absl::Time begin = absl::Now();
  // One window of tokens at a time: memory grows with the window, not with the corpus.
  WindowedBatches windows(values, batches, options.read_window_tokens);
  int64_t since_checkpoint = 0;
  int64_t checkpoints = 0;
  for (size_t b = start; b < batches.size(); ++b) {
    ASSIGN_OR_RETURN(const SentenceBatch batch, windows.Get(b));
    ASSIGN_OR_RETURN(const Matrix<float> rows,
                     tokens ? extractor.TokenFeatures(batch) : extractor.SentenceEmbeddings(batch));
    RETURN_IF_ERROR(writer->Append(rows.view()));
    progress.Add(rows.rows());
    since_checkpoint += rows.rows();
    if (since_checkpoint >= options.checkpoint_rows && b + 1 < batches.size()) {
      RETURN_IF_ERROR(writer->Checkpoint());
      since_checkpoint = 0;
      if (options.after_checkpoint) options.after_checkpoint(++checkpoints);
    }
  }
  progress.Finish();
  report.seconds = absl::ToDoubleSeconds(absl::Now() - begin);
  report.rows_per_second =
      report.seconds > 0 ? (spec.rows - report.resumed_from) / report.seconds : 0;
  ASSIGN_OR_RETURN(report.digest, writer->Commit());
  return report;
}

absl::StatusOr<KeysReport> RunKeysStep(const KeysStepOptions& options) {
  // LibTorch sets OpenMP to 1 thread on these machines: always set the count explicitly.
  at::set_num_threads(std::max(1, options.threads));
  ASSIGN_OR_RETURN(const FileDigest values_digest, DigestFile(options.values_path));
  ASSIGN_OR_RETURN(const std::unique_ptr<ValuesReader> values,
                   ValuesReader::Open(options.values_path));
  const TokenizerInfo& tokenizer = values->tokenizer();
  ASSIGN_OR_RETURN(LoadedExtractor loaded,
                   LoadTransformerExtractor(options.model_path, options.feature, options.device));
  if (loaded.vocab_size != tokenizer.vocab_size || loaded.eos_id != tokenizer.eos_id ||
      loaded.pad_id != tokenizer.pad_id) {
    return absl::FailedPreconditionError(
        absl::StrCat(options.model_path, " has vocabulary ", loaded.vocab_size, " (eos ",
                     loaded.eos_id, ", pad ", loaded.pad_id, "), ", options.values_path,
                     " was tokenized for ", tokenizer.vocab_size, " (eos ", tokenizer.eos_id,
                     ", pad ", tokenizer.pad_id, "): another tokenizer"));
  }
  if (!loaded.tokenizer.empty() && Sha256Hex(loaded.tokenizer) != tokenizer.sha256) {
    return absl::FailedPreconditionError(
        absl::StrCat(options.model_path, " embeds tokenizer sha256 ", Sha256Hex(loaded.tokenizer),
                     ", ", options.values_path, " was tokenized with ", tokenizer.sha256,
                     ": rebuild the values with the model's tokenizer"));
  }
  ASSIGN_OR_RETURN(const FileDigest model_digest, DigestFile(options.model_path));
  const bool tokens = options.keys.kind == KeyKind::kTokens;
  const std::map<std::string, std::string> identity = {
      {"model_sha256", model_digest.sha256},
      {"values_sha256", values_digest.sha256},
      {"tokenizer_sha256", tokenizer.sha256},
      {"feature", tokens ? options.feature : std::string("encoder_mean")}};
  std::error_code error;
  if (std::filesystem::exists(options.out_path, error)) {
    const KeysFileSpec spec = KeysSpec(*values, *loaded.extractor, options.keys, identity);
    ASSIGN_OR_RETURN(const bool matches, CompleteKeysFileMatches(options.out_path, spec));
    if (matches) {
      KeysReport report;
      report.already_complete = true;
      ASSIGN_OR_RETURN(report.digest, DigestFile(options.out_path));
      report.rows = spec.rows;
      report.dim = spec.dim;
      return report;
    }
    // Complete keys of this computation in another dtype (a run with other options stopped
    // after publishing them): computed again as asked.
    std::fprintf(stderr, "keys: %s holds keys of another shape or dtype: computing them again\n",
                 options.out_path.c_str());
    std::filesystem::remove(options.out_path, error);
  }
  return ComputeKeys(*values, *loaded.extractor, options.keys, identity, options.out_path);
}

}  // namespace knnserve::datastore
