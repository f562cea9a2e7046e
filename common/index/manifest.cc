#include "common/index/manifest.h"

#include <exception>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace knnserve {
namespace {

using nlohmann::json;

constexpr char kFormat[] = "knnserve-index";

json FileToJson(const ManifestFile& f) {
  return {{"file", f.file}, {"bytes", f.digest.bytes}, {"sha256", f.digest.sha256}};
}

// The field `key` of `object` (named `path` + key in errors: "shards[1].index.sha256").
template <typename T>
T Field(const json& object, const std::string& path, const char* key) {
  try {
    return object.at(key).get<T>();
  } catch (const json::exception& e) {
    throw std::runtime_error(absl::StrCat(path, key, ": ", e.what()));
  }
}

const json& Object(const json& parent, const std::string& path, const char* key) {
  try {
    return parent.at(key);
  } catch (const json::exception& e) {
    throw std::runtime_error(absl::StrCat(path, key, ": ", e.what()));
  }
}

ManifestFile FileFromJson(const json& j, const std::string& path) {
  return {Field<std::string>(j, path, "file"),
          {Field<int64_t>(j, path, "bytes"), Field<std::string>(j, path, "sha256")}};
}

std::optional<ManifestFile> OptionalFile(const json& j, const std::string& path, const char* key) {
  if (!j.contains(key) || j.at(key).is_null()) return std::nullopt;
  return FileFromJson(j.at(key), absl::StrCat(path, key, "."));
}

absl::Status Check(const IndexManifest& m, const std::string& source) {
  auto bad = [&source](auto... parts) {
    return absl::DataLossError(absl::StrCat(source, ": ", parts...));
  };
  if (m.dim <= 0) return bad("dim ", m.dim);
  if (m.shards.empty()) return bad("no shards");
  int64_t next_id = 0;
  int64_t next_sentence = 0;
  for (size_t s = 0; s < m.shards.size(); ++s) {
    const ShardManifest& shard = m.shards[s];
    if (shard.id_begin != next_id || shard.id_end < shard.id_begin) {
      return bad("shard ", s, " covers ids [", shard.id_begin, ", ", shard.id_end,
                 "), expected to start at ", next_id);
    }
    if (shard.sentence_begin != next_sentence || shard.sentence_end < shard.sentence_begin) {
      return bad("shard ", s, " covers sentences [", shard.sentence_begin, ", ", shard.sentence_end,
                 "), expected to start at ", next_sentence);
    }
    if (m.subset_quantizer.has_value() != shard.subset_codes.has_value()) {
      return bad("shard ", s, " subset codes do not match the subset quantizer's presence");
    }
    next_id = shard.id_end;
    next_sentence = shard.sentence_end;
  }
  if (next_id != m.total_vectors) {
    return bad("shards cover ", next_id, " ids, total_vectors is ", m.total_vectors);
  }
  if (next_sentence != m.num_sentences) {
    return bad("shards cover ", next_sentence, " sentences, num_sentences is ", m.num_sentences);
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<ManifestFile> IndexManifest::Files() const {
  std::vector<ManifestFile> files;
  if (subset_quantizer) files.push_back(*subset_quantizer);
  for (const ShardManifest& shard : shards) {
    files.push_back(shard.index);
    if (shard.values) files.push_back(*shard.values);
    if (shard.subset_codes) files.push_back(*shard.subset_codes);
  }
  return files;
}

std::string IndexManifest::ToJson() const {
  json shards_json = json::array();
  for (const ShardManifest& s : shards) {
    json j = {{"id_begin", s.id_begin},
              {"id_end", s.id_end},
              {"sentence_begin", s.sentence_begin},
              {"sentence_end", s.sentence_end},
              {"index", FileToJson(s.index)}};
    if (s.values) j["values"] = FileToJson(*s.values);
    if (s.subset_codes) j["subset_codes"] = FileToJson(*s.subset_codes);
    shards_json.push_back(std::move(j));
  }
  json j = {{"format", kFormat},
            {"version", kVersion},
            {"factory", factory},
            {"metric", std::string(MetricName(metric))},
            {"dim", dim},
            {"total_vectors", total_vectors},
            {"num_sentences", num_sentences},
            {"shards", std::move(shards_json)}};
  if (subset_quantizer) {
    j["subset"] = {{"m", subset_m}, {"quantizer", FileToJson(*subset_quantizer)}};
  }
  return j.dump(2) + "\n";
}

absl::StatusOr<IndexManifest> IndexManifest::FromJson(const std::string& text,
                                                      const std::string& source) {
  IndexManifest m;
  try {
    const json j = json::parse(text);
    if (Field<std::string>(j, "", "format") != kFormat) {
      return absl::DataLossError(absl::StrCat(source, ": not a knnserve index manifest"));
    }
    if (const int version = Field<int>(j, "", "version"); version != kVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat(source, ": manifest version ", version, ", this build reads ", kVersion));
    }
    m.factory = Field<std::string>(j, "", "factory");
    const std::string metric = Field<std::string>(j, "", "metric");
    if (metric == MetricName(Metric::kL2)) {
      m.metric = Metric::kL2;
    } else if (metric == MetricName(Metric::kInnerProduct)) {
      m.metric = Metric::kInnerProduct;
    } else {
      return absl::DataLossError(absl::StrCat(source, ": unknown metric \"", metric, "\""));
    }
    m.dim = Field<int>(j, "", "dim");
    m.total_vectors = Field<int64_t>(j, "", "total_vectors");
    m.num_sentences = Field<int64_t>(j, "", "num_sentences");
    if (j.contains("subset")) {
      const json& subset = j.at("subset");
      m.subset_m = Field<int>(subset, "subset.", "m");
      m.subset_quantizer =
          FileFromJson(Object(subset, "subset.", "quantizer"), "subset.quantizer.");
    }
    const json& shards = Object(j, "", "shards");
    for (size_t i = 0; i < shards.size(); ++i) {
      const json& s = shards.at(i);
      const std::string path = absl::StrCat("shards[", i, "].");
      ShardManifest shard;
      shard.id_begin = Field<int64_t>(s, path, "id_begin");
      shard.id_end = Field<int64_t>(s, path, "id_end");
      shard.sentence_begin = Field<int64_t>(s, path, "sentence_begin");
      shard.sentence_end = Field<int64_t>(s, path, "sentence_end");
      shard.index = FileFromJson(Object(s, path, "index"), path + "index.");
      shard.values = OptionalFile(s, path, "values");
      shard.subset_codes = OptionalFile(s, path, "subset_codes");
      m.shards.push_back(std::move(shard));
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(source, ": bad manifest: ", e.what()));
  }
  RETURN_IF_ERROR(Check(m, source));
  return m;
}

absl::StatusOr<std::unique_ptr<VerifiedFileReader>> OpenChecked(const std::string& dir,
                                                                const ManifestFile& f) {
  return VerifiedFileReader::Open(absl::StrCat(dir, "/", f.file), f.digest);
}

absl::StatusOr<IndexManifest> ReadManifest(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kManifestFileName);
  ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path));
  return IndexManifest::FromJson(std::string(bytes.begin(), bytes.end()), path);
}

absl::StatusOr<FileDigest> WriteManifest(const std::string& dir, const IndexManifest& manifest) {
  return WriteFileAtomically(absl::StrCat(dir, "/", kManifestFileName), manifest.ToJson());
}

}  // namespace knnserve
