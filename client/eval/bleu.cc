#include "client/eval/bleu.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace knnserve::eval {
namespace {

constexpr char kVersion[] = "2.x-compatible(knnserve)";

// ---- UTF-8 <-> code points (invalid bytes pass through as single code points) ----
std::u32string DecodeUtf8(absl::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int extra = c >= 0xF8 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    if (i + extra >= s.size()) extra = 0;  // truncated sequence: pass the byte through
    char32_t cp = extra == 0 ? c : (c & (0x3F >> extra));
    bool valid = true;
    for (int k = 1; k <= extra; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) valid = false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!valid) {
      cp = c;
      extra = 0;
    }
    out.push_back(cp);
    i += extra + 1;
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string EncodeUtf8(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) AppendUtf8(cp, out);
  return out;
}

// Python's str.isspace() set, which str.split() splits on.
bool IsPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

bool IsDigit(char32_t c) { return c >= '0' && c <= '9'; }

// Python's str.split() with no arguments.
std::vector<std::u32string> PySplit(const std::u32string& s) {
  std::vector<std::u32string> words;
  std::u32string current;
  for (char32_t c : s) {
    if (IsPySpace(c)) {
      if (!current.empty()) words.push_back(std::move(current));
      current.clear();
    } else {
      current.push_back(c);
    }
  }
  if (!current.empty()) words.push_back(std::move(current));
  return words;
}

std::u32string RStrip(std::u32string s) {
  while (!s.empty() && IsPySpace(s.back())) s.pop_back();
  return s;
}

// The first regex of sacreBLEU's TokenizerRegexp: [\{-\~\[-\` -\&\(-\+\:-\@\/].
bool IsTokenizedPunct(char32_t c) {
  return (c >= '{' && c <= '~') || (c >= '[' && c <= '`') || (c >= ' ' && c <= '&') ||
         (c >= '(' && c <= '+') || (c >= ':' && c <= '@') || c == '/';
}

bool IsPeriodOrComma(char32_t c) { return c == '.' || c == ','; }

std::vector<std::string> Words(const std::u32string& s) {
  std::vector<std::string> words;
  for (const std::u32string& w : PySplit(s)) words.push_back(EncodeUtf8(w));
  return words;
}

std::vector<std::string> TokenizeForBleu(const std::string& line, const BleuOptions& options) {
  const std::string stripped = EncodeUtf8(RStrip(DecodeUtf8(line)));
  if (options.tokenize == "none") return Words(DecodeUtf8(stripped));
  return Words(DecodeUtf8(Tokenize13a(stripped)));
}

using NgramCounts = std::unordered_map<std::string, int64_t>;

NgramCounts CountNgrams(const std::vector<std::string>& words, int max_order) {
  NgramCounts counts;
  for (int n = 1; n <= max_order; ++n) {
    for (size_t i = 0; i + n <= words.size(); ++i) {
      std::string key = words[i];
      for (int k = 1; k < n; ++k) absl::StrAppend(&key, " ", words[i + k]);
      ++counts[key];
    }
  }
  return counts;
}

int NgramOrder(const std::string& key) {
  return 1 + static_cast<int>(std::count(key.begin(), key.end(), ' '));
}

double MyLog(double x) { return x == 0 ? -9999999999.0 : std::log(x); }

double DefaultSmoothValue(const std::string& method) {
  if (method == "floor") return 0.1;
  if (method == "add-k") return 1.0;
  return 0.0;
}

absl::Status CheckStreams(const std::vector<std::string>& hypotheses,
                          const std::vector<std::vector<std::string>>& references) {
  if (references.empty()) return absl::InvalidArgumentError("no reference stream given");
  for (size_t r = 0; r < references.size(); ++r) {
    if (references[r].size() != hypotheses.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("reference stream ", r + 1, " has ", references[r].size(),
                       " lines but there are ", hypotheses.size(), " hypotheses"));
    }
  }
  return absl::OkStatus();
}

