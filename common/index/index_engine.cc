#include "common/index/index_engine.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/adc/subset_adc.h"
#include "common/heap.h"
#include "common/index/faiss_index.h"
#include "common/index/manifest.h"
#include "common/index/shard_data.h"
#include "common/status_macros.h"
#include "common/topk.h"

namespace knnserve {
namespace {

absl::Status CheckQuery(const EngineInfo& info, const SearchQuery& query) {
  if (query.queries.cols() != info.dim) {
    return absl::InvalidArgumentError(absl::StrCat("queries have dimension ", query.queries.cols(),
                                                   ", the index has ", info.dim));
  }
  return CheckQueryValues(query.queries, "queries");
}

// One shard: faiss index (local ids), values, optional subset ADC over its sentences.
// Thread-safety: immutable; Search is const and thread-safe.
class ShardEngine : public SearchEngine {
 public:
  ShardEngine(EngineInfo info, std::unique_ptr<FaissIndex> index, std::vector<int32_t> values,
              std::shared_ptr<const SubsetQuantizer> quantizer,
              std::unique_ptr<const SubsetSearcher> adc)
      : info_(std::move(info)),
        index_(std::move(index)),
        values_(std::move(values)),
        quantizer_(std::move(quantizer)),
        adc_(std::move(adc)) {}

  const EngineInfo& info() const override { return info_; }

  absl::StatusOr<EngineResult> Search(const SearchQuery& query) const override {
    RETURN_IF_ERROR(CheckQuery(info_, query));
    EngineResult result;
    if (query.is_subset()) {
      if (adc_ == nullptr) {
        return absl::FailedPreconditionError(
            "subset search: this index has no subset codes (build it with values and a PQ)");
      }
      ASSIGN_OR_RETURN(Matrix<float> transformed, quantizer_->Transform(query.queries.view()));
      ASSIGN_OR_RETURN(SubsetResult subset,
                       adc_->SearchSubset(transformed.view(), query.subset_groups, query.row_group,
                                          query.params.k));
      result.neighbors = std::move(subset.neighbors);
      result.vectors_searched = subset.vectors_scanned;
    } else {
      if (index_ == nullptr) {
        return absl::FailedPreconditionError(
            "full search: this index was loaded for subset searches only, without its faiss "
            "index (knnserve-shard --subset-only, or embedded subset kNN-MT)");
      }
      ASSIGN_OR_RETURN(result.neighbors, index_->Search(query.queries.view(), query.params));
      for (int64_t& id : result.neighbors.ids) {
        if (id >= 0) id += info_.id_begin;
      }
      result.vectors_searched = index_->size();
    }
    if (info_.has_values) AttachValues(result.neighbors);
    return result;
  }

 private:
  void AttachValues(Neighbors& n) const {
    n.values.assign(n.ids.size(), -1);
    for (size_t i = 0; i < n.ids.size(); ++i) {
      if (n.ids[i] >= 0) n.values[i] = values_[n.ids[i] - info_.id_begin];
    }
  }

  const EngineInfo info_;
  const std::unique_ptr<FaissIndex> index_;
  const std::vector<int32_t> values_;
  const std::shared_ptr<const SubsetQuantizer> quantizer_;
  const std::unique_ptr<const SubsetSearcher> adc_;
};

// Several shards searched one after the other (each uses all threads) and merged.
class MergedEngine : public SearchEngine {
 public:
  MergedEngine(EngineInfo info, std::vector<std::unique_ptr<SearchEngine>> shards)
      : info_(std::move(info)), shards_(std::move(shards)) {}

  const EngineInfo& info() const override { return info_; }

  absl::StatusOr<EngineResult> Search(const SearchQuery& query) const override {
    std::vector<EngineResult> parts;
    parts.reserve(shards_.size());
    std::vector<const Neighbors*> lists;
    EngineResult result;
    for (const auto& shard : shards_) {
      ASSIGN_OR_RETURN(EngineResult part, shard->Search(query));
      result.vectors_searched += part.vectors_searched;
      parts.push_back(std::move(part));
      lists.push_back(&parts.back().neighbors);
    }
    ASSIGN_OR_RETURN(result.neighbors, MergeTopK(lists, query.params.k, info_.metric));
    return result;
  }

