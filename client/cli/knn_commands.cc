// Translation on the command line: `knnserve translate --mode base|knn|subset-knn` (every mode
// runs through one path) and `knnserve tune` (grid search of kNN-MT's k, τ, λ on a dev set).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "client/cli/commands.h"
#include "client/data/parallel_corpus.h"
#include "client/datastore/pipeline.h"
#include "client/decode/search.h"
#include "client/eval/bleu.h"
#include "client/knn/knn_processor.h"
#include "client/knn/local_retriever.h"
#include "client/knn/provenance.h"
#include "client/knn/remote_retriever.h"
#include "client/knn/subset_selector.h"
#include "client/knn/thread_plan.h"
#include "client/model/checkpoint.h"
#include "client/tokenizer/tokenizer.h"
#include "common/cli_checks.h"
#include "common/datastore/values_file.h"
#include "common/files.h"
#include "common/progress.h"
#include "common/request.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace knnserve::cli {
namespace {

// Where retrieval happens and how: shared by translate and tune.
struct RetrievalFlags {
  std::string mode = "base";  // base | knn | subset-knn
  std::string datastore;      // directory of `knnserve datastore build`
  std::string index_dir;      // embedded: the index directory, loaded in-process
  std::string router;         // remote: the router's host:port
  knn::KnnOptions knn;
  std::string knn_config;  // JSON written by `knnserve tune`; explicit flags win
  int subset_sentences = 512;
  std::string sentence_index;
  // Embedded mode: threads of a step's search (0: auto, see PlanThreads).
  int search_threads = 0;
  // Whether beam search decodes two batches at a time, alternating their steps
  // (decode::BeamSearchBatches): auto | on | off (auto: see PlanThreads).
  std::string interleave_batches = "auto";
  knn::RemoteRetrieverOptions remote;
  int64_t step_deadline_ms = 10000;
};

void AddRetrievalFlags(CLI::App* cmd, RetrievalFlags* f) {
  cmd->add_option("--mode", f->mode, "base | knn | subset-knn")
      ->check(CLI::IsMember({"base", "knn", "subset-knn"}))
      ->capture_default_str();
  cmd->add_option("--datastore", f->datastore,
                  "datastore directory (`knnserve datastore build`): its sentence index and "
                  "values; its index/ is searched in-process unless --router or --index");
  cmd->add_option("--index", f->index_dir, "embedded retrieval: index directory (no servers)");
  cmd->add_option("--search-threads", f->search_threads,
                  "embedded retrieval: threads of each step's search; the model gets the "
                  "rest of --threads while a search runs beside it. With interleaved batches "
                  "(0: --threads - 1 up to 160 query rows a step, else 1 in the background); "
                  "otherwise fewer than --threads: the search runs beside the model while it "
                  "computes the step's log-probabilities; as many: after it (0: 1 for --mode "
                  "knn with batch x beam <= 80 query rows, else --threads)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  cmd->add_option("--interleave-batches", f->interleave_batches,
                  "auto | on | off: beam search decodes two batches at a time and alternates "
                  "their steps, so that one batch's retrieval runs while the model computes the "
                  "other's step (the same translations as one batch at a time). auto: on with "
                  "--router, and embedded with --threads >= 2")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_option("--router", f->router, "remote retrieval: router address host:port")
      ->check(HostPort());
  cmd->add_option("--knn-topk", f->knn.k, "neighbours per step (k)")
      ->check(CLI::Range(1, RequestLimits().max_k))
      ->capture_default_str();
  cmd->add_option("--knn-temperature", f->knn.temperature, "softmax temperature τ")
      ->check(FiniteRange(knn::kMinTemperature, knn::kMaxTemperature))
      ->capture_default_str();
  cmd->add_option("--knn-weight", f->knn.weight, "interpolation weight λ of p_kNN")
      ->check(FiniteRange(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--knn-nprobe", f->knn.nprobe, "IVF lists probed (0: index default)")
      ->check(CLI::Range(0, RequestLimits().max_nprobe))
      ->capture_default_str();
  cmd->add_option("--knn-threshold", f->knn.threshold,
                  "ignore neighbours farther than this distance (0: off)")
      ->check(FiniteRange(0.0, 1e30))
      ->capture_default_str();
  cmd->add_option("--knn-config", f->knn_config,
                  "k/τ/λ from `knnserve tune` (JSON); explicit --knn-* flags win");
  cmd->add_option("--subset-sentences", f->subset_sentences,
                  "subset-knn: datastore sentences retrieved per source sentence")
      ->check(CLI::Range(1, RequestLimits().max_k))
      ->capture_default_str();
  cmd->add_option("--sentence-index", f->sentence_index,
                  "subset-knn: sentence index directory (default: DATASTORE/sentence_index)");
  cmd->add_option("--tls-ca", f->remote.tls.ca, "remote: CA that signed the router's cert");
  cmd->add_option("--tls-cert", f->remote.tls.cert, "remote: client certificate (mTLS)");
  cmd->add_option("--tls-key", f->remote.tls.key, "remote: client key (mTLS)");
  cmd->add_option("--tls-server-name", f->remote.tls_server_name,
                  "remote: name the router's certificate must carry");
  cmd->add_option("--step-deadline-ms", f->step_deadline_ms, "remote: deadline of one step")
      ->check(CLI::Range(int64_t{1}, int64_t{86'400'000}))
      ->capture_default_str();
  cmd->add_option(
         "--retries", f->remote.max_retries,
         "remote: retries of a failed step (100 ms apart, doubling up to 2 s: 6 wait 5.1 s)")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
}

// Fills k/τ/λ from --knn-config where the flag was not given explicitly.
// Notes (stderr) the retrieval flags given that this run does not use: a mistyped mode or a
// flag meant for the other door would otherwise go unnoticed.
void NoteUnusedFlags(const CLI::App& cmd, const RetrievalFlags& f) {
  std::vector<std::string> unused;
  const auto given = [&cmd](const char* flag) { return cmd.count(flag) > 0; };
  const bool remote = !f.router.empty();
  if (f.mode == "base") {
    for (const char* flag :
         {"--datastore", "--index", "--router", "--knn-config", "--knn-topk", "--knn-temperature",
          "--knn-weight", "--knn-nprobe", "--knn-threshold", "--subset-sentences",
          "--sentence-index", "--search-threads", "--interleave-batches"}) {
      if (given(flag)) unused.push_back(flag);
    }
  } else if (f.mode != "subset-knn") {
    for (const char* flag : {"--subset-sentences", "--sentence-index"}) {
      if (given(flag)) unused.push_back(flag);
    }
  }
  for (const char* flag : {"--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name",
                           "--step-deadline-ms", "--retries"}) {
    if (!remote && given(flag)) unused.push_back(flag);
  }
  if (remote && f.mode != "base" && given("--search-threads")) {
    unused.push_back("--search-threads");
  }
  if (!unused.empty()) {
    std::fprintf(stderr, "note: not used by --mode %s%s: %s\n", f.mode.c_str(),
                 remote ? " with --router" : " in-process", absl::StrJoin(unused, ", ").c_str());
  }
}

absl::Status ApplyKnnConfig(const CLI::App& cmd, RetrievalFlags& f) {
  if (f.knn_config.empty()) return absl::OkStatus();
  std::ifstream file(f.knn_config);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot read --knn-config ", f.knn_config));
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& e) {
    // e.g. a number beyond double's range (1e400), which nlohmann refuses to parse
    return absl::InvalidArgumentError(absl::StrCat(f.knn_config, ": not JSON: ", e.what()));
  }
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(f.knn_config, ": not a JSON object"));
  }
  // What the file sets (each unless its flag was given) and what `knnserve tune` records beside
  // it; any other field is refused (a misspelt one would silently leave a default).
  const auto integer = [&](const nlohmann::json& v, const std::string& key, int64_t min,
                           int64_t max, auto& out) -> absl::Status {
    if (!v.is_number_integer() || v.get<int64_t>() < min || v.get<int64_t>() > max) {
      return absl::InvalidArgumentError(absl::StrCat(f.knn_config, ": ", key, " = ", v.dump(),
                                                     " is not an integer in [", min, ", ", max,
                                                     "]"));
    }
    out = static_cast<std::remove_reference_t<decltype(out)>>(v.get<int64_t>());
    return absl::OkStatus();
  };
  // The ranges ValidateKnnOptions checks, checked here so that the error names the file.
  const auto number = [&](const nlohmann::json& v, const std::string& key, double min, double max,
                          double& out) -> absl::Status {
    if (!v.is_number() || !(v.get<double>() >= min && v.get<double>() <= max)) {
      return absl::InvalidArgumentError(absl::StrCat(f.knn_config, ": ", key, " = ", v.dump(),
                                                     " is not a number in [", min, ", ", max, "]"));
    }
    out = v.get<double>();
    return absl::OkStatus();
  };
  for (const auto& [key, value] : json.items()) {
    // knn_topk -> --knn-topk; only the knn_ fields have flags.
    const std::string flag = "--" + absl::StrReplaceAll(key, {{"_", "-"}});
    const bool flag_given = absl::StartsWith(key, "knn_") &&
                            cmd.get_option_no_throw(flag) != nullptr && cmd.count(flag) > 0;
    if (key == "knn_topk") {
      if (!flag_given) RETURN_IF_ERROR(integer(value, key, 1, RequestLimits().max_k, f.knn.k));
    } else if (key == "knn_nprobe") {
      if (!flag_given) {
        RETURN_IF_ERROR(integer(value, key, 0, RequestLimits().max_nprobe, f.knn.nprobe));
      }
    } else if (key == "knn_temperature") {
      if (!flag_given) {
        RETURN_IF_ERROR(
            number(value, key, knn::kMinTemperature, knn::kMaxTemperature, f.knn.temperature));
      }
    } else if (key == "knn_weight") {
      if (!flag_given) RETURN_IF_ERROR(number(value, key, 0, 1, f.knn.weight));
    } else if (key == "knn_threshold") {
      if (!flag_given) {
        RETURN_IF_ERROR(number(value, key, 0, std::numeric_limits<double>::max(), f.knn.threshold));
      }
    } else if (key != "dev" && key != "dev_bleu" && key != "dev_base_bleu" &&
               key != "dev_sentences" && key != "mode" && key != "beam") {
      return absl::InvalidArgumentError(absl::StrCat(
          f.knn_config, ": unknown field \"", key,
          "\" (it sets knn_topk, knn_temperature, knn_weight, knn_nprobe, knn_threshold)"));
    }
  }
  return absl::OkStatus();
}

