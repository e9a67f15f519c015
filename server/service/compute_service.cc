#include "server/service/compute_service.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/alarm.h"

#include "server/common/status_macros.h"
#include "server/core/tenant_table.h"
#include "server/service/call.h"
#include "server/service/compute_convert.h"

namespace tessera {
namespace {

// A tenant's weight in the transfer executor: its compute share.
double Weight(const TenantRuntime& runtime) {
  return static_cast<double>(std::max<uint32_t>(1, runtime.quota().compute_share_percent));
}

constexpr int64_t kDefaultChunkBytes = 1 << 20;
constexpr int64_t kMinChunkBytes = 4 << 10;
constexpr absl::string_view kTensorPages = "tensors";

// A unary call finished by whichever comes first: the work's completion, a timer, or the
// client going away. Reference counted: gRPC holds one reference until OnDone, and every
// pending callback holds one, so the reactor outlives all of them.
class WaitReactor final : public grpc::ServerUnaryReactor {
 public:
  WaitReactor(grpc::CallbackServerContext* context, const char* rpc) : log_(context, rpc) {}

  CallLog& log() { return log_; }
  void Hold() { refs_.fetch_add(1); }
  void Release() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }
  /// True for exactly one caller, who then fills the response and calls Complete.
  bool Claim() { return !claimed_.exchange(true); }
  void Complete(const absl::Status& status) { Finish(log_.Finish(status)); }
  void CompleteIfUnclaimed(const absl::Status& status) {
    if (Claim()) Complete(status);
  }

  /// Calls `fire` at `deadline` unless the call is finished first.
  void SetTimer(absl::Time deadline, std::function<void()> fire) {
    Hold();
    alarm_ = std::make_unique<grpc::Alarm>();
    alarm_->Set(absl::ToChronoTime(deadline), [this, fire = std::move(fire)](bool fired) {
      if (fired) fire();
      Release();
    });
  }

  /// Runs `action` when the client goes away (at once if it already has).
  void SetCancelAction(absl::AnyInvocable<void() &&> action) {
    {
      absl::MutexLock lock(&mu_);
      if (!cancelled_) {
        cancel_action_ = std::move(action);
        return;
      }
    }
    std::move(action)();
  }

  void OnCancel() override {
    absl::AnyInvocable<void() &&> action;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      action = std::move(cancel_action_);
    }
    if (action != nullptr) std::move(action)();
    CompleteIfUnclaimed(
        absl::CancelledError("the client cancelled the call or its deadline passed"));
  }
  void OnDone() override {
    if (alarm_ != nullptr) alarm_->Cancel();
    Release();
  }
  // Both reactions are short and never wait (OnCancel takes a queued job off its queue and
  // answers; OnDone drops a reference), so gRPC may run them, and the end of the call, on the
  // thread that completes the call. Otherwise gRPC 1.51 hands every call's end to its executor
  // thread: a wake-up and a context switch per call, about a quarter of the server's CPU time
  // for tiny launches at 16 in flight (perf). Inline, OnCancel takes the runtime's and the
  // scheduler's locks, so nothing may finish or cancel a call while holding them (the lock
  // order of tenant_runtime.h: callbacks run after the locks are released). gRPC marks the
  // hook "not API": a gRPC without it fails to compile here (override), never silently.
  bool InternalInlineable() override { return true; }

 private:
  ~WaitReactor() override = default;
  std::atomic<int> refs_{1};
  std::atomic<bool> claimed_{false};
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::AnyInvocable<void() &&> cancel_action_ ABSL_GUARDED_BY(mu_);
  CallLog log_;
  std::unique_ptr<grpc::Alarm> alarm_;
};

// Authenticates a waiting call; on failure finishes it and returns nullptr.
std::shared_ptr<TenantRuntime> Authenticate(const Authenticator& auth, WaitReactor* reactor,
                                            grpc::CallbackServerContext* context) {
  absl::StatusOr<std::shared_ptr<TenantRuntime>> runtime = auth.AuthenticateTenant(*context);
  if (!runtime.ok()) {
    reactor->CompleteIfUnclaimed(runtime.status());
    return nullptr;
  }
  reactor->log().set_tenant((*runtime)->tenant_id());
  return *std::move(runtime);
}

// Answers `reactor` with `job` unless something else answered first. For a waiting
// Launch/Submit (`expiry_fails_call`) a job that expired in its queue answers
// DEADLINE_EXCEEDED: its deadline is the call's own, and the scheduler may notice it a moment
// before gRPC does. WaitJob returns the expired job as it is.
void AnswerNow(WaitReactor* reactor, v1::Job* response, const JobInfo& job,
               bool expiry_fails_call = false) {
  if (reactor->Claim()) {
    if (expiry_fails_call && job.state == JobState::kCancelled &&
        absl::IsDeadlineExceeded(job.error)) {
      reactor->Complete(job.error);
      return;
    }
    JobToProto(job, response);
    reactor->Complete(absl::OkStatus());
  }
}

