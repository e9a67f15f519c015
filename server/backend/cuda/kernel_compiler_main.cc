// tessera-kernel-compiler: compiles one generated kernel (a tenant-defined kernel,
// kernels/expr/cuda_codegen.h) with NVRTC, for the CUDA backend module, which runs it as a
// child process with a deadline and memory and CPU limits (server/backend/cuda/nvrtc.h), so
// that NVRTC is never loaded into the server and a compiler crash or runaway compile ends
// here. The protocol (arguments, output, exit status) is in nvrtc_library.h.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include <unistd.h>

#include "common/fd_io.h"
#include "server/backend/cuda/kernel_compiler_args.h"
#include "server/backend/cuda/nvrtc_library.h"

namespace {

using namespace tessera::cuda;  // NOLINT: a small program
using tessera::ReadAll;
using tessera::WriteAll;

int Usage() {
  std::fputs(
      "usage: tessera-kernel-compiler --version\n"
      "       tessera-kernel-compiler --gpu-architecture=sm_XY [--name=NAME] < source.cu > image\n",
      stderr);
  return kCompilerUsage;
}

}  // namespace

int main(int argc, char** argv) {
  KernelCompilerArgs args;
  if (ParseKernelCompilerArgs(argc, argv, &args) != nullptr || args.malformed_arch ||
      !args.AsksOneThing()) {
    return Usage();
  }
  std::string error;
  std::unique_ptr<NvrtcLibrary> nvrtc = NvrtcLibrary::Load(&error);
  if (nvrtc == nullptr) {
    std::fprintf(stderr, "cannot load NVRTC (libnvrtc.so.13): %s\n", error.c_str());
    return kCompilerNoNvrtc;
  }
  if (args.version) {
    return WriteAll(1, nvrtc->Version() + "\n") ? kCompilerOk : kCompilerUsage;
  }
  std::string source, image;
  if (!ReadAll(0, &source)) {
    std::fprintf(stderr, "reading the source: %s\n", std::strerror(errno));
    return kCompilerUsage;
  }
  const int status = nvrtc->Compile(source, args.arch, args.name, &image, &error);
  if (status != kCompilerOk) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return status;
  }
  if (!WriteAll(1, image)) {
    std::fprintf(stderr, "writing the image: %s\n", std::strerror(errno));
    return kCompilerUsage;
  }
  return kCompilerOk;
}
