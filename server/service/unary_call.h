#ifndef TESSERA_SERVER_SERVICE_UNARY_CALL_H_
#define TESSERA_SERVER_SERVICE_UNARY_CALL_H_

// The one shape of a unary call, for every handler of both services: authenticate the caller,
// name it in the access log, run the body (inline, or as a task of an executor), finish with
// the body's status.
#include <memory>
#include <type_traits>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

#include "server/core/tenant_runtime.h"
#include "server/service/auth.h"
#include "server/service/call.h"

namespace tessera {

/// A tenant's call: the runtime of the tenant whose key it carries
/// (Authenticator::AuthenticateTenant, with its refusals and redirects), named in `log`.
absl::StatusOr<std::shared_ptr<TenantRuntime>> AuthenticateTenantCall(
    const Authenticator& auth, grpc::CallbackServerContext& context, CallLog& log);

/// Runs a call's body on the gRPC thread (bodies that never block).
struct RunInline {
  template <typename Caller>
  absl::Status operator()(const Caller&, absl::AnyInvocable<void() &&> task) const {
    std::move(task)();
    return absl::OkStatus();
  }
};

/// Serves one unary call. `authenticate(log)` returns the caller (absl::StatusOr<Caller>) or
/// the status that ends the call; `body(caller, log)` returns the call's status;
/// `schedule(caller, task)` runs the task (RunInline, or queues it on an executor, returning
/// the refusal when it cannot). The reactor, context and messages stay valid until the task
/// finishes the call.
template <typename Authenticate, typename Body, typename Schedule = RunInline>
grpc::ServerUnaryReactor* ServeUnary(grpc::CallbackServerContext* context, const char* rpc,
                                     Authenticate authenticate, Body body, Schedule schedule = {}) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if constexpr (std::is_same_v<Schedule, RunInline>) {
    // The hot path (GetUsage, GetTensor, CancelJob, ...): no task, no shared log to allocate.
    CallLog log(context, rpc);
    auto caller = authenticate(log);
    reactor->Finish(log.Finish(caller.ok() ? body(*caller, log) : caller.status()));
    return reactor;
  }
  auto log = std::make_shared<CallLog>(context, rpc);
  auto caller = authenticate(*log);
  if (!caller.ok()) {
    reactor->Finish(log->Finish(caller.status()));
    return reactor;
  }
  const auto who = *caller;  // a copy: the task takes the caller
  absl::Status queued =
      schedule(who, [reactor, log, body = std::move(body), caller = *std::move(caller)]() mutable {
        reactor->Finish(log->Finish(body(caller, *log)));
      });
  if (!queued.ok()) reactor->Finish(log->Finish(queued));
  return reactor;
}

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_UNARY_CALL_H_
