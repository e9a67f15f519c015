#ifndef TESSERA_SERVER_SERVICE_WAIT_REACTOR_H_
#define TESSERA_SERVER_SERVICE_WAIT_REACTOR_H_

// The reactor of the Compute calls that wait (Launch and Submit with wait, WaitJob,
// Synchronize): answered by the job's end, a timer or the client's leaving, whichever comes
// first.
#include <atomic>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/alarm.h"
#include "grpcpp/grpcpp.h"

#include "server/core/tenant_runtime.h"
#include "server/service/auth.h"
#include "server/service/call.h"
#include "tessera/v1/compute.pb.h"

namespace tessera {

/// A unary call finished by whichever comes first: the work's completion, a timer, or the
/// client going away. Reference counted: gRPC holds one reference until OnDone, and every
/// pending callback holds one, so the reactor outlives all of them.
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

/// Authenticates a waiting call (AuthenticateTenantCall); on failure finishes it and returns
/// nullptr.
std::shared_ptr<TenantRuntime> AuthenticateWaiting(const Authenticator& auth, WaitReactor* reactor,
                                                   grpc::CallbackServerContext* context);

/// Answers `reactor` with `job` unless something else answered first. For a waiting
/// Launch/Submit (`expiry_fails_call`) a job that expired in its queue answers
/// DEADLINE_EXCEEDED: its deadline is the call's own, and the scheduler may notice it a moment
/// before gRPC does. WaitJob returns the expired job as it is.
void AnswerNow(WaitReactor* reactor, v1::Job* response, const JobInfo& job,
               bool expiry_fails_call = false);

/// A job callback that answers `reactor` with the finished job, unless something else
/// answered first; it holds a reference on the reactor until it runs.
TenantRuntime::JobCallback AnswerWithJob(WaitReactor* reactor, v1::Job* response,
                                         bool expiry_fails_call = false);

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_WAIT_REACTOR_H_
