#ifndef TESSERA_SERVER_BACKEND_CUDA_NVRTC_LIBRARY_H_
#define TESSERA_SERVER_BACKEND_CUDA_NVRTC_LIBRARY_H_

// NVRTC loaded at run time (dlopen, as the module loads the driver), for the kernel compiler
// helper (kernel_compiler_main.cc) and the fake driver's test compiler: never linked into the
// server or the CUDA module, which run the helper as a child process (nvrtc.h). Plain C++
// without Abseil, and the protocol between the module and the helper.
#include <memory>
#include <string>
#include <vector>

namespace tessera::cuda {

// ---- The helper's protocol -----------------------------------------------------------------
//
//   tessera-kernel-compiler --version
//       stdout: "nvrtc MAJOR.MINOR\n" (what a compiled image depends on: part of the cache key)
//   tessera-kernel-compiler --gpu-architecture=sm_XY [--name=NAME] < source > image
//       stdin: CUDA C++; stdout: a cubin for sm_XY, or PTX (NUL-terminated) for the newest
//       architecture NVRTC has when sm_XY is newer than that (the driver JIT-compiles it).
//
// Exit status: kCompilerOk, or one of the below with the reason on stderr.
inline constexpr int kCompilerOk = 0;
inline constexpr int kCompilerUsage = 1;            // bad arguments, I/O error
inline constexpr int kCompilerNoNvrtc = 2;          // libnvrtc cannot be loaded
inline constexpr int kCompilerRejected = 3;         // the source does not compile (the log)
inline constexpr int kCompilerUnsupportedArch = 4;  // older than every architecture of NVRTC
inline constexpr int kCompilerOutOfMemory = 5;      // NVRTC ran out of memory

/// NVRTC's entry points, from libnvrtc.so.13 (else libnvrtc.so, else the toolkit's
/// /usr/local/cuda/lib64). Not thread-safe; one per process.
class NvrtcLibrary {
 public:
  /// Null with `*error` naming each file tried and why it failed.
  static std::unique_ptr<NvrtcLibrary> Load(std::string* error);
  ~NvrtcLibrary();
  NvrtcLibrary(const NvrtcLibrary&) = delete;
  NvrtcLibrary& operator=(const NvrtcLibrary&) = delete;

  /// "nvrtc 13.0".
  std::string Version() const;
  /// The architectures NVRTC generates code for (75, 80, ... 121).
  std::vector<int> Architectures() const;

  /// Compiles `source` for sm_`arch` (see the protocol above): a kCompiler* status, with the
  /// image in `*image` or the reason (the NVRTC log) in `*error`.
  int Compile(const std::string& source, int arch, const std::string& name, std::string* image,
              std::string* error) const;

 private:
  NvrtcLibrary() = default;
  struct Api;
  void* handle_ = nullptr;
  std::unique_ptr<Api> api_;
};

/// The architecture of "--gpu-architecture=sm_XY" (80 for sm_80); 0 when malformed.
int ParseArchitecture(const std::string& flag);

}  // namespace tessera::cuda

#endif  // TESSERA_SERVER_BACKEND_CUDA_NVRTC_LIBRARY_H_
