// `datastore build`: every step runs once, a rerun skips verified outputs, a changed output is
// recomputed with everything after it (an output recomputed the same keeps what follows it), a
// failed rebuild loses nothing, another model's directory is refused, and decoding
// checks that the keys came from its model and feature; a full disk fails a step without
// losing earlier ones or publishing a half-written file.
#include "client/datastore/pipeline.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/datastore/datastore_manifest.h"
#include "common/datastore/hdf5_file.h"
#include "common/datastore/values_file.h"
#include "common/files.h"
#include "common/index/manifest.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/datastore/tiny_setup.h"
#include "tests/testing/file_size_limit.h"
#include "tests/testing/temp_dir.h"

namespace knnserve::datastore {
namespace {

namespace fs = std::filesystem;
using ::knnserve::testing::FileSizeLimit;
using ::knnserve::testing::StatusIs;
using ::knnserve::testing::Tiny;
using ::testing::HasSubstr;

class PipelineTest : public knnserve::testing::TempDirTest {
 protected:
  BuildOptions Options() {
    BuildOptions o;
    o.corpus_path = knnserve::testing::kPairs50;
    o.model_path = Tiny().model_path;
    o.out_dir = Path("ds");
    o.threads = 1;
    o.keys.max_tokens = 64;
    o.keys.progress.out = devnull_;
    o.index.factory = "Flat";
    o.index.shards = 2;
    o.index.progress.out = devnull_;
    return o;
  }
  static std::vector<float> ReadAll(const std::string& path) {
    auto file = Hdf5File::Open(path, Hdf5File::Mode::kReadOnly);
    EXPECT_OK(file.status());
    if (!file.ok()) return {};
    auto shape = (*file)->Shape("/keys");
    EXPECT_OK(shape.status());
    std::vector<float> out(shape->first * shape->second);
    EXPECT_OK((*file)->ReadRows("/keys", 0, shape->first, out.data()));
    return out;
  }
  static std::vector<std::string> Skipped(const std::vector<StepResult>& results) {
    std::vector<std::string> names;
    for (const StepResult& r : results) {
      if (r.skipped) names.push_back(r.step);
    }
    return names;
  }
};

TEST_F(PipelineTest, BuildsEveryStepThenSkipsThemAllWhenVerified) {
  ASSERT_OK_AND_ASSIGN(const auto first, BuildDatastore(Options()));
  ASSERT_EQ(first.size(), 5u);
  EXPECT_TRUE(Skipped(first).empty());
  ASSERT_OK_AND_ASSIGN(const ValuesFile values, ReadValuesFile(Path("ds/") + kValuesFileName));
  ASSERT_OK_AND_ASSIGN(const IndexManifest index, ReadManifest(Path("ds/index")));
  EXPECT_EQ(index.total_vectors, static_cast<int64_t>(values.target.tokens.size()));
  EXPECT_EQ(index.num_sentences, values.num_sentences());
  EXPECT_EQ(index.shards.size(), 2u);
  ASSERT_OK_AND_ASSIGN(const IndexManifest sentences, ReadManifest(Path("ds/sentence_index")));
  EXPECT_EQ(sentences.total_vectors, values.num_sentences());

  ASSERT_OK_AND_ASSIGN(const auto second, BuildDatastore(Options()));
  EXPECT_THAT(Skipped(second),
              ::testing::ElementsAre("values", "keys", "sentence_keys", "index", "sentence_index"));
}

TEST_F(PipelineTest, ARerunWithOtherIndexOptionsRebuildsTheIndexAndKeepsTheKeys) {
  ASSERT_OK(BuildDatastore(Options()).status());
  BuildOptions other = Options();
  other.index.factory = "PQ4np";
  other.index.shards = 3;
  ASSERT_OK_AND_ASSIGN(const auto results, BuildDatastore(other));
  EXPECT_THAT(Skipped(results), ::testing::ElementsAre("values", "keys", "sentence_keys"));
  ASSERT_OK_AND_ASSIGN(const IndexManifest index, ReadManifest(Path("ds/index")));
  EXPECT_EQ(index.factory, "PQ4np");
  EXPECT_EQ(index.shards.size(), 3u);
  ASSERT_OK_AND_ASSIGN(const auto again, BuildDatastore(other));
  EXPECT_EQ(Skipped(again).size(), 5u);
  // Other key options (float32 keys) rebuild the keys and everything after them.
  other.keys.fp16 = false;
  ASSERT_OK_AND_ASSIGN(const auto fp32, BuildDatastore(other));
  EXPECT_THAT(Skipped(fp32), ::testing::ElementsAre("values"));
}

// A run stopped after the keys step published keys.h5 but before datastore.json recorded it
// (the records of the steps being recomputed are gone from it by then): the next run adopts
// the keys when they are what it asks for, and computes them again in the dtype it asks for.
TEST_F(PipelineTest, KeysPublishedButNotRecordedAreAdoptedOnlyInTheDtypeAskedFor) {
  ASSERT_OK(BuildDatastore(Options()).status());
  const std::string keys = Path("ds/") + kKeysFileName;
  ASSERT_OK_AND_ASSIGN(const FileDigest built, DigestFile(keys));
  const auto forget_keys_and_later = [this] {
    ASSERT_OK_AND_ASSIGN(std::optional<DatastoreManifest> manifest,
                         ReadDatastoreManifest(Path("ds")));
    ASSERT_TRUE(manifest.has_value());
    for (const char* step : {"keys", "sentence_keys", "index", "sentence_index"}) {
      manifest->steps.erase(step);
      manifest->step_options.erase(step);
    }
    ASSERT_OK(WriteDatastoreManifest(Path("ds"), *manifest));
  };
  forget_keys_and_later();
  ASSERT_OK_AND_ASSIGN(const auto adopted, BuildDatastore(Options()));
  EXPECT_THAT(adopted[1].detail, HasSubstr("already complete"));
  ASSERT_OK_AND_ASSIGN(const FileDigest after, DigestFile(keys));
  EXPECT_EQ(after.sha256, built.sha256);

  forget_keys_and_later();
  BuildOptions fp32 = Options();
  fp32.keys.fp16 = false;
  ASSERT_OK_AND_ASSIGN(const auto recomputed, BuildDatastore(fp32));
  EXPECT_THAT(recomputed[1].detail, ::testing::Not(HasSubstr("already complete")));
  ASSERT_OK_AND_ASSIGN(auto file, Hdf5File::Open(keys, Hdf5File::Mode::kReadOnly));
  ASSERT_OK_AND_ASSIGN(const Hdf5Type type, file->TypeOf("/keys"));
  EXPECT_EQ(type, Hdf5Type::kFloat32);
}

// A factory string faiss cannot build, for the index or the sentence index, fails the build
// before the values and the keys are computed (hours on a real corpus), naming the flag and the
// string; a factory that does not fit the model's key width (PQ7 of 32 dimensions) too.
TEST_F(PipelineTest, ABadFactoryFailsBeforeTheKeysAreComputed) {
  for (const bool sentences : {false, true}) {
    for (const char* factory : {"Bogus", "IVF4,PQ7"}) {
      BuildOptions bad = Options();
      (sentences ? bad.sentence_factory : bad.index.factory) = factory;
      EXPECT_THAT(BuildDatastore(bad),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr(absl::StrCat(sentences ? "--sentence-factory " : "--factory ",
                                                  factory, ": "))));
      EXPECT_FALSE(fs::exists(Path("ds/") + kValuesFileName)) << factory;
      EXPECT_FALSE(fs::exists(Path("ds/") + kKeysFileName)) << factory;
    }
  }
}

// translate's --datastore (provenance, sentence index) must be the datastore of the index it
// searches: an --index of another datastore is refused before decoding, naming both sizes.
TEST_F(PipelineTest, TranslateRefusesAnIndexOfAnotherDatastore) {
  ASSERT_OK(BuildDatastore(Options()).status());
  BuildOptions other = Options();
  other.corpus_path = Write("half.tsv", [] {
    std::ifstream in(knnserve::testing::kPairs50);
    std::string line, text;
    for (int i = 0; i < 25 && std::getline(in, line); ++i) text += line + "\n";
    return text;
  }());
  other.out_dir = Path("other");
  ASSERT_OK(BuildDatastore(other).status());
  const std::string input = Write("input.txt", "a\n");
  const std::string out = Path("translate.out");
  const std::string command =
      absl::StrCat(KNNSERVE_BIN, " translate --model ", Tiny().model_path, " --input ", input,
                   " --output ", Path("hyp.txt"), " --mode knn --datastore ", Path("ds"),
                   " --index ", Path("other/index"), " > ", out, " 2>&1");
  EXPECT_NE(std::system(command.c_str()), 0);
  std::stringstream text;
  text << std::ifstream(out).rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("--datastore must be the datastore of that index"));
}

