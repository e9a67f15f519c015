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

#include "server/backend/cuda/nvrtc_library.h"
#include "server/common/fd_io.h"

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
  bool version = false;
  int arch = 0;
  std::string name = "kernel";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--version") {
      version = true;
    } else if (arg.rfind("--gpu-architecture=", 0) == 0) {
      arch = ParseArchitecture(arg);
      if (arch == 0) return Usage();
    } else if (arg.rfind("--name=", 0) == 0) {
      name = arg.substr(7);
    } else {
      return Usage();
    }
  }
  if (version == (arch != 0)) return Usage();
  std::string error;
  std::unique_ptr<NvrtcLibrary> nvrtc = NvrtcLibrary::Load(&error);
  if (nvrtc == nullptr) {
    std::fprintf(stderr, "cannot load NVRTC (libnvrtc.so.13): %s\n", error.c_str());
    return kCompilerNoNvrtc;
  }
  if (version) {
    return WriteAll(1, nvrtc->Version() + "\n") ? kCompilerOk : kCompilerUsage;
  }
  std::string source, image;
  if (!ReadAll(0, &source)) {
    std::fprintf(stderr, "reading the source: %s\n", std::strerror(errno));
    return kCompilerUsage;
  }
  const int status = nvrtc->Compile(source, arch, name, &image, &error);
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