// ---- chrF ----
using CharNgrams = std::vector<std::unordered_map<std::u32string, int64_t>>;

CharNgrams CharNgramCounts(const std::string& line, const ChrfOptions& options) {
  std::u32string s = DecodeUtf8(line);
  if (!options.whitespace) {
    std::u32string joined;
    for (const auto& w : PySplit(s)) joined += w;
    s = std::move(joined);
  }
  CharNgrams counts(options.char_order);
  for (int n = 1; n <= options.char_order; ++n) {
    for (size_t i = 0; i + n <= s.size(); ++i) ++counts[n - 1][s.substr(i, n)];
  }
  return counts;
}

double ChrfFromStats(const std::vector<double>& stats, const ChrfOptions& options) {
  constexpr double kEps = 1e-16;
  const double factor = options.beta * options.beta;
  double eps_score = 0, avg_prec = 0, avg_rec = 0;
  int effective_order = 0;
  const int order = options.char_order;
  for (int i = 0; i < order; ++i) {
    const double n_hyp = stats[3 * i], n_ref = stats[3 * i + 1], n_match = stats[3 * i + 2];
    const double prec = n_hyp > 0 ? n_match / n_hyp : kEps;
    const double rec = n_ref > 0 ? n_match / n_ref : kEps;
    const double denom = factor * prec + rec;
    eps_score += denom > 0 ? (1 + factor) * prec * rec / denom : kEps;
    if (n_hyp > 0 && n_ref > 0) {
      avg_prec += prec;
      avg_rec += rec;
      ++effective_order;
    }
  }
  if (options.eps_smoothing) return 100 * eps_score / order;
  if (effective_order == 0) return 0.0;
  avg_prec /= effective_order;
  avg_rec /= effective_order;
  if (avg_prec + avg_rec == 0) return 0.0;
  return 100 * (1 + factor) * avg_prec * avg_rec / (factor * avg_prec + avg_rec);
}

}  // namespace

std::string Tokenize13a(absl::string_view line) {
  std::string s = absl::StrReplaceAll(line, {{"<skipped>", ""}});
  s = absl::StrReplaceAll(s, {{"-\n", ""}});
  s = absl::StrReplaceAll(s, {{"\n", " "}});
  if (s.find('&') != std::string::npos) {
    s = absl::StrReplaceAll(s, {{"&quot;", "\""}});
    s = absl::StrReplaceAll(s, {{"&amp;", "&"}});
    s = absl::StrReplaceAll(s, {{"&lt;", "<"}});
    s = absl::StrReplaceAll(s, {{"&gt;", ">"}});
  }
  const std::u32string in = DecodeUtf8(absl::StrCat(" ", s, " "));
  // Each pass mirrors one re.sub: left to right, non-overlapping matches.
  std::u32string a;
  for (char32_t c : in) {
    if (IsTokenizedPunct(c)) {
      a += U' ';
      a += c;
      a += U' ';
    } else {
      a += c;
    }
  }
  std::u32string b;  // ([^0-9])([\.,]) -> '\1 \2 '
  for (size_t i = 0; i < a.size();) {
    if (i + 1 < a.size() && !IsDigit(a[i]) && IsPeriodOrComma(a[i + 1])) {
      b += a[i];
      b += U' ';
      b += a[i + 1];
      b += U' ';
      i += 2;
    } else {
      b += a[i++];
    }
  }
  std::u32string c;  // ([\.,])([^0-9]) -> ' \1 \2'
  for (size_t i = 0; i < b.size();) {
    if (i + 1 < b.size() && IsPeriodOrComma(b[i]) && !IsDigit(b[i + 1])) {
      c += U' ';
      c += b[i];
      c += U' ';
      c += b[i + 1];
      i += 2;
    } else {
      c += b[i++];
    }
  }
  std::u32string d;  // ([0-9])(-) -> '\1 \2 '
  for (size_t i = 0; i < c.size();) {
    if (i + 1 < c.size() && IsDigit(c[i]) && c[i + 1] == U'-') {
      d += c[i];
      d += U' ';
      d += U'-';
      d += U' ';
      i += 2;
    } else {
      d += c[i++];
    }
  }
  return absl::StrJoin(Words(d), " ");
}