// The retriever, the subset selector and the processor of one run (all null in base mode).
struct KnnSetup {
  std::unique_ptr<knn::Retriever> retriever;
  std::unique_ptr<knn::SubsetSelector> selector;
  std::unique_ptr<knn::KnnLogitsProcessor> processor;
  // The processor of the second batch in flight (decode::SearchOptions::second_processor); null
  // when batches are decoded one at a time.
  std::unique_ptr<knn::KnnLogitsProcessor> second;
  bool interleave = false;  // whether `second` is wanted
};

// Fresh processors with `options` over the setup's retriever (statistics start at zero).
absl::Status ResetProcessor(const knn::KnnOptions& options, KnnSetup& setup) {
  auto create = [&] {
    return knn::KnnLogitsProcessor::Create(setup.retriever.get(), options, setup.selector.get());
  };
  ASSIGN_OR_RETURN(setup.processor, create());
  setup.second.reset();
  if (setup.interleave) {
    ASSIGN_OR_RETURN(setup.second, create());
  }
  return absl::OkStatus();
}

knn::ThreadPlan PlanThreads(const RetrievalFlags& flags, int threads, int64_t step_rows) {
  return knn::PlanThreads({.mode = flags.mode,
                           .remote = !flags.router.empty(),
                           .interleave = flags.interleave_batches,
                           .search_threads = flags.search_threads,
                           .threads = threads,
                           .step_rows = step_rows});
}

