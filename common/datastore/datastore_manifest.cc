#include "common/datastore/datastore_manifest.h"

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace knnserve {
namespace {

using nlohmann::json;

constexpr char kFormat[] = "knnserve-datastore";

std::string ManifestPath(const std::string& dir) {
  return (std::filesystem::path(dir) / kDatastoreManifestFileName).string();
}

}  // namespace

std::string DatastoreManifest::ToJson() const {
  json steps_json = json::object();
  for (const auto& [name, f] : steps) {
    steps_json[name] = {{"file", f.file}, {"bytes", f.digest.bytes}, {"sha256", f.digest.sha256}};
    if (auto it = step_options.find(name); it != step_options.end()) {
      steps_json[name]["options"] = it->second;
    }
  }
  const json j = {{"format", kFormat},
                  {"version", kVersion},
                  {"inputs", inputs},
                  {"steps", std::move(steps_json)}};
  return j.dump(2) + "\n";
}

absl::StatusOr<DatastoreManifest> DatastoreManifest::FromJson(const std::string& text,
                                                              const std::string& source) {
  DatastoreManifest manifest;
  try {
    const json j = json::parse(text);
    if (j.at("format").get<std::string>() != kFormat) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": not a ", kFormat, " manifest"));
    }
    if (j.at("version").get<int>() != kVersion) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": unsupported version ", j.at("version").dump()));
    }
    manifest.inputs = j.at("inputs").get<std::map<std::string, std::string>>();
    for (const auto& [name, f] : j.at("steps").items()) {
      manifest.steps[name] =
          ManifestFile{f.at("file").get<std::string>(),
                       FileDigest{f.at("bytes").get<int64_t>(), f.at("sha256").get<std::string>()}};
      if (f.contains("options")) manifest.step_options[name] = f.at("options").get<std::string>();
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": bad manifest: ", e.what()));
  }
  return manifest;
}

absl::StatusOr<std::optional<DatastoreManifest>> ReadDatastoreManifest(const std::string& dir) {
  const std::string path = ManifestPath(dir);
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    if (error)
      return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", error.message()));
    return std::optional<DatastoreManifest>();
  }
  ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes, ReadFileBytes(path));
  ASSIGN_OR_RETURN(DatastoreManifest manifest,
                   DatastoreManifest::FromJson(std::string(bytes.begin(), bytes.end()), path));
  return std::optional<DatastoreManifest>(std::move(manifest));
}

absl::Status WriteDatastoreManifest(const std::string& dir, const DatastoreManifest& manifest) {
  return WriteFileAtomically(ManifestPath(dir), manifest.ToJson()).status();
}

absl::Status CheckInputs(const DatastoreManifest& manifest,
                         const std::map<std::string, std::string>& expected,
                         const std::string& dir) {
  for (const auto& [name, value] : expected) {
    auto it = manifest.inputs.find(name);
    if (it != manifest.inputs.end() && it->second != value) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir, " was built with ", name, " ", it->second, ", this run has ", value,
                       ": another corpus, tokenizer or model (use a new output directory)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace knnserve
