#include "server/service/wait_reactor.h"

#include "server/service/compute_convert.h"
#include "server/service/unary_call.h"

namespace tessera {

std::shared_ptr<TenantRuntime> AuthenticateWaiting(const Authenticator& auth, WaitReactor* reactor,
                                                   grpc::CallbackServerContext* context) {
  absl::StatusOr<std::shared_ptr<TenantRuntime>> runtime =
      AuthenticateTenantCall(auth, *context, reactor->log());
  if (!runtime.ok()) {
    reactor->CompleteIfUnclaimed(runtime.status());
    return nullptr;
  }
  return *std::move(runtime);
}

void AnswerNow(WaitReactor* reactor, v1::Job* response, const JobInfo& job,
               bool expiry_fails_call) {
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

TenantRuntime::JobCallback AnswerWithJob(WaitReactor* reactor, v1::Job* response,
                                         bool expiry_fails_call) {
  reactor->Hold();
  return [reactor, response, expiry_fails_call](const JobInfo& done) {
    AnswerNow(reactor, response, done, expiry_fails_call);
    reactor->Release();
  };
}

}  // namespace tessera