// --datastore names where provenance (values.h5) and the sentence index come from: the index
// searched (--index, or the router's shards) must hold that datastore's tokens, or printed
// sentences and subsets would name other tokens than those searched.
absl::Status CheckRetrieverServesDatastore(const knn::RetrieverInfo& info,
                                           const std::string& datastore) {
  const std::string values_path = absl::StrCat(datastore, "/", kValuesFileName);
  ASSIGN_OR_RETURN(const std::unique_ptr<ValuesReader> values, ValuesReader::Open(values_path));
  const int64_t tokens = values->num_tokens(ValuesSide::kTarget);
  if (info.total_vectors != tokens ||
      (info.num_sentences != 0 && info.num_sentences != values->num_sentences())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the index searched holds ", info.total_vectors, " vectors of ", info.num_sentences,
        " sentences, but ", values_path, " holds ", tokens, " tokens of ", values->num_sentences(),
        " sentences: --datastore must be the datastore of that index"));
  }
  return absl::OkStatus();
}

// Opens what flags.mode needs: nothing for base; the retriever (embedded or remote), the subset
// selector for subset-knn (searching on the search's threads, or `threads` when nothing runs
// beside the model), and processors with flags.knn, as `plan` says. `full_searches`: the caller
// also runs full searches in subset-knn mode (--print-neighbors); without them an embedded
// subset-knn retriever loads the subset codes alone.
absl::StatusOr<KnnSetup> MakeKnn(RetrievalFlags flags, const std::string& model_path, int threads,
                                 const knn::ThreadPlan& plan, bool full_searches = false) {
  KnnSetup setup;
  if (flags.mode == "base") return setup;
  if (!flags.datastore.empty()) {
    RETURN_IF_ERROR(datastore::CheckDatastoreForDecoding(flags.datastore, model_path));
  }
  if (flags.index_dir.empty() && flags.router.empty() && !flags.datastore.empty()) {
    flags.index_dir = absl::StrCat(flags.datastore, "/index");
  }
  if (flags.index_dir.empty() == flags.router.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--mode ", flags.mode,
        " needs exactly one of --index DIR or --datastore DIR (embedded) or --router ADDR"));
  }
  if (!flags.index_dir.empty()) {
    // Subset kNN-MT searches only its subsets: the faiss index stays on disk.
    const bool full_search = flags.mode != "subset-knn" || full_searches;
    ASSIGN_OR_RETURN(setup.retriever, knn::LocalRetriever::Create(
                                          flags.index_dir, plan.search_threads, full_search));
    flags.knn.overlap_search = plan.overlap;
    flags.knn.background_search = plan.background_search;
  } else {
    flags.remote.address = flags.router;
    flags.remote.step_deadline = absl::Milliseconds(flags.step_deadline_ms);
    ASSIGN_OR_RETURN(setup.retriever, knn::RemoteRetriever::Create(flags.remote));
  }
  if (!flags.datastore.empty()) {
    RETURN_IF_ERROR(CheckRetrieverServesDatastore(setup.retriever->info(), flags.datastore));
  }
  if (flags.mode == "subset-knn") {
    std::string path = flags.sentence_index;
    if (path.empty() && !flags.datastore.empty()) {
      path = absl::StrCat(flags.datastore, "/sentence_index");
    }
    if (path.empty()) {
      return absl::InvalidArgumentError(
          "subset-knn needs the sentence index: --datastore DIR or --sentence-index DIR");
    }
    // The selection runs on the processors' workers, beside the model when searches do.
    const int select_threads = plan.overlap ? plan.search_threads : threads;
    ASSIGN_OR_RETURN(
        std::unique_ptr<knn::SentenceIndexSelector> selector,
        knn::SentenceIndexSelector::Load(path, flags.subset_sentences, select_threads));
    if (selector->num_sentences() != setup.retriever->info().num_sentences) {
      return absl::InvalidArgumentError(
          absl::StrCat("sentence index ", path, " holds ", selector->num_sentences(),
                       " embeddings, the datastore's index ", setup.retriever->info().num_sentences,
                       " sentences: it is not that datastore's sentence index"));
    }
    setup.selector = std::move(selector);
  }
  setup.interleave = plan.interleave;
  RETURN_IF_ERROR(ResetProcessor(flags.knn, setup));
  return setup;
}

