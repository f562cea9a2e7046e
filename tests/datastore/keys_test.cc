// The keys step with a tiny transformer: keys equal the model's own features, resume after a
// kill is bit-identical, fingerprints are enforced, h5py reads what we write.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/datastore/key_computation.h"
#include "client/datastore/pipeline.h"
#include "common/datastore/hdf5_file.h"
#include "common/datastore/values_builder.h"
#include "common/datastore/values_file.h"
#include "common/files.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/datastore/tiny_setup.h"
#include "tests/testing/temp_dir.h"

namespace knnserve::datastore {
namespace {

using ::knnserve::testing::StatusIs;
using ::knnserve::testing::Tiny;
using ::testing::HasSubstr;

class KeysTest : public knnserve::testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    ValuesBuildOptions values;
    values.corpus_path = knnserve::testing::kPairs50;
    values.out_path = Path(kValuesFileName);
    values.progress.out = devnull_;
    ASSERT_OK(RunValuesStep(*Tiny().tokenizer, values).status());
  }

  KeysStepOptions Step(KeyKind kind) {
    KeysStepOptions step;
    step.values_path = Path(kValuesFileName);
    step.model_path = Tiny().model_path;
    step.out_path = Path(kind == KeyKind::kTokens ? kKeysFileName : kSentenceKeysFileName);
    step.threads = 1;
    step.keys.kind = kind;
    step.keys.max_tokens = 64;  // many small batches
    step.keys.checkpoint_rows = 40;
    step.keys.read_window_tokens = 150;  // many windows (the CLI's default reads one)
    step.keys.progress.out = devnull_;
    return step;
  }

  // Rows [begin, end) of /keys as floats.
  static std::vector<float> ReadKeys(const std::string& path, int64_t begin, int64_t end,
                                     int64_t dim) {
    std::vector<float> out((end - begin) * dim);
    auto file = Hdf5File::Open(path, Hdf5File::Mode::kReadOnly);
    EXPECT_OK(file.status());
    EXPECT_OK((*file)->ReadRows("/keys", begin, end, out.data()));
    return out;
  }
};

// Features of one sentence computed alone (no batch, no padding), [len, d].
torch::Tensor FeaturesAlone(model::TransformerModel& model, const std::vector<int32_t>& source,
                            const std::vector<int32_t>& target, bool encoder_mean) {
  torch::NoGradGuard no_grad;
  auto tensor = [](std::vector<int64_t> ids) {
    return torch::tensor(ids, torch::kLong).unsqueeze(0);
  };
  std::vector<int64_t> src(source.begin(), source.end());
  model::EncoderOutput encoded = model->Encode(tensor(src));
  if (encoder_mean) return encoded.states[0].mean(0, /*keepdim=*/true);
  std::vector<int64_t> prev = {model->config().eos_id};
  prev.insert(prev.end(), target.begin(), target.end() - 1);
  return model->Decode(tensor(prev), encoded).features[0];
}

void ExpectCloseToFp16(const std::vector<float>& stored, const torch::Tensor& expected,
                       const std::string& what) {
  const torch::Tensor e = expected.contiguous();
  ASSERT_EQ(static_cast<int64_t>(stored.size()), e.numel()) << what;
  const float* p = e.data_ptr<float>();
  for (size_t i = 0; i < stored.size(); ++i) {
    // float16 keeps 11 significant bits: relative error <= 2^-11, plus batching noise.
    ASSERT_NEAR(stored[i], p[i], 1e-3f * std::max(1.0f, std::abs(p[i])))
        << what << " [" << i << "]";
  }
}

