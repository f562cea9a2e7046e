// Atomic files, SHA-256, the HDF5 datastore adapter and building from HDF5.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "common/datastore/hdf5_datastore.h"
#include "common/files.h"
#include "common/half.h"
#include "common/index/builder.h"
#include "common/index/index_engine.h"
#include "common/index/manifest.h"
#include "common/index/shard_data.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/index_test_util.h"
#include "tests/testing/file_size_limit.h"
#include "tests/testing/temp_dir.h"

namespace knnserve {
namespace {

using ::knnserve::testing::FileSizeLimit;
using ::knnserve::testing::FreshTempDir;
using ::knnserve::testing::IsOk;
using ::knnserve::testing::StatusIs;
using ::testing::HasSubstr;

TEST(Files, Sha256KnownAnswer) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Files, AtomicWriteLeavesOnlyTheFinalFile) {
  const std::string dir = FreshTempDir("atomic").string();
  ASSERT_OK_AND_ASSIGN(FileDigest d, WriteFileAtomically(dir + "/a.bin", "hello"));
  EXPECT_EQ(d.bytes, 5);
  EXPECT_EQ(d.sha256, Sha256Hex("hello"));
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename(), "a.bin");
    ++files;
  }
  EXPECT_EQ(files, 1);
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, ReadFileBytes(dir + "/a.bin"));
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "hello");
}

TEST(Files, UncommittedWriterRemovesItsTemporaryFile) {
  const std::string dir = FreshTempDir("uncommitted").string();
  {
    ASSERT_OK_AND_ASSIGN(auto writer, AtomicFileWriter::Create(dir + "/b.bin"));
    ASSERT_THAT(writer->Append("partial"), IsOk());
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

TEST(Files, CheckRoomForRefusesMoreThanTheDiskOrTheFileSizeLimitAllows) {
  const std::string path = FreshTempDir("room").string() + "/big.bin";
  EXPECT_OK(CheckRoomFor(path, 1 << 20));
  EXPECT_THAT(CheckRoomFor(path, int64_t{1} << 60),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("big.bin needs")));
  FileSizeLimit limit(1 << 16);
  EXPECT_OK(CheckRoomFor(path, 1 << 16));
  EXPECT_THAT(CheckRoomFor(path, (1 << 16) + 1),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("file size limit")));
}

TEST(Files, AFullDiskFailsTheAtomicWriteAndKeepsTheOldFile) {
  const std::string dir = FreshTempDir("full").string();
  ASSERT_OK(WriteFileAtomically(dir + "/f.bin", "old").status());
  {
    FileSizeLimit limit(1 << 12);
    EXPECT_FALSE(WriteFileAtomically(dir + "/f.bin", std::string(1 << 13, 'x')).ok());
  }
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, ReadFileBytes(dir + "/f.bin"));
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "old");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1);  // no temp left
}

// Renaming a temporary file over a device would replace the device with a file: devices are
// written in place, and their errors (a full /dev/full) are reported.
TEST(Files, ADeviceIsWrittenInPlaceAndADirectoryIsRefused) {
  ASSERT_OK(WriteFileAtomically("/dev/null", "discarded").status());
  EXPECT_TRUE(std::filesystem::is_character_file("/dev/null"));
  if (std::filesystem::exists("/dev/full")) {
    EXPECT_THAT(WriteFileAtomically("/dev/full", "x").status(),
                StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("/dev/full")));
    EXPECT_TRUE(std::filesystem::is_character_file("/dev/full"));
  }
  const std::string dir = FreshTempDir("write_dir").string();
  EXPECT_THAT(WriteFileAtomically(dir, "x").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a directory")));
}

TEST(Files, ADirectoryLockIsHeldByOneHolderAtATime) {
  const std::string dir = FreshTempDir("lock").string() + "/ds";
  ASSERT_OK_AND_ASSIGN(auto first, DirectoryLock::Acquire(dir));  // creates the directory
  EXPECT_THAT(DirectoryLock::Acquire(dir),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("another knnserve command is writing " + dir)));
  first.reset();
  EXPECT_THAT(DirectoryLock::Acquire(dir), IsOk());
}

// The pid of a process that has ended.
pid_t EndedProcess() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

