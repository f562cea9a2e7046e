// Corpus BLEU and chrF computed exactly as sacreBLEU 2.x does: BLEU with the 13a tokenizer,
// exponential smoothing and the closest reference length by default; chrF with character
// n-grams up to 6, beta 2, whitespace removed and effective-order averaging by default.
// Inputs are UTF-8; chrF counts code points; whitespace is Python's str.split() whitespace.
// Lowercasing is not offered (Python's Unicode lower() is not reproduced here).
#ifndef KNNSERVE_CLIENT_EVAL_BLEU_H_
#define KNNSERVE_CLIENT_EVAL_BLEU_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace knnserve::eval {

// sacreBLEU's "13a" tokenizer (mteval-v13a.pl).
std::string Tokenize13a(absl::string_view line);

struct BleuOptions {
  std::string tokenize = "13a";  // 13a | none
  std::string smooth_method = "exp";  // exp | floor | add-k | none
  double smooth_value = -1;  // < 0: sacreBLEU's default (floor 0.1, add-k 1)
  int max_ngram_order = 4;
  bool effective_order = false;
};

struct BleuStats {
  int64_t sys_len = 0;
  int64_t ref_len = 0;
  std::vector<double> correct;  // per order (double: add-k smoothing adds fractions)
  std::vector<double> total;
};

struct BleuScore {
  double score = 0;                 // 0..100
  std::vector<double> precisions;   // 0..100 per order, after smoothing
  BleuStats stats;
  double brevity_penalty = 0;
  // "BLEU = 34.12 66.7/41.2/27.3/18.2 (BP = 1.000 ratio = 1.012 hyp_len = 85 ref_len = 84)"
  std::string Format() const;
};

// sacreBLEU's signature, e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.x".
std::string BleuSignature(const BleuOptions& options, int num_refs);

// references[r][i] is reference r of hypothesis i; every stream must have
// hypotheses.size() lines.
absl::StatusOr<BleuScore> CorpusBleu(const std::vector<std::string>& hypotheses,
                                     const std::vector<std::vector<std::string>>& references,
                                     const BleuOptions& options = {});

// BLEU from sufficient statistics (sacreBLEU's BLEU.compute_bleu).
BleuScore ComputeBleu(BleuStats stats, const BleuOptions& options);

struct ChrfOptions {
  int char_order = 6;
  double beta = 2;
  bool whitespace = false;     // keep whitespace in character n-grams
  bool eps_smoothing = false;  // chrF++.py-style epsilon smoothing instead of effective order
};

// sacreBLEU's signature, e.g. "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.x".
std::string ChrfSignature(const ChrfOptions& options, int num_refs);

// Corpus chrF (0..100); with several references each sentence uses its best-scoring one.
absl::StatusOr<double> CorpusChrf(const std::vector<std::string>& hypotheses,
                                  const std::vector<std::vector<std::string>>& references,
                                  const ChrfOptions& options = {});

}  // namespace knnserve::eval

#endif  // KNNSERVE_CLIENT_EVAL_BLEU_H_
