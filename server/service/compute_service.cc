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
#include "server/core/region_tickets.h"
#include "server/core/tenant_table.h"
#include "server/service/call.h"
#include "server/service/compute_convert.h"
#include "server/service/convert.h"
#include "server/service/transfer_reactors.h"

namespace tessera {
namespace {

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

grpc::ServerUnaryReactor* ComputeService::Forward(grpc::CallbackServerContext* context,
                                                  const char* rpc,
                                                  const google::protobuf::MessageLite& request,
                                                  google::protobuf::MessageLite* response) {
  if (forwarder_ == nullptr) return nullptr;
  return forwarder_->ForwardUnary(context, rpc, request, response);
}

grpc::ServerUnaryReactor* ComputeService::RedirectRegion(grpc::CallbackServerContext* context,
                                                         const char* rpc) {
  if (forwarder_ == nullptr) return nullptr;
  return forwarder_->RedirectRegion(context, rpc);
}

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
  if (auto* forwarded = Forward(context, "CreateTensor", *request, response)) return forwarded;
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
  const double weight = TransferWeight(**runtime);
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

grpc::ServerReadReactor<grpc::ByteBuffer>* ComputeService::WriteTensor(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  if (forwarder_ != nullptr) {
    if (auto* forwarded = forwarder_->ForwardWriteTensor(context, response)) return forwarded;
  }
  return NewWriteTensorReactor(context, authenticator_, &transfers_, response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ComputeService::ReadTensor(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  if (forwarder_ != nullptr) {
    if (auto* forwarded = forwarder_->ForwardReadTensor(context, *request)) return forwarded;
  }
  return NewReadTensorReactor(context, authenticator_, &transfers_, *request, max_message_bytes_);
}

grpc::ServerUnaryReactor* ComputeService::GetTensor(grpc::CallbackServerContext* context,
                                                    const v1::GetTensorRequest* request,
                                                    v1::TensorInfo* response) {
  if (auto* forwarded = Forward(context, "GetTensor", *request, response)) return forwarded;
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
  if (auto* forwarded = Forward(context, "ListTensors", *request, response)) return forwarded;
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
  if (auto* forwarded = Forward(context, "DeleteTensor", *request, response)) return forwarded;
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
  if (auto* forwarded = Forward(context, "Launch", *request, response)) return forwarded;
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
  if (auto* forwarded = Forward(context, "Submit", *request, response)) return forwarded;
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
  if (auto* forwarded = Forward(context, "WaitJob", *request, response)) return forwarded;
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
  if (auto* forwarded = Forward(context, "CancelJob", *request, response)) return forwarded;
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
  if (auto* forwarded = Forward(context, "Synchronize", *request, response)) return forwarded;
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
                                                      const v1::ListKernelsRequest* request,
                                                      v1::ListKernelsResponse* response) {
  if (auto* forwarded = Forward(context, "ListKernels", *request, response)) return forwarded;
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
  const double weight = TransferWeight(**runtime);
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
  if (auto* forwarded = Forward(context, "DefineKernel", *request, response)) return forwarded;
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
                                                       v1::DeleteKernelResponse* response) {
  if (auto* forwarded = Forward(context, "DeleteKernel", *request, response)) return forwarded;
  return ServeOffThread(context, "DeleteKernel",
                        [this, request](TenantRuntime& runtime) -> absl::Status {
                          RETURN_IF_ERROR(CheckReference(request->name(), "name", "a kernel name"));
                          return tenants_->DeleteKernel(runtime, request->name());
                        });
}

grpc::ServerUnaryReactor* ComputeService::GetUsage(grpc::CallbackServerContext* context,
                                                   const v1::GetUsageRequest* request,
                                                   v1::Usage* response) {
  if (auto* forwarded = Forward(context, "GetUsage", *request, response)) return forwarded;
  return Serve(context, "GetUsage", [&](TenantRuntime& runtime) -> absl::Status {
    UsageToProto(runtime.Usage(), response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ComputeService::Locate(grpc::CallbackServerContext* context,
                                                 const v1::LocateRequest*, v1::Location* response) {
  // Authenticated, but not a call in the tenant's RequestGate: a client asks it once per
  // connection, and it must not use up the tenant's quota of calls.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  CallLog log(context, "Locate");
  absl::StatusOr<Authenticator::Location> where = authenticator_->LocateTenant(*context);
  if (where.ok()) {
    response->set_here(where->here);
    response->set_node_name(where->node);
    response->set_address(where->address);
  }
  reactor->Finish(log.Finish(where.status()));
  return reactor;
}

// ---- regions ----------------------------------------------------------------------------------
// Registering a region and moving a region's bytes touch the device (cuMemHostRegister, copies):
// on the transfer executor, never on a gRPC thread. Listing and tickets are bookkeeping.

grpc::ServerUnaryReactor* ComputeService::BeginRegion(grpc::CallbackServerContext* context,
                                                      const v1::BeginRegionRequest* request,
                                                      v1::RegionTicket* response) {
  if (auto* redirected = RedirectRegion(context, "BeginRegion")) return redirected;
  return Serve(context, "BeginRegion", [&](TenantRuntime& runtime) -> absl::Status {
    if (regions_ == nullptr) {
      return absl::FailedPreconditionError(
          "this server has no descriptor socket: regions need tessera-server --unix_socket "
          "and a client on the same node");
    }
    ASSIGN_OR_RETURN(RegionTickets::Ticket ticket,
                     regions_->Issue(runtime.shared_from_this(), request->size_bytes()));
    response->set_ticket(ticket.ticket);
    response->set_socket_path(region_socket_);
    TimeToProto(ticket.expire_time, response->mutable_expire_time());
    response->set_size_bytes(ticket.size_bytes);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ComputeService::FinishRegion(grpc::CallbackServerContext* context,
                                                       const v1::FinishRegionRequest* request,
                                                       v1::Region* response) {
  if (auto* redirected = RedirectRegion(context, "FinishRegion")) return redirected;
  return Serve(context, "FinishRegion", [&](TenantRuntime& runtime) -> absl::Status {
    if (regions_ == nullptr) {
      return absl::FailedPreconditionError(
          "this server has no descriptor socket: regions need tessera-server --unix_socket");
    }
    RETURN_IF_ERROR(CheckReference(request->ticket(), "ticket", "a region ticket"));
    ASSIGN_OR_RETURN(RegionInfo region, regions_->Finish(runtime.tenant_id(), request->ticket()));
    RegionToProto(region, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ComputeService::ListRegions(grpc::CallbackServerContext* context,
                                                      const v1::ListRegionsRequest*,
                                                      v1::ListRegionsResponse* response) {
  if (auto* redirected = RedirectRegion(context, "ListRegions")) return redirected;
  return Serve(context, "ListRegions", [&](TenantRuntime& runtime) -> absl::Status {
    for (const RegionInfo& region : runtime.ListRegions()) {
      RegionToProto(region, response->add_regions());
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ComputeService::UnregisterRegion(
    grpc::CallbackServerContext* context, const v1::UnregisterRegionRequest* request,
    v1::UnregisterRegionResponse* response) {
  if (auto* redirected = RedirectRegion(context, "UnregisterRegion")) return redirected;
  // Unmapping (and cuMemHostUnregister) may take a while for a large region.
  return ServeOffThread(
      context, "UnregisterRegion", [request, response](TenantRuntime& runtime) -> absl::Status {
        RETURN_IF_ERROR(CheckReference(request->handle(), "handle", "a region handle"));
        ASSIGN_OR_RETURN(uint64_t released, runtime.UnregisterRegion(request->handle()));
        response->set_released_bytes(released);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ComputeService::WriteTensorFromRegion(
    grpc::CallbackServerContext* context, const v1::WriteTensorFromRegionRequest* request,
    v1::TensorInfo* response) {
  if (auto* redirected = RedirectRegion(context, "WriteTensorFromRegion")) return redirected;
  return ServeOffThread(
      context, "WriteTensorFromRegion",
      [request, response](TenantRuntime& runtime) -> absl::Status {
        std::optional<kernels::TensorMeta> create;
        if (request->has_create()) {
          ASSIGN_OR_RETURN(create, MetaFromProto(request->create(), "create"));
        } else if (request->handle().empty()) {
          return absl::InvalidArgumentError("the request needs a handle or a create spec");
        } else {
          RETURN_IF_ERROR(CheckReference(request->handle(), "handle", "a tensor handle"));
        }
        RETURN_IF_ERROR(CheckReference(request->region(), "region", "a region handle"));
        ASSIGN_OR_RETURN(TensorInfo info,
                         runtime.WriteFromRegion(request->handle(), create, request->region(),
                                                 request->offset(), request->length()));
        TensorInfoToProto(info, response);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ComputeService::ReadTensorIntoRegion(
    grpc::CallbackServerContext* context, const v1::ReadTensorIntoRegionRequest* request,
    v1::ReadTensorIntoRegionResponse* response) {
  if (auto* redirected = RedirectRegion(context, "ReadTensorIntoRegion")) return redirected;
  return ServeOffThread(
      context, "ReadTensorIntoRegion", [request, response](TenantRuntime& runtime) -> absl::Status {
        RETURN_IF_ERROR(CheckReference(request->handle(), "handle", "a tensor handle"));
        RETURN_IF_ERROR(CheckReference(request->region(), "region", "a region handle"));
        ASSIGN_OR_RETURN(
            TenantRuntime::RegionRead read,
            runtime.ReadIntoRegion(request->handle(), request->offset(), request->length(),
                                   request->region(), request->region_offset()));
        TensorInfoToProto(read.info, response->mutable_info());
        response->set_bytes(read.bytes);
        return absl::OkStatus();
      });
}

}  // namespace tessera
