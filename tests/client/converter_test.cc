// tools/convert_fairseq.py on a checkpoint written in fairseq's exact structure
// (make_fairseq_checkpoint.py), loaded back by the C++ model.
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/model/checkpoint.h"
#include "client/tokenizer/tokenizer.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace knnserve::model {
namespace {

const char kPython[] = "/usr/bin/python3";

int RunCommand(const std::string& command) { return std::system(command.c_str()); }

class ConverterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RunCommand(absl::StrCat(kPython, " -c 'import torch' 2>/dev/null")) != 0) {
      GTEST_SKIP() << "Debian's python3-torch is not installed";
    }
    dir_ = testing::FreshTempDir("converter_test");
    TokenizerTrainOptions tok;
    tok.tsv_path = KNNSERVE_TESTDATA_DIR "/pairs50.tsv";
    tok.model_prefix = (dir_ / "spm").string();
    tok.vocab_size = 120;
    tok.hard_vocab_limit = false;
    tok.threads = 1;
    ASSERT_OK(TrainTokenizer(tok));
    ASSERT_OK_AND_ASSIGN(spm_, Tokenizer::Load((dir_ / "spm.model").string()));
    std::ofstream pieces(dir_ / "pieces.txt");
    for (int id = 4; id < spm_->vocab_size(); ++id) pieces << spm_->IdToPiece(id) << "\n";
    pieces.close();
    ASSERT_EQ(RunCommand(absl::StrCat(kPython, " ", KNNSERVE_SOURCE_DIR,
                               "/tests/client/make_fairseq_checkpoint.py ", Path("pieces.txt"),
                               " ", dir_.string())),
              0);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  int Convert(const std::string& src_dict, const std::string& out) {
    return RunCommand(absl::StrCat(kPython, " ", KNNSERVE_SOURCE_DIR, "/tools/convert_fairseq.py",
                            " --checkpoint ", Path("fairseq.pt"), " --src-dict ", src_dict,
                            " --tgt-dict ", Path("dict.tgt.txt"), " --spm ", Path("spm.model"),
                            " --out ", out, " 2>", Path("stderr.txt")));
  }

  std::filesystem::path dir_;
  std::unique_ptr<Tokenizer> spm_;
};

TEST_F(ConverterTest, FairseqParametersArriveUnderTheSameNames) {
  ASSERT_EQ(Convert(Path("dict.src.txt"), Path("converted.pt")), 0);
  ASSERT_OK_AND_ASSIGN(LoadedModel loaded, LoadCheckpoint(Path("converted.pt")));
  const TransformerConfig& c = loaded.model->config();
  EXPECT_EQ(c.d_model, 32);
  EXPECT_EQ(c.encoder_layers, 2);
  EXPECT_EQ(c.decoder_heads, 4);
  EXPECT_TRUE(c.encoder_normalize_before);
  EXPECT_TRUE(c.learned_positions);
  EXPECT_FALSE(c.share_all_embeddings);
  EXPECT_TRUE(c.share_decoder_input_output_embed);
  EXPECT_EQ(c.src_vocab_size, spm_->vocab_size());

  std::ifstream in(Path("expected.pt"), std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::impl::GenericDict expected = torch::pickle_load(bytes).toGenericDict();
  int64_t compared = 0;
  for (const auto& item : loaded.model->named_parameters()) {
    auto it = expected.find(item.key());
    ASSERT_NE(it, expected.end()) << item.key() << " is not in the fairseq checkpoint";
    EXPECT_TRUE(item.value().equal(it->value().toTensor())) << item.key();
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int64_t>(expected.size()));
}

TEST_F(ConverterTest, TokenizerMapsPiecesToTheFairseqDictionaryIds) {
  ASSERT_EQ(Convert(Path("dict.src.txt"), Path("converted.pt")), 0);
  ASSERT_OK_AND_ASSIGN(LoadedModel loaded, LoadCheckpoint(Path("converted.pt")));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer, MakeTokenizer(loaded));
  const std::string text = "Alle Aktionen entfernen";
  ASSERT_OK_AND_ASSIGN(std::vector<int> spm_ids, spm_->Encode(text));
  ASSERT_OK_AND_ASSIGN(std::vector<int> model_ids, tokenizer->Encode(text));
  ASSERT_EQ(model_ids.size(), spm_ids.size());
  const int n = spm_->vocab_size();
  for (size_t i = 0; i < spm_ids.size(); ++i) {
    // The dictionaries list pieces 4..n-1 in reverse: spm id s is fairseq id 4 + (n - 1 - s).
    EXPECT_EQ(model_ids[i], 4 + (n - 1 - spm_ids[i]));
  }
  ASSERT_OK_AND_ASSIGN(std::string decoded, tokenizer->Decode(model_ids));
  EXPECT_EQ(decoded, text);
}

TEST_F(ConverterTest, ExportedConvertedModelKeepsItsVocabulary) {
  ASSERT_EQ(Convert(Path("dict.src.txt"), Path("converted.pt")), 0);
  ASSERT_OK_AND_ASSIGN(LoadedModel loaded, LoadCheckpoint(Path("converted.pt")));
  ASSERT_OK(SaveCheckpoint(Path("again.pt"), loaded.model, loaded.tokenizer, nullptr,
                           torch::kFloat, loaded.vocab));
  ASSERT_OK_AND_ASSIGN(LoadedModel again, LoadCheckpoint(Path("again.pt")));
  EXPECT_EQ(again.vocab.source, loaded.vocab.source);
  EXPECT_EQ(again.vocab.target, loaded.vocab.target);
  for (const auto& item : again.model->named_parameters()) {
    EXPECT_TRUE(item.value().equal(loaded.model->named_parameters()[item.key()])) << item.key();
  }
}

TEST_F(ConverterTest, WrongDictionaryIsRejectedWithAClearMessage) {
  std::ofstream short_dict(Path("short.txt"));
  short_dict << "hello 3\n";
  short_dict.close();
  EXPECT_NE(Convert(Path("short.txt"), Path("bad.pt")), 0);
  std::ifstream err(Path("stderr.txt"));
  std::string message((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  EXPECT_THAT(message, ::testing::HasSubstr("encoder.embed_tokens has"));
  EXPECT_FALSE(std::filesystem::exists(Path("bad.pt")));
}

}  // namespace
}  // namespace knnserve::model
