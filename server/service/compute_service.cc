#include "server/service/compute_service.h"

#include "absl/strings/str_cat.h"

#include "server/service/call.h"

namespace tessera {
namespace {

// A streaming call that ends at once with a status.
template <typename Message>
class FinishedReader final : public grpc::ServerReadReactor<Message> {
 public:
  explicit FinishedReader(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

template <typename Message>
class FinishedWriter final : public grpc::ServerWriteReactor<Message> {
 public:
  explicit FinishedWriter(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::Status ComputeService::NotYet(grpc::CallbackServerContext* context, const char* rpc) const {
  CallLog log(context, rpc);
  absl::StatusOr<std::string> tenant = authenticator_->AuthenticateTenant(*context);
  if (!tenant.ok()) return log.Finish(tenant.status());
  log.set_tenant(*tenant);
  return log.Finish(absl::UnimplementedError(
      absl::StrCat("Compute.", rpc,
                   " is not available in this release: the data plane (tensors, kernels, "
                   "jobs) is not implemented yet; your tenant key was accepted")));
}

grpc::ServerUnaryReactor* ComputeService::Unary(grpc::CallbackServerContext* context,
                                                const char* rpc) const {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(NotYet(context, rpc));
  return reactor;
}

grpc::ServerUnaryReactor* ComputeService::CreateTensor(grpc::CallbackServerContext* context,
                                                       const v1::CreateTensorRequest*,
                                                       v1::TensorInfo*) {
  return Unary(context, "CreateTensor");
}

grpc::ServerReadReactor<v1::WriteTensorRequest>* ComputeService::WriteTensor(
    grpc::CallbackServerContext* context, v1::TensorInfo*) {
  return new FinishedReader<v1::WriteTensorRequest>(NotYet(context, "WriteTensor"));
}

grpc::ServerWriteReactor<v1::ReadTensorResponse>* ComputeService::ReadTensor(
    grpc::CallbackServerContext* context, const v1::ReadTensorRequest*) {
  return new FinishedWriter<v1::ReadTensorResponse>(NotYet(context, "ReadTensor"));
}

grpc::ServerUnaryReactor* ComputeService::GetTensor(grpc::CallbackServerContext* context,
                                                    const v1::GetTensorRequest*, v1::TensorInfo*) {
  return Unary(context, "GetTensor");
}

grpc::ServerUnaryReactor* ComputeService::ListTensors(grpc::CallbackServerContext* context,
                                                      const v1::ListTensorsRequest*,
                                                      v1::ListTensorsResponse*) {
  return Unary(context, "ListTensors");
}

grpc::ServerUnaryReactor* ComputeService::DeleteTensor(grpc::CallbackServerContext* context,
                                                       const v1::DeleteTensorRequest*,
                                                       v1::DeleteTensorResponse*) {
  return Unary(context, "DeleteTensor");
}

grpc::ServerUnaryReactor* ComputeService::Launch(grpc::CallbackServerContext* context,
                                                 const v1::LaunchRequest*, v1::Job*) {
  return Unary(context, "Launch");
}

grpc::ServerUnaryReactor* ComputeService::Submit(grpc::CallbackServerContext* context,
                                                 const v1::SubmitRequest*, v1::Job*) {
  return Unary(context, "Submit");
}

grpc::ServerUnaryReactor* ComputeService::WaitJob(grpc::CallbackServerContext* context,
                                                  const v1::WaitJobRequest*, v1::Job*) {
  return Unary(context, "WaitJob");
}

grpc::ServerUnaryReactor* ComputeService::CancelJob(grpc::CallbackServerContext* context,
                                                    const v1::CancelJobRequest*, v1::Job*) {
  return Unary(context, "CancelJob");
}

grpc::ServerUnaryReactor* ComputeService::Synchronize(grpc::CallbackServerContext* context,
                                                      const v1::SynchronizeRequest*,
                                                      v1::SynchronizeResponse*) {
  return Unary(context, "Synchronize");
}

grpc::ServerUnaryReactor* ComputeService::ListKernels(grpc::CallbackServerContext* context,
                                                      const v1::ListKernelsRequest*,
                                                      v1::ListKernelsResponse*) {
  return Unary(context, "ListKernels");
}

grpc::ServerUnaryReactor* ComputeService::GetUsage(grpc::CallbackServerContext* context,
                                                   const v1::GetUsageRequest*, v1::Usage*) {
  return Unary(context, "GetUsage");
}

}  // namespace tessera