// A job callback that answers `reactor` with the finished job, unless something else
// answered first; it holds a reference on the reactor until it runs.
TenantRuntime::JobCallback AnswerWithJob(WaitReactor* reactor, v1::Job* response,
                                         bool expiry_fails_call = false) {
  reactor->Hold();
  return [reactor, response, expiry_fails_call](const JobInfo& done) {
    AnswerNow(reactor, response, done, expiry_fails_call);
    reactor->Release();
  };
}

// Lets a closing tenant cancel a transfer's call: the runtime keeps a hook that calls
// TryCancel while the reactor lives, and nothing once it is done.
class TransferCanceller {
 public:
  TransferCanceller(grpc::CallbackServerContext* context, std::shared_ptr<TenantRuntime> runtime)
      : state_(std::make_shared<State>()), runtime_(std::move(runtime)) {
    state_->context = context;
    hook_ = runtime_->AddTransferHook([state = state_]() {
      absl::MutexLock lock(&state->mu);
      if (state->context != nullptr) state->context->TryCancel();
    });
  }
  ~TransferCanceller() {
    {
      absl::MutexLock lock(&state_->mu);
      state_->context = nullptr;
    }
    runtime_->RemoveTransferHook(hook_);
  }

 private:
  struct State {
    absl::Mutex mu;
    grpc::CallbackServerContext* context ABSL_GUARDED_BY(mu) = nullptr;
  };
  std::shared_ptr<State> state_;
  std::shared_ptr<TenantRuntime> runtime_;
  uint64_t hook_ = 0;
};

// Uploads: a header, then chunks; answered once the client half-closes. Reactions only
// hand work to the transfer executor: chunks are copied (into a staging copy that commits
// only when every byte arrived and the client is still there) off gRPC's threads. Two
// message buffers: gRPC reads the next chunk into one while the executor copies the other,
// so the connection is never idle for a copy and at most two chunks are held per upload.
// The executor runs one task of an upload at a time (`busy_`), in the order read.
class WriteTensorReactor final : public grpc::ServerReadReactor<v1::WriteTensorRequest> {
 public:
  WriteTensorReactor(grpc::CallbackServerContext* context, const Authenticator* auth,
                     FairExecutor* transfers, v1::TensorInfo* response)
      : context_(context),
        log_(context, "WriteTensor"),
        transfers_(transfers),
        response_(response) {
    absl::StatusOr<std::shared_ptr<TenantRuntime>> runtime = auth->AuthenticateTenant(*context);
    if (!runtime.ok()) {
      Answer(runtime.status());
      return;
    }
    runtime_ = *std::move(runtime);
    canceller_.emplace(context, runtime_);
    log_.set_tenant(runtime_->tenant_id());
    StartRead(&buffers_[0]);
  }

