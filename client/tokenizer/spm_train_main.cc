// knnserve-spm-train: runs SentencePiece training in its own small process (see
// sentencepiece_shim.h for why it cannot run inside knnserve). Arguments are SentencePiece's
// own flags (--input=..., --model_prefix=..., ...). Not meant to be called by hand: use
// `knnserve tokenizer train`.
#include <sentencepiece_trainer.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  std::string args;
  for (int i = 1; i < argc; ++i) {
    if (i > 1) args += ' ';
    args += argv[i];
  }
  const sentencepiece::util::Status status = sentencepiece::SentencePieceTrainer::Train(args);
  if (!status.ok()) {
    std::fprintf(stderr, "sentencepiece: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
