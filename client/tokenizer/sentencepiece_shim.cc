// The loadable module that wraps SentencePiece (see sentencepiece_shim.h). The only
// library translation unit that includes SentencePiece (spm_train_main.cc is a separate tool).
#include "client/tokenizer/sentencepiece_shim.h"

#include <sentencepiece_processor.h>

namespace knnserve::spm_shim {
namespace {

std::string ErrorOf(const sentencepiece::util::Status& status) {
  return status.ok() ? std::string() : std::string("sentencepiece: ") + status.ToString();
}

class ProcessorImpl : public Processor {
 public:
  std::string LoadFromSerialized(const std::string& serialized_model) override {
    return ErrorOf(processor_.LoadFromSerializedProto(serialized_model));
  }
  std::string Encode(const std::string& text, std::vector<int>* ids) const override {
    return ErrorOf(processor_.Encode(text, ids));
  }
  std::string Decode(const std::vector<int>& ids, std::string* text) const override {
    return ErrorOf(processor_.Decode(ids, text));
  }
  std::string EncodePieces(const std::string& text,
                           std::vector<std::string>* pieces) const override {
    return ErrorOf(processor_.Encode(text, pieces));
  }
  std::string DecodePieces(const std::vector<std::string>& pieces,
                           std::string* text) const override {
    return ErrorOf(processor_.Decode(pieces, text));
  }
  int PieceSize() const override { return processor_.GetPieceSize(); }
  std::string IdToPiece(int id) const override { return processor_.IdToPiece(id); }
  int pad_id() const override { return processor_.pad_id(); }
  int bos_id() const override { return processor_.bos_id(); }
  int eos_id() const override { return processor_.eos_id(); }
  int unk_id() const override { return processor_.unk_id(); }

 private:
  sentencepiece::SentencePieceProcessor processor_;
};

class LibraryImpl : public Library {
 public:
  std::unique_ptr<Processor> NewProcessor() const override {
    return std::make_unique<ProcessorImpl>();
  }
};

}  // namespace
}  // namespace knnserve::spm_shim

extern "C" __attribute__((visibility("default"))) const knnserve::spm_shim::Library*
KnnserveSentencePieceLibrary() {
  static const knnserve::spm_shim::LibraryImpl library;
  return &library;
}
