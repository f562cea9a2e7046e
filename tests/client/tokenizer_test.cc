#include "client/tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "client/data/parallel_corpus.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace knnserve {
namespace {

using ::knnserve::testing::StatusIs;
using ::testing::HasSubstr;

const char kPairs[] = KNNSERVE_TESTDATA_DIR "/pairs50.tsv";

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(testing::FreshTempDir("tokenizer_test"));
    TokenizerTrainOptions options;
    options.tsv_path = kPairs;
    options.model_prefix = (*dir_ / "spm").string();
    options.vocab_size = 120;
    options.hard_vocab_limit = false;
    options.threads = 1;
    train_status_ = new absl::Status(TrainTokenizer(options));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
    delete train_status_;
  }
  static std::string ModelPath() { return (*dir_ / "spm.model").string(); }

  static std::filesystem::path* dir_;
  static absl::Status* train_status_;
};
std::filesystem::path* TokenizerTest::dir_ = nullptr;
absl::Status* TokenizerTest::train_status_ = nullptr;

TEST_F(TokenizerTest, TrainedModelUsesFairseqSpecialIds) {
  ASSERT_OK(*train_status_);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Load(ModelPath()));
  EXPECT_LE(tokenizer->vocab_size(), 120);
  EXPECT_EQ(tokenizer->IdToPiece(Tokenizer::kBos), "<s>");
  EXPECT_EQ(tokenizer->IdToPiece(Tokenizer::kPad), "<pad>");
  EXPECT_EQ(tokenizer->IdToPiece(Tokenizer::kEos), "</s>");
  EXPECT_EQ(tokenizer->IdToPiece(Tokenizer::kUnk), "<unk>");
}

TEST_F(TokenizerTest, EncodeDecodeRoundTripsTheTrainingText) {
  ASSERT_OK(*train_status_);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Load(ModelPath()));
  ASSERT_OK_AND_ASSIGN(std::vector<data::SentencePair> pairs, data::ReadTsv(kPairs));
  for (const auto& pair : pairs) {
    for (const std::string& text : {pair.source, pair.target}) {
      ASSERT_OK_AND_ASSIGN(std::vector<int> ids, tokenizer->Encode(text));
      EXPECT_FALSE(ids.empty());
      ids.push_back(Tokenizer::kEos);  // special ids are skipped by Decode
      ASSERT_OK_AND_ASSIGN(std::string decoded, tokenizer->Decode(ids));
      EXPECT_EQ(decoded, text);
    }
  }
}

TEST_F(TokenizerTest, SerializedModelLoadsTheSameTokenizer) {
  ASSERT_OK(*train_status_);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> a, Tokenizer::Load(ModelPath()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> b, Tokenizer::FromSerialized(a->serialized()));
  EXPECT_EQ(*a->Encode("Alle Aktionen entfernen"), *b->Encode("Alle Aktionen entfernen"));
}

TEST_F(TokenizerTest, BadInputsGiveClearErrors) {
  ASSERT_OK(*train_status_);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Load(ModelPath()));
  EXPECT_THAT(tokenizer->Decode({5, 100000}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("100000")));
  EXPECT_THAT(Tokenizer::Load("/nonexistent/spm.model"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/spm.model")));
  EXPECT_THAT(Tokenizer::FromSerialized("garbage"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sentencepiece")));
  // A file that is not a SentencePiece model: the error names it.
  const std::string not_a_model = (*dir_ / "not_a_model.txt").string();
  std::ofstream(not_a_model) << "garbage";
  EXPECT_THAT(Tokenizer::Load(not_a_model), StatusIs(absl::StatusCode::kInvalidArgument,
                                                     HasSubstr("tokenizer " + not_a_model + ": ")));
  TokenizerTrainOptions options;
  options.tsv_path = kPairs;
  options.model_prefix = "has space";
  EXPECT_THAT(TrainTokenizer(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("without spaces")));
  options.model_prefix = (*dir_ / "x").string();
  options.model_type = "word";
  EXPECT_THAT(TrainTokenizer(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unigram or bpe")));
}

}  // namespace
}  // namespace knnserve
