#include "common/index/builder.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files.h"
#include "common/index/faiss_index.h"
#include "common/index/shard_data.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

void RemoveFilesNoLongerListed(const std::string& dir, const IndexManifest& previous,
                               const IndexManifest& current) {
  const std::vector<ManifestFile> keep = current.Files();
  for (const ManifestFile& old : previous.Files()) {
    const bool in_dir = old.file.find('/') == std::string::npos && old.file != "..";
    if (!in_dir || std::any_of(keep.begin(), keep.end(),
                               [&old](const ManifestFile& f) { return f.file == old.file; })) {
      continue;
    }
    std::error_code ignored;
    std::filesystem::remove(std::filesystem::path(dir) / old.file, ignored);
  }
}

struct ShardRange {
  int64_t id_begin, id_end, sentence_begin, sentence_end;
};

// `rows` rows (in `sentences` sentences, or -1 without values) split into `shards` shards.
absl::Status CheckSplit(int64_t rows, int64_t sentences, int shards) {
  if (shards < 1) return absl::InvalidArgumentError(absl::StrCat("shards = ", shards));
  if (rows < shards) {
    return absl::InvalidArgumentError(absl::StrCat(rows, " keys cannot fill ", shards, " shards"));
  }
  // Shards number their vectors with 32-bit local ids (global id = shard base + local): a
  // larger shard could be built, after hours, but never served.
  constexpr int64_t kMostPerShard = (int64_t{1} << 32) - (int64_t{1} << 24);  // room for boundaries
  if ((rows + shards - 1) / shards > kMostPerShard) {
    return absl::InvalidArgumentError(absl::StrCat(
        rows, " keys in ", shards, " shards: a shard holds fewer than 2^32 vectors; use ",
        "at least ", (rows + kMostPerShard - 1) / kMostPerShard, " shards"));
  }
  if (sentences >= 0 && sentences < shards) {
    return absl::InvalidArgumentError(
        absl::StrCat(sentences, " sentences cannot fill ", shards, " shards"));
  }
  return absl::OkStatus();
}

