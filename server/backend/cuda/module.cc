// The module's exported entry points (cuda_module.h); everything else is hidden.
#include "server/backend/cuda/cuda_backend.h"
#include "server/backend/cuda_module.h"

extern "C" __attribute__((visibility("default"))) void tessera_cuda_backend_create(
    const tessera::CudaModuleOptions& options,
    absl::StatusOr<std::unique_ptr<tessera::Backend>>* result) {
  absl::StatusOr<std::unique_ptr<tessera::cuda::CudaBackend>> backend =
      tessera::cuda::CudaBackend::Create(options);
  if (!backend.ok()) {
    *result = backend.status();
  } else {
    *result = std::unique_ptr<tessera::Backend>(std::move(*backend));
  }
}

extern "C" __attribute__((visibility("default"))) void* tessera_cuda_context_handle(
    tessera::TenantContext& context) {
  return tessera::cuda::RawContextOf(context);
}

extern "C" __attribute__((visibility("default"))) absl::Status tessera_cuda_inject_fault(
    tessera::TenantContext& context, int stream) {
  return tessera::cuda::InjectFaultInto(context, stream);
}
