#include "client/model/checkpoint.h"

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/files.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/test_models.h"
#include "tests/testing/temp_dir.h"

namespace knnserve::model {
namespace {

using ::knnserve::testing::StatusIs;
using ::knnserve::testing::TinyModel;
using ::knnserve::testing::TinyModelOptions;
using ::testing::HasSubstr;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::FreshTempDir("checkpoint_test"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
};

TEST_F(CheckpointTest, SaveLoadRoundTripIsExact) {
  TransformerModel model = TinyModel(TinyModelOptions{.pre_norm = true, .tied = false});
  const std::string tokenizer("\x00\x01spm-bytes\xff", 13);
  TrainerState trainer{R"({"step":7})", {{"exp_avg.x", torch::arange(5, torch::kFloat)}}};
  ASSERT_OK(SaveCheckpoint(Path("a.pt"), model, tokenizer, &trainer));

  ASSERT_OK_AND_ASSIGN(LoadedModel loaded, LoadCheckpoint(Path("a.pt")));
  EXPECT_EQ(loaded.model->config().ToJson(), model->config().ToJson());
  EXPECT_EQ(loaded.tokenizer, tokenizer);
  ASSERT_TRUE(loaded.trainer.has_value());
  EXPECT_EQ(loaded.trainer->json, trainer.json);
  EXPECT_TRUE(loaded.trainer->tensors.at("exp_avg.x").equal(torch::arange(5, torch::kFloat)));
  auto original = model->named_parameters();
  for (const auto& item : loaded.model->named_parameters()) {
    EXPECT_TRUE(item.value().equal(original[item.key()])) << item.key();
  }
  EXPECT_FALSE(loaded.model->is_training());
}

TEST_F(CheckpointTest, Float16CheckpointLoadsCloseAndHalfTheSize) {
  TransformerModel model = TinyModel();
  ASSERT_OK(SaveCheckpoint(Path("f32.pt"), model, "", nullptr, torch::kFloat));
  ASSERT_OK(SaveCheckpoint(Path("f16.pt"), model, "", nullptr, torch::kHalf));
  EXPECT_LT(std::filesystem::file_size(Path("f16.pt")),
            0.6 * std::filesystem::file_size(Path("f32.pt")));
  ASSERT_OK_AND_ASSIGN(LoadedModel loaded, LoadCheckpoint(Path("f16.pt")));
  EXPECT_FALSE(loaded.trainer.has_value());
  auto original = model->named_parameters();
  for (const auto& item : loaded.model->named_parameters()) {
    EXPECT_EQ(item.value().dtype(), torch::kFloat);
    EXPECT_TRUE(torch::allclose(item.value(), original[item.key()], 1e-3, 1e-4)) << item.key();
  }
}

TEST_F(CheckpointTest, SavingLeavesNoTemporaryFiles) {
  TransformerModel model = TinyModel();
  ASSERT_OK(SaveCheckpoint(Path("a.pt"), model, "", nullptr));
  ASSERT_OK(SaveCheckpoint(Path("a.pt"), model, "", nullptr));  // overwrite in place
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    ++files;
    EXPECT_EQ(entry.path().filename(), "a.pt");
  }
  EXPECT_EQ(files, 1);
}

TEST_F(CheckpointTest, ParameterOfAnotherArchitectureIsRejectedByName) {
  // Saved untied (with decoder.output_projection.weight), then claimed to be tied.
  TransformerModel untied = TinyModel(TinyModelOptions{.tied = false});
  ASSERT_OK(SaveCheckpoint(Path("u.pt"), untied, "", nullptr));
  std::ifstream in(Path("u.pt"), std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::impl::GenericDict root = torch::pickle_load(bytes).toGenericDict();
  root.insert_or_assign("config", TinyModel()->config().ToJson());
  std::vector<char> edited = torch::pickle_save(c10::IValue(root));
  ASSERT_OK(
      WriteFileAtomically(Path("edited.pt"), std::string(edited.begin(), edited.end())).status());
  EXPECT_THAT(
      LoadCheckpoint(Path("edited.pt")),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("decoder.embed_tokens.weight")));
}

TEST_F(CheckpointTest, MissingAndForeignFilesGiveClearErrors) {
  EXPECT_THAT(LoadCheckpoint(Path("nope.pt")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope.pt")));
  ASSERT_OK(WriteFileAtomically(Path("junk.pt"), "not a checkpoint").status());
  EXPECT_THAT(LoadCheckpoint(Path("junk.pt")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("junk.pt")));
}

}  // namespace
}  // namespace knnserve::model
