#include "server/backend/cuda/driver.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

#include "server/backend/gpu_policy.h"

namespace tessera::cuda {

// gpu_policy classifies errors by number on hosts without cuda.h; keep the two in step.
static_assert(CUDA_ERROR_ILLEGAL_ADDRESS == 700 && CUDA_ERROR_LAUNCH_FAILED == 719 &&
              CUDA_ERROR_MPS_SERVER_NOT_READY == 807 && CUDA_ERROR_MPS_CLIENT_TERMINATED == 810 &&
              CUDA_ERROR_OUT_OF_MEMORY == 2 && CUDA_ERROR_MPS_MAX_CLIENTS_REACHED == 808 &&
              CUDA_ERROR_CONTEXT_IS_DESTROYED == 709 && CUDA_ERROR_CONTAINED == 226);

// The ABI the entry points are requested for: the toolkit this module was built with.
constexpr int kAbiVersion = CUDA_VERSION;

Driver::~Driver() {
  if (handle_ != nullptr) dlclose(handle_);
}

absl::StatusOr<std::unique_ptr<Driver>> Driver::Load() {
  auto driver = std::make_unique<Driver>();
  driver->handle_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver->handle_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA driver: cannot load libcuda.so.1 (", dlerror(), ")"));
  }
  using GetProcAddress = decltype(&::cuGetProcAddress);
  auto get_proc = reinterpret_cast<GetProcAddress>(dlsym(driver->handle_, "cuGetProcAddress_v2"));
  auto get_version = reinterpret_cast<decltype(&::cuDriverGetVersion)>(
      dlsym(driver->handle_, "cuDriverGetVersion"));
  if (get_proc == nullptr || get_version == nullptr) {
    return absl::FailedPreconditionError(
        "the CUDA driver is too old: libcuda.so.1 has no cuGetProcAddress_v2 (CUDA 12 or later "
        "is needed, CUDA 13 for this build)");
  }
  if (get_version(&driver->version) != CUDA_SUCCESS || driver->version < kAbiVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA driver supports CUDA ", driver->version / 1000, ".", driver->version % 1000 / 10,
        " but this CUDA module was built with CUDA ", kAbiVersion / 1000, ".",
        kAbiVersion % 1000 / 10, "; install a newer NVIDIA driver or use --backend=cpu"));
  }
  auto resolve = [&](const char* name, void** slot) {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = get_proc(name, slot, kAbiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS) *slot = nullptr;
    return *slot != nullptr;
  };
  std::string missing;
#define TESSERA_CUDA_RESOLVE_REQUIRED(name)                        \
  if (!resolve(#name, reinterpret_cast<void**>(&driver->name))) {  \
    absl::StrAppend(&missing, missing.empty() ? "" : ", ", #name); \
  }
  TESSERA_CUDA_REQUIRED(TESSERA_CUDA_RESOLVE_REQUIRED)
#undef TESSERA_CUDA_RESOLVE_REQUIRED
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA driver lacks entry points this backend needs: ", missing));
  }
  bool green = true;
#define TESSERA_CUDA_RESOLVE_OPTIONAL(name) \
  green = resolve(#name, reinterpret_cast<void**>(&driver->name)) && green;
  TESSERA_CUDA_OPTIONAL(TESSERA_CUDA_RESOLVE_OPTIONAL)
#undef TESSERA_CUDA_RESOLVE_OPTIONAL
  driver->green_entry_points = green;
  CUresult init = driver->cuInit(0);
  if (init != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuInit failed: ", driver->ErrorName(init),
                     init == CUDA_ERROR_NO_DEVICE ? " (no CUDA device is visible)" : ""));
  }
  return driver;
}

std::string Driver::ErrorName(CUresult result) const {
  const char* name = nullptr;
  if (cuGetErrorName == nullptr || cuGetErrorName(result, &name) != CUDA_SUCCESS ||
      name == nullptr) {
    return absl::StrCat("CUresult ", static_cast<int>(result));
  }
  return name;
}

absl::Status Driver::Check(CUresult result, absl::string_view what) const {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  if (on_process_fatal && ClassifyCudaError(static_cast<int>(result)).process_fatal) {
    on_process_fatal(result);
  }
  const char* description = nullptr;
  if (cuGetErrorString == nullptr || cuGetErrorString(result, &description) != CUDA_SUCCESS ||
      description == nullptr) {
    description = "no description";
  }
  return CudaErrorStatus(static_cast<int>(result), ErrorName(result), description, what);
}

}  // namespace tessera::cuda