// Valid offsets and a value per key.
absl::Status CheckValues(const KeySource& keys, const ValueSource& values) {
  RETURN_IF_ERROR(ValidateOffsets(values.offsets(), values.num_tokens(), "/offsets", "/tokens"));
  if (values.num_tokens() != keys.rows()) {
    return absl::InvalidArgumentError(absl::StrCat("values hold ", values.num_tokens(),
                                                   " tokens but keys hold ", keys.rows(), " rows"));
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const KeySource& keys, const ValueSource* values,
                          const IndexBuildOptions& o) {
  if (o.threads < 1) return absl::InvalidArgumentError(absl::StrCat("threads = ", o.threads));
  if (o.chunk_rows < 1 || o.train_size < 1) {
    return absl::InvalidArgumentError("chunk_rows and train_size must be positive");
  }
  if (values != nullptr) RETURN_IF_ERROR(CheckValues(keys, *values));
  return CheckSplit(keys.rows(), values != nullptr ? values->num_sentences() : -1, o.shards);
}

// `whole` split into `shards` equal-sized id ranges; with values, each boundary moves to the
// nearest sentence boundary (keeping every shard at least one sentence).
std::vector<ShardRange> SplitShards(const ShardRange& whole, int shards,
                                    const ValueSource* values) {
  std::vector<ShardRange> out(shards);
  const int64_t rows = whole.id_end - whole.id_begin;
  if (values == nullptr) {
    for (int s = 0; s < shards; ++s) {
      out[s] = {whole.id_begin + rows * s / shards, whole.id_begin + rows * (s + 1) / shards, 0, 0};
    }
    return out;
  }
  const absl::Span<const int64_t> offsets = values->offsets();
  std::vector<int64_t> cut(shards + 1);
  cut[0] = whole.sentence_begin;
  cut[shards] = whole.sentence_end;
  for (int s = 1; s < shards; ++s) {
    const int64_t target = whole.id_begin + rows * s / shards;
    int64_t j = std::lower_bound(offsets.begin() + whole.sentence_begin,
                                 offsets.begin() + whole.sentence_end + 1, target) -
                offsets.begin();
    if (j > whole.sentence_begin && target - offsets[j - 1] < offsets[j] - target) --j;
    cut[s] = std::clamp<int64_t>(j, cut[s - 1] + 1, whole.sentence_end - (shards - s));
  }
  for (int s = 0; s < shards; ++s) {
    out[s] = {offsets[cut[s]], offsets[cut[s + 1]], cut[s], cut[s + 1]};
  }
  return out;
}

// A uniform sample of train_size rows (selection sampling: sequential, sorted, seeded), or all.
absl::StatusOr<Matrix<float>> ReadTrainingSample(const KeySource& keys,
                                                 const IndexBuildOptions& o) {
  const int64_t n = keys.rows();
  const int64_t want = std::min(n, o.train_size);
  Matrix<float> sample(want, keys.dim());
  if (want == n) {
    RETURN_IF_ERROR(keys.Read(0, n, sample.data()));
    return sample;
  }
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  Matrix<float> chunk(std::min(o.chunk_rows, n), keys.dim());
  int64_t taken = 0;
  ProgressBar bar("read training sample", n, o.progress);
  for (int64_t begin = 0; begin < n && taken < want; begin += o.chunk_rows) {
    const int64_t end = std::min(n, begin + o.chunk_rows);
    bool read = false;
    for (int64_t i = begin; i < end && taken < want; ++i) {
      if (uniform(rng) * (n - i) >= want - taken) continue;
      if (!read) {
        RETURN_IF_ERROR(keys.Read(begin, end, chunk.data()));
        read = true;
      }
      std::copy(chunk.row(i - begin), chunk.row(i - begin + 1), sample.row(taken++));
    }
    bar.Add(end - begin);
  }
  return sample;
}

std::string ShardFile(int shard, absl::string_view ext) {
  return absl::StrFormat("shard-%05d.%s", shard, ext);
}

// Passes the bytes of the values file of shard range `r` to append(data, size) (a Status):
// ValuesHeader, then its tokens read chunk_rows at a time, so not even one shard's tokens are
// held whole.
template <typename Append>
absl::Status StreamShardValues(const ValueSource& values, const ShardRange& r, int64_t chunk_rows,
                               Append append) {
  const std::string header = ValuesHeader(r.id_end - r.id_begin);
  RETURN_IF_ERROR(append(header.data(), header.size()));
  std::vector<int32_t> chunk(std::min(chunk_rows, r.id_end - r.id_begin));
  for (int64_t begin = r.id_begin; begin < r.id_end; begin += chunk_rows) {
    const int64_t end = std::min(r.id_end, begin + chunk_rows);
    RETURN_IF_ERROR(values.Read(begin, end, chunk.data()));
    RETURN_IF_ERROR(append(chunk.data(), (end - begin) * sizeof(int32_t)));
  }
  return absl::OkStatus();
}

absl::StatusOr<FileDigest> WriteShardValues(const ValueSource& values, const ShardRange& r,
                                            int64_t chunk_rows, const std::string& path) {
  ASSIGN_OR_RETURN(const std::unique_ptr<AtomicFileWriter> out, AtomicFileWriter::Create(path));
  RETURN_IF_ERROR(StreamShardValues(values, r, chunk_rows, [&](const void* data, size_t size) {
    return out->Append(data, size);
  }));
  return out->Commit();
}

// The digest the values file of shard range `r` would have, written from `values`.
absl::StatusOr<FileDigest> ShardValuesDigest(const ValueSource& values, const ShardRange& r,
                                             int64_t chunk_rows) {
  Sha256 sha;
  FileDigest digest;
  RETURN_IF_ERROR(StreamShardValues(values, r, chunk_rows, [&](const void* data, size_t size) {
    sha.Update(data, size);
    digest.bytes += static_cast<int64_t>(size);
    return absl::OkStatus();
  }));
  digest.sha256 = sha.HexDigest();
  return digest;
}

// The files of one build, written under staged names (TemporaryPath: what a killed build
// leaves is debris that DirectoryLock removes) and renamed to their own names only once every
// one is written: a build that fails before (a full disk, an unreadable key) leaves the index it
// would replace whole, loadable and recorded. Staged files not published are removed.
class StagedFiles {
 public:
  explicit StagedFiles(std::string dir) : dir_(std::move(dir)) {}
  StagedFiles(const StagedFiles&) = delete;
  StagedFiles& operator=(const StagedFiles&) = delete;
  ~StagedFiles() {
    std::error_code ignored;
    for (const std::string& file : files_) std::filesystem::remove(Staged(file), ignored);
  }

  // Where `file` (a name in the directory) is written.
  std::string Add(const std::string& file) {
    files_.push_back(file);
    return Staged(file);
  }
  // Renames every staged file to its name.
  absl::Status Publish() {
    for (; !files_.empty(); files_.pop_back()) {
      RETURN_IF_ERROR(PublishFile(Staged(files_.back()), Final(files_.back())));
    }
    return absl::OkStatus();
  }

 private:
  std::string Final(const std::string& file) const { return absl::StrCat(dir_, "/", file); }
  std::string Staged(const std::string& file) const { return TemporaryPath(Final(file)); }

  const std::string dir_;
  std::vector<std::string> files_;  // staged, not yet published
};

}  // namespace