TEST_F(KeysTest, KeysEqualTheModelsFeaturesForTheSamePrefixWithinFp16) {
  ASSERT_OK_AND_ASSIGN(const KeysReport report, RunKeysStep(Step(KeyKind::kTokens)));
  ASSERT_OK_AND_ASSIGN(const ValuesFile values, ReadValuesFile(Path(kValuesFileName)));
  EXPECT_EQ(report.rows, static_cast<int64_t>(values.target.tokens.size()));
  EXPECT_GT(report.batches, 3);
  ASSERT_OK_AND_ASSIGN(model::LoadedModel loaded, model::LoadCheckpoint(Tiny().model_path));
  const int64_t d = loaded.model->config().d_model;
  for (int64_t s = 0; s < values.num_sentences(); s += 7) {
    const auto& t = values.target;
    const auto& src = values.source;
    const std::vector<int32_t> target(t.tokens.begin() + t.offsets[s],
                                      t.tokens.begin() + t.offsets[s + 1]);
    const std::vector<int32_t> source(src.tokens.begin() + src.offsets[s],
                                      src.tokens.begin() + src.offsets[s + 1]);
    ExpectCloseToFp16(ReadKeys(Path(kKeysFileName), t.offsets[s], t.offsets[s + 1], d),
                      FeaturesAlone(loaded.model, source, target, false),
                      absl::StrCat("sentence ", s));
  }
}

TEST_F(KeysTest, SentenceKeysAreTheMeanEncoderOutput) {
  ASSERT_OK_AND_ASSIGN(const KeysReport report, RunKeysStep(Step(KeyKind::kSentences)));
  ASSERT_OK_AND_ASSIGN(const ValuesFile values, ReadValuesFile(Path(kValuesFileName)));
  EXPECT_EQ(report.rows, values.num_sentences());
  ASSERT_OK_AND_ASSIGN(model::LoadedModel loaded, model::LoadCheckpoint(Tiny().model_path));
  const int64_t d = loaded.model->config().d_model;
  for (int64_t s = 0; s < values.num_sentences(); s += 5) {
    const auto& src = values.source;
    const std::vector<int32_t> source(src.tokens.begin() + src.offsets[s],
                                      src.tokens.begin() + src.offsets[s + 1]);
    ExpectCloseToFp16(ReadKeys(Path(kSentenceKeysFileName), s, s + 1, d),
                      FeaturesAlone(loaded.model, source, {}, true), absl::StrCat("sentence ", s));
  }
}

TEST_F(KeysTest, KilledMidRunThenResumedEqualsAnUninterruptedRunBitForBit) {
  const KeysStepOptions step = Step(KeyKind::kTokens);
  ASSERT_OK_AND_ASSIGN(const KeysReport uninterrupted, RunKeysStep(step));

  const std::string dir = Path("resumed");
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(Path(kValuesFileName), dir + "/" + kValuesFileName);
  const std::vector<std::string> argv = {
      KNNSERVE_BIN, "datastore", "keys",           "--model", Tiny().model_path,   "--out", dir,
      "--threads",  "1",         "--batch-tokens", "64",      "--checkpoint-rows", "40"};
  std::vector<std::string> killed = argv;
  killed.insert(killed.end(), {"--debug-kill-after-checkpoints", "3"});
  const int status = knnserve::testing::RunProcess(killed);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  const std::string keys = dir + "/" + kKeysFileName;
  EXPECT_FALSE(std::filesystem::exists(keys)) << "a killed run must not publish keys.h5";
  {
    ASSERT_OK_AND_ASSIGN(auto partial,
                         Hdf5File::Open(PartialPath(keys), Hdf5File::Mode::kReadOnly));
    ASSERT_OK_AND_ASSIGN(const int64_t done, partial->GetIntAttribute("rows_completed"));
    EXPECT_GT(done, 0);
    EXPECT_LT(done, uninterrupted.rows);
  }
  ASSERT_EQ(knnserve::testing::RunProcess(argv), 0);
  // Every key bit-identical (float16 -> float is exact, so equal floats mean equal halves).
  const int64_t d = 32;
  const std::vector<float> expected = ReadKeys(Path(kKeysFileName), 0, uninterrupted.rows, d);
  const std::vector<float> resumed = ReadKeys(keys, 0, uninterrupted.rows, d);
  ASSERT_EQ(resumed.size(), expected.size());
  EXPECT_EQ(std::memcmp(resumed.data(), expected.data(), expected.size() * sizeof(float)), 0);
}