TEST_F(PipelineTest, AFailedRebuildWithBadIndexOptionsKeepsTheOldIndex) {
  ASSERT_OK(BuildDatastore(Options()).status());
  ASSERT_OK_AND_ASSIGN(const IndexManifest before, ReadManifest(Path("ds/index")));
  BuildOptions bad = Options();
  bad.index.factory = "Bogus";
  EXPECT_FALSE(BuildDatastore(bad).ok());
  bad = Options();
  bad.index.shards = 0;
  EXPECT_FALSE(BuildDatastore(bad).ok());
  // The old index is still whole and recorded: the original options skip every step.
  ASSERT_OK_AND_ASSIGN(const IndexManifest after, ReadManifest(Path("ds/index")));
  EXPECT_EQ(after.factory, before.factory);
  ASSERT_OK_AND_ASSIGN(const auto results, BuildDatastore(Options()));
  EXPECT_EQ(Skipped(results).size(), 5u);
}

// A rebuild with other values options that fails (here: the disk fills) loses nothing: the old
// values.h5 stays, and so do the records of every step, so the old options skip them all.
TEST_F(PipelineTest, AFailedValuesRebuildWithOtherOptionsKeepsEveryStep) {
  ASSERT_OK(BuildDatastore(Options()).status());
  const std::string values = Path("ds/") + kValuesFileName;
  ASSERT_OK_AND_ASSIGN(const FileDigest built, DigestFile(values));
  BuildOptions other = Options();
  other.max_sentence_tokens = 2 * Options().max_sentence_tokens;
  {
    FileSizeLimit disk_full(fs::file_size(values) / 2);
    EXPECT_THAT(BuildDatastore(other).status().message(), HasSubstr(kValuesFileName));
  }
  ASSERT_OK_AND_ASSIGN(const FileDigest after, DigestFile(values));
  EXPECT_EQ(after.sha256, built.sha256);
  ASSERT_OK_AND_ASSIGN(const auto results, BuildDatastore(Options()));
  EXPECT_EQ(Skipped(results).size(), 5u);
}