struct LoadedTranslator {
  model::LoadedModel loaded;
  std::unique_ptr<Tokenizer> tokenizer;
};

absl::StatusOr<LoadedTranslator> LoadTranslator(const std::string& path) {
  LoadedTranslator t;
  ASSIGN_OR_RETURN(t.loaded, model::LoadCheckpoint(path));
  ASSIGN_OR_RETURN(t.tokenizer, Tokenizer::FromSerialized(t.loaded.tokenizer));
  return t;
}

struct RunReport {
  decode::TranslateStats stats;
  double seconds = 0;
  knn::KnnStats knn;
};

std::string FormatReport(const std::string& mode, const RunReport& r) {
  std::string line = absl::StrFormat(
      "%s: %d sentences in %.2f s: %.2f sentences/s, %.1f tokens/s", mode, r.stats.sentences,
      r.seconds, r.stats.sentences / r.seconds, r.stats.generated_tokens / r.seconds);
  if (r.knn.steps > 0) {
    const double retrieval = absl::ToDoubleSeconds(r.knn.retrieval_time);
    const double search = absl::ToDoubleSeconds(r.knn.search_time);
    const double select = absl::ToDoubleSeconds(r.knn.select_time);
    const double interpolate = absl::ToDoubleSeconds(r.knn.interpolate_time);
    absl::StrAppendFormat(&line,
                          "; retrieval waits %.2f s (%.0f%%; searches %.2f s, partly while the "
                          "model ran; %d steps, %.1f rows/step), interpolation %.2f s (%.0f%%)",
                          retrieval, 100 * retrieval / r.seconds, search, r.knn.steps,
                          static_cast<double>(r.knn.query_rows) / r.knn.steps, interpolate,
                          100 * interpolate / r.seconds);
    if (r.knn.subset_sentences > 0) {
      absl::StrAppendFormat(&line, ", subset selection %.2f s (%.0f%%, %.0f sentences/source)",
                            select, 100 * select / r.seconds,
                            static_cast<double>(r.knn.subset_sentences) / r.stats.sentences);
    }
  }
  return line;
}