 private:
  const EngineInfo info_;
  const std::vector<std::unique_ptr<SearchEngine>> shards_;
};

absl::StatusOr<std::shared_ptr<const SubsetQuantizer>> LoadQuantizer(
    const std::string& dir, const IndexManifest& manifest, const IndexEngineOptions& options) {
  if (!manifest.subset_quantizer) return nullptr;
  ASSIGN_OR_RETURN(const std::unique_ptr<VerifiedFileReader> in,
                   OpenChecked(dir, *manifest.subset_quantizer));
  ASSIGN_OR_RETURN(std::unique_ptr<SubsetQuantizer> q, SubsetQuantizer::Read(*in, options.threads));
  return std::shared_ptr<const SubsetQuantizer>(std::move(q));
}

// What one shard's files hold, loaded and checked against the manifest.
struct ShardParts {
  EngineInfo info;
  std::unique_ptr<FaissIndex> index;  // in serving form; null without full search
  std::vector<int32_t> values;        // when info.has_values
  std::optional<SubsetCodes> codes;   // subset codes, with their global bases set
};

absl::StatusOr<ShardParts> LoadShardParts(const std::string& dir, const IndexManifest& manifest,
                                          int shard_id, const IndexEngineOptions& options) {
  const ShardManifest& shard = manifest.shards[shard_id];
  ShardParts parts;
  const int64_t rows = shard.id_end - shard.id_begin;
  if (options.full_search) {
    ASSIGN_OR_RETURN(const std::unique_ptr<VerifiedFileReader> in, OpenChecked(dir, shard.index));
    // Codes + 4 bytes per vector while serving; IVF-PQ lists packed for the quantized scan.
    ASSIGN_OR_RETURN(parts.index,
                     FaissIndex::LoadForServing(*in, options.threads, options.adc_kernel));
    ReturnFreedHeapMemory();  // faiss's lists, before the values and codes are read
    if (parts.index->dim() != manifest.dim || parts.index->metric() != manifest.metric ||
        parts.index->size() != rows) {
      return absl::DataLossError(absl::StrCat(in->name(), ": dimension ", parts.index->dim(),
                                              ", metric ", MetricName(parts.index->metric()), ", ",
                                              parts.index->size(),
                                              " vectors do not match the manifest"));
    }
  } else if (!shard.subset_codes || !manifest.subset_quantizer) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": shard ", shard_id,
                     " has no subset codes, and an engine without full search has nothing else "
                     "to search"));
  }
  if (shard.values) {
    ASSIGN_OR_RETURN(const std::unique_ptr<VerifiedFileReader> in, OpenChecked(dir, *shard.values));
    ASSIGN_OR_RETURN(parts.values, ReadValues(*in));
    if (static_cast<int64_t>(parts.values.size()) != rows) {
      return absl::DataLossError(
          absl::StrCat(in->name(), ": ", parts.values.size(), " values for ", rows, " vectors"));
    }
  }
  if (shard.subset_codes) {
    ASSIGN_OR_RETURN(const std::unique_ptr<VerifiedFileReader> in,
                     OpenChecked(dir, *shard.subset_codes));
    ASSIGN_OR_RETURN(SubsetCodes codes, ReadSubsetCodes(*in));
    if (codes.num_sentences() != shard.sentence_end - shard.sentence_begin ||
        codes.num_vectors() != rows) {
      return absl::DataLossError(absl::StrCat(in->name(), ": ", codes.num_sentences(),
                                              " sentences, ", codes.num_vectors(),
                                              " vectors do not match the manifest"));
    }
    codes.sentence_begin = shard.sentence_begin;
    codes.token_begin = shard.id_begin;
    parts.codes = std::move(codes);
  }
  EngineInfo& info = parts.info;
  info.dim = manifest.dim;
  info.metric = manifest.metric;
  info.factory = manifest.factory;
  info.total_vectors = manifest.total_vectors;
  info.id_begin = shard.id_begin;
  info.id_end = shard.id_end;
  info.num_sentences = manifest.num_sentences;
  info.sentence_begin = shard.sentence_begin;
  info.sentence_end = shard.sentence_end;
  info.has_values = shard.values.has_value();
  info.subset_only = !options.full_search;
  ReturnFreedHeapMemory();
  return parts;
}

absl::StatusOr<std::unique_ptr<SearchEngine>> MakeShardEngine(
    ShardParts parts, std::shared_ptr<const SubsetQuantizer> quantizer,
    const IndexManifest& manifest, const IndexEngineOptions& options) {
  std::unique_ptr<const SubsetSearcher> adc;
  if (parts.codes) {
    ASSIGN_OR_RETURN(
        std::unique_ptr<SubsetAdc> cpu,
        SubsetAdc::Create(quantizer->codebook(), manifest.metric, *std::move(parts.codes),
                          {options.threads, options.adc_kernel}));
    if (options.subset_searcher) {
      ASSIGN_OR_RETURN(adc, options.subset_searcher(std::move(cpu)));
    } else {
      adc = std::move(cpu);
    }
  }
  return std::make_unique<ShardEngine>(
      std::move(parts.info), std::move(parts.index), std::move(parts.values),
      adc != nullptr ? std::move(quantizer) : nullptr, std::move(adc));
}

