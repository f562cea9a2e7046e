// `knnserve index build|add|search|info` (client/cli/index_commands.cc, Torch-free) driven through
// CLI11 as the knnserve tool does.
#include <filesystem>
#include <string>
#include <vector>

#include "client/cli/commands.h"
#include "common/datastore/hdf5_datastore.h"
#include "common/datastore/hdf5_file.h"
#include "common/files.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/index_test_util.h"
#include "tests/testing/temp_dir.h"

namespace knnserve {
namespace {

using ::knnserve::testing::IsOk;
using ::testing::HasSubstr;

// Runs the index commands with `args` (without the program name); returns stdout.
std::string RunCli(std::vector<std::string> args) {
  CLI::App app;
  cli::RegisterIndexCommands(app);
  args.insert(args.begin(), "knnserve");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStdout();
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (...) {
    ::testing::internal::GetCapturedStdout();
    throw;
  }
  return ::testing::internal::GetCapturedStdout();
}

TEST(IndexCli, BuildInfoSearchRoundTrip) {
  const std::string dir = testing::FreshTempDir("cli").string();
  const testing::Datastore ds = testing::MakeDatastore(600, 8, 5, 8);
  ASSERT_THAT(WriteKeysHdf5(dir + "/keys.h5", ds.keys.view(), /*fp16=*/true), IsOk());
  ASSERT_THAT(WriteValuesHdf5(dir + "/values.h5", ds.values), IsOk());

  const std::string built =
      RunCli({"index", "build", "--keys", dir + "/keys.h5", "--values", dir + "/values.h5",
              "--factory", "IVF4,PQ4", "--shards", "2", "--out", dir + "/index", "--threads", "1"});
  EXPECT_THAT(built, HasSubstr("\"factory\": \"IVF4,PQ4\""));
  EXPECT_TRUE(std::filesystem::exists(dir + "/index/manifest.json"));

  const std::string info = RunCli({"index", "info", dir + "/index"});
  EXPECT_EQ(info, built);
  EXPECT_THAT(info, HasSubstr("shard-00001.subset"));

  const std::string full = RunCli({"index", "search", dir + "/index", "--queries", dir + "/keys.h5",
                                   "--rows", "3", "--k", "4", "--nprobe", "4"});
  EXPECT_THAT(full, HasSubstr("# 3 queries, k 4;"));
  EXPECT_THAT(full, HasSubstr("# 600 vectors searched"));
  // Searched a row at a time, the same neighbours (each call scans the lists again).
  const std::string by_row =
      RunCli({"index", "search", dir + "/index", "--queries", dir + "/keys.h5", "--rows", "3",
              "--k", "4", "--nprobe", "4", "--batch", "1"});
  EXPECT_EQ(by_row.substr(0, by_row.rfind("# ")), full.substr(0, full.rfind("# ")));
  EXPECT_THAT(by_row, HasSubstr("# 1800 vectors searched"));
  // Row 0 is a stored key: its nearest neighbour is itself (id 0).
  EXPECT_THAT(full, HasSubstr("query 0\n  0 0 " + std::to_string(ds.values.tokens[0]) + " "));

  const std::string subset = RunCli({"index", "search", dir + "/index", "--queries",
                                     dir + "/keys.h5", "--rows", "1", "--subset", "0,1"});
  const int64_t subset_tokens = ds.values.offsets[2];
  EXPECT_THAT(subset, HasSubstr(absl::StrCat(subset_tokens, " vectors searched")));

  // Checked like a server's requests: sentence ids in range and not empty; an empty --subset
  // is refused, not searched as a full search.
  for (const char* bad : {"0,,1", "-1", "99999", ""}) {
    EXPECT_THROW(RunCli({"index", "search", dir + "/index", "--queries", dir + "/keys.h5", "--rows",
                         "1", "--subset", bad}),
                 CLI::RuntimeError)
        << bad;
  }
}

// `index add` turns the rows appended to a datastore's files into new shards: the manifest then
// lists them after the old ones, and a search finds an added key (its own nearest neighbour).
TEST(IndexCli, AddGrowsTheIndexByShardsOfTheAppendedRows) {
  const std::string dir = testing::FreshTempDir("cli_add").string();
  const testing::Datastore ds = testing::MakeDatastore(600, 8, 5, 10);
  const int64_t old_sentences = ds.values.num_sentences() / 2;
  const int64_t old_rows = ds.values.offsets[old_sentences];
  DatastoreValues old_values;
  old_values.offsets.assign(ds.values.offsets.begin(),
                            ds.values.offsets.begin() + old_sentences + 1);
  old_values.tokens.assign(ds.values.tokens.begin(), ds.values.tokens.begin() + old_rows);
  ASSERT_THAT(WriteKeysHdf5(dir + "/old-keys.h5", {ds.keys.data(), old_rows, ds.keys.cols()},
                            /*fp16=*/false),
              IsOk());
  ASSERT_THAT(WriteValuesHdf5(dir + "/old-values.h5", old_values), IsOk());
  ASSERT_THAT(WriteKeysHdf5(dir + "/keys.h5", ds.keys.view(), /*fp16=*/false), IsOk());
  ASSERT_THAT(WriteValuesHdf5(dir + "/values.h5", ds.values), IsOk());
  RunCli({"index", "build", "--keys", dir + "/old-keys.h5", "--values", dir + "/old-values.h5",
          "--factory", "Flat", "--shards", "2", "--out", dir + "/index", "--subset-m", "4"});

  const std::vector<std::string> add = {
      "index",    "add", dir + "/index", "--keys", dir + "/keys.h5", "--values", dir + "/values.h5",
      "--shards", "1"};
  const std::string grown = RunCli(add);
  EXPECT_THAT(grown, HasSubstr("\"total_vectors\": 600"));
  EXPECT_THAT(grown, HasSubstr("shard-00002.subset"));
  EXPECT_EQ(RunCli({"index", "info", dir + "/index"}), grown);
  EXPECT_THROW(RunCli(add), CLI::RuntimeError);  // nothing left to add
  EXPECT_THROW(RunCli({"index", "add", dir + "/index", "--keys", dir + "/keys.h5"}),
               CLI::RuntimeError);  // the index carries values

  const std::string last_row = dir + "/last.h5";
  ASSERT_THAT(WriteKeysHdf5(last_row, {ds.keys.row(599), 1, ds.keys.cols()}, /*fp16=*/false),
              IsOk());
  const std::string found =
      RunCli({"index", "search", dir + "/index", "--queries", last_row, "--k", "1"});
  EXPECT_THAT(found, HasSubstr("query 0\n  0 599 " + std::to_string(ds.values.tokens[599]) + " "));
}

// Search flags the search would not use are refused, not ignored: --nprobe of an index without
// IVF lists or of a subset search, --ef-search of an index without an HNSW graph.
TEST(IndexCli, SearchRefusesParametersTheSearchWouldNotUse) {
  const std::string dir = testing::FreshTempDir("cli_params").string();
  const testing::Datastore ds = testing::MakeDatastore(300, 8, 5, 8);
  ASSERT_THAT(WriteKeysHdf5(dir + "/keys.h5", ds.keys.view(), /*fp16=*/false), IsOk());
  ASSERT_THAT(WriteValuesHdf5(dir + "/values.h5", ds.values), IsOk());
  for (const char* factory : {"Flat", "IVF4,PQ4"}) {
    RunCli({"index", "build", "--keys", dir + "/keys.h5", "--values", dir + "/values.h5",
            "--factory", factory, "--out", dir + "/" + factory, "--subset-m", "4"});
  }
  const auto search = [&dir](const std::string& index, std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "index", "search", dir + "/" + index, "--queries", dir + "/keys.h5", "--rows", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunCli(args);
  };
  EXPECT_THAT(search("IVF4,PQ4", {"--nprobe", "2"}), HasSubstr("# 1 queries"));
  for (const auto& [index, extra] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"Flat", {"--nprobe", "2"}},
           {"Flat", {"--ef-search", "16"}},
           {"IVF4,PQ4", {"--ef-search", "16"}},
           {"IVF4,PQ4", {"--subset", "0", "--nprobe", "2"}}}) {
    EXPECT_THROW(search(index, extra), CLI::RuntimeError) << index << " " << extra[0];
  }
}

