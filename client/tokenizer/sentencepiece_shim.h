// Internal: a std-only interface to SentencePiece, implemented in a separately loaded module.
//
// Two problems force the indirection:
//  * SentencePiece 0.1.97's headers declare `namespace absl { using std::string_view; }`, which
//    collides with abseil's own absl::string_view class, so no translation unit may include
//    both. This header uses only the standard library.
//  * Debian's libsentencepiece bundles its own protobuf-lite and exports its symbols; in a
//    process that also loads libprotobuf.so (gRPC, LibTorch's ONNX) the two copies interpose
//    each other and the process crashes during static initialization. The module
//    (libknnserve_spm.so) is therefore opened with dlopen(RTLD_LOCAL | RTLD_DEEPBIND), so that
//    SentencePiece binds to its own protobuf and nobody else sees it.
//  * Under RTLD_DEEPBIND the module sees libstdc++'s own std::cerr, not the executable's
//    copy-relocated (and only initialized) one, so any SentencePiece logging would crash.
//    Encoding and decoding do not log; training logs a lot and therefore runs in a separate
//    small executable (knnserve-spm-train, spm_train_main.cc) that links nothing else.
// Use client/tokenizer/tokenizer.h instead of this header.
#ifndef KNNSERVE_CLIENT_TOKENIZER_SENTENCEPIECE_SHIM_H_
#define KNNSERVE_CLIENT_TOKENIZER_SENTENCEPIECE_SHIM_H_

#include <memory>
#include <string>
#include <vector>

namespace knnserve::spm_shim {

// Thread-safe for concurrent Encode/Decode after LoadFromSerialized.
class Processor {
 public:
  virtual ~Processor() = default;
  // All return an empty string on success, else the error message.
  virtual std::string LoadFromSerialized(const std::string& serialized_model) = 0;
  virtual std::string Encode(const std::string& text, std::vector<int>* ids) const = 0;
  virtual std::string Decode(const std::vector<int>& ids, std::string* text) const = 0;
  virtual std::string EncodePieces(const std::string& text,
                                   std::vector<std::string>* pieces) const = 0;
  virtual std::string DecodePieces(const std::vector<std::string>& pieces,
                                   std::string* text) const = 0;
  virtual int PieceSize() const = 0;
  virtual std::string IdToPiece(int id) const = 0;
  virtual int pad_id() const = 0;
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
  virtual int unk_id() const = 0;
};

// The module's entry point.
class Library {
 public:
  virtual ~Library() = default;
  virtual std::unique_ptr<Processor> NewProcessor() const = 0;
};

// Exported by the module (extern "C"): returns a process-lifetime Library.
using GetLibraryFn = const Library* (*)();
inline constexpr char kGetLibrarySymbol[] = "KnnserveSentencePieceLibrary";

}  // namespace knnserve::spm_shim

#endif  // KNNSERVE_CLIENT_TOKENIZER_SENTENCEPIECE_SHIM_H_
