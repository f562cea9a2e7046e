// The values step, the values reader, batch plans and the resumable key file, without a model.
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/datastore/batch_plan.h"
#include "common/datastore/hdf5_datastore.h"
#include "common/datastore/hdf5_file.h"
#include "common/datastore/keys_file.h"
#include "common/datastore/values_builder.h"
#include "common/datastore/values_file.h"
#include "common/files.h"
#include "common/index/builder.h"
#include "common/status_macros.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/file_size_limit.h"
#include "tests/testing/temp_dir.h"

namespace knnserve {
namespace {

using ::knnserve::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr int kVocab = 50;
constexpr int kEos = 2;

// A deterministic word-level "tokenizer": every word becomes 4 + (its hash mod 46).
absl::StatusOr<std::vector<int>> FakeTokenize(absl::string_view text) {
  std::vector<int> ids;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    ids.push_back(4 + static_cast<int>(std::hash<std::string>()(std::string(word)) % 46));
  }
  return ids;
}

TokenizerInfo FakeTokenizerInfo() {
  TokenizerInfo info;
  info.vocab_size = kVocab;
  info.sha256 = Sha256Hex("fake tokenizer");
  return info;
}

class ValuesTest : public testing::TempDirTest {
 protected:
  ValuesBuildOptions Options(const std::string& corpus) {
    ValuesBuildOptions o;
    o.corpus_path = Write("corpus.tsv", corpus);
    o.out_path = Path("values.h5");
    o.tokenizer = FakeTokenizerInfo();
    o.threads = 2;
    o.block_lines = 3;  // several blocks
    o.chunk = 5;        // several HDF5 appends per dataset
    o.progress.out = devnull_;
    return o;
  }
};

TEST(SplitCorpusLineTest, ClassifiesBadLines) {
  BadLineKind kind;
  EXPECT_OK(SplitCorpusLine("a b\tc d\r", 100, &kind));
  EXPECT_FALSE(SplitCorpusLine("no tab", 100, &kind).ok());
  EXPECT_EQ(kind, BadLineKind::kMissingTab);
  EXPECT_FALSE(SplitCorpusLine("a\tb\tc", 100, &kind).ok());
  EXPECT_EQ(kind, BadLineKind::kExtraTab);
  EXPECT_FALSE(SplitCorpusLine(" \tb", 100, &kind).ok());
  EXPECT_EQ(kind, BadLineKind::kEmptySide);
  EXPECT_FALSE(SplitCorpusLine("a\t", 100, &kind).ok());
  EXPECT_EQ(kind, BadLineKind::kEmptySide);
  EXPECT_FALSE(SplitCorpusLine("a\xff\tb", 100, &kind).ok());
  EXPECT_EQ(kind, BadLineKind::kInvalidUtf8);
  EXPECT_FALSE(SplitCorpusLine("aaaa\tbbbb", 5, &kind).ok());
  EXPECT_EQ(kind, BadLineKind::kOverLong);
}

TEST(SplitCorpusLineTest, Utf8ValidatorRejectsOverlongSurrogatesAndTruncation) {
  EXPECT_TRUE(IsValidUtf8("Größe 日本 \xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // UTF-16 surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xE6\x97"));          // truncated
}

TEST_F(ValuesTest, TokensOfEverySentenceAreTheTokenizedTargetPlusEosSortedByLength) {
  const std::vector<std::string> sources = {"s one",  "s two two", "s", "s four four four x",
                                            "s five", "s six six"};
  const std::vector<std::string> targets = {"t a b c", "t", "t d e", "t f g h i j", "t k", "t l m"};
  std::string corpus;
  for (size_t i = 0; i < sources.size(); ++i) corpus += sources[i] + "\t" + targets[i] + "\n";
  ValuesBuildOptions options = Options(corpus);
  ASSERT_OK_AND_ASSIGN(const ValuesReport report, BuildValues(options, FakeTokenize));
  EXPECT_EQ(report.sentences, 6);
  EXPECT_EQ(report.bad.total(), 0);

  ASSERT_OK_AND_ASSIGN(const ValuesFile values, ReadValuesFile(options.out_path));
  ASSERT_EQ(values.num_sentences(), 6);
  int64_t previous_length = 0;
  for (int64_t s = 0; s < values.num_sentences(); ++s) {
    const int64_t line = values.order[s];
    auto ids = [&](const std::string& text) {
      const std::vector<int> tokenized = *FakeTokenize(text);
      std::vector<int32_t> out(tokenized.begin(), tokenized.end());
      out.push_back(kEos);
      return out;
    };
    const auto& t = values.target;
    const auto& src = values.source;
    EXPECT_EQ(
        std::vector<int32_t>(t.tokens.begin() + t.offsets[s], t.tokens.begin() + t.offsets[s + 1]),
        ids(targets[line]))
        << "sentence " << s;
    EXPECT_EQ(std::vector<int32_t>(src.tokens.begin() + src.offsets[s],
                                   src.tokens.begin() + src.offsets[s + 1]),
              ids(sources[line]));
    const int64_t length = t.offsets[s + 1] - t.offsets[s];
    EXPECT_GE(length, previous_length);
    previous_length = length;
  }
  EXPECT_EQ(values.tokenizer.sha256, FakeTokenizerInfo().sha256);
  EXPECT_EQ(values.corpus_lines, 6);
  // The index layer reads the same file.
  ASSERT_OK_AND_ASSIGN(const DatastoreValues plain, ReadValuesHdf5(options.out_path));
  EXPECT_EQ(plain.tokens, values.target.tokens);
  EXPECT_FALSE(std::filesystem::exists(PartialPath(options.out_path)));
}

TEST_F(ValuesTest, BadLinesAreCountedAndReportedWithTheirLineNumbers) {
  ValuesBuildOptions options =
      Options("a\tb\nno tab\nx\ty\tz\n \tempty\nbad \xff\tutf\nw w w w w w\tlong\nc\td\n");
  options.max_tokens = 4;  // "w w w w w w" + EOS is 7 tokens
  ASSERT_OK_AND_ASSIGN(const ValuesReport report, BuildValues(options, FakeTokenize));
  EXPECT_EQ(report.sentences, 2);
  EXPECT_EQ(report.corpus_lines, 7);
  EXPECT_THAT(report.bad.counts, ElementsAre(1, 1, 1, 1, 1));
  EXPECT_THAT(report.bad.examples,
              ElementsAre("line 2: missing tab", "line 3: more than one tab", "line 4: empty side",
                          "line 5: invalid UTF-8", "line 6: over-long"));
  ASSERT_OK_AND_ASSIGN(const ValuesFile values, ReadValuesFile(options.out_path));
  EXPECT_EQ(values.bad_lines, 5);
  EXPECT_THAT(values.order, ElementsAre(0, 6));
}

// A side that is not blank but tokenizes to nothing (SentencePiece normalizes non-breaking and
// zero-width spaces away) is an empty side, not a sentence of EOS alone.
TEST_F(ValuesTest, ASideOfNoTokensIsAnEmptySide) {
  const auto drop_nbsp = [](absl::string_view text) {
    return FakeTokenize(absl::StrReplaceAll(text, {{"\xc2\xa0", ""}}));
  };
  ValuesBuildOptions options = Options("a\tb\nx\t\xc2\xa0\nc\td\n");
  ASSERT_OK_AND_ASSIGN(const ValuesReport report, BuildValues(options, drop_nbsp));
  EXPECT_EQ(report.sentences, 2);
  EXPECT_THAT(report.bad.examples, ElementsAre("line 2: empty side"));
}

TEST_F(ValuesTest, StrictModeFailsOnTheFirstBadLineAndWritesNothing) {
  ValuesBuildOptions options = Options("a\tb\nno tab\nc\td\n");
  options.strict = true;
  EXPECT_THAT(BuildValues(options, FakeTokenize),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 2: missing tab")));
  EXPECT_FALSE(std::filesystem::exists(options.out_path));
}

TEST_F(ValuesTest, ACorpusWithoutUsableLinesIsAnError) {
  ValuesBuildOptions options = Options("no tab\n");
  EXPECT_THAT(BuildValues(options, FakeTokenize),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no usable sentence")));
}

// `n` seeded random corpus lines of 1 to 12 words each side.
std::string RandomCorpus(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> words(1, 12);
  std::uniform_int_distribution<int> letter('a', 'z');
  auto side = [&] {
    std::string text;
    for (int w = words(rng); w > 0; --w) text += std::string(1 + w % 3, letter(rng)) + " ";
    return text;
  };
  std::string corpus;
  for (int i = 0; i < n; ++i) corpus += side() + "\t" + side() + "\n";
  return corpus;
}

// Writes `values` as the values step lays it out, inconsistent or not (for refusal tests).
absl::Status WriteValuesFile(const std::string& path, const ValuesFile& values) {
  ASSIGN_OR_RETURN(std::unique_ptr<Hdf5File> file, Hdf5File::Open(path, Hdf5File::Mode::kCreate));
  RETURN_IF_ERROR(file->SetAttribute("format", kValuesFormat));
  for (const auto& [name, value] :
       std::vector<std::pair<std::string, int64_t>>{{"version", kValuesVersion},
                                                    {"vocab_size", values.tokenizer.vocab_size},
                                                    {"bos_id", values.tokenizer.bos_id},
                                                    {"pad_id", values.tokenizer.pad_id},
                                                    {"eos_id", values.tokenizer.eos_id},
                                                    {"unk_id", values.tokenizer.unk_id},
                                                    {"corpus_lines", values.corpus_lines},
                                                    {"bad_lines", values.bad_lines}}) {
    RETURN_IF_ERROR(file->SetAttribute(name, value));
  }
  RETURN_IF_ERROR(file->SetAttribute("tokenizer_sha256", values.tokenizer.sha256));
  RETURN_IF_ERROR(file->SetAttribute("corpus_sha256", values.corpus_sha256));
  for (const auto& [name, tokens] : {std::make_pair("/tokens", &values.target.tokens),
                                     std::make_pair("/src_tokens", &values.source.tokens)}) {
    RETURN_IF_ERROR(file->CreateVector(name, Hdf5Type::kInt32, 64, false));
    RETURN_IF_ERROR(file->AppendInt32(name, *tokens));
  }
  for (const auto& [name, ints] : {std::make_pair("/offsets", &values.target.offsets),
                                   std::make_pair("/src_offsets", &values.source.offsets),
                                   std::make_pair("/order", &values.order)}) {
    RETURN_IF_ERROR(file->CreateVector(name, Hdf5Type::kInt64, 64, false));
    RETURN_IF_ERROR(file->AppendInt64(name, *ints));
  }
  return file->Close();
}

class ValuesReaderTest : public ValuesTest {
 protected:
  // A values.h5 of 60 seeded random lines, read whole.
  ValuesFile BuildRandom() {
    const ValuesBuildOptions options = Options(RandomCorpus(60, 11));
    EXPECT_OK(BuildValues(options, FakeTokenize));
    absl::StatusOr<ValuesFile> values = ReadValuesFile(options.out_path);
    EXPECT_OK(values.status());
    return values.ok() ? *std::move(values) : ValuesFile();
  }
};

// Sentences [begin, end) of a side read whole, as ReadSentences returns them.
DatastoreValues Slice(const DatastoreValues& side, int64_t begin, int64_t end) {
  DatastoreValues out;
  out.tokens.assign(side.tokens.begin() + side.offsets[begin],
                    side.tokens.begin() + side.offsets[end]);
  for (int64_t s = begin; s <= end; ++s) {
    out.offsets.push_back(side.offsets[s] - side.offsets[begin]);
  }
  return out;
}

TEST_F(ValuesReaderTest, ReadsTheSameTokensAsReadValuesFileForRandomSentenceRanges) {
  const ValuesFile whole = BuildRandom();
  ASSERT_EQ(whole.num_sentences(), 60);
  ASSERT_OK_AND_ASSIGN(const std::unique_ptr<ValuesReader> reader,
                       ValuesReader::Open(Path("values.h5")));
  ASSERT_EQ(reader->num_sentences(), whole.num_sentences());
  EXPECT_EQ(reader->offsets(ValuesSide::kTarget), whole.target.offsets);
  EXPECT_EQ(reader->offsets(ValuesSide::kSource), whole.source.offsets);
  EXPECT_EQ(reader->num_tokens(ValuesSide::kTarget),
            static_cast<int64_t>(whole.target.tokens.size()));
  EXPECT_EQ(reader->order(), whole.order);
  EXPECT_EQ(reader->tokenizer().sha256, whole.tokenizer.sha256);
  EXPECT_EQ(reader->corpus_lines(), 60);

  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int64_t> sentence(0, whole.num_sentences());
  for (int trial = 0; trial < 100; ++trial) {
    int64_t begin = sentence(rng), end = sentence(rng);
    if (begin > end) std::swap(begin, end);  // empty ranges (begin == end) included
    for (const ValuesSide side : {ValuesSide::kTarget, ValuesSide::kSource}) {
      const DatastoreValues& expected = side == ValuesSide::kTarget ? whole.target : whole.source;
      ASSERT_OK_AND_ASSIGN(const DatastoreValues got, reader->ReadSentences(side, begin, end));
      const DatastoreValues want = Slice(expected, begin, end);
      EXPECT_EQ(got.tokens, want.tokens) << "[" << begin << ", " << end << ")";
      EXPECT_EQ(got.offsets, want.offsets) << "[" << begin << ", " << end << ")";
    }
  }
  EXPECT_THAT(reader->ReadSentences(ValuesSide::kTarget, 3, 61),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("values.h5")));
}

TEST_F(ValuesReaderTest, ATokenOutsideTheVocabularyIsRefusedNamingTheFileAndTheSentence) {
  ValuesFile bad = BuildRandom();
  bad.source.tokens[bad.source.offsets[7] + 1] = kVocab;
  const std::string path = Path("bad.h5");
  ASSERT_OK(WriteValuesFile(path, bad));
  // Opening reads no token; ranges without the bad one read fine.
  ASSERT_OK_AND_ASSIGN(const std::unique_ptr<ValuesReader> reader, ValuesReader::Open(path));
  EXPECT_OK(reader->ReadSentences(ValuesSide::kSource, 0, 7).status());
  EXPECT_OK(reader->ReadSentences(ValuesSide::kTarget, 0, 60).status());
  const auto names_it = StatusIs(
      absl::StatusCode::kInvalidArgument,
      AllOf(HasSubstr("bad.h5"),
            HasSubstr(absl::StrCat("/src_tokens of sentence 7 (corpus line ", bad.order[7] + 1,
                                   ") holds token id 50 at position 1"))));
  EXPECT_THAT(reader->ReadSentences(ValuesSide::kSource, 5, 9), names_it);
  EXPECT_THAT(ReadValuesFile(path), names_it);
  std::vector<int32_t> tokens(3);
  const int64_t bad_token = bad.source.offsets[7] + 1;
  EXPECT_THAT(reader->ReadTokens(ValuesSide::kSource, bad_token - 1, bad_token + 2, tokens.data()),
              names_it);
}

TEST_F(ValuesReaderTest, TargetValueSourceReadsAnyTokenRangeAsInMemory) {
  const ValuesFile whole = BuildRandom();
  ASSERT_OK_AND_ASSIGN(const std::unique_ptr<ValuesReader> reader,
                       ValuesReader::Open(Path("values.h5")));
  const TargetValueSource source(*reader);
  EXPECT_THAT(source.offsets(), ElementsAreArray(whole.target.offsets));
  const int64_t n = static_cast<int64_t>(whole.target.tokens.size());
  ASSERT_EQ(source.num_tokens(), n);
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int64_t> token(0, n);
  for (int trial = 0; trial < 50; ++trial) {
    int64_t begin = token(rng), end = token(rng);
    if (begin > end) std::swap(begin, end);
    std::vector<int32_t> got(end - begin);
    ASSERT_OK(source.Read(begin, end, got.data()));
    EXPECT_TRUE(std::equal(got.begin(), got.end(), whole.target.tokens.begin() + begin))
        << "[" << begin << ", " << end << ")";
  }
}

// The index step streams values.h5: its index directory is the one built from the values in
// memory, file for file (the manifest holds every file's SHA-256).
TEST_F(ValuesReaderTest, AnIndexBuiltFromTheStreamedValuesEqualsOneBuiltFromMemory) {
  const ValuesFile whole = BuildRandom();
  ASSERT_OK_AND_ASSIGN(const std::unique_ptr<ValuesReader> reader,
                       ValuesReader::Open(Path("values.h5")));
  Matrix<float> keys(static_cast<int64_t>(whole.target.tokens.size()), 8);
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < keys.size(); ++i) keys.data()[i] = normal(rng);
  IndexBuildOptions options;
  options.factory = "IVF4,PQ2";  // with subset codes
  options.shards = 3;
  options.chunk_rows = 50;  // chunks cross shard and sentence boundaries
  options.progress.out = devnull_;
  const MatrixKeySource key_source(keys.view());
  const TargetValueSource streamed(*reader);
  const MemoryValueSource memory(whole.target);
  ASSERT_OK_AND_ASSIGN(const IndexManifest a,
                       BuildIndex(key_source, &streamed, options, Path("streamed")));
  ASSERT_OK_AND_ASSIGN(const IndexManifest b,
                       BuildIndex(key_source, &memory, options, Path("memory")));
  ASSERT_GT(a.subset_m, 0);
  EXPECT_EQ(a.ToJson(), b.ToJson());
}

TEST_F(ValuesReaderTest, InconsistentOffsetsOrOrderAreRefusedAtOpenNamingTheFile) {
  const ValuesFile good = BuildRandom();
  struct Case {
    const char* what;
    std::function<void(ValuesFile&)> spoil;
  };
  const std::vector<Case> cases = {
      {"/offsets decrease at sentence 3",
       [](ValuesFile& v) { v.target.offsets[4] = v.target.offsets[3] - 1; }},
      {"/src_offsets end at", [](ValuesFile& v) { v.source.offsets.back() -= 1; }},
      {"/src_offsets must start with 0", [](ValuesFile& v) { v.source.offsets[0] = 1; }},
      {"/src_offsets 59",
       [](ValuesFile& v) {
         v.source.offsets.pop_back();
         v.source.tokens.resize(v.source.offsets.back());
       }},
      {"twice", [](ValuesFile& v) { v.order[1] = v.order[0]; }},
  };
  for (const Case& c : cases) {
    ValuesFile bad = good;
    c.spoil(bad);
    const std::string path = Path("bad.h5");
    ASSERT_OK(WriteValuesFile(path, bad));
    EXPECT_THAT(ValuesReader::Open(path), StatusIs(absl::StatusCode::kInvalidArgument,
                                                   AllOf(HasSubstr("bad.h5"), HasSubstr(c.what))))
        << c.what;
  }
}

TEST(BatchPlanTest, BatchesAreContiguousAndWithinTheTokenBudget) {
  const std::vector<int64_t> lengths = {2, 3, 3, 4, 9, 10, 30, 5};
  const std::vector<Batch> batches = PlanBatches(lengths, 20, 3);
  int64_t next = 0;
  for (const Batch& b : batches) {
    EXPECT_EQ(b.begin, next);
    EXPECT_LE(b.end - b.begin, 3);
    int64_t longest = 0;
    for (int64_t i = b.begin; i < b.end; ++i) longest = std::max(longest, lengths[i]);
    EXPECT_EQ(b.max_length, longest);
    // Only a sentence longer than the budget may exceed it, alone.
    EXPECT_TRUE((b.end - b.begin) * longest <= 20 || b.end - b.begin == 1);
    next = b.end;
  }
  EXPECT_EQ(next, 8);
}

TEST(BatchPlanTest, PaddingFractionCountsBothSides) {
  const std::vector<Batch> one = {{0, 2, 4}};
  // sources 2 and 4 (pad 2), targets 3 and 3 (pad 0): 12 real of 14.
  EXPECT_DOUBLE_EQ(PaddingFraction(one, std::vector<int64_t>{2, 4}, std::vector<int64_t>{3, 3}),
                   1.0 - 12.0 / 14.0);
}

class KeysFileTest : public testing::TempDirTest {
 protected:
  static KeysFileSpec Spec(const std::string& model) {
    KeysFileSpec spec;
    spec.rows = 10;
    spec.dim = 3;
    spec.chunk_rows = 4;
    spec.identity = {{"model_sha256", model}};
    return spec;
  }
  static Matrix<float> Rows(int64_t n, float base) {
    Matrix<float> m(n, 3);
    for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = base + 0.25f * static_cast<float>(i);
    return m;
  }
};

TEST_F(KeysFileTest, ResumesAtTheLastCheckpointAndPublishesOnlyWhenComplete) {
  const std::string path = Path("keys.h5");
  {
    ASSERT_OK_AND_ASSIGN(auto writer, KeysFileWriter::CreateOrResume(path, Spec("m")));
    ASSERT_OK(writer->Append(Rows(4, 0).view()));
    ASSERT_OK(writer->Checkpoint());
    ASSERT_OK(writer->Append(Rows(3, 100).view()));  // written but never checkpointed
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  ASSERT_OK_AND_ASSIGN(auto writer, KeysFileWriter::CreateOrResume(path, Spec("m")));
  EXPECT_EQ(writer->resumed_from(), 4);
  ASSERT_OK(writer->Append(Rows(6, 4).view()));
  ASSERT_OK_AND_ASSIGN(const FileDigest digest, writer->Commit());
  EXPECT_OK(VerifyFile(path, digest));
  EXPECT_FALSE(std::filesystem::exists(PartialPath(path)));
  ASSERT_OK_AND_ASSIGN(auto keys, Hdf5KeySource::Open(path));
  std::vector<float> all(30);
  ASSERT_OK(keys->Read(0, 10, all.data()));
  EXPECT_FLOAT_EQ(all[4 * 3], 4.0f);  // row 4 is the resumed run's, not the lost one's
  ASSERT_OK_AND_ASSIGN(const bool matches, CompleteKeysFileMatches(path, Spec("m")));
  EXPECT_TRUE(matches);
  KeysFileSpec fp32 = Spec("m");
  fp32.fp16 = !fp32.fp16;
  ASSERT_OK_AND_ASSIGN(const bool fp32_matches, CompleteKeysFileMatches(path, fp32));
  EXPECT_FALSE(fp32_matches);
  EXPECT_THAT(CompleteKeysFileMatches(path, Spec("other")),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("model_sha256")));
}

TEST_F(KeysFileTest, APartialFileOfAnotherComputationIsRefused) {
  const std::string path = Path("keys.h5");
  {
    ASSERT_OK_AND_ASSIGN(auto writer, KeysFileWriter::CreateOrResume(path, Spec("m")));
    ASSERT_OK(writer->Append(Rows(4, 0).view()));
    ASSERT_OK(writer->Checkpoint());
  }
  EXPECT_THAT(KeysFileWriter::CreateOrResume(path, Spec("another model")),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("model_sha256 = \"m\"")));
}