std::string BleuScore::Format() const {
  std::vector<std::string> precs;
  for (double p : precisions) precs.push_back(absl::StrFormat("%.1f", p));
  const double ratio =
      stats.ref_len > 0 ? static_cast<double>(stats.sys_len) / stats.ref_len : 0.0;
  return absl::StrFormat("BLEU = %.2f %s (BP = %.3f ratio = %.3f hyp_len = %d ref_len = %d)",
                         score, absl::StrJoin(precs, "/"), brevity_penalty, ratio,
                         stats.sys_len, stats.ref_len);
}

std::string BleuSignature(const BleuOptions& options, int num_refs) {
  std::string smooth = options.smooth_method;
  if (options.smooth_method == "floor" || options.smooth_method == "add-k") {
    const double value = options.smooth_value >= 0 ? options.smooth_value
                                                   : DefaultSmoothValue(options.smooth_method);
    absl::StrAppend(&smooth, absl::StrFormat("[%.2f]", value));
  }
  return absl::StrCat("nrefs:", num_refs, "|case:mixed|eff:",
                      options.effective_order ? "yes" : "no", "|tok:", options.tokenize,
                      "|smooth:", smooth, "|version:", kVersion);
}

BleuScore ComputeBleu(BleuStats stats, const BleuOptions& options) {
  const int max_order = options.max_ngram_order;
  stats.correct.resize(max_order, 0);
  stats.total.resize(max_order, 0);
  const double smooth_value = options.smooth_value >= 0
                                  ? options.smooth_value
                                  : DefaultSmoothValue(options.smooth_method);
  BleuScore result;
  result.brevity_penalty = 1.0;
  if (stats.sys_len < stats.ref_len) {
    result.brevity_penalty =
        stats.sys_len > 0
            ? std::exp(1.0 - static_cast<double>(stats.ref_len) / stats.sys_len)
            : 0.0;
  }
  result.precisions.assign(max_order, 0.0);
  const bool any_correct =
      std::any_of(stats.correct.begin(), stats.correct.end(), [](double c) { return c != 0; });
  if (any_correct) {
    double smooth_mteval = 1.0;
    int eff_order = max_order;
    for (int n = 1; n <= max_order; ++n) {
      if (options.smooth_method == "add-k" && n > 1) {
        stats.correct[n - 1] += smooth_value;
        stats.total[n - 1] += smooth_value;
      }
      if (stats.total[n - 1] == 0) break;
      if (options.effective_order) eff_order = n;
      if (stats.correct[n - 1] == 0) {
        if (options.smooth_method == "exp") {
          smooth_mteval *= 2;
          result.precisions[n - 1] = 100.0 / (smooth_mteval * stats.total[n - 1]);
        } else if (options.smooth_method == "floor") {
          result.precisions[n - 1] = 100.0 * smooth_value / stats.total[n - 1];
        }
      } else {
        result.precisions[n - 1] = 100.0 * stats.correct[n - 1] / stats.total[n - 1];
      }
    }
    double log_sum = 0;
    for (int n = 0; n < eff_order; ++n) log_sum += MyLog(result.precisions[n]);
    result.score = result.brevity_penalty * std::exp(log_sum / eff_order);
  }
  result.stats = std::move(stats);
  return result;
}

