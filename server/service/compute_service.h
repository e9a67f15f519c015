#ifndef TESSERA_SERVER_SERVICE_COMPUTE_SERVICE_H_
#define TESSERA_SERVER_SERVICE_COMPUTE_SERVICE_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "server/common/fair_executor.h"
#include "server/core/validation.h"
#include "server/service/auth.h"
#include "server/service/forward.h"
#include "tessera/v1/compute.grpc.pb.h"

namespace tessera {

class RegionTickets;
class TenantTable;

/// tessera.v1.Compute: a stateless adapter over each tenant's TenantRuntime. Authenticates
/// the tenant key, maps wire types, and never blocks a gRPC thread on device work: calls
/// that wait (Launch/Submit with `wait`, WaitJob, Synchronize) are finished from the job's
/// completion, a timer, or the client's cancellation, whichever comes first.
///
/// WriteTensor and ReadTensor are raw methods (grpc::ByteBuffer): their bulk messages are read
/// and written by hand, each byte copied once between gRPC's slices and the tensor
/// (transfer_reactors.h).
///
/// In a fleet, a tenant's calls that reach this node while it lives on another are relayed
/// to its home (Forwarder, forward.h), except Locate and the region RPCs.
///
/// `authenticator` is borrowed and must outlive the service.
class ComputeService final
    : public v1::Compute::WithRawCallbackMethod_WriteTensor<
          v1::Compute::WithRawCallbackMethod_ReadTensor<v1::Compute::CallbackService>> {
 public:
  /// `tenants` (DefineKernel, DeleteKernel) is not owned and must outlive the service.
  /// `regions` (nullptr: no descriptor socket, BeginRegion is FAILED_PRECONDITION) is not
  /// owned and must outlive the service; `region_socket` is its path. `forwarding`: in a
  /// fleet (a node name), calls for tenants homed elsewhere are forwarded or redirected.
  ComputeService(const Authenticator* authenticator, TenantTable* tenants,
                 int64_t max_message_bytes, RegionTickets* regions = nullptr,
                 std::string region_socket = "", ForwardOptions forwarding = {})
      : authenticator_(authenticator),
        tenants_(tenants),
        max_message_bytes_(max_message_bytes),
        regions_(regions),
        region_socket_(std::move(region_socket)),
        forwarder_(
            forwarding.node_name.empty()
                ? nullptr
                : std::make_unique<Forwarder>(authenticator, tenants, std::move(forwarding))),
        transfers_("tensor transfers", kMaxPendingTransfers, kMaxPendingTransfersPerTenant,
                   kTransferThreads) {}

  grpc::ServerUnaryReactor* CreateTensor(grpc::CallbackServerContext* context,
                                         const v1::CreateTensorRequest* request,
                                         v1::TensorInfo* response) override;
  /// Raw: WriteTensorRequest messages in, a serialized TensorInfo out.
  grpc::ServerReadReactor<grpc::ByteBuffer>* WriteTensor(grpc::CallbackServerContext* context,
                                                         grpc::ByteBuffer* response) override;
  /// Raw: a serialized ReadTensorRequest in, ReadTensorResponse messages out.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ReadTensor(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request) override;
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
  grpc::ServerUnaryReactor* DefineKernel(grpc::CallbackServerContext* context,
                                         const v1::DefineKernelRequest* request,
                                         v1::KernelInfo* response) override;
  grpc::ServerUnaryReactor* DeleteKernel(grpc::CallbackServerContext* context,
                                         const v1::DeleteKernelRequest* request,
                                         v1::DeleteKernelResponse* response) override;
  grpc::ServerUnaryReactor* Locate(grpc::CallbackServerContext* context,
                                   const v1::LocateRequest* request,
                                   v1::Location* response) override;
  grpc::ServerUnaryReactor* GetUsage(grpc::CallbackServerContext* context,
                                     const v1::GetUsageRequest* request,
                                     v1::Usage* response) override;

  // Regions (compute_regions.cc).
  grpc::ServerUnaryReactor* BeginRegion(grpc::CallbackServerContext* context,
                                        const v1::BeginRegionRequest* request,
                                        v1::RegionTicket* response) override;
  grpc::ServerUnaryReactor* FinishRegion(grpc::CallbackServerContext* context,
                                         const v1::FinishRegionRequest* request,
                                         v1::Region* response) override;
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* context,
                                        const v1::ListRegionsRequest* request,
                                        v1::ListRegionsResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* context,
                                             const v1::UnregisterRegionRequest* request,
                                             v1::UnregisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* WriteTensorFromRegion(grpc::CallbackServerContext* context,
                                                  const v1::WriteTensorFromRegionRequest* request,
                                                  v1::TensorInfo* response) override;
  grpc::ServerUnaryReactor* ReadTensorIntoRegion(
      grpc::CallbackServerContext* context, const v1::ReadTensorIntoRegionRequest* request,
      v1::ReadTensorIntoRegionResponse* response) override;

 private:
  /// The reactor relaying this call to the tenant's home (Forwarder::ForwardUnary); nullptr
  /// when it is this node's to answer, and always on a single server.
  grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* context, const char* rpc,
                                    const google::protobuf::MessageLite& request,
                                    google::protobuf::MessageLite* response);
  /// The redirect of a region RPC for a tenant homed elsewhere (Forwarder::RedirectRegion);
  /// nullptr otherwise.
  grpc::ServerUnaryReactor* RedirectRegion(grpc::CallbackServerContext* context, const char* rpc);
  /// Authenticates, runs `body(runtime, log)` inline, finishes with its status.
  template <typename Body>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* context, const char* rpc, Body body);
  /// The same, with `body` run on the transfer executor (it may block on disk).
  template <typename Body>
  grpc::ServerUnaryReactor* ServeOffThread(grpc::CallbackServerContext* context, const char* rpc,
                                           Body body);
  /// Enqueues a job and answers at once, or when it finishes if `wait`.
  grpc::ServerUnaryReactor* Enqueue(grpc::CallbackServerContext* context, const char* rpc,
                                    int64_t stream, std::vector<LaunchSpec> steps, bool program,
                                    bool wait, const google::protobuf::Duration* queue_timeout,
                                    v1::Job* response, absl::Status parse_error);

  /// Threads that copy tensor bytes (CreateTensor data, WriteTensor and ReadTensor chunks)
  /// and commit tenant kernels, so that no gRPC reaction copies or syncs. Tenants share them
  /// by weighted fair queueing (FairExecutor, weight = compute share): a tenant with one chunk
  /// waiting goes before one with many. A call has at most one task queued, so a tenant has
  /// at most quota.max_requests_in_flight (≤ kMaxRequestsInFlight): one within its quota is
  /// never refused here, and with no global cap one tenant's backlog never refuses another's
  /// call. The queue is bounded by the sum of the tenants' quotas.
  static constexpr int kTransferThreads = 4;
  static constexpr size_t kMaxPendingTransfers = std::numeric_limits<size_t>::max();
  static constexpr size_t kMaxPendingTransfersPerTenant = kMaxRequestsInFlight;

  const Authenticator* const authenticator_;
  TenantTable* const tenants_;
  const int64_t max_message_bytes_;
  RegionTickets* const regions_;
  const std::string region_socket_;
  const std::unique_ptr<Forwarder> forwarder_;  // null on a single server
  FairExecutor transfers_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_COMPUTE_SERVICE_H_
