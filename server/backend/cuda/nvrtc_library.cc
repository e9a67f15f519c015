#include "server/backend/cuda/nvrtc_library.h"

#include <algorithm>

#include <dlfcn.h>
#include <nvrtc.h>

namespace tessera::cuda {

// clang-format off
#define TESSERA_NVRTC_ENTRIES(X) \
  X(nvrtcVersion)                \
  X(nvrtcGetNumSupportedArchs)   \
  X(nvrtcGetSupportedArchs)      \
  X(nvrtcCreateProgram)          \
  X(nvrtcDestroyProgram)         \
  X(nvrtcCompileProgram)         \
  X(nvrtcGetProgramLogSize)      \
  X(nvrtcGetProgramLog)          \
  X(nvrtcGetCUBINSize)           \
  X(nvrtcGetCUBIN)               \
  X(nvrtcGetPTXSize)             \
  X(nvrtcGetPTX)                 \
  X(nvrtcGetErrorString)
// clang-format on

struct NvrtcLibrary::Api {
#define TESSERA_NVRTC_MEMBER(name) decltype(&::name) name = nullptr;
  TESSERA_NVRTC_ENTRIES(TESSERA_NVRTC_MEMBER)
#undef TESSERA_NVRTC_MEMBER
};

std::unique_ptr<NvrtcLibrary> NvrtcLibrary::Load(std::string* error) {
  std::unique_ptr<NvrtcLibrary> nvrtc(new NvrtcLibrary());
  error->clear();
  for (const char* file :
       {"libnvrtc.so.13", "libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so.13"}) {
    // Never unmapped (RTLD_NODELETE): NVRTC's copy of the C++ runtime keeps memory in its
    // statics, which LeakSanitizer reports as a leak once the library is gone.
    nvrtc->handle_ = dlopen(file, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (nvrtc->handle_ != nullptr) break;
    const char* why = dlerror();
    *error += std::string(error->empty() ? "" : "; ") + (why != nullptr ? why : file);
  }
  if (nvrtc->handle_ == nullptr) return nullptr;
  nvrtc->api_ = std::make_unique<Api>();
  std::string missing;
#define TESSERA_NVRTC_RESOLVE(name)                                                      \
  nvrtc->api_->name = reinterpret_cast<decltype(&::name)>(dlsym(nvrtc->handle_, #name)); \
  if (nvrtc->api_->name == nullptr) missing += std::string(missing.empty() ? "" : ", ") + #name;
  TESSERA_NVRTC_ENTRIES(TESSERA_NVRTC_RESOLVE)
#undef TESSERA_NVRTC_RESOLVE
  if (!missing.empty()) {
    *error = "the NVRTC library lacks " + missing;
    return nullptr;
  }
  return nvrtc;
}

NvrtcLibrary::~NvrtcLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

std::string NvrtcLibrary::Version() const {
  int major = 0, minor = 0;
  api_->nvrtcVersion(&major, &minor);
  return "nvrtc " + std::to_string(major) + "." + std::to_string(minor);
}

std::vector<int> NvrtcLibrary::Architectures() const {
  int count = 0;
  if (api_->nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS || count <= 0) return {};
  std::vector<int> archs(static_cast<size_t>(count));
  if (api_->nvrtcGetSupportedArchs(archs.data()) != NVRTC_SUCCESS) return {};
  std::sort(archs.begin(), archs.end());
  return archs;
}

int NvrtcLibrary::Compile(const std::string& source, int arch, const std::string& name,
                          std::string* image, std::string* error) const {
  const std::vector<int> archs = Architectures();
  if (archs.empty()) {
    *error = Version() + " lists no GPU architecture";
    return kCompilerNoNvrtc;
  }
  if (arch < archs.front()) {
    *error = Version() + " cannot compile for sm_" + std::to_string(arch) + " (it supports sm_" +
             std::to_string(archs.front()) + " to sm_" + std::to_string(archs.back()) + ")";
    return kCompilerUnsupportedArch;
  }
  // A GPU newer than this NVRTC gets PTX of the newest architecture NVRTC knows, which the
  // driver compiles for the GPU (every architecture runs PTX of an older one).
  int target = arch;
  if (std::find(archs.begin(), archs.end(), arch) == archs.end()) {
    target = archs.front();
    for (int a : archs) {
      if (a <= arch) target = a;
    }
  }
  const bool ptx = target != arch || arch > archs.back();
  const std::string gpu =
      "--gpu-architecture=" + std::string(ptx ? "compute_" : "sm_") + std::to_string(target);
  // No FMA contraction: a * b + c rounds twice, as the CPU backend computes it.
  const char* options[] = {gpu.c_str(), "--fmad=false", "--std=c++17"};
  nvrtcProgram program = nullptr;
  nvrtcResult r = api_->nvrtcCreateProgram(&program, source.c_str(), (name + ".cu").c_str(), 0,
                                           nullptr, nullptr);
  if (r != NVRTC_SUCCESS) {
    *error = std::string("nvrtcCreateProgram: ") + api_->nvrtcGetErrorString(r);
    return r == NVRTC_ERROR_OUT_OF_MEMORY ? kCompilerOutOfMemory : kCompilerUsage;
  }
  r = api_->nvrtcCompileProgram(program, 3, options);
  int status = kCompilerOk;
  if (r != NVRTC_SUCCESS) {
    size_t size = 0;
    std::string log;
    if (api_->nvrtcGetProgramLogSize(program, &size) == NVRTC_SUCCESS && size > 1) {
      log.resize(size);
      api_->nvrtcGetProgramLog(program, log.data());
      log.resize(size - 1);
    }
    *error = std::string(api_->nvrtcGetErrorString(r)) + " (" + gpu + ")" +
             (log.empty() ? "" : ":\n" + log);
    status = r == NVRTC_ERROR_OUT_OF_MEMORY ? kCompilerOutOfMemory : kCompilerRejected;
  } else {
    size_t size = 0;
    r = ptx ? api_->nvrtcGetPTXSize(program, &size) : api_->nvrtcGetCUBINSize(program, &size);
    if (r == NVRTC_SUCCESS) {
      image->resize(size);  // PTX's size counts its NUL, which cuModuleLoadData needs
      r = ptx ? api_->nvrtcGetPTX(program, image->data())
              : api_->nvrtcGetCUBIN(program, image->data());
    }
    if (r != NVRTC_SUCCESS) {
      *error = std::string("reading the compiled image: ") + api_->nvrtcGetErrorString(r);
      status = r == NVRTC_ERROR_OUT_OF_MEMORY ? kCompilerOutOfMemory : kCompilerUsage;
    }
  }
  api_->nvrtcDestroyProgram(&program);
  return status;
}

int ParseArchitecture(const std::string& flag) {
  const std::string prefix = "--gpu-architecture=sm_";
  if (flag.compare(0, prefix.size(), prefix) != 0 || flag.size() == prefix.size() ||
      flag.size() > prefix.size() + 4) {
    return 0;
  }
  int arch = 0;
  for (size_t i = prefix.size(); i < flag.size(); ++i) {
    if (flag[i] < '0' || flag[i] > '9') return 0;
    arch = arch * 10 + (flag[i] - '0');
  }
  return arch;
}

}  // namespace tessera::cuda
