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
#include "server/service/unary_call.h"
#include "server/service/wait_reactor.h"

namespace tessera {
namespace {

constexpr absl::string_view kTensorPages = "tensors";

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
  return ServeUnary(
      context, rpc,
      [&](CallLog& log) { return AuthenticateTenantCall(*authenticator_, *context, log); },
      [body = std::move(body)](std::shared_ptr<TenantRuntime>& runtime, CallLog&) mutable {
        return body(*runtime);
      });
}

template <typename Body>
grpc::ServerUnaryReactor* ComputeService::ServeOffThread(grpc::CallbackServerContext* context,
                                                         const char* rpc, Body body) {
  return ServeUnary(
      context, rpc,
      [&](CallLog& log) { return AuthenticateTenantCall(*authenticator_, *context, log); },
      [body = std::move(body)](std::shared_ptr<TenantRuntime>& runtime, CallLog&) mutable {
        return body(*runtime);
      },
      [this](const std::shared_ptr<TenantRuntime>& runtime, absl::AnyInvocable<void() &&> task) {
        return transfers_.Schedule(runtime->tenant_id(), TransferWeight(*runtime), std::move(task));
      });
}

grpc::ServerUnaryReactor* ComputeService::CreateTensor(grpc::CallbackServerContext* context,
                                                       const v1::CreateTensorRequest* request,
                                                       v1::TensorInfo* response) {
  if (auto* forwarded = Forward(context, "CreateTensor", *request, response)) return forwarded;
  // Inline data is copied on the transfer executor, never on a gRPC thread.
  return ServeOffThread(
      context, "CreateTensor", [request, response](TenantRuntime& runtime) -> absl::Status {
        if (request->data().size() > kMaxCreateTensorDataBytes) {
          return absl::InvalidArgumentError(
              absl::StrCat("data is ", request->data().size(),
                           " bytes; CreateTensor takes at most ", kMaxCreateTensorDataBytes,
                           " bytes (16 MiB) inline: stream larger tensors with WriteTensor "
                           "(C++ Client::Upload, Python Client.put)"));
        }
        ASSIGN_OR_RETURN(kernels::TensorMeta meta, MetaFromProto(request->spec(), "spec"));
        ASSIGN_OR_RETURN(TensorInfo info, runtime.CreateTensor(meta, request->data()));
        TensorInfoToProto(info, response);
        return absl::OkStatus();
      });
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
  std::shared_ptr<TenantRuntime> runtime = AuthenticateWaiting(*authenticator_, reactor, context);
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
  // deadline is left to the scheduler, which ends the job DEADLINE_EXCEEDED. A call forwarded
  // by another node reaches here with the caller's deadline plus the hop's latency, so the
  // forwarding node's timer ends the call here a little before our deadline: a cancellation
  // that close to a forwarded call's deadline is that deadline passing (the job expires).
  absl::Time cancels_until = deadline;
  if (context->client_metadata().count(kForwardedByMetadata) > 0) {
    cancels_until -= kForwardedDeadlineSlack;
  }
  reactor->SetCancelAction([runtime, id = job->id, cancels_until] {
    if (absl::Now() < cancels_until) (void)runtime->CancelJob(id);
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
  std::shared_ptr<TenantRuntime> runtime = AuthenticateWaiting(*authenticator_, reactor, context);
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
  std::shared_ptr<TenantRuntime> runtime = AuthenticateWaiting(*authenticator_, reactor, context);
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
