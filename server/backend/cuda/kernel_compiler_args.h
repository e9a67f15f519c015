#ifndef TESSERA_SERVER_BACKEND_CUDA_KERNEL_COMPILER_ARGS_H_
#define TESSERA_SERVER_BACKEND_CUDA_KERNEL_COMPILER_ARGS_H_

// The command line of the kernel compiler helper (the protocol in nvrtc_library.h), parsed once
// for tessera-kernel-compiler (kernel_compiler_main.cc) and the fake driver's test compiler
// (tests/fake_cuda/driver/fake_kernel_compiler.cc), which report a bad command line each in
// its own words. Plain C++ without Abseil.
#include <string>

namespace tessera::cuda {

/// What the command line asks for.
struct KernelCompilerArgs {
  bool version = false;         // --version
  int arch = 0;                 // the last --gpu-architecture=sm_XY; 0 if none or malformed
  bool malformed_arch = false;  // some --gpu-architecture= was malformed
  std::string name = "kernel";  // --name=NAME

  /// Asks for exactly one thing: --version, or a compilation for a well-formed architecture.
  bool AsksOneThing() const { return version != (arch != 0); }
};

/// Parses argv[1, argc) into `*args` (which starts as default-constructed): null, or the first
/// argument that is none of the protocol's, where parsing stops. A malformed architecture does
/// not stop it: it sets `malformed_arch` and `arch = 0`.
const char* ParseKernelCompilerArgs(int argc, char** argv, KernelCompilerArgs* args);

}  // namespace tessera::cuda

#endif  // TESSERA_SERVER_BACKEND_CUDA_KERNEL_COMPILER_ARGS_H_
