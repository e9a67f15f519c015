#include "server/backend/cuda/resources.h"

#include <algorithm>
#include <iterator>

#include "server/backend/cuda/cuda_backend.h"

namespace tessera::cuda {

cublasStatus_t BlasHandle::Create(const Driver& driver, uint64_t workspace_bytes) {
  Reset();
  driver_ = &driver;
  workspace_bytes_ = workspace_bytes;
  cublasStatus_t status = cublasCreate(&handle_);
  if (status != CUBLAS_STATUS_SUCCESS) handle_ = nullptr;
  return status;
}

cublasStatus_t BlasHandle::Bind(CUstream stream, CUresult& driver_error) {
  driver_error = CUDA_SUCCESS;
  auto it = std::find_if(workspaces_.begin(), workspaces_.end(),
                         [&](const auto& w) { return w.first == stream; });
  if (it == workspaces_.end()) {
    CUdeviceptr memory = 0;
    driver_error = driver_->cuMemAlloc(&memory, workspace_bytes_);
    if (driver_error != CUDA_SUCCESS) return CUBLAS_STATUS_ALLOC_FAILED;
    workspaces_.emplace_back(stream, DeviceMemory(*driver_, memory));
    it = std::prev(workspaces_.end());
  }
  cublasStatus_t status = cublasSetStream(handle_, stream);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  return cublasSetWorkspace(handle_, reinterpret_cast<void*>(it->second.get()), workspace_bytes_);
}

bool BlasHandle::HasWorkspace(CUstream stream) const {
  return std::any_of(workspaces_.begin(), workspaces_.end(),
                     [&](const auto& w) { return w.first == stream; });
}

void BlasHandle::Reset() {
  if (handle_ != nullptr) cublasDestroy(handle_);
  handle_ = nullptr;
  workspaces_.clear();
}

void Incarnation::Destroy() {
  absl::MutexLock use(&use_mu);
  if (context == nullptr) return;
  {
    ScopedContext scoped(*driver, context);
    programs.clear();  // before the modules their graphs launch
    user_modules.clear();
    spare_events.clear();
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