  void OnReadDone(bool ok) override {
    int full = -1;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;  // answered already (a failed chunk); nothing more to do
      if (!ok) {
        ended_ = true;
        if (busy_) return;  // the running task completes the call when it ends
        busy_ = true;
      } else if (busy_) {
        waiting_ = true;  // both buffers taken: handed over when the running task ends
        return;
      } else {
        busy_ = true;
        full = TakeReadLocked();
      }
    }
    if (full < 0) return Post([this] { Complete(); });
    CopyAndReadNext(full);
  }
  void OnCancel() override { cancelled_.store(true); }
  void OnDone() override { delete this; }  // an unfinished writer commits nothing

 private:
  // Queues `task` on the transfer executor; when the executor refuses it, answers the call.
  void Post(absl::AnyInvocable<void() &&> task) {
    absl::Status queued =
        transfers_->Schedule(runtime_->tenant_id(), Weight(*runtime_), std::move(task));
    if (!queued.ok()) Answer(queued);
  }

  // The buffer gRPC just filled; gRPC reads into the other one from now on.
  int TakeReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int full = reading_;
    reading_ ^= 1;
    return full;
  }

  // Queues the copy of buffer `full` and reads the next message into the other. The read
  // starts first: a copy that fails answers the call, and after that (with no read in
  // flight) gRPC may end the reactor at once.
  void CopyAndReadNext(int full) {
    StartRead(&buffers_[full ^ 1]);
    Post([this, full] { Consume(full); });
  }

  // On the executor: copies buffer `index`, then hands the executor the message read
  // meanwhile (a task of its own, so that tenants still take turns chunk by chunk), or
  // completes the call when the stream has ended.
  void Consume(int index) {
    absl::Status status = ConsumeMessage(buffers_[index]);
    buffers_[index].Clear();  // the chunk's bytes are in the staging copy now
    if (!status.ok()) return Answer(status);
    int next = -1;
    {
      absl::MutexLock lock(&mu_);
      if (waiting_) {
        waiting_ = false;
        next = TakeReadLocked();
      } else if (!ended_) {
        busy_ = false;
        return;
      }
    }
    if (next < 0) return Complete();
    CopyAndReadNext(next);
  }

  absl::Status ConsumeMessage(const v1::WriteTensorRequest& request) {
    if (writer_ == nullptr) {
      if (!request.has_header()) {
        return absl::InvalidArgumentError("the first message must be a header");
      }
      const v1::WriteHeader& header = request.header();
      std::optional<kernels::TensorMeta> create;
      if (header.has_create()) {
        ASSIGN_OR_RETURN(create, MetaFromProto(header.create(), "header.create"));
      } else if (header.handle().empty()) {
        return absl::InvalidArgumentError("header needs a handle or a create spec");
      } else {
        RETURN_IF_ERROR(CheckReference(header.handle(), "header.handle", "a tensor handle"));
      }
      ASSIGN_OR_RETURN(writer_, runtime_->BeginWrite(header.handle(), create));
      return absl::OkStatus();
    }
    if (!request.has_chunk()) {
      return absl::InvalidArgumentError("after the header, every message must be a chunk");
    }
    if (request.chunk().data().empty()) {
      return absl::InvalidArgumentError("chunk.data is empty; every chunk carries bytes");
    }
    return writer_->Write(request.chunk().offset(), request.chunk().data());
  }

  // The client stopped sending: half-closed (commit) or gone (commit nothing).
  void Complete() {
    if (cancelled_.load() || context_->IsCancelled()) {
      return Answer(absl::CancelledError("the client cancelled the upload; nothing was written"));
    }
    if (writer_ == nullptr) return Answer(absl::InvalidArgumentError("no header was sent"));
    const bool created = writer_->info().handle.empty();
    absl::StatusOr<TensorInfo> info = writer_->Finish();
    if (!info.ok()) return Answer(info.status());
    if (cancelled_.load() && created) {
      // Gone while committing: the new tensor's handle would reach nobody.
      (void)runtime_->DeleteTensor(info->handle);
      return Answer(absl::CancelledError("the client cancelled the upload; nothing was written"));
    }
    TensorInfoToProto(*info, response_);
    Answer(absl::OkStatus());
  }

  // Ends the call with `status` (OK: the commit above succeeded). The writer is released
  // before the answer goes out, so a client's next call never finds the tensor still held by
  // this upload. A read may still be in flight: its OnReadDone sees `finished_` and does
  // nothing, and OnDone waits for it.
  void Answer(const absl::Status& status) {
    writer_.reset();
    {
      absl::MutexLock lock(&mu_);
      finished_ = true;
    }
    Finish(log_.Finish(status));
  }

  grpc::CallbackServerContext* const context_;
  CallLog log_;
  FairExecutor* const transfers_;
  v1::TensorInfo* const response_;
  v1::WriteTensorRequest buffers_[2];
  absl::Mutex mu_;
  int reading_ ABSL_GUARDED_BY(mu_) = 0;       // the buffer gRPC reads into
  bool busy_ ABSL_GUARDED_BY(mu_) = false;     // an executor task of this upload is queued or runs
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;  // buffers_[reading_] holds a read message
  bool ended_ ABSL_GUARDED_BY(mu_) = false;    // the client stopped sending
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<TenantRuntime> runtime_;
  std::optional<TransferCanceller> canceller_;
  std::unique_ptr<TenantRuntime::Writer> writer_;
  std::atomic<bool> cancelled_{false};
};

