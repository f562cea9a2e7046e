#include "client/knn/remote_retriever.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/wire.h"
#include "grpcpp/grpcpp.h"

namespace knnserve::knn {
namespace {

// Cancels a stream whose current step outlives its deadline (a gRPC deadline covers the whole
// call; a decoding session needs one per step). Thread-safe; one step armed at a time.
class StepWatchdog {
 public:
  StepWatchdog() : thread_([this] { Run(); }) {}
  ~StepWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void Arm(grpc::ClientContext* context, absl::Duration timeout) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      context_ = context;
      deadline_ = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
      fired_ = false;
    }
    cv_.notify_all();
  }

  // Stops watching; true when the deadline passed and the call was cancelled.
  bool Disarm() {
    std::lock_guard<std::mutex> lock(mu_);
    context_ = nullptr;
    return fired_;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (context_ == nullptr) {
        cv_.wait(lock);
      } else if (std::chrono::steady_clock::now() >= deadline_) {
        context_->TryCancel();
        context_ = nullptr;
        fired_ = true;
      } else {
        cv_.wait_until(lock, deadline_);
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  grpc::ClientContext* context_ = nullptr;  // guarded by mu_
  std::chrono::steady_clock::time_point deadline_;
  bool fired_ = false;
  bool stop_ = false;
  std::thread thread_;  // last: started after the fields it reads
};

bool IsTransient(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded ||
         code == absl::StatusCode::kAborted || code == absl::StatusCode::kCancelled;
}

std::atomic<int64_t> next_session_id{0};

// One decoding session: one SearchStream, reopened on transient failures.
class RemoteSession : public RetrievalSession {
 public:
  RemoteSession(v1::Retrieval::Stub* stub, const RemoteRetrieverOptions* options,
                std::optional<v1::StreamRequest> setup)
      : stub_(stub), options_(options), setup_(std::move(setup)), id_(next_session_id++) {}

  ~RemoteSession() override {
    if (stream_ != nullptr) CloseStream().IgnoreError();
  }

  absl::StatusOr<Neighbors> Search(MatrixView<const float> queries,
                                   const std::vector<int32_t>& row_group,
                                   const SearchParams& params) override {
    v1::StreamRequest message;
    v1::SearchRequest* step = message.mutable_step();
    EncodeSearchRequest(queries, options_->fp16_queries ? v1::DTYPE_FP16 : v1::DTYPE_FP32, params,
                        step);
    step->mutable_row_group()->Assign(row_group.begin(), row_group.end());
    step->set_allow_partial(options_->allow_partial);
    step->set_request_id(absl::StrCat("knn-", id_, "-", steps_++));
    absl::Duration backoff = options_->retry_backoff;
    for (int attempt = 0;; ++attempt) {
      absl::StatusOr<Neighbors> result = AttemptReopeningAnEndedStream(message);
      if (result.ok() || !IsTransient(result.status().code()) || attempt >= options_->max_retries) {
        if (!result.ok() && attempt > 0) {
          return absl::Status(
              result.status().code(),
              absl::StrCat(result.status().message(), " (after ", attempt, " retries)"));
        }
        return result;
      }
      ++retries_;
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, options_->max_retry_backoff);
    }
  }

 private:
  // A stream that answered earlier steps may have been ended by the server since (idle for
  // --stream-idle-seconds, or a router that restarted between two steps): a step that finds it
  // ended is sent at once on a new stream, with the setup, without spending a retry or its
  // backoff. A step on a stream just opened is not: its failure says the server is unwell.
  absl::StatusOr<Neighbors> AttemptReopeningAnEndedStream(const v1::StreamRequest& message) {
    const bool reused = stream_ != nullptr;
    absl::StatusOr<Neighbors> result = Attempt(message);
    if (reused && stream_ == nullptr && result.status().code() == absl::StatusCode::kUnavailable) {
      return Attempt(message);
    }
    return result;
  }

  // The step deadline covers opening the stream and its setup too: a write blocks while the
  // router takes no more data (a stalled router, a setup of ~32k sentence ids).
  absl::StatusOr<Neighbors> Attempt(const v1::StreamRequest& message) {
    const bool opening = stream_ == nullptr;
    if (opening) context_ = std::make_unique<grpc::ClientContext>();
    // Armed before the call starts (its start waits for the connection): a cancellation issued
    // before it is honoured once it starts.
    watchdog_.Arm(context_.get(), options_->step_deadline);
    if (opening) stream_ = stub_->SearchStream(context_.get());
    v1::SearchResponse response;
    const bool set_up = !opening || !setup_.has_value() || stream_->Write(*setup_);
    const bool ok = set_up && stream_->Write(message) && stream_->Read(&response);
    const bool timed_out = watchdog_.Disarm();
    // An answer read just as the watchdog cancelled the stream is still the answer; the
    // cancelled stream goes, so that the next step opens another instead of failing on it.
    if (ok && timed_out) CloseStream().IgnoreError();
    if (!ok) {
      absl::Status status = CloseStream();
      if (timed_out) {
        return absl::DeadlineExceededError(absl::StrCat(
            "retrieval step ", message.step().request_id(), " took longer than ",
            absl::FormatDuration(options_->step_deadline), " (", options_->address, ")"));
      }
      if (!status.ok()) return status;
      return absl::UnavailableError(
          set_up ? absl::StrCat("the retrieval stream to ", options_->address, " ended")
                 : absl::StrCat("could not send the session setup to ", options_->address));
    }
    if (response.error_code() != 0) {
      return absl::Status(static_cast<absl::StatusCode>(response.error_code()),
                          absl::StrCat("retrieval step ", message.step().request_id(), ": ",
                                       response.error_message()));
    }
    return DecodeNeighbors(response);
  }

  // Bounded by the step deadline too: Finish waits for the router to end the call, which a
  // stalled router never does (the session's destructor, and so the decoder, would wait).
  absl::Status CloseStream() {
    watchdog_.Arm(context_.get(), options_->step_deadline);
    stream_->WritesDone();
    absl::Status status = FromGrpcStatus(stream_->Finish());
    watchdog_.Disarm();
    stream_.reset();
    context_.reset();
    if (status.ok()) return status;
    return absl::Status(status.code(), absl::StrCat("retrieval stream to ", options_->address, ": ",
                                                    status.message()));
  }

  v1::Retrieval::Stub* const stub_;
  const RemoteRetrieverOptions* const options_;
  const std::optional<v1::StreamRequest> setup_;
  const int64_t id_;
  int64_t steps_ = 0;
  int64_t retries_ = 0;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StreamRequest, v1::SearchResponse>> stream_;
  StepWatchdog watchdog_;
};

}  // namespace