void RemoveIndex(const std::string& dir) {
  if (absl::StatusOr<IndexManifest> manifest = ReadManifest(dir); manifest.ok()) {
    RemoveFilesNoLongerListed(dir, *manifest, IndexManifest());
  }
  std::error_code ignored;
  std::filesystem::remove(std::filesystem::path(dir) / kManifestFileName, ignored);
}

absl::Status CheckIndexFactory(const IndexBuildOptions& options, int dim) {
  return FaissIndex::Create(options.factory, dim, options.metric, /*threads=*/1).status();
}

namespace {

// Shard number `shard` of rows `r`: a copy of `trained` holding those keys, their values (when
// `values` is set) and their subset codes (when `quantizer` is set), written as staged files.
absl::StatusOr<ShardManifest> WriteShard(const FaissIndex& trained,
                                         const SubsetQuantizer* quantizer, const KeySource& keys,
                                         const ValueSource* values, const ShardRange& r, int shard,
                                         int64_t chunk_rows, StagedFiles& staged,
                                         ProgressBar& bar) {
  ASSIGN_OR_RETURN(std::unique_ptr<FaissIndex> index, trained.CloneEmpty());
  ShardManifest entry{r.id_begin, r.id_end, r.sentence_begin, r.sentence_end, {}, {}, {}};
  // The subset codes go to their file as they are encoded: a shard's codes are as large as
  // its index's, and are never needed whole.
  std::unique_ptr<AtomicFileWriter> codes_out;
  if (quantizer != nullptr) {
    std::vector<int64_t> offsets(values->offsets().begin() + r.sentence_begin,
                                 values->offsets().begin() + r.sentence_end + 1);
    for (int64_t& o : offsets) o -= r.id_begin;
    entry.subset_codes = ManifestFile{ShardFile(shard, "subset"), {}};
    ASSIGN_OR_RETURN(codes_out, AtomicFileWriter::Create(staged.Add(entry.subset_codes->file)));
    RETURN_IF_ERROR(codes_out->Append(SubsetCodesHeader(quantizer->codebook().m, offsets)));
  }
  Matrix<float> chunk(std::min(chunk_rows, r.id_end - r.id_begin), keys.dim());
  for (int64_t begin = r.id_begin; begin < r.id_end; begin += chunk_rows) {
    const int64_t end = std::min(r.id_end, begin + chunk_rows);
    const MatrixView<const float> rows{chunk.data(), end - begin, keys.dim()};
    RETURN_IF_ERROR(keys.Read(begin, end, chunk.data()));
    RETURN_IF_ERROR(index->Add(rows));
    if (codes_out != nullptr) {
      ASSIGN_OR_RETURN(Matrix<uint8_t> c, quantizer->Encode(rows));
      RETURN_IF_ERROR(codes_out->Append(c.data(), c.size()));
    }
    bar.Add(end - begin);
  }
  entry.index.file = ShardFile(shard, "faiss");
  ASSIGN_OR_RETURN(entry.index.digest, index->Save(staged.Add(entry.index.file)));
  if (values != nullptr) {
    const std::string file = ShardFile(shard, "values");
    ASSIGN_OR_RETURN(FileDigest digest, WriteShardValues(*values, r, chunk_rows, staged.Add(file)));
    entry.values = ManifestFile{file, digest};
  }
  if (codes_out != nullptr) {
    ASSIGN_OR_RETURN(entry.subset_codes->digest, codes_out->Commit());
  }
  return entry;
}

// BuildIndex's work, in a directory the caller has locked.
absl::StatusOr<IndexManifest> WriteIndex(const KeySource& keys, const ValueSource* values,
                                         const IndexBuildOptions& options,
                                         const std::string& out_dir) {
  std::error_code ec;
  StagedFiles staged(out_dir);

  ASSIGN_OR_RETURN(
      std::unique_ptr<FaissIndex> trained,
      FaissIndex::Create(options.factory, keys.dim(), options.metric, options.threads));
  if (options.opq_iterations > 0) trained->SetOpqIterations(options.opq_iterations);
  std::unique_ptr<SubsetQuantizer> quantizer;
  {
    ASSIGN_OR_RETURN(Matrix<float> sample, ReadTrainingSample(keys, options));
    if (!trained->is_trained()) RETURN_IF_ERROR(trained->Train(sample.view()));
    const int subset_m = options.subset_m > 0 ? options.subset_m : trained->pq_m();
    if (values != nullptr && subset_m > 0) {
      ASSIGN_OR_RETURN(quantizer,
                       SubsetQuantizer::Train(*trained, subset_m, sample.view(), options.threads));
    }
  }
  IndexManifest manifest;
  manifest.factory = options.factory;
  manifest.metric = options.metric;
  manifest.dim = keys.dim();
  manifest.total_vectors = keys.rows();
  manifest.num_sentences = values != nullptr ? values->num_sentences() : 0;
  if (quantizer != nullptr) {
    manifest.subset_m = quantizer->codebook().m;
    const std::string file = "subset_quantizer.faiss";
    ASSIGN_OR_RETURN(FileDigest digest, quantizer->Save(staged.Add(file)));
    manifest.subset_quantizer = ManifestFile{file, digest};
  }

  ProgressBar bar("index add", keys.rows(), options.progress);
  const std::vector<ShardRange> ranges = SplitShards(
      {0, keys.rows(), 0, values != nullptr ? values->num_sentences() : 0}, options.shards, values);
  for (int s = 0; s < options.shards; ++s) {
    ASSIGN_OR_RETURN(ShardManifest entry,
                     WriteShard(*trained, quantizer.get(), keys, values, ranges[s], s,
                                options.chunk_rows, staged, bar));
    manifest.shards.push_back(std::move(entry));
  }
  bar.Finish();
  // From the first file renamed on, an index this one replaces no longer matches its manifest:
  // the manifest goes first, so a build stopped while renaming leaves no index that claims to
  // be whole. The files of the replaced index that this one does not reuse (a build with fewer
  // shards, or without subset codes) go once the new manifest is in place: only files the old
  // manifest listed are removed.
  absl::StatusOr<IndexManifest> previous = ReadManifest(out_dir);
  std::filesystem::remove(absl::StrCat(out_dir, "/", kManifestFileName), ec);
  RETURN_IF_ERROR(staged.Publish());
  RETURN_IF_ERROR(WriteManifest(out_dir, manifest).status());
  if (previous.ok()) RemoveFilesNoLongerListed(out_dir, *previous, manifest);
  return manifest;
}

}  // namespace

