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

absl::Status CheckOptions(const KeySource& keys, const ValueSource* values,
                          const IndexBuildOptions& o) {
  if (o.shards < 1) return absl::InvalidArgumentError(absl::StrCat("shards = ", o.shards));
  if (o.threads < 1) return absl::InvalidArgumentError(absl::StrCat("threads = ", o.threads));
  if (o.chunk_rows < 1 || o.train_size < 1) {
    return absl::InvalidArgumentError("chunk_rows and train_size must be positive");
  }
  if (keys.rows() < o.shards) {
    return absl::InvalidArgumentError(
        absl::StrCat(keys.rows(), " keys cannot fill ", o.shards, " shards"));
  }
  // Shards number their vectors with 32-bit local ids (global id = shard base + local): a
  // larger shard could be built, after hours, but never served.
  constexpr int64_t kMostPerShard = (int64_t{1} << 32) - (int64_t{1} << 24);  // room for boundaries
  if ((keys.rows() + o.shards - 1) / o.shards > kMostPerShard) {
    return absl::InvalidArgumentError(absl::StrCat(
        keys.rows(), " keys in ", o.shards, " shards: a shard holds fewer than 2^32 vectors; use ",
        "at least ", (keys.rows() + kMostPerShard - 1) / kMostPerShard, " shards"));
  }
  if (values != nullptr) {
    RETURN_IF_ERROR(
        ValidateOffsets(values->offsets(), values->num_tokens(), "/offsets", "/tokens"));
    if (values->num_tokens() != keys.rows()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "values hold ", values->num_tokens(), " tokens but keys hold ", keys.rows(), " rows"));
    }
    if (values->num_sentences() < o.shards) {
      return absl::InvalidArgumentError(
          absl::StrCat(values->num_sentences(), " sentences cannot fill ", o.shards, " shards"));
    }
  }
  return absl::OkStatus();
}

// Equal-sized id ranges; with values, each boundary moves to the nearest sentence boundary
// (keeping every shard at least one sentence).
std::vector<ShardRange> SplitShards(int64_t rows, int shards, const ValueSource* values) {
  std::vector<ShardRange> out(shards);
  if (values == nullptr) {
    for (int s = 0; s < shards; ++s) {
      out[s] = {rows * s / shards, rows * (s + 1) / shards, 0, 0};
    }
    return out;
  }
  const absl::Span<const int64_t> offsets = values->offsets();
  const int64_t sentences = values->num_sentences();
  std::vector<int64_t> cut(shards + 1);
  cut[0] = 0;
  cut[shards] = sentences;
  for (int s = 1; s < shards; ++s) {
    const int64_t target = rows * s / shards;
    int64_t j = std::lower_bound(offsets.begin(), offsets.end(), target) - offsets.begin();
    if (j > 0 && target - offsets[j - 1] < offsets[j] - target) --j;
    cut[s] = std::clamp<int64_t>(j, cut[s - 1] + 1, sentences - (shards - s));
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

// The shard's values file, read and written chunk_rows tokens at a time: not even one shard's
// tokens are held whole.
absl::StatusOr<FileDigest> WriteShardValues(const ValueSource& values, const ShardRange& r,
                                            int64_t chunk_rows, const std::string& path) {
  ASSIGN_OR_RETURN(const std::unique_ptr<AtomicFileWriter> out, AtomicFileWriter::Create(path));
  RETURN_IF_ERROR(out->Append(ValuesHeader(r.id_end - r.id_begin)));
  std::vector<int32_t> chunk(std::min(chunk_rows, r.id_end - r.id_begin));
  for (int64_t begin = r.id_begin; begin < r.id_end; begin += chunk_rows) {
    const int64_t end = std::min(r.id_end, begin + chunk_rows);
    RETURN_IF_ERROR(values.Read(begin, end, chunk.data()));
    RETURN_IF_ERROR(out->Append(chunk.data(), (end - begin) * sizeof(int32_t)));
  }
  return out->Commit();
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
  Matrix<float> chunk(std::min(options.chunk_rows, keys.rows()), keys.dim());
  const std::vector<ShardRange> ranges = SplitShards(keys.rows(), options.shards, values);
  for (int s = 0; s < options.shards; ++s) {
    const ShardRange& r = ranges[s];
    ASSIGN_OR_RETURN(std::unique_ptr<FaissIndex> shard, trained->CloneEmpty());
    ShardManifest entry{r.id_begin, r.id_end, r.sentence_begin, r.sentence_end, {}, {}, {}};
    // The subset codes go to their file as they are encoded: a shard's codes are as large as
    // its index's, and are never needed whole.
    std::unique_ptr<AtomicFileWriter> codes_out;
    if (quantizer != nullptr) {
      std::vector<int64_t> offsets(values->offsets().begin() + r.sentence_begin,
                                   values->offsets().begin() + r.sentence_end + 1);
      for (int64_t& o : offsets) o -= r.id_begin;
      entry.subset_codes = ManifestFile{ShardFile(s, "subset"), {}};
      ASSIGN_OR_RETURN(codes_out, AtomicFileWriter::Create(staged.Add(entry.subset_codes->file)));
      RETURN_IF_ERROR(codes_out->Append(SubsetCodesHeader(quantizer->codebook().m, offsets)));
    }
    for (int64_t begin = r.id_begin; begin < r.id_end; begin += options.chunk_rows) {
      const int64_t end = std::min(r.id_end, begin + options.chunk_rows);
      const MatrixView<const float> rows{chunk.data(), end - begin, keys.dim()};
      RETURN_IF_ERROR(keys.Read(begin, end, chunk.data()));
      RETURN_IF_ERROR(shard->Add(rows));
      if (codes_out != nullptr) {
        ASSIGN_OR_RETURN(Matrix<uint8_t> c, quantizer->Encode(rows));
        RETURN_IF_ERROR(codes_out->Append(c.data(), c.size()));
      }
      bar.Add(end - begin);
    }
    entry.index.file = ShardFile(s, "faiss");
    ASSIGN_OR_RETURN(entry.index.digest, shard->Save(staged.Add(entry.index.file)));
    if (values != nullptr) {
      const std::string file = ShardFile(s, "values");
      ASSIGN_OR_RETURN(FileDigest digest,
                       WriteShardValues(*values, r, options.chunk_rows, staged.Add(file)));
      entry.values = ManifestFile{file, digest};
    }
    if (codes_out != nullptr) {
      ASSIGN_OR_RETURN(entry.subset_codes->digest, codes_out->Commit());
    }
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

}  // namespace knnserve