absl::StatusOr<std::vector<std::string>> Translate(LoadedTranslator& t,
                                                   const std::vector<std::string>& sources,
                                                   decode::SearchOptions search, int64_t batch_size,
                                                   KnnSetup& knn, RunReport* report,
                                                   ProgressBar* progress) {
  search.processor = knn.processor.get();
  search.second_processor = knn.second.get();
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(std::vector<std::string> hyps,
                   decode::TranslateTexts(t.loaded.model, *t.tokenizer, sources, search, batch_size,
                                          &report->stats, progress));
  report->seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (knn.processor != nullptr) report->knn = knn.processor->stats();
  if (knn.second != nullptr) report->knn.Add(knn.second->stats());
  return hyps;
}

struct TranslateFlags {
  std::string model;
  std::string input = "-";
  std::string output = "-";
  decode::SearchOptions search;
  int64_t batch_size = 32;
  int threads = 2;
  RetrievalFlags retrieval;
  bool print_neighbors = false;
  int print_neighbors_k = 4;
  std::string stats_json;
};

void RunTranslate(CLI::App* cmd, TranslateFlags& flags) {
  AdviseWaitPolicy();
  KeepFreedMemory();
  const knn::ThreadPlan plan =
      PlanThreads(flags.retrieval, flags.threads, flags.batch_size * flags.search.beam_size);
  // LibTorch sets OpenMP to 1 thread on these machines: set it explicitly (the embedded search
  // sets its own count per call).
  at::set_num_threads(plan.model_threads);
  ExitOnError(ApplyKnnConfig(*cmd, flags.retrieval));
  NoteUnusedFlags(*cmd, flags.retrieval);
  if (flags.print_neighbors && flags.retrieval.mode == "base") {
    ExitOnError(absl::InvalidArgumentError("--print-neighbors needs --mode knn or subset-knn"));
  }
  // The output files are created before anything loads: a path that cannot be written fails
  // now, not after the translation. Each is published whole at the end (or written in place
  // when it is a device).
  ExitOnError(CheckDistinctFiles(
      {{"--input", flags.input}, {"--output", flags.output}, {"--stats-json", flags.stats_json}}));
  std::unique_ptr<AtomicFileWriter> output_file;
  if (flags.output != "-") output_file = ValueOrExit(AtomicFileWriter::Create(flags.output));
  std::unique_ptr<AtomicFileWriter> stats_file;
  if (!flags.stats_json.empty()) {
    stats_file = ValueOrExit(AtomicFileWriter::Create(flags.stats_json));
  }
  absl::StatusOr<LoadedTranslator> translator = LoadTranslator(flags.model);
  ExitOnError(translator.status());
  absl::StatusOr<KnnSetup> knn =
      MakeKnn(flags.retrieval, flags.model, flags.threads, plan, flags.print_neighbors);
  ExitOnError(knn.status());
  const std::string input = flags.input == "-" ? "/dev/stdin" : flags.input;
  absl::StatusOr<std::vector<std::string>> sources = data::ReadSources(input, nullptr);
  ExitOnError(sources.status());
  ProgressBar progress(absl::StrCat("translate (", flags.retrieval.mode, ")"),
                       static_cast<int64_t>(sources->size()));
  RunReport report;
  absl::StatusOr<std::vector<std::string>> hyps =
      Translate(*translator, *sources, flags.search, flags.batch_size, *knn, &report, &progress);
  ExitOnError(hyps.status());
  progress.Finish();
  if (report.stats.cut_sources > 0) {
    std::fprintf(
        stderr,
        "note: %lld input lines were longer than the model reads (%lld tokens): only "
        "their beginning was translated\n",
        static_cast<long long>(report.stats.cut_sources),
        static_cast<long long>(translator->loaded.model->config().max_source_positions - 1));
  }
  std::string text;
  for (const std::string& line : *hyps) absl::StrAppend(&text, line, "\n");
  if (output_file != nullptr) {
    ExitOnError(output_file->Append(text));
    ExitOnError(output_file->Commit().status());
  } else {
    std::cout << text << std::flush;
    if (!std::cout) {
      ExitOnError(absl::DataLossError("cannot write the translations to standard output"));
    }
  }
  std::string threads = absl::StrCat(flags.threads, " threads: model ", plan.model_threads);
  if (knn->retriever != nullptr && flags.retrieval.router.empty()) {
    absl::StrAppend(&threads, ", search ", plan.search_threads,
                    plan.background_search ? " in the background" : "");
  }
  if (plan.interleave) absl::StrAppend(&threads, ", two batches interleaved");
  std::fprintf(stderr, "%s (beam %d, batch %lld, %s)\n",
               FormatReport(flags.retrieval.mode, report).c_str(), flags.search.beam_size,
               static_cast<long long>(flags.batch_size), threads.c_str());
  if (!flags.stats_json.empty()) {
    nlohmann::json json = {
        {"mode", flags.retrieval.mode},
        {"sentences", report.stats.sentences},
        {"tokens", report.stats.generated_tokens},
        {"seconds", report.seconds},
        {"retrieval_seconds", absl::ToDoubleSeconds(report.knn.retrieval_time)},
        {"search_seconds", absl::ToDoubleSeconds(report.knn.search_time)},
        {"select_seconds", absl::ToDoubleSeconds(report.knn.select_time)},
        {"interpolate_seconds", absl::ToDoubleSeconds(report.knn.interpolate_time)},
        {"knn_topk", flags.retrieval.knn.k},
        {"knn_temperature", flags.retrieval.knn.temperature},
        {"knn_weight", flags.retrieval.knn.weight}};
    ExitOnError(stats_file->Append(json.dump(2) + "\n"));
    ExitOnError(stats_file->Commit().status());
  }
  if (flags.print_neighbors) {
    absl::StatusOr<std::unique_ptr<knn::ProvenancePrinter>> printer =
        knn::ProvenancePrinter::Create(
            flags.retrieval.datastore.empty() ? "" : flags.retrieval.datastore + "/values.h5");
    ExitOnError(printer.status());
    for (size_t i = 0; i < sources->size(); ++i) {
      absl::StatusOr<std::string> text =
          (*printer)->Explain(translator->loaded.model, *translator->tokenizer, (*sources)[i],
                              (*hyps)[i], *knn->processor, flags.print_neighbors_k);
      ExitOnError(text.status());
      std::fprintf(stderr, "# sentence %zu\n%s", i, text->c_str());
    }
  }
}