absl::StatusOr<BleuScore> CorpusBleu(const std::vector<std::string>& hypotheses,
                                     const std::vector<std::vector<std::string>>& references,
                                     const BleuOptions& options) {
  if (auto s = CheckStreams(hypotheses, references); !s.ok()) return s;
  if (options.tokenize != "13a" && options.tokenize != "none") {
    return absl::InvalidArgumentError(
        absl::StrCat("BLEU tokenizer must be 13a or none, got ", options.tokenize));
  }
  if (options.smooth_method != "exp" && options.smooth_method != "floor" &&
      options.smooth_method != "add-k" && options.smooth_method != "none") {
    return absl::InvalidArgumentError(absl::StrCat(
        "BLEU smoothing must be exp, floor, add-k or none, got ", options.smooth_method));
  }
  if (options.max_ngram_order < 1) {
    return absl::InvalidArgumentError("BLEU max n-gram order must be >= 1");
  }
  const int max_order = options.max_ngram_order;
  BleuStats stats;
  stats.correct.assign(max_order, 0);
  stats.total.assign(max_order, 0);
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    NgramCounts ref_max;
    std::vector<int64_t> ref_lens;
    for (const auto& stream : references) {
      const std::vector<std::string> words = TokenizeForBleu(stream[i], options);
      ref_lens.push_back(static_cast<int64_t>(words.size()));
      for (const auto& [ngram, count] : CountNgrams(words, max_order)) {
        int64_t& best = ref_max[ngram];
        best = std::max(best, count);
      }
    }
    const std::vector<std::string> hyp = TokenizeForBleu(hypotheses[i], options);
    const int64_t hyp_len = static_cast<int64_t>(hyp.size());
    int64_t closest_diff = -1, closest_len = -1;
    for (int64_t len : ref_lens) {
      const int64_t diff = std::llabs(hyp_len - len);
      if (closest_diff == -1 || diff < closest_diff) {
        closest_diff = diff;
        closest_len = len;
      } else if (diff == closest_diff && len < closest_len) {
        closest_len = len;
      }
    }
    stats.sys_len += hyp_len;
    stats.ref_len += closest_len;
    for (const auto& [ngram, count] : CountNgrams(hyp, max_order)) {
      const int n = NgramOrder(ngram) - 1;
      stats.total[n] += count;
      if (auto it = ref_max.find(ngram); it != ref_max.end()) {
        stats.correct[n] += std::min(count, it->second);
      }
    }
  }
  return ComputeBleu(std::move(stats), options);
}

std::string ChrfSignature(const ChrfOptions& options, int num_refs) {
  return absl::StrCat("nrefs:", num_refs, "|case:mixed|eff:",
                      options.eps_smoothing ? "no" : "yes", "|nc:", options.char_order,
                      "|nw:0|space:", options.whitespace ? "yes" : "no", "|version:", kVersion);
}

absl::StatusOr<double> CorpusChrf(const std::vector<std::string>& hypotheses,
                                  const std::vector<std::vector<std::string>>& references,
                                  const ChrfOptions& options) {
  if (auto s = CheckStreams(hypotheses, references); !s.ok()) return s;
  if (options.char_order < 1) return absl::InvalidArgumentError("chrF order must be >= 1");
  const int order = options.char_order;
  std::vector<double> corpus(3 * order, 0.0);
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    const CharNgrams hyp = CharNgramCounts(hypotheses[i], options);
    std::vector<double> best;
    double best_f = -1;
    for (const auto& stream : references) {
      const CharNgrams ref = CharNgramCounts(stream[i], options);
      std::vector<double> stats(3 * order, 0.0);
      for (int n = 0; n < order; ++n) {
        int64_t hyp_count = 0, ref_count = 0, match = 0;
        for (const auto& [gram, count] : hyp[n]) {
          hyp_count += count;
          if (auto it = ref[n].find(gram); it != ref[n].end()) match += std::min(count, it->second);
        }
        for (const auto& [gram, count] : ref[n]) ref_count += count;
        stats[3 * n] = ref[n].empty() ? 0 : static_cast<double>(hyp_count);
        stats[3 * n + 1] = static_cast<double>(ref_count);
        stats[3 * n + 2] = static_cast<double>(match);
      }
      const double f = ChrfFromStats(stats, options);
      if (f > best_f) {
        best_f = f;
        best = std::move(stats);
      }
    }
    for (int k = 0; k < 3 * order; ++k) corpus[k] += best[k];
  }
  return ChrfFromStats(corpus, options);
}

}  // namespace knnserve::eval