// The shards (consecutive id and sentence ranges) as one: their IvfAdc lists moved into the
// first shard's index, values and subset codes concatenated. Only for shards whose lists
// IvfAdc scans (or that have no index, without full search): then one coarse search and one
// table per query and list serve all shards, and the answers equal merging the shards' answers
// (same tables, same distances).
absl::StatusOr<ShardParts> MergeShardParts(std::vector<ShardParts> shards) {
  // The merged values and codes are reserved whole, and each shard's freed once appended: grown
  // by appending alone, they would be copied at every doubling, up to twice their size at once.
  size_t total_values = 0;
  size_t total_codes = 0;
  for (const ShardParts& shard : shards) {
    total_values += shard.values.size();
    if (shard.codes) total_codes += shard.codes->codes.size();
  }
  ShardParts merged = std::move(shards[0]);
  merged.values.reserve(total_values);
  if (merged.codes) merged.codes->codes.reserve(total_codes);
  std::vector<std::unique_ptr<FaissIndex>> others;
  std::vector<int64_t> offsets;
  for (size_t i = 1; i < shards.size(); ++i) {
    ShardParts& shard = shards[i];
    merged.info.has_values = merged.info.has_values && shard.info.has_values;
    merged.values.insert(merged.values.end(), shard.values.begin(), shard.values.end());
    FreeVector(shard.values);
    if (merged.codes && shard.codes) {
      SubsetCodes& codes = *merged.codes;
      const int64_t base = codes.num_vectors();
      for (size_t s = 1; s < shard.codes->offsets.size(); ++s) {
        codes.offsets.push_back(base + shard.codes->offsets[s]);
      }
      codes.codes.insert(codes.codes.end(), shard.codes->codes.begin(), shard.codes->codes.end());
      shard.codes.reset();
    } else {
      merged.codes.reset();
    }
    offsets.push_back(shard.info.id_begin - merged.info.id_begin);
    merged.info.id_end = shard.info.id_end;
    merged.info.sentence_end = shard.info.sentence_end;
    others.push_back(std::move(shard.index));
  }
  if (!merged.info.has_values) merged.values.clear();
  if (merged.index != nullptr) {
    RETURN_IF_ERROR(merged.index->AbsorbIvfLists(std::move(others), offsets));
  }
  return merged;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SearchEngine>> CreateEngine(const std::string& dir, int shard_id,
                                                           const IndexEngineOptions& options) {
  ASSIGN_OR_RETURN(IndexManifest manifest, ReadManifest(dir));
  if (shard_id < 0 || shard_id >= static_cast<int>(manifest.shards.size())) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", shard_id, " does not exist: ", dir,
                                                   " has ", manifest.shards.size(), " shards"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const SubsetQuantizer> quantizer,
                   LoadQuantizer(dir, manifest, options));
  ASSIGN_OR_RETURN(ShardParts parts, LoadShardParts(dir, manifest, shard_id, options));
  return MakeShardEngine(std::move(parts), std::move(quantizer), manifest, options);
}

absl::StatusOr<std::unique_ptr<SearchEngine>> CreateLocalEngine(const std::string& dir,
                                                                const IndexEngineOptions& options) {
  ASSIGN_OR_RETURN(IndexManifest manifest, ReadManifest(dir));
  ASSIGN_OR_RETURN(std::shared_ptr<const SubsetQuantizer> quantizer,
                   LoadQuantizer(dir, manifest, options));
  std::vector<ShardParts> parts;
  // A merged IvfAdc numbers all vectors with 32-bit ids: beyond, the shards stay apart.
  bool mergeable = options.merge_shards && manifest.shards.size() > 1 &&
                   manifest.total_vectors < (int64_t{1} << 32);
  for (int s = 0; s < static_cast<int>(manifest.shards.size()); ++s) {
    ASSIGN_OR_RETURN(ShardParts shard, LoadShardParts(dir, manifest, s, options));
    // Without full search only the subset codes are merged.
    mergeable = mergeable && (shard.index == nullptr || shard.index->uses_ivf_adc());
    parts.push_back(std::move(shard));
  }
  if (mergeable) {
    ASSIGN_OR_RETURN(ShardParts merged, MergeShardParts(std::move(parts)));
    ReturnFreedHeapMemory();
    return MakeShardEngine(std::move(merged), std::move(quantizer), manifest, options);
  }
  std::vector<std::unique_ptr<SearchEngine>> shards;
  bool has_values = true;
  for (ShardParts& shard : parts) {
    ASSIGN_OR_RETURN(std::unique_ptr<SearchEngine> engine,
                     MakeShardEngine(std::move(shard), quantizer, manifest, options));
    has_values = has_values && engine->info().has_values;
    shards.push_back(std::move(engine));
  }
  if (shards.size() == 1) return std::move(shards[0]);
  EngineInfo info = shards.front()->info();
  info.id_begin = 0;
  info.id_end = manifest.total_vectors;
  info.sentence_begin = 0;
  info.sentence_end = manifest.num_sentences;
  info.has_values = has_values;
  return std::make_unique<MergedEngine>(std::move(info), std::move(shards));
}

}  // namespace knnserve
