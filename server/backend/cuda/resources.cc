#include "server/backend/cuda/resources.h"

#include "server/backend/cuda/cuda_backend.h"

namespace tessera::cuda {

cublasStatus_t BlasHandle::Create(const Driver& driver, uint64_t workspace_bytes,
                                  CUresult& driver_error) {
  Reset();
  driver_error = CUDA_SUCCESS;
  cublasStatus_t status = cublasCreate(&handle_);
  if (status != CUBLAS_STATUS_SUCCESS) {
    handle_ = nullptr;
    return status;
  }
  CUdeviceptr memory = 0;
  driver_error = driver.cuMemAlloc(&memory, workspace_bytes);
  if (driver_error != CUDA_SUCCESS) {
    Reset();
    return CUBLAS_STATUS_ALLOC_FAILED;
  }
  workspace_ = DeviceMemory(driver, memory);
  workspace_bytes_ = workspace_bytes;
  status = cublasSetWorkspace(handle_, reinterpret_cast<void*>(memory), workspace_bytes);
  if (status != CUBLAS_STATUS_SUCCESS) Reset();
  return status;
}

cublasStatus_t BlasHandle::Bind(CUstream stream) const {
  cublasStatus_t status = cublasSetStream(handle_, stream);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  return cublasSetWorkspace(handle_, reinterpret_cast<void*>(workspace_.get()), workspace_bytes_);
}

void BlasHandle::Reset() {
  if (handle_ != nullptr) cublasDestroy(handle_);
  handle_ = nullptr;
  workspace_.Reset();
}

void Incarnation::Destroy() {
  absl::MutexLock use(&use_mu);
  if (context == nullptr) return;
  {
    ScopedContext scoped(*driver, context);
    user_modules.clear();
    blas.Reset();
    for (int i = 0; i < 2; ++i) {
      staging[i].Reset();
      staging_done[i].Reset();
    }
    streams.clear();
    copy.Reset();
  }
  if (green != nullptr) {
    driver->cuGreenCtxDestroy(green);
  } else {
    driver->cuCtxDestroy(context);
  }
  context = nullptr;
  green = nullptr;
  if (owner != nullptr && !sm_groups.empty()) owner->ReleaseSmGroups(device, sm_groups);
  sm_groups.clear();
}

CudaBuffer::~CudaBuffer() {
  absl::ReaderMutexLock use(&inc_->use_mu);
  if (!inc_->lost.load() && inc_->context != nullptr) {
    ScopedContext scoped(*inc_->driver, inc_->context);
    inc_->driver->cuMemFree(ptr_);
  }
}

}  // namespace tessera::cuda