void RegisterTranslate(CLI::App& app) {
  auto flags = std::make_shared<TranslateFlags>();
  CLI::App* cmd =
      app.add_subcommand("translate", "translate text: base NMT, kNN-MT or subset kNN-MT");
  cmd->add_option("--model", flags->model, "checkpoint (.pt)")->required();
  cmd->add_option("--input", flags->input, "plain text or TSV (first column); - is stdin")
      ->capture_default_str();
  cmd->add_option("--output", flags->output, "detokenized output; - is stdout")
      ->capture_default_str();
  cmd->add_option("--beam", flags->search.beam_size, "beam size (1: greedy)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--lenpen", flags->search.length_penalty)
      ->check(FiniteRange(-100.0, 100.0))
      ->capture_default_str();
  cmd->add_option("--max-len-a", flags->search.max_len_a)
      ->check(FiniteRange(0.0, 1e6))
      ->capture_default_str();
  cmd->add_option("--max-len-b", flags->search.max_len_b)
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  cmd->add_option("--batch-size", flags->batch_size, "sentences per batch")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--threads", flags->threads)->check(CLI::Range(1, 1024))->capture_default_str();
  AddRetrievalFlags(cmd, &flags->retrieval);
  cmd->add_flag(
      "--print-neighbors", flags->print_neighbors,
      "print, per output token, its nearest datastore tokens (stderr): stored sentence, its "
      "1-based line in the datastore corpus, position; from a full search, also in "
      "subset-knn mode");
  cmd->add_option("--print-neighbors-k", flags->print_neighbors_k, "neighbours printed per token")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--stats-json", flags->stats_json, "write the speed report as JSON");
  cmd->callback([cmd, flags] { RunTranslate(cmd, *flags); });
}