// A partial of this computation with another shape, dtype or layout holds no usable rows: it is
// started over.
TEST_F(KeysFileTest, APartialFileOfOtherOptionsIsStartedOver) {
  const std::string path = Path("keys.h5");
  {
    ASSERT_OK_AND_ASSIGN(auto writer, KeysFileWriter::CreateOrResume(path, Spec("m")));
    ASSERT_OK(writer->Append(Rows(4, 0).view()));
    ASSERT_OK(writer->Checkpoint());
  }
  KeysFileSpec wider = Spec("m");
  wider.dim = 4;
  KeysFileSpec batched = Spec("m");
  batched.layout["batching"] = "other";
  for (const KeysFileSpec& spec : {wider, batched, Spec("m")}) {
    ASSERT_OK_AND_ASSIGN(auto writer, KeysFileWriter::CreateOrResume(path, spec));
    EXPECT_EQ(writer->resumed_from(), 0);
  }
}

// A partial that cannot be opened is kept, and the error names it: the old code deleted it
// whatever the reason (HDF5 refuses a file another process holds open).
TEST_F(KeysFileTest, APartialThatCannotBeOpenedIsKept) {
  const std::string path = Path("keys.h5");
  std::ofstream(PartialPath(path)) << "not HDF5";
  const absl::Status status = KeysFileWriter::CreateOrResume(path, Spec("m")).status();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("cannot resume " + PartialPath(path) + " (kept"));
  EXPECT_TRUE(std::filesystem::exists(PartialPath(path)));
}