// What killed writers left (their temporaries, in the directory and an index's subdirectory)
// goes. Files of a process still running (this one, or an index build, which takes no lock),
// files not named as knnserve names its temporaries, and anything deeper stay.
TEST(Files, ADirectoryLockRemovesTheDebrisOfKilledWriters) {
  const std::string dir = FreshTempDir("debris").string();
  std::filesystem::create_directories(dir + "/index/deeper");
  const std::string ended = std::to_string(EndedProcess());
  const std::string own = std::to_string(::getpid());
  const std::vector<std::string> debris = {"values.h5.spill.knnserve-tmp." + ended,
                                           "index/shard-00001.faiss.knnserve-tmp." + ended,
                                           "keys.h5.knnserve-tmp." + ended};
  const std::vector<std::string> kept = {"values.h5.spill.knnserve-tmp." + own,
                                         "index/manifest.json.knnserve-tmp.1",  // init runs
                                         "index/deeper/x.knnserve-tmp." + ended,
                                         "report.tmp." + ended,
                                         "notes.tmp",
                                         "keys.h5",
                                         "index/shard-00000.faiss"};
  for (const std::vector<std::string>* names : {&debris, &kept}) {
    for (const std::string& name : *names) std::ofstream(dir + "/" + name) << "x";
  }
  ASSERT_OK_AND_ASSIGN(auto lock, DirectoryLock::Acquire(dir));
  EXPECT_EQ(lock->RemoveDebris(DirectoryLock::DebrisScope::kDirectory), 2);
  EXPECT_EQ(lock->RemoveDebris(DirectoryLock::DebrisScope::kDirectoryAndSubdirectories), 1);
  for (const std::string& name : debris) {
    EXPECT_FALSE(std::filesystem::exists(dir + "/" + name)) << name;
  }
  for (const std::string& name : kept) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + name)) << name;
  }
}