// Downloads: chunks of at most chunk_bytes, one write in flight, each filled by the transfer
// executor. What the stream holds (the chunk and gRPC's serialized copy) is charged to the
// tenant's memory quota as transfer staging.
class ReadTensorReactor final : public grpc::ServerWriteReactor<v1::ReadTensorResponse> {
 public:
  ReadTensorReactor(grpc::CallbackServerContext* context, const Authenticator* auth,
                    FairExecutor* transfers, const v1::ReadTensorRequest& request,
                    int64_t max_message_bytes)
      : log_(context, "ReadTensor"), transfers_(transfers) {
    absl::Status status = Start(auth, context, request, max_message_bytes);
    if (!status.ok()) {
      Done(status);
      return;
    }
    Post();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Done(absl::CancelledError("the client stopped reading"));
    } else if (position_ >= end_) {
      Done(absl::OkStatus());
    } else {
      Post();
    }
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Start(const Authenticator* auth, grpc::CallbackServerContext* context,
                     const v1::ReadTensorRequest& request, int64_t max_message_bytes) {
    ASSIGN_OR_RETURN(runtime_, auth->AuthenticateTenant(*context));
    log_.set_tenant(runtime_->tenant_id());
    int64_t max_chunk = max_message_bytes / 2;
    chunk_bytes_ = request.chunk_bytes() == 0 ? std::min(kDefaultChunkBytes, max_chunk)
                                              : static_cast<int64_t>(request.chunk_bytes());
    if (chunk_bytes_ < kMinChunkBytes || chunk_bytes_ > max_chunk) {
      return absl::InvalidArgumentError(absl::StrCat("chunk_bytes is ", chunk_bytes_,
                                                     "; the range is ", kMinChunkBytes, "..",
                                                     max_chunk, " (--max_message_bytes / 2)"));
    }
    RETURN_IF_ERROR(CheckReference(request.handle(), "handle", "a tensor handle"));
    ASSIGN_OR_RETURN(reader_, runtime_->BeginRead(request.handle()));
    uint64_t size = reader_->info().size_bytes;
    if (request.offset() > size || request.length() > size - request.offset()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "offset ", request.offset(), " + length ", request.length(), " is outside the tensor's ",
          size, " bytes (offset 0..", size, ", offset + length <= ", size, ")"));
    }
    position_ = request.offset();
    end_ = request.length() == 0 ? size : request.offset() + request.length();
    // Never more than the range, and smaller chunks when the quota has little room left.
    chunk_bytes_ = std::min<int64_t>(chunk_bytes_, std::max<uint64_t>(end_ - position_, 1));
    // Two chunks while one is in flight: our message and gRPC's serialized copy of it.
    absl::StatusOr<MemoryCharge> charge = runtime_->ReserveStaging(2 * chunk_bytes_);
    while (!charge.ok() && chunk_bytes_ > kMinChunkBytes) {
      chunk_bytes_ = std::max(kMinChunkBytes, chunk_bytes_ / 4);
      charge = runtime_->ReserveStaging(2 * chunk_bytes_);
    }
    if (!charge.ok()) return charge.status();
    staging_ = *std::move(charge);
    canceller_.emplace(context, runtime_);
    return absl::OkStatus();
  }

  void Post() {
    absl::Status queued =
        transfers_->Schedule(runtime_->tenant_id(), Weight(*runtime_), [this] { WriteNext(); });
    if (!queued.ok()) Done(queued);
  }

  void WriteNext() {
    response_.Clear();
    if (first_) {
      TensorInfoToProto(reader_->info(), response_.mutable_info());
      first_ = false;
    }
    uint64_t n = std::min<uint64_t>(static_cast<uint64_t>(chunk_bytes_), end_ - position_);
    v1::Chunk* chunk = response_.mutable_chunk();
    chunk->set_offset(position_);
    std::string* data = chunk->mutable_data();
    data->resize(n);
    absl::Status status = reader_->Read(position_, n, data->data());
    if (!status.ok()) {
      Done(status);
      return;
    }
    position_ += n;
    StartWrite(&response_);
  }

  // The reader and the staging charge are released before the final status goes out (see
  // WriteTensorReactor::Answer): a client's next GetUsage never sees this download.
  void Done(const absl::Status& status) {
    reader_.reset();
    staging_.Release();
    Finish(log_.Finish(status));
  }

  CallLog log_;
  FairExecutor* const transfers_;
  std::shared_ptr<TenantRuntime> runtime_;
  std::unique_ptr<TenantRuntime::Reader> reader_;
  std::optional<TransferCanceller> canceller_;
  MemoryCharge staging_;
  v1::ReadTensorResponse response_;
  int64_t chunk_bytes_ = 0;
  uint64_t position_ = 0, end_ = 0;
  bool first_ = true;
};