// ---------------------------------------------------------------------------------------------
// tune

struct TuneFlags {
  std::string model;
  std::string dev;
  std::string out;
  RetrievalFlags retrieval;
  std::vector<int> topk = {8, 16, 32};
  std::vector<double> temperature = {10, 100, 1000};
  std::vector<double> weight = {0.2, 0.4, 0.6, 0.8};
  int64_t sentences = 300;
  int beam = 1;
  int64_t batch_size = 32;
  int threads = 2;
};

struct TunePoint {
  knn::KnnOptions knn;
  double bleu = 0;
};

// What tune's flags may not say, checked before anything loads: it chooses k, τ and λ itself,
// over the grids, in a kNN mode.
absl::Status CheckTuneFlags(const CLI::App& cmd, const TuneFlags& flags) {
  if (flags.retrieval.mode == "base") {
    return absl::InvalidArgumentError("tune needs --mode knn or subset-knn");
  }
  for (const char* chosen : {"--knn-topk", "--knn-temperature", "--knn-weight", "--knn-config"}) {
    if (cmd.count(chosen) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(chosen,
                       " does not apply to tune: it tries --grid-topk x --grid-temperature x "
                       "--grid-weight"));
    }
  }
  for (const char* grid : {"--grid-topk", "--grid-temperature", "--grid-weight"}) {
    for (const std::string& value : cmd.get_option(grid)->results()) {
      if (absl::StripAsciiWhitespace(value).empty()) {
        return absl::InvalidArgumentError(absl::StrCat(grid, " has an empty value"));
      }
    }
  }
  for (const int k : flags.topk) {
    if (k > RequestLimits().max_k) {
      return absl::InvalidArgumentError(
          absl::StrCat("--grid-topk ", k, " exceeds ", RequestLimits().max_k));
    }
    for (const double t : flags.temperature) {
      for (const double w : flags.weight) {
        knn::KnnOptions options = flags.retrieval.knn;
        options.k = k;
        options.temperature = t;
        options.weight = w;
        if (absl::Status s = knn::ValidateKnnOptions(options); !s.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("grid k=", k, " temperature=", t, " weight=", w, ": ", s.message()));
        }
      }
    }
  }
  return absl::OkStatus();
}