// A creation killed before the partial was published leaves "<partial>.new", never a partial:
// the next run starts over.
TEST_F(KeysFileTest, AnUnfinishedCreationIsStartedOver) {
  const std::string path = Path("keys.h5");
  std::ofstream(PartialPath(path) + ".new") << "half-created";
  ASSERT_OK_AND_ASSIGN(auto writer, KeysFileWriter::CreateOrResume(path, Spec("m")));
  EXPECT_EQ(writer->resumed_from(), 0);
  EXPECT_FALSE(std::filesystem::exists(PartialPath(path) + ".new"));
}

// A disk that fills while HDF5 writes leaves a file whose close fails. HDF5 1.10 crashes when
// such a file is closed again, as its C++ library does at exit: the process must still end with
// the code it chose.
using Hdf5FileDeathTest = testing::TempDirTest;

TEST_F(Hdf5FileDeathTest, AProcessWhoseCloseFailedExitsWithItsOwnCode) {
  const std::string path = Path("full.h5");
  EXPECT_EXIT(
      {
        testing::FileSizeLimit limit(64 << 10);
        auto file = Hdf5File::Open(path, Hdf5File::Mode::kCreate);
        if (!file.ok()) std::_Exit(1);
        if (!(*file)->CreateVector("tokens", Hdf5Type::kInt32, 1 << 16, false).ok()) std::_Exit(1);
        const std::vector<int32_t> tokens(1 << 20, 7);
        const absl::Status written = (*file)->AppendInt32("tokens", tokens);
        const absl::Status closed = (*file)->Close();
        std::exit(!written.ok() && !closed.ok() ? 3 : 1);
      },
      ::testing::ExitedWithCode(3), "");
}

}  // namespace
}  // namespace knnserve