// One launch: a Launch request (`handles`; `field` empty) or step `index` of a Submit
// (`operands`; `field` "steps[i]"). Checks what only the wire can get wrong (lengths, counts,
// references to earlier steps) so that nothing is left to a lookup or a narrowing cast; the
// core checks the rest against the kernel and the tenant's tensors.
absl::StatusOr<LaunchSpec> StepFromProto(
    const std::string& kernel, const google::protobuf::RepeatedPtrField<v1::Operand>* operands,
    const google::protobuf::RepeatedPtrField<std::string>* handles,
    const google::protobuf::RepeatedPtrField<v1::Output>& outputs,
    const google::protobuf::Map<std::string, v1::AttrValue>& attrs, absl::string_view field,
    int index) {
  const std::string prefix = field.empty() ? "" : absl::StrCat(field, ".");
  RETURN_IF_ERROR(CheckReference(kernel, absl::StrCat(prefix, "kernel"),
                                 "a kernel name (ListKernels lists them)"));
  const int inputs = handles != nullptr ? handles->size() : operands->size();
  if (static_cast<size_t>(inputs) > MaxKernelInputs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "inputs has ", inputs, " entries; no kernel takes more than ", MaxKernelInputs()));
  }
  LaunchSpec spec;
  spec.kernel = kernel;
  for (int i = 0; i < inputs; ++i) {
    const std::string input = absl::StrCat(prefix, "inputs[", i, "]");
    if (handles != nullptr) {
      RETURN_IF_ERROR(CheckReference((*handles)[i], input, "a tensor handle"));
      spec.inputs.push_back(Operand{(*handles)[i]});
      continue;
    }
    const v1::Operand& op = (*operands)[i];
    if (op.has_step_output()) {
      // Both are uint32 on the wire: bounded here, before they become ints.
      const uint32_t step = op.step_output().step();
      const uint32_t output = op.step_output().output();
      if (step >= static_cast<uint32_t>(index)) {
        return absl::InvalidArgumentError(
            index == 0 ? absl::StrCat(input, ".step_output.step is ", step,
                                      ", not an earlier step: step 0 has none (give a handle)")
                       : absl::StrCat(input, ".step_output.step is ", step,
                                      ", not an earlier step: the range is 0..", index - 1));
      }
      if (output >= MaxKernelOutputs()) {
        return absl::InvalidArgumentError(
            absl::StrCat(input, ".step_output.output is ", output, "; no kernel has more than ",
                         MaxKernelOutputs(), " outputs (0..", MaxKernelOutputs() - 1, ")"));
      }
      spec.inputs.push_back(Operand{"", static_cast<int>(step), static_cast<int>(output)});
    } else if (op.source_case() == v1::Operand::kHandle) {
      RETURN_IF_ERROR(
          CheckReference(op.handle(), absl::StrCat(input, ".handle"), "a tensor handle"));
      spec.inputs.push_back(Operand{op.handle()});
    } else {
      return absl::InvalidArgumentError(absl::StrCat(input, " needs a handle or a step_output"));
    }
  }
  ASSIGN_OR_RETURN(spec.outputs, OutputsFromProto(outputs, absl::StrCat(prefix, "outputs")));
  ASSIGN_OR_RETURN(spec.attrs, AttrsFromProto(attrs, absl::StrCat(prefix, "attrs")));
  return spec;
}

}  // namespace

template <typename Body>
grpc::ServerUnaryReactor* ComputeService::Serve(grpc::CallbackServerContext* context,
                                                const char* rpc, Body body) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  CallLog log(context, rpc);
  absl::StatusOr<std::shared_ptr<TenantRuntime>> runtime =
      authenticator_->AuthenticateTenant(*context);
  if (!runtime.ok()) {
    reactor->Finish(log.Finish(runtime.status()));
    return reactor;
  }
  log.set_tenant((*runtime)->tenant_id());
  reactor->Finish(log.Finish(body(**runtime)));
  return reactor;
}

grpc::ServerUnaryReactor* ComputeService::CreateTensor(grpc::CallbackServerContext* context,
                                                       const v1::CreateTensorRequest* request,
                                                       v1::TensorInfo* response) {
  // Inline data is copied on the transfer executor, never on a gRPC thread.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto log = std::make_shared<CallLog>(context, "CreateTensor");
  absl::StatusOr<std::shared_ptr<TenantRuntime>> runtime =
      authenticator_->AuthenticateTenant(*context);
  if (!runtime.ok()) {
    reactor->Finish(log->Finish(runtime.status()));
    return reactor;
  }
  log->set_tenant((*runtime)->tenant_id());
  if (request->data().size() > kMaxCreateTensorDataBytes) {
    reactor->Finish(log->Finish(absl::InvalidArgumentError(absl::StrCat(
        "data is ", request->data().size(), " bytes; CreateTensor takes at most ",
        kMaxCreateTensorDataBytes,
        " bytes (16 MiB) inline: stream larger tensors with WriteTensor (C++ Client::Upload, "
        "Python Client.put)"))));
    return reactor;
  }
  const std::string tenant = (*runtime)->tenant_id();
  const double weight = Weight(**runtime);
  absl::Status queued = transfers_.Schedule(
      tenant, weight, [reactor, log, request, response, runtime = *std::move(runtime)]() {
        absl::Status status = [&]() -> absl::Status {
          ASSIGN_OR_RETURN(kernels::TensorMeta meta, MetaFromProto(request->spec(), "spec"));
          ASSIGN_OR_RETURN(TensorInfo info, runtime->CreateTensor(meta, request->data()));
          TensorInfoToProto(info, response);
          return absl::OkStatus();
        }();
        reactor->Finish(log->Finish(status));
      });
  if (!queued.ok()) reactor->Finish(log->Finish(queued));
  return reactor;
}