absl::StatusOr<IndexManifest> BuildIndex(const KeySource& keys, const ValueSource* values,
                                         const IndexBuildOptions& options,
                                         const std::string& out_dir) {
  RETURN_IF_ERROR(CheckOptions(keys, values, options));
  std::error_code ec;
  const bool created = !std::filesystem::exists(out_dir, ec);
  ASSIGN_OR_RETURN(std::unique_ptr<DirectoryLock> lock, DirectoryLock::Acquire(out_dir));
  // The staged files of builds that were killed; only the index's own directory is ours.
  lock->RemoveDebris(DirectoryLock::DebrisScope::kDirectory);
  absl::StatusOr<IndexManifest> manifest = WriteIndex(keys, values, options, out_dir);
  if (!manifest.ok() && created) DirectoryLock::ReleaseAndRemoveIfEmpty(std::move(lock));
  return manifest;
}

namespace {

// Whether `keys` and `values` extend the index of `manifest` by appending: its dimension, values
// exactly when its shards have them, sentences that end where the index ends, and, shard by
// shard, the very tokens its values files hold.
absl::Status CheckExtends(const IndexManifest& manifest, const std::string& dir,
                          const KeySource& keys, const ValueSource* values,
                          const IndexAddOptions& o) {
  if (o.threads < 1) return absl::InvalidArgumentError(absl::StrCat("threads = ", o.threads));
  if (o.chunk_rows < 1) return absl::InvalidArgumentError("chunk_rows must be positive");
  if (keys.dim() != manifest.dim) {
    return absl::InvalidArgumentError(absl::StrCat("keys of dimension ", keys.dim(),
                                                   " for the index in ", dir, " of dimension ",
                                                   manifest.dim));
  }
  if (keys.rows() <= manifest.total_vectors) {
    return absl::InvalidArgumentError(absl::StrCat("nothing to add: the keys hold ", keys.rows(),
                                                   " rows and the index in ", dir,
                                                   " already holds ", manifest.total_vectors));
  }
  const bool has_values = manifest.shards.front().values.has_value();
  if (has_values != (values != nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the index in ", dir,
                     has_values ? " carries values: the added rows need theirs"
                                : " carries no values: its new shards cannot either"));
  }
  if (values == nullptr) return CheckSplit(keys.rows() - manifest.total_vectors, -1, o.shards);
  RETURN_IF_ERROR(CheckValues(keys, *values));
  const absl::Span<const int64_t> offsets = values->offsets();
  if (values->num_sentences() <= manifest.num_sentences ||
      offsets[manifest.num_sentences] != manifest.total_vectors) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the values do not extend the index in ", dir, ": its ", manifest.num_sentences,
        " sentences end at token ", manifest.total_vectors, ", the values' first ",
        std::min(manifest.num_sentences, values->num_sentences()), " at token ",
        offsets[std::min(manifest.num_sentences, values->num_sentences())]));
  }
  for (size_t s = 0; s < manifest.shards.size(); ++s) {
    const ShardManifest& shard = manifest.shards[s];
    ASSIGN_OR_RETURN(
        const FileDigest digest,
        ShardValuesDigest(*values, {shard.id_begin, shard.id_end, 0, 0}, o.chunk_rows));
    if (digest.sha256 != shard.values->digest.sha256) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the values do not extend the index in ", dir, ": tokens [", shard.id_begin, ", ",
          shard.id_end, ") differ from those of shard ", s, " (", shard.values->file, ")"));
    }
  }
  return CheckSplit(keys.rows() - manifest.total_vectors,
                    values->num_sentences() - manifest.num_sentences, o.shards);
}