// Other values options that change nothing in values.h5 (no sentence is longer than either
// limit) recompute the values, which hash the same: the keys and indexes stay.
TEST_F(PipelineTest, AValuesRebuildThatComesOutTheSameKeepsTheLaterSteps) {
  ASSERT_OK(BuildDatastore(Options()).status());
  BuildOptions other = Options();
  other.max_sentence_tokens = 2 * Options().max_sentence_tokens;
  ASSERT_OK_AND_ASSIGN(const auto results, BuildDatastore(other));
  EXPECT_THAT(Skipped(results),
              ::testing::ElementsAre("keys", "sentence_keys", "index", "sentence_index"));
  ASSERT_OK_AND_ASSIGN(const auto again, BuildDatastore(other));
  EXPECT_EQ(Skipped(again).size(), 5u);
}

// An index made from keys that were computed again (here in float32) is stale: it goes whole
// before its rebuild, and no file of it stays beside the new index.
TEST_F(PipelineTest, AnIndexOfChangedKeysGoesWholeBeforeItsRebuild) {
  BuildOptions options = Options();
  options.index.shards = 3;
  ASSERT_OK(BuildDatastore(options).status());
  options.keys.fp16 = false;
  options.index.shards = 2;
  ASSERT_OK(BuildDatastore(options).status());
  ASSERT_OK_AND_ASSIGN(const IndexManifest index, ReadManifest(Path("ds/index")));
  std::vector<std::string> expected = {"manifest.json", ".knnserve.lock"};  // the build's lock
  for (const ManifestFile& f : index.Files()) expected.push_back(f.file);
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(Path("ds/index"))) {
    left.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(left, ::testing::UnorderedElementsAreArray(expected));
}

TEST_F(PipelineTest, ValuesAloneMayNotReplaceTheValuesOfComputedKeys) {
  EXPECT_OK(CheckValuesMayBeWritten(Path("fresh")));
  ASSERT_OK(BuildDatastore(Options()).status());
  EXPECT_THAT(CheckValuesMayBeWritten(Path("ds")),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("datastore.json")));
  fs::remove(Path("ds/datastore.json"));
  EXPECT_THAT(CheckValuesMayBeWritten(Path("ds")),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("keys.h5")));
  // Keys still being computed count too: they name the values they are computed from.
  fs::create_directories(Path("computing"));
  std::ofstream(Path("computing/") + PartialPath(kKeysFileName)) << "rows";
  EXPECT_THAT(CheckValuesMayBeWritten(Path("computing")),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("keys.h5.partial")));
}

