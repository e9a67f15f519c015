#ifndef TESSERA_SERVER_SERVICE_TRANSFER_REACTORS_H_
#define TESSERA_SERVER_SERVICE_TRANSFER_REACTORS_H_

// The streamed transfers, WriteTensor (uploads) and ReadTensor (downloads): one reactor class
// per call, registered as raw callback methods so that their bulk messages are read and
// written by hand (transfer_wire.h) and each byte is copied once between gRPC's slices and
// the tensor. Reactions only hand work to the transfer executor, which copies.
#include <cstdint>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"

#include "server/common/fair_executor.h"
#include "server/core/tenant_runtime.h"
#include "server/service/auth.h"

namespace tessera {

/// A tenant's weight in the transfer executor: its compute share (at least 1).
double TransferWeight(const TenantRuntime& runtime);

/// The reactor of one WriteTensor call (`response`: the serialized TensorInfo answer). It
/// deletes itself when gRPC is done with the call. `auth` and `transfers` are borrowed and
/// must outlive the call (the service owns them and shuts the server down first).
grpc::ServerReadReactor<grpc::ByteBuffer>* NewWriteTensorReactor(
    grpc::CallbackServerContext* context, const Authenticator* auth, FairExecutor* transfers,
    grpc::ByteBuffer* response);

/// The reactor of one ReadTensor call (`request`: the serialized ReadTensorRequest, read before
/// this returns). Chunks are at most `max_message_bytes` / 2. Ownership as above.
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewReadTensorReactor(
    grpc::CallbackServerContext* context, const Authenticator* auth, FairExecutor* transfers,
    const grpc::ByteBuffer& request, int64_t max_message_bytes);

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_TRANSFER_REACTORS_H_