// `index build` refuses keys that say they are not complete, and keys that name the sha256 of
// other values than --values (equal token counts are not enough).
TEST(IndexCli, BuildRefusesIncompleteKeysAndKeysOfOtherValues) {
  const std::string dir = testing::FreshTempDir("cli_pairing").string();
  const testing::Datastore ds = testing::MakeDatastore(300, 8, 5, 9);
  const std::string keys = dir + "/keys.h5";
  const std::string values = dir + "/values.h5";
  ASSERT_THAT(WriteKeysHdf5(keys, ds.keys.view(), /*fp16=*/false), IsOk());
  ASSERT_THAT(WriteValuesHdf5(values, ds.values), IsOk());
  const auto set_attribute = [&keys](const std::string& name, auto value) {
    ASSERT_OK_AND_ASSIGN(auto file, Hdf5File::Open(keys, Hdf5File::Mode::kReadWrite));
    ASSERT_THAT(file->SetAttribute(name, value), IsOk());
    ASSERT_THAT(file->Close(), IsOk());
  };
  const std::vector<std::string> build = {"index", "build",     "--keys", keys,    "--values",
                                          values,  "--factory", "Flat",   "--out", dir + "/index"};
  set_attribute("values_sha256", absl::string_view("0123"));
  EXPECT_THROW(RunCli(build), CLI::RuntimeError);
  ASSERT_OK_AND_ASSIGN(const FileDigest digest, DigestFile(values));
  set_attribute("values_sha256", absl::string_view(digest.sha256));
  EXPECT_THAT(RunCli(build), HasSubstr("\"factory\": \"Flat\""));
  set_attribute("complete", int64_t{0});
  EXPECT_THAT(Hdf5KeySource::Open(keys).status(),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not complete")));
  EXPECT_THROW(RunCli(build), CLI::RuntimeError);
}

TEST(IndexCli, OutOfRangeFlagsAreRefusedAtParse) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"index", "search", "dir", "--queries", "q.h5", "--rows", "-5"},
        {"index", "search", "dir", "--queries", "q.h5", "--k", "0"},
        {"index", "search", "dir", "--queries", "q.h5", "--shard", "-2"},
        {"index", "build", "--keys", "k.h5", "--out", "o", "--shards", "0"},
        {"index", "build", "--keys", "k.h5", "--out", "o", "--threads", "0"},
        {"index", "build", "--keys", "k.h5", "--out", "o", "--seed", "-1"}}) {
    EXPECT_THROW(RunCli(args), CLI::ValidationError) << args[args.size() - 2];
  }
}

TEST(IndexCli, ErrorsExitWithStatusOne) {
  EXPECT_THROW(RunCli({"index", "info", "/nonexistent/index"}), CLI::RuntimeError);
  EXPECT_THROW(RunCli({"index", "build", "--keys", "/nonexistent.h5", "--out", "/tmp/x"}),
               CLI::RuntimeError);
}

}  // namespace
}  // namespace knnserve
