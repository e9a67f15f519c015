#include "server/backend/cuda/kernel_compiler_args.h"

#include "server/backend/cuda/nvrtc_library.h"

namespace tessera::cuda {

const char* ParseKernelCompilerArgs(int argc, char** argv, KernelCompilerArgs* args) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--version") {
      args->version = true;
    } else if (arg.rfind("--gpu-architecture=", 0) == 0) {
      args->arch = ParseArchitecture(arg);
      if (args->arch == 0) args->malformed_arch = true;
    } else if (arg.rfind("--name=", 0) == 0) {
      args->name = arg.substr(7);
    } else {
      return argv[i];
    }
  }
  return nullptr;
}

}  // namespace tessera::cuda