// The trained state every shard shares, read from the smallest shard's file (verified).
absl::StatusOr<std::unique_ptr<FaissIndex>> ReadTrained(const IndexManifest& manifest,
                                                        const std::string& dir, int threads) {
  const ShardManifest* smallest = &manifest.shards.front();
  for (const ShardManifest& shard : manifest.shards) {
    if (shard.index.digest.bytes < smallest->index.digest.bytes) smallest = &shard;
  }
  ASSIGN_OR_RETURN(const std::unique_ptr<VerifiedFileReader> in, OpenChecked(dir, smallest->index));
  return FaissIndex::ReadTrainedEmpty(*in, threads);
}

// AddToIndex's work, in a directory the caller has locked.
absl::StatusOr<IndexManifest> AppendShards(const KeySource& keys, const ValueSource* values,
                                           const IndexAddOptions& options, const std::string& dir) {
  ASSIGN_OR_RETURN(IndexManifest manifest, ReadManifest(dir));
  RETURN_IF_ERROR(CheckExtends(manifest, dir, keys, values, options));
  ASSIGN_OR_RETURN(const std::unique_ptr<FaissIndex> trained,
                   ReadTrained(manifest, dir, options.threads));
  std::unique_ptr<SubsetQuantizer> quantizer;
  if (manifest.subset_quantizer) {
    ASSIGN_OR_RETURN(const std::unique_ptr<VerifiedFileReader> in,
                     OpenChecked(dir, *manifest.subset_quantizer));
    ASSIGN_OR_RETURN(quantizer, SubsetQuantizer::Read(*in, options.threads));
  }
  StagedFiles staged(dir);
  const ShardRange added{manifest.total_vectors, keys.rows(), manifest.num_sentences,
                         values != nullptr ? values->num_sentences() : 0};
  ProgressBar bar("index add", added.id_end - added.id_begin, options.progress);
  const int first = static_cast<int>(manifest.shards.size());
  const std::vector<ShardRange> ranges = SplitShards(added, options.shards, values);
  for (int s = 0; s < options.shards; ++s) {
    ASSIGN_OR_RETURN(ShardManifest entry,
                     WriteShard(*trained, quantizer.get(), keys, values, ranges[s], first + s,
                                options.chunk_rows, staged, bar));
    manifest.shards.push_back(std::move(entry));
  }
  bar.Finish();
  manifest.total_vectors = added.id_end;
  manifest.num_sentences = added.sentence_end;
  // The new shards' files are named by numbers no shard has yet, so the index stays whole while
  // they are renamed into place; it has them from the moment its manifest is replaced.
  RETURN_IF_ERROR(staged.Publish());
  RETURN_IF_ERROR(WriteManifest(dir, manifest).status());
  return manifest;
}

}  // namespace

absl::StatusOr<IndexManifest> AddToIndex(const KeySource& keys, const ValueSource* values,
                                         const IndexAddOptions& options, const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::path(dir) / kManifestFileName, ec)) {
    return absl::NotFoundError(absl::StrCat("no index in ", dir, " (", kManifestFileName,
                                            " is missing): build one first"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<DirectoryLock> lock, DirectoryLock::Acquire(dir));
  lock->RemoveDebris(DirectoryLock::DebrisScope::kDirectory);
  return AppendShards(keys, values, options, dir);
}

}  // namespace knnserve