// Two flags naming one file (the same path spelled otherwise, or a link to it) are refused
// naming both flags; stdin/stdout ("-"), unset paths and devices may repeat.
TEST(Files, CheckDistinctFilesRefusesTwoNamesOfOneFile) {
  const std::string dir = FreshTempDir("distinct").string();
  std::ofstream(dir + "/dev.tsv") << "a\tb\n";
  std::filesystem::create_symlink(dir + "/dev.tsv", dir + "/link.tsv");
  EXPECT_THAT(CheckDistinctFiles({{"--dev", dir + "/dev.tsv"}, {"--out", dir + "/./dev.tsv"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--dev " + dir + "/dev.tsv and --out " + dir +
                                 "/./dev.tsv name the same file")));
  EXPECT_THAT(CheckDistinctFiles({{"--dev", dir + "/dev.tsv"}, {"--out", dir + "/link.tsv"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the same file")));
  EXPECT_THAT(CheckDistinctFiles(
                  {{"--output", dir + "/new.txt"}, {"--stats-json", dir + "/sub/../new.txt"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the same file")));
  EXPECT_THAT(CheckDistinctFiles({{"--input", "-"},
                                  {"--output", "-"},
                                  {"--stats-json", ""},
                                  {"--x", ""},
                                  {"--a", "/dev/null"},
                                  {"--b", "/dev/null"},
                                  {"--out", dir + "/other.json"},
                                  {"--dev", dir + "/dev.tsv"}}),
              IsOk());
}

TEST(Files, VerifiedReaderRefusesAMismatchNamingTheFile) {
  const std::string dir = FreshTempDir("verify").string();
  ASSERT_OK_AND_ASSIGN(FileDigest d, WriteFileAtomically(dir + "/c.bin", "content"));
  EXPECT_THAT(VerifiedFileReader::Open(dir + "/c.bin", {d.bytes + 1, d.sha256}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("c.bin has 7 bytes")));
  EXPECT_THAT(VerifiedFileReader::Open(dir + "/c.bin", {d.bytes, Sha256Hex("other")}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("c.bin has 7 bytes, sha256 ")));
  EXPECT_THAT(VerifiedFileReader::Open(dir + "/missing.bin", d),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.bin")));
}

// Reads of every size, through and around its buffer, give the file back byte for byte.
TEST(Files, VerifiedReaderReadsTheFileInAnyPieces) {
  const std::string dir = FreshTempDir("pieces").string();
  std::string content(3 * (1 << 20) + 12345, '\0');
  std::mt19937 rng(7);
  for (char& c : content) c = static_cast<char>(rng());
  ASSERT_OK_AND_ASSIGN(FileDigest d, WriteFileAtomically(dir + "/p.bin", content));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VerifiedFileReader> in,
                       VerifiedFileReader::Open(dir + "/p.bin", d));
  std::string back;
  for (const size_t piece : {size_t{1}, size_t{7}, size_t{1} << 20, size_t{3}, size_t{2} << 20,
                             size_t{100000}, size_t{1} << 22}) {
    std::string part(piece, '\0');
    ASSERT_OK_AND_ASSIGN(const size_t n, in->Read(part.data(), part.size()));
    back.append(part, 0, n);
    EXPECT_EQ(in->remaining(), content.size() - back.size());
  }
  EXPECT_EQ(back, content);
  char more;
  ASSERT_OK_AND_ASSIGN(const size_t past_the_end, in->Read(&more, 1));
  EXPECT_EQ(past_the_end, 0u);
}

// Files are replaced by renaming a new one over them: a reader keeps reading what it checked.
TEST(Files, VerifiedReaderReadsTheFileItCheckedWhenAnotherReplacesIt) {
  const std::string dir = FreshTempDir("replaced").string();
  ASSERT_OK_AND_ASSIGN(FileDigest d, WriteFileAtomically(dir + "/r.bin", "checked"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VerifiedFileReader> in,
                       VerifiedFileReader::Open(dir + "/r.bin", d));
  ASSERT_OK(WriteFileAtomically(dir + "/r.bin", "replacement").status());
  std::string back(16, '\0');
  ASSERT_OK_AND_ASSIGN(const size_t n, in->Read(back.data(), back.size()));
  EXPECT_EQ(back.substr(0, n), "checked");
}

// A manifest field of the wrong type or missing is named with its path.
TEST(IndexManifest, BadFieldsAreNamedWithTheirPath) {
  IndexManifest m;
  m.factory = "Flat";
  m.dim = 4;
  m.total_vectors = 10;
  ShardManifest shard;
  shard.id_end = 10;
  shard.index = {"shard-00000.faiss", {123, std::string(64, 'a')}};
  m.shards = {shard, shard};
  m.shards[1].id_begin = 10;
  m.shards[1].id_end = 10;
  const std::string good = m.ToJson();
  ASSERT_OK(IndexManifest::FromJson(good, "m.json").status());
  const auto replaced = [&good](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.rfind(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  EXPECT_THAT(IndexManifest::FromJson(replaced("\"dim\": 4", "\"dim\": \"abc\""), "m.json"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("m.json: bad manifest: dim: ")));
  EXPECT_THAT(IndexManifest::FromJson(replaced("\"bytes\": 123", "\"bytes\": \"x\""), "m.json"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("shards[1].index.bytes: ")));
  EXPECT_THAT(IndexManifest::FromJson(replaced("\"index\":", "\"other\":"), "m.json"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("shards[1].index: ")));
}

TEST(ShardData, RoundTripsAndRefusesBadHeaders) {
  const std::vector<int32_t> values = {5, -1, 7};
  const std::string v = SerializeValues(values);
  const auto read_values = [](const std::string& s, const std::string& name) {
    SpanReader in(s.data(), s.size(), name);
    return ReadValues(in);
  };
  const auto read_codes = [](const std::string& s, const std::string& name) {
    SpanReader in(s.data(), s.size(), name);
    return ReadSubsetCodes(in);
  };
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> back, read_values(v, "v"));
  EXPECT_EQ(back, values);
  EXPECT_THAT(read_values(v.substr(0, v.size() - 1), "x.values"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("x.values")));

  SubsetCodes codes{2, 0, 0, {0, 1, 3}, {1, 2, 3, 4, 5, 6}};
  std::string c = SerializeSubsetCodes(codes);
  ASSERT_OK_AND_ASSIGN(SubsetCodes parsed, read_codes(c, "c"));
  EXPECT_EQ(SubsetCodesHeader(codes.m, codes.offsets) +
                std::string(codes.codes.begin(), codes.codes.end()),
            c);
  EXPECT_EQ(parsed.offsets, codes.offsets);
  EXPECT_EQ(parsed.codes, codes.codes);
  std::string huge_m = c;
  huge_m[11] = '\x7f';  // m = 0x7f000002: with 2^40 vectors its size check would overflow
  EXPECT_THAT(read_codes(huge_m, "m.subset"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("m.subset: bad header (m ")));
  c[16] = '\x7f';  // num_sentences' low byte: the header no longer matches the payload
  EXPECT_THAT(read_codes(c, "y.subset"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("y.subset")));
  EXPECT_THAT(read_values(c, "z"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not a KNSVALS1")));
}

TEST(Hdf5Datastore, KeysRoundTripFloat32AndFloat16) {
  const std::string dir = FreshTempDir("h5keys").string();
  const testing::Datastore ds = testing::MakeDatastore(300, 12, 4, 1);
  for (bool fp16 : {false, true}) {
    SCOPED_TRACE(fp16);
    const std::string path = dir + (fp16 ? "/keys16.h5" : "/keys32.h5");
    ASSERT_THAT(WriteKeysHdf5(path, ds.keys.view(), fp16), IsOk());
    ASSERT_OK_AND_ASSIGN(auto source, Hdf5KeySource::Open(path));
    EXPECT_EQ(source->rows(), 300);
    EXPECT_EQ(source->dim(), 12);
    EXPECT_EQ(source->is_fp16(), fp16);
    std::vector<float> rows(50 * 12);
    ASSERT_THAT(source->Read(100, 150, rows.data()), IsOk());
    for (int i = 0; i < 50 * 12; ++i) {
      const float want = ds.keys.data()[100 * 12 + i];
      EXPECT_EQ(rows[i], fp16 ? HalfToFloat(FloatToHalf(want)) : want);
    }
  }
}

TEST(Hdf5Datastore, ValuesRoundTripAndValidation) {
  const std::string dir = FreshTempDir("h5values").string();
  const testing::Datastore ds = testing::MakeDatastore(200, 4, 2, 2);
  ASSERT_THAT(WriteValuesHdf5(dir + "/values.h5", ds.values), IsOk());
  ASSERT_OK_AND_ASSIGN(DatastoreValues v, ReadValuesHdf5(dir + "/values.h5"));
  EXPECT_EQ(v.tokens, ds.values.tokens);
  EXPECT_EQ(v.offsets, ds.values.offsets);

  DatastoreValues bad = ds.values;
  bad.offsets.back() += 1;
  ASSERT_THAT(WriteValuesHdf5(dir + "/bad.h5", bad), IsOk());
  EXPECT_THAT(ReadValuesHdf5(dir + "/bad.h5"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("bad.h5"), HasSubstr("/offsets end at"))));
  EXPECT_THAT(Hdf5KeySource::Open(dir + "/values.h5"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("values.h5")));
}

// An index built from keys.h5 + values.h5, streamed, is the one built from memory file for file
// (the manifest holds every file's SHA-256); each shard's values file, written in chunks, is what
// the one-shot serializer makes of its tokens.
TEST(Hdf5Datastore, BuildFromHdf5EqualsBuildFromMemory) {
  const std::string dir = FreshTempDir("h5build").string();
  const testing::Datastore ds = testing::MakeDatastore(800, 8, 6, 3);
  ASSERT_THAT(WriteKeysHdf5(dir + "/keys.h5", ds.keys.view(), /*fp16=*/false), IsOk());
  ASSERT_THAT(WriteValuesHdf5(dir + "/values.h5", ds.values), IsOk());
  ASSERT_OK_AND_ASSIGN(auto keys, Hdf5KeySource::Open(dir + "/keys.h5"));
  ASSERT_OK_AND_ASSIGN(auto values, Hdf5ValueSource::Open(dir + "/values.h5"));
  EXPECT_THAT(values->offsets(), ::testing::ElementsAreArray(ds.values.offsets));
  IndexBuildOptions options;
  options.factory = "IVF4,PQ2";  // with subset codes
  options.shards = 2;
  options.chunk_rows = 100;
  options.progress.out = nullptr;
  ASSERT_OK_AND_ASSIGN(const IndexManifest from_h5,
                       BuildIndex(*keys, values.get(), options, dir + "/from_h5"));
  MatrixKeySource memory(ds.keys.view());
  const MemoryValueSource memory_values(ds.values);
  ASSERT_OK_AND_ASSIGN(const IndexManifest from_memory,
                       BuildIndex(memory, &memory_values, options, dir + "/from_memory"));
  ASSERT_GT(from_h5.subset_m, 0);
  EXPECT_EQ(from_h5.ToJson(), from_memory.ToJson());
  for (const ShardManifest& shard : from_h5.shards) {
    const std::string one_shot = SerializeValues(absl::MakeConstSpan(
        ds.values.tokens.data() + shard.id_begin, shard.id_end - shard.id_begin));
    EXPECT_EQ(shard.values->digest.sha256, Sha256Hex(one_shot));
  }
}

// Keys that would give a shard 2^32 vectors or more are refused before anything is read or
// trained (shards number their vectors with 32-bit ids: the shard could never be served).
TEST(IndexBuild, ShardsOfMoreThan32BitIdsAreRefusedUpFront) {
  class HugeKeys : public KeySource {
   public:
    int64_t rows() const override { return int64_t{5} << 30; }
    int dim() const override { return 4; }
    absl::Status Read(int64_t, int64_t, float*) const override {
      return absl::InternalError("read");
    }
  } keys;
  IndexBuildOptions options;
  options.factory = "IVF4,PQ2";
  options.progress.out = nullptr;
  const std::string dir = FreshTempDir("huge").string();
  EXPECT_THAT(BuildIndex(keys, nullptr, options, dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a shard holds fewer than 2^32 vectors; use at least 2 shards")));
  options.shards = 2;  // allowed: the build goes on to read the keys
  const absl::Status two = BuildIndex(keys, nullptr, options, dir).status();
  EXPECT_FALSE(two.ok());
  EXPECT_THAT(two.message(), ::testing::Not(HasSubstr("2^32")));
}

// Small IVF-PQ builds (with subset codes when given values), quiet.
IndexBuildOptions QuietIvfPq(int shards) {
  IndexBuildOptions options;
  options.factory = "IVF4,PQ2";
  options.shards = shards;
  options.progress.out = nullptr;
  return options;
}

// The names of the files in `dir`.
std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

// A build over an existing index leaves only its own files: those of the old index's extra
// shards and of its subset codes go once the new manifest is written; other files stay.
TEST(Hdf5Datastore, ARebuildRemovesTheFilesOfTheIndexItReplaces) {
  const std::string dir = FreshTempDir("rebuild").string();
  const testing::Datastore ds = testing::MakeDatastore(300, 8, 4, 5);
  MatrixKeySource keys(ds.keys.view());
  const MemoryValueSource values(ds.values);
  IndexBuildOptions options = QuietIvfPq(3);
  ASSERT_OK_AND_ASSIGN(const IndexManifest old_index, BuildIndex(keys, &values, options, dir));
  std::ofstream(dir + "/notes.txt") << "not the index's";
  options.factory = "Flat";
  options.shards = 1;
  ASSERT_OK_AND_ASSIGN(const IndexManifest new_index, BuildIndex(keys, &values, options, dir));
  std::vector<std::string> expected = {"manifest.json", "notes.txt", ".knnserve.lock"};
  for (const ManifestFile& f : new_index.Files()) expected.push_back(f.file);
  EXPECT_THAT(FilesIn(dir), ::testing::UnorderedElementsAreArray(expected));
  EXPECT_GT(old_index.Files().size(), new_index.Files().size());
}

// `keys`, whose reads that start at row `first_bad_row` or later fail ("bad sector").
class KeysFailingFrom : public KeySource {
 public:
  KeysFailingFrom(const KeySource& keys, int64_t first_bad_row)
      : keys_(keys), first_bad_row_(first_bad_row) {}
  int64_t rows() const override { return keys_.rows(); }
  int dim() const override { return keys_.dim(); }
  absl::Status Read(int64_t begin, int64_t end, float* out) const override {
    if (begin >= first_bad_row_) return absl::DataLossError("bad sector");
    return keys_.Read(begin, end, out);
  }

 private:
  const KeySource& keys_;
  const int64_t first_bad_row_;
};

// `dir` holds `index` whole: the same manifest, every file it lists verifying, and no other
// file (the lock file aside).
void ExpectIndexIsStill(const IndexManifest& index, const std::string& dir) {
  ASSERT_OK_AND_ASSIGN(const IndexManifest now, ReadManifest(dir));
  EXPECT_EQ(now.ToJson(), index.ToJson());
  std::vector<std::string> expected = {"manifest.json", ".knnserve.lock"};
  for (const ManifestFile& f : index.Files()) {
    EXPECT_OK(VerifyFile(dir + "/" + f.file, f.digest)) << f.file;
    expected.push_back(f.file);
  }
  EXPECT_THAT(FilesIn(dir), ::testing::UnorderedElementsAreArray(expected));
}

// A rebuild that fails after writing some of its files (a key read fails in its second shard)
// leaves the index it would replace whole: the same manifest, every file verifying, nothing of
// its own left behind.
TEST(IndexBuild, AFailedRebuildKeepsTheIndexItWouldReplace) {
  const std::string dir = FreshTempDir("failed-rebuild").string();
  const testing::Datastore ds = testing::MakeDatastore(300, 8, 4, 5);
  const MatrixKeySource keys(ds.keys.view());
  const MemoryValueSource values(ds.values);
  IndexBuildOptions options = QuietIvfPq(2);
  ASSERT_OK_AND_ASSIGN(const IndexManifest old_index, BuildIndex(keys, &values, options, dir));

  // Reads from row 100 on fail; the training sample (all rows, read from row 0) does not.
  const KeysFailingFrom failing(keys, 100);
  options.factory = "IVF4,PQ4";
  EXPECT_THAT(BuildIndex(failing, &values, options, dir),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bad sector")));

  ExpectIndexIsStill(old_index, dir);
}

// A build holds its directory's lock: it is refused while another command writes there, and
// removes the staged files of builds that were killed. A failed build leaves no directory it
// created, and keeps one that was there before.
TEST(IndexBuild, LocksItsDirectoryAndLeavesNoneBehindWhenItFails) {
  const std::string root = FreshTempDir("build-lock").string();
  const testing::Datastore ds = testing::MakeDatastore(300, 8, 4, 5);
  const MatrixKeySource keys(ds.keys.view());
  const MemoryValueSource values(ds.values);
  IndexBuildOptions options = QuietIvfPq(1);

  const std::string locked = root + "/locked";
  {
    ASSERT_OK_AND_ASSIGN(const std::unique_ptr<DirectoryLock> other,
                         DirectoryLock::Acquire(locked));
    EXPECT_THAT(BuildIndex(keys, &values, options, locked),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("another knnserve command is writing " + locked)));
  }
  const std::string debris =
      locked + "/shard-00000.faiss.knnserve-tmp." + std::to_string(EndedProcess());
  std::ofstream(debris) << "x";
  ASSERT_OK(BuildIndex(keys, &values, options, locked).status());
  EXPECT_FALSE(std::filesystem::exists(debris));

  const KeysFailingFrom unreadable(keys, 0);
  const std::string fresh = root + "/fresh";
  EXPECT_THAT(BuildIndex(unreadable, &values, options, fresh),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bad sector")));
  EXPECT_FALSE(std::filesystem::exists(fresh));
  const std::string existing = root + "/existing";
  std::filesystem::create_directories(existing);
  EXPECT_THAT(BuildIndex(unreadable, &values, options, existing),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bad sector")));
  EXPECT_TRUE(std::filesystem::is_directory(existing));
}

TEST(Hdf5Datastore, BuildRefusesValuesThatDoNotMatchTheKeys) {
  const std::string dir = FreshTempDir("h5mismatch").string();
  const testing::Datastore ds = testing::MakeDatastore(200, 4, 2, 2);
  DatastoreValues shorter = ds.values;
  shorter.offsets.pop_back();
  shorter.tokens.resize(shorter.offsets.back());
  const MemoryValueSource values(shorter);
  MatrixKeySource keys(ds.keys.view());
  IndexBuildOptions options;
  options.progress.out = nullptr;
  EXPECT_THAT(BuildIndex(keys, &values, options, dir),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens but keys hold")));
  DatastoreValues bad = ds.values;
  bad.offsets.back() += 1;
  const MemoryValueSource bad_values(bad);
  EXPECT_THAT(BuildIndex(keys, &bad_values, options, dir),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/offsets end at")));
}

// Adding to an index refuses what would not extend it by appending, and a failed add (a key of
// the added rows unreadable) leaves the index as it was: the same manifest, every file
// verifying, no file of the add left behind.
TEST(IndexAdd, RefusesWhatDoesNotExtendTheIndexAndKeepsIt) {
  const std::string dir = FreshTempDir("add-refusals").string();
  const testing::Datastore ds = testing::MakeDatastore(800, 8, 4, 6);
  const int64_t old_sentences = ds.values.num_sentences() * 2 / 3;
  const int64_t old_rows = ds.values.offsets[old_sentences];
  DatastoreValues old_values;
  old_values.offsets.assign(ds.values.offsets.begin(),
                            ds.values.offsets.begin() + old_sentences + 1);
  old_values.tokens.assign(ds.values.tokens.begin(), ds.values.tokens.begin() + old_rows);
  const MatrixKeySource old_keys({ds.keys.data(), old_rows, ds.keys.cols()});
  const MemoryValueSource old_source(old_values);
  IndexBuildOptions build = QuietIvfPq(2);
  build.factory = "Flat";
  build.subset_m = 2;  // subset codes too
  ASSERT_OK_AND_ASSIGN(const IndexManifest index, BuildIndex(old_keys, &old_source, build, dir));
  ASSERT_TRUE(index.subset_quantizer.has_value());

  const MatrixKeySource keys(ds.keys.view());
  const MemoryValueSource values(ds.values);
  IndexAddOptions add;
  add.progress.out = nullptr;
  const auto refused = [&](const KeySource& k, const ValueSource* v, IndexAddOptions o,
                           absl::StatusCode code, const std::string& reason) {
    EXPECT_THAT(AddToIndex(k, v, o, dir), StatusIs(code, HasSubstr(reason)));
  };
  const Matrix<float> wider(ds.keys.rows(), ds.keys.cols() + 1);
  refused(MatrixKeySource(wider.view()), &values, add, absl::StatusCode::kInvalidArgument,
          "keys of dimension 9 for the index in " + dir + " of dimension 8");
  refused(old_keys, &old_source, add, absl::StatusCode::kInvalidArgument, "nothing to add");
  refused(keys, nullptr, add, absl::StatusCode::kInvalidArgument, "carries values");
  DatastoreValues changed = ds.values;
  changed.tokens[old_rows - 1] += 1;  // a token of the last old shard
  const MemoryValueSource changed_source(changed);
  refused(keys, &changed_source, add, absl::StatusCode::kFailedPrecondition,
          "differ from those of shard 1 (shard-00001.values)");
  DatastoreValues moved = ds.values;  // the last old sentence runs on into the first new one
  moved.offsets.erase(moved.offsets.begin() + old_sentences);
  const MemoryValueSource moved_source(moved);
  refused(keys, &moved_source, add, absl::StatusCode::kFailedPrecondition,
          "do not extend the index");
  IndexAddOptions too_many = add;
  too_many.shards = static_cast<int>(ds.values.num_sentences() - old_sentences) + 1;
  refused(keys, &values, too_many, absl::StatusCode::kInvalidArgument, "sentences cannot fill");
  const KeysFailingFrom failing(keys, old_rows);
  refused(failing, &values, add, absl::StatusCode::kDataLoss, "bad sector");
  EXPECT_THAT(AddToIndex(keys, &values, add, dir + "/none"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no index in " + dir + "/none")));

  ExpectIndexIsStill(index, dir);

  // And the datastore as it grew is taken.
  ASSERT_OK_AND_ASSIGN(const IndexManifest grown, AddToIndex(keys, &values, add, dir));
  EXPECT_EQ(grown.shards.size(), 3u);
  EXPECT_EQ(grown.total_vectors, ds.keys.rows());
}

}  // namespace
}  // namespace knnserve