RemoteRetriever::RemoteRetriever(RemoteRetrieverOptions options,
                                 std::unique_ptr<v1::Retrieval::Stub> stub, RetrieverInfo info)
    : options_(std::move(options)), stub_(std::move(stub)), info_(info) {}

absl::StatusOr<std::unique_ptr<RemoteRetriever>> RemoteRetriever::Create(
    const RemoteRetrieverOptions& options) {
  if (options.address.empty()) return absl::InvalidArgumentError("no router address given");
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   MakeChannelCredentials(options.tls));
  // Responses are at most max_rows x max_k neighbours; queries at most max_rows x dim floats.
  const int64_t max_message_bytes = RequestLimits().MaxMessageBytes(4096);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.address, credentials,
                                MakeChannelArguments(max_message_bytes, options.tls_server_name));
  std::unique_ptr<v1::Retrieval::Stub> stub = v1::Retrieval::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options.connect_timeout));
  context.set_wait_for_ready(true);
  v1::InfoResponse response;
  grpc::Status status = stub->Info(&context, v1::InfoRequest(), &response);
  if (!status.ok()) {
    return absl::Status(
        FromGrpcStatus(status).code(),
        absl::StrCat("router ", options.address, " did not answer Info: ", status.error_message(),
                     status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                         ? " (no connection: is a router listening there, and does the host "
                           "name resolve?)"
                         : ""));
  }
  ASSIGN_OR_RETURN(Metric metric, MetricFromProto(response.metric()));
  RetrieverInfo info;
  info.dim = response.dim();
  info.metric = metric;
  info.total_vectors = response.total_vectors();
  info.num_sentences = response.num_sentences();
  info.supports_subset = response.supports_subset();
  info.subset_only = response.subset_only();
  // A server that does not report its limits enforces the defaults.
  if (response.limits().max_rows() > 0) info.max_rows = response.limits().max_rows();
  return absl::WrapUnique(new RemoteRetriever(options, std::move(stub), info));
}

absl::StatusOr<std::unique_ptr<RetrievalSession>> RemoteRetriever::StartSession(
    SubsetGroups groups) {
  std::optional<v1::StreamRequest> setup;
  if (!groups.empty()) {
    if (!info_.supports_subset) {
      return absl::FailedPreconditionError(
          absl::StrCat("subset kNN-MT requested, but the index behind ", options_.address,
                       " has no subset codes"));
    }
    setup.emplace();
    v1::SessionSetup* s = setup->mutable_setup();
    for (const std::vector<int64_t>& ids : groups) {
      s->add_subset_groups()->mutable_sentence_ids()->Assign(ids.begin(), ids.end());
    }
    s->set_allow_partial(options_.allow_partial);
  }
  return std::make_unique<RemoteSession>(stub_.get(), &options_, std::move(setup));
}

}  // namespace knnserve::knn