void RunTune(const CLI::App& cmd, TuneFlags& flags) {
  KeepFreedMemory();
  ExitOnError(CheckTuneFlags(cmd, flags));
  ExitOnError(CheckDistinctFiles({{"--dev", flags.dev}, {"--out", flags.out}}));
  // Created before anything loads: a path that cannot be written fails now, not after the grid.
  std::unique_ptr<AtomicFileWriter> out_file = ValueOrExit(AtomicFileWriter::Create(flags.out));
  const knn::ThreadPlan plan =
      PlanThreads(flags.retrieval, flags.threads, flags.batch_size * flags.beam);
  at::set_num_threads(plan.model_threads);
  absl::StatusOr<LoadedTranslator> translator = LoadTranslator(flags.model);
  ExitOnError(translator.status());
  // Exactly source<TAB>reference on every line (a line without a reference would score 0).
  absl::StatusOr<std::vector<data::SentencePair>> pairs = data::ReadTsv(flags.dev);
  ExitOnError(pairs.status());
  if (pairs->empty()) {
    ExitOnError(absl::InvalidArgumentError(absl::StrCat(flags.dev, ": no dev sentences")));
  }
  std::vector<std::string> refs;
  std::vector<std::string> sources;
  for (data::SentencePair& pair : *pairs) {
    sources.push_back(std::move(pair.source));
    refs.push_back(std::move(pair.target));
  }
  if (flags.sentences > 0 && static_cast<size_t>(flags.sentences) < sources.size()) {
    sources.resize(flags.sentences);  // the first N: a fixed, reproducible slice
    refs.resize(flags.sentences);
  }
  decode::SearchOptions search;
  search.beam_size = flags.beam;
  absl::StatusOr<KnnSetup> knn = MakeKnn(flags.retrieval, flags.model, flags.threads, plan);
  ExitOnError(knn.status());
  KnnSetup base;
  auto score = [&](KnnSetup& setup) -> double {
    RunReport report;
    absl::StatusOr<std::vector<std::string>> hyps =
        Translate(*translator, sources, search, flags.batch_size, setup, &report, nullptr);
    ExitOnError(hyps.status());
    absl::StatusOr<eval::BleuScore> bleu = eval::CorpusBleu(*hyps, {refs});
    ExitOnError(bleu.status());
    return bleu->score;
  };
  const double base_bleu = score(base);
  std::fprintf(stderr, "tune: base BLEU %.2f on %zu dev sentences\n", base_bleu, sources.size());
  const int64_t total =
      static_cast<int64_t>(flags.topk.size() * flags.temperature.size() * flags.weight.size());
  ProgressBar progress("tune", total, {.unit = "configs"});
  TunePoint best;
  best.bleu = -1;
  for (int k : flags.topk) {
    for (double t : flags.temperature) {
      for (double w : flags.weight) {
        knn::KnnOptions options = knn->processor->options();  // as MakeKnn set it up
        options.k = k;
        options.temperature = t;
        options.weight = w;
        ExitOnError(ResetProcessor(options, *knn));
        const double bleu = score(*knn);
        std::fprintf(stderr, "tune: k=%d temperature=%g weight=%g BLEU %.2f\n", k, t, w, bleu);
        if (bleu > best.bleu) best = {options, bleu};
        progress.Add(1);
      }
    }
  }
  progress.Finish();
  nlohmann::json json = {{"knn_topk", best.knn.k},
                         {"knn_temperature", best.knn.temperature},
                         {"knn_weight", best.knn.weight},
                         {"knn_nprobe", best.knn.nprobe},
                         {"knn_threshold", best.knn.threshold},
                         {"dev_bleu", best.bleu},
                         {"dev_base_bleu", base_bleu},
                         {"dev", flags.dev},
                         {"dev_sentences", sources.size()},
                         {"mode", flags.retrieval.mode},
                         {"beam", flags.beam}};
  const std::string best_json = json.dump(2) + "\n";
  ExitOnError(out_file->Append(best_json.data(), best_json.size()));
  ExitOnError(out_file->Commit().status());
  std::fprintf(stderr, "tune: best k=%d temperature=%g weight=%g BLEU %.2f (base %.2f) -> %s\n",
               best.knn.k, best.knn.temperature, best.knn.weight, best.bleu, base_bleu,
               flags.out.c_str());
}

void RegisterTune(CLI::App& app) {
  auto flags = std::make_shared<TuneFlags>();
  CLI::App* cmd = app.add_subcommand(
      "tune", "grid-search kNN-MT's k, temperature and weight by BLEU on a dev TSV");
  cmd->add_option("--model", flags->model, "checkpoint (.pt)")->required();
  cmd->add_option("--dev", flags->dev, "dev TSV (source<TAB>reference)")->required();
  cmd->add_option("--out", flags->out, "where the best values go (JSON, for --knn-config)")
      ->required();
  AddRetrievalFlags(cmd, &flags->retrieval);
  cmd->add_option("--grid-topk", flags->topk, "k values tried")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--grid-temperature", flags->temperature, "τ values tried")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--grid-weight", flags->weight, "λ values tried")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--sentences", flags->sentences, "first N dev sentences (<= 0: all)")
      ->capture_default_str();
  cmd->add_option("--beam", flags->beam, "beam size while tuning (1: greedy)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--batch-size", flags->batch_size)
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--threads", flags->threads)->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->get_option("--mode")->default_val("knn");
  cmd->callback([cmd, flags] { RunTune(*cmd, *flags); });
}

}  // namespace

void RegisterKnnCommands(CLI::App& app) {
  RegisterTranslate(app);
  RegisterTune(app);
}

}  // namespace knnserve::cli
