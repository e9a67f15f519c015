#ifndef TESSERA_SERVER_SERVICE_COMPUTE_SERVICE_H_
#define TESSERA_SERVER_SERVICE_COMPUTE_SERVICE_H_

#include "server/service/auth.h"
#include "tessera/v1/compute.grpc.pb.h"

namespace tessera {

/// tessera.v1.Compute. The data plane (tensors, kernels, jobs) is not in this release:
/// every RPC authenticates the tenant key, so clients can already check their credentials,
/// and then answers UNIMPLEMENTED. The data-plane issue replaces these bodies with calls
/// into the core; the authentication and logging edge stays.
///
/// `authenticator` is borrowed and must outlive the service.
class ComputeService final : public v1::Compute::CallbackService {
 public:
  explicit ComputeService(const Authenticator* authenticator) : authenticator_(authenticator) {}

  grpc::ServerUnaryReactor* CreateTensor(grpc::CallbackServerContext* context,
                                         const v1::CreateTensorRequest* request,
                                         v1::TensorInfo* response) override;
  grpc::ServerReadReactor<v1::WriteTensorRequest>* WriteTensor(grpc::CallbackServerContext* context,
                                                               v1::TensorInfo* response) override;
  grpc::ServerWriteReactor<v1::ReadTensorResponse>* ReadTensor(
      grpc::CallbackServerContext* context, const v1::ReadTensorRequest* request) override;
  grpc::ServerUnaryReactor* GetTensor(grpc::CallbackServerContext* context,
                                      const v1::GetTensorRequest* request,
                                      v1::TensorInfo* response) override;
  grpc::ServerUnaryReactor* ListTensors(grpc::CallbackServerContext* context,
                                        const v1::ListTensorsRequest* request,
                                        v1::ListTensorsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteTensor(grpc::CallbackServerContext* context,
                                         const v1::DeleteTensorRequest* request,
                                         v1::DeleteTensorResponse* response) override;
  grpc::ServerUnaryReactor* Launch(grpc::CallbackServerContext* context,
                                   const v1::LaunchRequest* request, v1::Job* response) override;
  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* context,
                                   const v1::SubmitRequest* request, v1::Job* response) override;
  grpc::ServerUnaryReactor* WaitJob(grpc::CallbackServerContext* context,
                                    const v1::WaitJobRequest* request, v1::Job* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerUnaryReactor* Synchronize(grpc::CallbackServerContext* context,
                                        const v1::SynchronizeRequest* request,
                                        v1::SynchronizeResponse* response) override;
  grpc::ServerUnaryReactor* ListKernels(grpc::CallbackServerContext* context,
                                        const v1::ListKernelsRequest* request,
                                        v1::ListKernelsResponse* response) override;
  grpc::ServerUnaryReactor* GetUsage(grpc::CallbackServerContext* context,
                                     const v1::GetUsageRequest* request,
                                     v1::Usage* response) override;

 private:
  /// The status of a data-plane call: the authentication error, else UNIMPLEMENTED.
  grpc::Status NotYet(grpc::CallbackServerContext* context, const char* rpc) const;
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context, const char* rpc) const;

  const Authenticator* const authenticator_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_COMPUTE_SERVICE_H_