grpc::ServerReadReactor<v1::WriteTensorRequest>* ComputeService::WriteTensor(
    grpc::CallbackServerContext* context, v1::TensorInfo* response) {
  return new WriteTensorReactor(context, authenticator_, &transfers_, response);
}

grpc::ServerWriteReactor<v1::ReadTensorResponse>* ComputeService::ReadTensor(
    grpc::CallbackServerContext* context, const v1::ReadTensorRequest* request) {
  return new ReadTensorReactor(context, authenticator_, &transfers_, *request, max_message_bytes_);
}

grpc::ServerUnaryReactor* ComputeService::GetTensor(grpc::CallbackServerContext* context,
                                                    const v1::GetTensorRequest* request,
                                                    v1::TensorInfo* response) {
  return Serve(context, "GetTensor", [&](TenantRuntime& runtime) -> absl::Status {
    RETURN_IF_ERROR(CheckReference(request->handle(), "handle", "a tensor handle"));
    ASSIGN_OR_RETURN(TensorInfo info, runtime.GetTensor(request->handle()));
    TensorInfoToProto(info, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ComputeService::ListTensors(grpc::CallbackServerContext* context,
                                                      const v1::ListTensorsRequest* request,
                                                      v1::ListTensorsResponse* response) {
  return Serve(context, "ListTensors", [&](TenantRuntime& runtime) -> absl::Status {
    ASSIGN_OR_RETURN(size_t limit, PageLimit(request->page_size()));
    std::string after;
    if (!request->page_token().empty()) {
      if (request->page_token().size() > 2 * kMaxReferenceBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "page_token is ", request->page_token().size(), " bytes; the limit is ",
            2 * kMaxReferenceBytes, " (pass next_page_token from a ListTensors reply)"));
      }
      ASSIGN_OR_RETURN(after, DecodePageToken(kTensorPages, request->page_token(), "ListTensors"));
    }
    TenantRuntime::TensorPage page = runtime.ListTensors(after, limit);
    for (const TensorInfo& t : page.tensors) TensorInfoToProto(t, response->add_tensors());
    if (!page.last_handle.empty()) {
      response->set_next_page_token(EncodePageToken(kTensorPages, page.last_handle));
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ComputeService::DeleteTensor(grpc::CallbackServerContext* context,
                                                       const v1::DeleteTensorRequest* request,
                                                       v1::DeleteTensorResponse* response) {
  return Serve(context, "DeleteTensor", [&](TenantRuntime& runtime) -> absl::Status {
    RETURN_IF_ERROR(CheckReference(request->handle(), "handle", "a tensor handle"));
    ASSIGN_OR_RETURN(uint64_t released, runtime.DeleteTensor(request->handle()));
    response->set_released_bytes(released);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ComputeService::Enqueue(grpc::CallbackServerContext* context,
                                                  const char* rpc, int64_t stream,
                                                  std::vector<LaunchSpec> steps, bool program,
                                                  bool wait,
                                                  const google::protobuf::Duration* timeout,
                                                  v1::Job* response, absl::Status parse_error) {
  auto* reactor = new WaitReactor(context, rpc);
  std::shared_ptr<TenantRuntime> runtime = Authenticate(*authenticator_, reactor, context);
  if (runtime == nullptr) return reactor;
  absl::Duration queue_timeout = absl::InfiniteDuration();
  if (parse_error.ok() && timeout != nullptr) {
    absl::StatusOr<absl::Duration> parsed = DurationFromProto(*timeout, "queue_timeout");
    if (parsed.ok()) {
      queue_timeout = *parsed;
    } else {
      parse_error = parsed.status();
    }
  }
  if (!parse_error.ok()) {
    reactor->CompleteIfUnclaimed(parse_error);
    return reactor;
  }
  // The job's deadline: the explicit queue timeout, and for a waiting call its own deadline.
  absl::Time deadline = absl::Now() + queue_timeout;
  if (wait && context->deadline() != std::chrono::system_clock::time_point::max()) {
    absl::Time call_deadline = absl::FromChrono(context->deadline());
    if (call_deadline < deadline) deadline = call_deadline;
  }
  if (!wait) {
    absl::StatusOr<JobInfo> job =
        runtime->Submit(stream, std::move(steps), program, nullptr, deadline);
    if (job.ok()) {
      AnswerNow(reactor, response, *job);
    } else {
      reactor->CompleteIfUnclaimed(job.status());
    }
    return reactor;
  }
  // The answer is attached before the job is enqueued, so a worker that finishes it at once
  // answers directly, without waiting for this thread to register afterwards.
  absl::StatusOr<JobInfo> job =
      runtime->Submit(stream, std::move(steps), program,
                      AnswerWithJob(reactor, response, /*expiry_fails_call=*/true), deadline);
  if (!job.ok()) {  // the callback was destroyed unrun: drop its reference here
    reactor->CompleteIfUnclaimed(job.status());
    reactor->Release();
    return reactor;
  }
  // A client that goes away takes its job with it if the job has not started; a passed
  // deadline is left to the scheduler, which ends the job DEADLINE_EXCEEDED.
  reactor->SetCancelAction([runtime, id = job->id, deadline] {
    if (absl::Now() < deadline) (void)runtime->CancelJob(id);
  });
  return reactor;
}

grpc::ServerUnaryReactor* ComputeService::Launch(grpc::CallbackServerContext* context,
                                                 const v1::LaunchRequest* request,
                                                 v1::Job* response) {
  absl::StatusOr<LaunchSpec> step = StepFromProto(request->kernel(), nullptr, &request->inputs(),
                                                  request->outputs(), request->attrs(), "", 0);
  std::vector<LaunchSpec> steps;
  if (step.ok()) steps.push_back(*std::move(step));
  return Enqueue(
      context, "Launch", request->stream(), std::move(steps), /*program=*/false, request->wait(),
      request->has_queue_timeout() ? &request->queue_timeout() : nullptr, response, step.status());
}

grpc::ServerUnaryReactor* ComputeService::Submit(grpc::CallbackServerContext* context,
                                                 const v1::SubmitRequest* request,
                                                 v1::Job* response) {
  std::vector<LaunchSpec> steps;
  absl::Status parsed;
  // Counted before anything is parsed: a huge program costs nothing.
  if (request->steps_size() < 1 || static_cast<size_t>(request->steps_size()) > kMaxProgramSteps) {
    parsed = absl::InvalidArgumentError(absl::StrCat(
        "steps has ", request->steps_size(), " entries; the range is 1..", kMaxProgramSteps));
  }
  for (int i = 0; i < request->steps_size() && parsed.ok(); ++i) {
    const v1::ProgramStep& s = request->steps(i);
    absl::StatusOr<LaunchSpec> step = StepFromProto(s.kernel(), &s.inputs(), nullptr, s.outputs(),
                                                    s.attrs(), absl::StrCat("steps[", i, "]"), i);
    if (step.ok()) {
      steps.push_back(*std::move(step));
    } else {
      parsed = step.status();
    }
  }
  return Enqueue(
      context, "Submit", request->stream(), std::move(steps), /*program=*/true, request->wait(),
      request->has_queue_timeout() ? &request->queue_timeout() : nullptr, response, parsed);
}

grpc::ServerUnaryReactor* ComputeService::WaitJob(grpc::CallbackServerContext* context,
                                                  const v1::WaitJobRequest* request,
                                                  v1::Job* response) {
  auto* reactor = new WaitReactor(context, "WaitJob");
  std::shared_ptr<TenantRuntime> runtime = Authenticate(*authenticator_, reactor, context);
  if (runtime == nullptr) return reactor;
  absl::StatusOr<absl::Duration> timeout = DurationFromProto(request->timeout(), "timeout");
  absl::Status valid = timeout.status();
  if (valid.ok()) valid = CheckReference(request->job_id(), "job_id", "a job id");
  if (!valid.ok()) {
    reactor->CompleteIfUnclaimed(valid);
    return reactor;
  }
  std::string id = request->job_id();
  absl::Status registered = runtime->WhenJobDone(id, AnswerWithJob(reactor, response));
  if (!registered.ok()) {  // unknown job: the callback was dropped unrun
    reactor->CompleteIfUnclaimed(registered);
    reactor->Release();
    return reactor;
  }
  if (request->has_timeout()) {
    std::shared_ptr<TenantRuntime> held = runtime;
    reactor->SetTimer(absl::Now() + *timeout, [reactor, response, held, id] {
      if (!reactor->Claim()) return;
      absl::StatusOr<JobInfo> now = held->GetJob(id);
      if (now.ok()) JobToProto(*now, response);
      reactor->Complete(now.status());
    });
  }
  return reactor;
}

grpc::ServerUnaryReactor* ComputeService::CancelJob(grpc::CallbackServerContext* context,
                                                    const v1::CancelJobRequest* request,
                                                    v1::Job* response) {
  return Serve(context, "CancelJob", [&](TenantRuntime& runtime) -> absl::Status {
    RETURN_IF_ERROR(CheckReference(request->job_id(), "job_id", "a job id"));
    ASSIGN_OR_RETURN(JobInfo job, runtime.CancelJob(request->job_id()));
    JobToProto(job, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ComputeService::Synchronize(grpc::CallbackServerContext* context,
                                                      const v1::SynchronizeRequest* request,
                                                      v1::SynchronizeResponse* response) {
  auto* reactor = new WaitReactor(context, "Synchronize");
  std::shared_ptr<TenantRuntime> runtime = Authenticate(*authenticator_, reactor, context);
  if (runtime == nullptr) return reactor;
  std::optional<int64_t> stream;
  if (request->has_stream()) stream = request->stream();
  reactor->Hold();
  absl::Status status = runtime->WhenIdle(stream, [reactor, response](uint64_t n) {
    if (reactor->Claim()) {
      response->set_jobs_completed(n);
      reactor->Complete(absl::OkStatus());
    }
    reactor->Release();
  });
  if (!status.ok()) {
    reactor->CompleteIfUnclaimed(status);
    reactor->Release();
  }
  return reactor;
}

grpc::ServerUnaryReactor* ComputeService::ListKernels(grpc::CallbackServerContext* context,
                                                      const v1::ListKernelsRequest*,
                                                      v1::ListKernelsResponse* response) {
  return Serve(context, "ListKernels", [&](TenantRuntime& runtime) -> absl::Status {
    *response = KernelCatalogProto();
    for (const KernelLibrary::Kernel& k : runtime.kernels().List()) {
      UserKernelToProto(*k, response->add_kernels());
    }
    return absl::OkStatus();
  });
}

// DefineKernel and DeleteKernel commit to the state store (an fsync): on the transfer
// executor, never on a gRPC thread.
template <typename Body>
grpc::ServerUnaryReactor* ComputeService::ServeOffThread(grpc::CallbackServerContext* context,
                                                         const char* rpc, Body body) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto log = std::make_shared<CallLog>(context, rpc);
  absl::StatusOr<std::shared_ptr<TenantRuntime>> runtime =
      authenticator_->AuthenticateTenant(*context);
  if (!runtime.ok()) {
    reactor->Finish(log->Finish(runtime.status()));
    return reactor;
  }
  log->set_tenant((*runtime)->tenant_id());
  const std::string tenant = (*runtime)->tenant_id();
  const double weight = Weight(**runtime);
  absl::Status queued = transfers_.Schedule(
      tenant, weight,
      [reactor, log, body = std::move(body), runtime = *std::move(runtime)]() mutable {
        reactor->Finish(log->Finish(body(*runtime)));
      });
  if (!queued.ok()) reactor->Finish(log->Finish(queued));
  return reactor;
}

grpc::ServerUnaryReactor* ComputeService::DefineKernel(grpc::CallbackServerContext* context,
                                                       const v1::DefineKernelRequest* request,
                                                       v1::KernelInfo* response) {
  return ServeOffThread(
      context, "DefineKernel", [this, request, response](TenantRuntime& runtime) -> absl::Status {
        ASSIGN_OR_RETURN(kernels::expr::Definition definition, DefinitionFromProto(*request));
        ASSIGN_OR_RETURN(KernelLibrary::Kernel kernel,
                         tenants_->DefineKernel(runtime, std::move(definition)));
        UserKernelToProto(*kernel, response);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ComputeService::DeleteKernel(grpc::CallbackServerContext* context,
                                                       const v1::DeleteKernelRequest* request,
                                                       v1::DeleteKernelResponse*) {
  return ServeOffThread(context, "DeleteKernel",
                        [this, request](TenantRuntime& runtime) -> absl::Status {
                          RETURN_IF_ERROR(CheckReference(request->name(), "name", "a kernel name"));
                          return tenants_->DeleteKernel(runtime, request->name());
                        });
}

grpc::ServerUnaryReactor* ComputeService::GetUsage(grpc::CallbackServerContext* context,
                                                   const v1::GetUsageRequest*,
                                                   v1::Usage* response) {
  return Serve(context, "GetUsage", [&](TenantRuntime& runtime) -> absl::Status {
    UsageToProto(runtime.Usage(), response);
    return absl::OkStatus();
  });
}

}  // namespace tessera