TEST_F(KeysTest, KeysOfAnotherModelAreRefused) {
  ASSERT_OK(RunKeysStep(Step(KeyKind::kTokens)).status());
  ASSERT_OK_AND_ASSIGN(const KeysReport again, RunKeysStep(Step(KeyKind::kTokens)));
  EXPECT_TRUE(again.already_complete);
  KeysStepOptions other = Step(KeyKind::kTokens);
  other.model_path = Tiny().other_model_path;
  EXPECT_THAT(RunKeysStep(other),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("model_sha256")));
}

TEST_F(KeysTest, ValuesOfAnotherTokenizerAreRefused) {
  ValuesBuildOptions values;
  values.corpus_path = knnserve::testing::kPairs50;
  values.out_path = Path(kValuesFileName);
  values.progress.out = devnull_;
  values.tokenizer.vocab_size = Tiny().tokenizer->vocab_size();
  values.tokenizer.sha256 = Sha256Hex("another tokenizer");
  ASSERT_OK(BuildValues(values, [](absl::string_view text) {
              return Tiny().tokenizer->Encode(text);
            }).status());
  EXPECT_THAT(RunKeysStep(Step(KeyKind::kTokens)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("rebuild the values with the model's tokenizer")));
}

TEST_F(KeysTest, H5pyReadsValuesAndKeys) {
  ASSERT_OK(RunKeysStep(Step(KeyKind::kTokens)).status());
  const std::string script = Write("read.py", R"(
import sys, h5py, numpy as np
v = h5py.File(sys.argv[1], "r"); k = h5py.File(sys.argv[2], "r")
print(v.attrs["format"], int(v.attrs["vocab_size"]), v.attrs["tokenizer_sha256"])
print(len(v["offsets"]) - 1, int(v["tokens"][:].astype(np.int64).sum()),
      int(v["src_tokens"][:].astype(np.int64).sum()), int(v["order"][:].sum()))
print(k["keys"].dtype, k["keys"].shape[0], k["keys"].shape[1], int(k.attrs["rows_completed"]),
      k.attrs["model_sha256"])
print(repr(float(k["keys"][3, 5])))
)");
  const std::string out = Path("h5py.txt");
  const std::string command = absl::StrCat("/usr/bin/python3 ", script, " ", Path(kValuesFileName),
                                           " ", Path(kKeysFileName), " > ", out);
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  const std::vector<std::string> lines = absl::StrSplit(text.str(), '\n');
  ASSERT_GE(lines.size(), 4u) << text.str();

  ASSERT_OK_AND_ASSIGN(const ValuesFile values, ReadValuesFile(Path(kValuesFileName)));
  auto sum = [](const auto& v) {
    int64_t total = 0;
    for (const auto x : v) total += x;
    return total;
  };
  EXPECT_EQ(lines[0], absl::StrCat("knnserve-values ", values.tokenizer.vocab_size, " ",
                                   values.tokenizer.sha256));
  EXPECT_EQ(lines[1], absl::StrCat(values.num_sentences(), " ", sum(values.target.tokens), " ",
                                   sum(values.source.tokens), " ", sum(values.order)));
  ASSERT_OK_AND_ASSIGN(const FileDigest model, DigestFile(Tiny().model_path));
  const int64_t d = 32;
  EXPECT_EQ(lines[2], absl::StrCat("float16 ", values.target.tokens.size(), " ", d, " ",
                                   values.target.tokens.size(), " ", model.sha256));
  const std::vector<float> row = ReadKeys(Path(kKeysFileName), 3, 4, d);
  EXPECT_EQ(std::stof(lines[3]), row[5]);
}

}  // namespace
}  // namespace knnserve::datastore