// A recomputed output that hashes as the recorded one did leaves the later steps' outputs valid.
TEST_F(PipelineTest, ACorruptedOutputIsRecomputedAndLaterStepsStandWhenItComesOutTheSame) {
  ASSERT_OK(BuildDatastore(Options()).status());
  const std::string sentence_keys = Path("ds/") + kSentenceKeysFileName;
  const std::vector<float> original = ReadAll(sentence_keys);
  {
    // Flip the last byte of sentence_keys.h5 (key data: the file stays readable HDF5).
    std::fstream f(sentence_keys, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char c = static_cast<char>(f.get() ^ 0x5a);
    f.seekp(-1, std::ios::end);
    f.put(c);
  }
  ASSERT_OK_AND_ASSIGN(const auto results, BuildDatastore(Options()));
  EXPECT_THAT(Skipped(results),
              ::testing::ElementsAre("values", "keys", "index", "sentence_index"));
  // Recomputed, not adopted: the same keys as the first build.
  EXPECT_EQ(ReadAll(sentence_keys), original);
  ASSERT_OK_AND_ASSIGN(const auto again, BuildDatastore(Options()));
  EXPECT_EQ(Skipped(again).size(), 5u);
}

TEST_F(PipelineTest, AFullDiskFailsTheStepKeepsEarlierStepsAndPublishesNothingHalfWritten) {
  ASSERT_OK(BuildDatastore(Options()).status());  // reference sizes and keys
  const auto size = [&](const char* name) { return fs::file_size(Path("ds/") + name); };
  const uintmax_t values_bytes = size(kValuesFileName);
  const uintmax_t keys_bytes = size(kKeysFileName);
  // Room for values.h5 (whose step first asks for room for its arrays uncompressed, 32 KiB
  // more), not for keys.h5.
  const uintmax_t limit = (values_bytes + keys_bytes) / 2 + 8192;
  ASSERT_GT(keys_bytes, limit + 4096);
  const std::vector<float> reference_keys = ReadAll(Path("ds/") + kKeysFileName);

  BuildOptions options = Options();
  options.out_dir = Path("full");
  {
    FileSizeLimit disk_full(limit);
    const absl::Status failed = BuildDatastore(options).status();
    EXPECT_FALSE(failed.ok());
    EXPECT_THAT(std::string(failed.message()), HasSubstr(kKeysFileName));
  }
  EXPECT_TRUE(fs::exists(Path("full/") + kValuesFileName));
  EXPECT_FALSE(fs::exists(Path("full/") + kKeysFileName));
  ASSERT_OK_AND_ASSIGN(const auto manifest, ReadDatastoreManifest(Path("full")));
  ASSERT_TRUE(manifest.has_value());
  EXPECT_EQ(manifest->steps.count("values"), 1u);
  EXPECT_EQ(manifest->steps.count("keys"), 0u);

  // With room again, the rerun keeps the values and computes the same keys.
  ASSERT_OK_AND_ASSIGN(const auto results, BuildDatastore(options));
  EXPECT_THAT(Skipped(results), ::testing::ElementsAre("values"));
  EXPECT_EQ(ReadAll(Path("full/") + kKeysFileName), reference_keys);
}

TEST_F(PipelineTest, ADirectoryBuiltWithAnotherModelIsRefused) {
  ASSERT_OK(BuildDatastore(Options()).status());
  BuildOptions other = Options();
  other.model_path = Tiny().other_model_path;
  EXPECT_THAT(BuildDatastore(other),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("model_sha256")));
  ASSERT_OK_AND_ASSIGN(const auto manifest, ReadDatastoreManifest(Path("ds")));
  ASSERT_TRUE(manifest.has_value());
  EXPECT_EQ(manifest->steps.size(), 5u);  // nothing of the first build was lost
}

TEST_F(PipelineTest, DecodingNeedsTheModelAndFeatureTheKeysCameFrom) {
  ASSERT_OK(BuildDatastore(Options()).status());
  EXPECT_OK(CheckDatastoreForDecoding(Path("ds"), Tiny().model_path));
  EXPECT_THAT(CheckDatastoreForDecoding(Path("ds"), Tiny().other_model_path),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("built with the model")));
  BuildOptions ffn = Options();
  ffn.out_dir = Path("ffn");
  ffn.feature = kFeatureFfnIn;
  ASSERT_OK(BuildDatastore(ffn).status());
  EXPECT_THAT(CheckDatastoreForDecoding(Path("ffn"), Tiny().model_path),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("ffn_in keys")));
  EXPECT_OK(CheckDatastoreForDecoding(Path("no-manifest"), Tiny().model_path));
}

}  // namespace
}  // namespace knnserve::datastore
