// tessera-fake-kernel-compiler: the kernel compiler the CUDA module runs in tests on the fake
// driver (TESSERA_KERNEL_COMPILER, set by ctest for the fake_cuda tests). It speaks the
// protocol of tessera-kernel-compiler (server/backend/cuda/nvrtc_library.h) and does what it
// does, then more:
//   1. compiles the source with the real NVRTC for the requested architecture, which must
//      succeed (so every generated kernel the tests run is known to compile for the GPUs the
//      tests ask for; there is no skipping: without NVRTC this fails as the real one does);
//   2. compiles the same source for the host, as the build compiles the catalog's kernels
//      for the fake driver (device.h force-included, every load and store checked), into a
//      shared object with an entry table (host_module.h), cached by content in
//      $TMPDIR/tessera-fake-kernels-<uid>/;
//   3. answers with an image the fake driver's cuModuleLoadData recognizes: the magic line
//      "TESSERA-FAKE-HOST-MODULE" and the shared object's path. The production compiler never
//      produces one, and NVIDIA's driver rejects it.
// --version says "nvrtc X.Y + fake host modules", so that cache keys never mix its images
// with real ones. Test hooks: a kernel named fake_compiler_hang* sleeps before compiling
// (for the deadline tests); $TESSERA_FAKE_KERNEL_COMPILER_LOG, if set, gets one line per
// NVRTC compilation ("nvrtc sm_90 <entry point> <image bytes>").
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fd_io.h"
#include "server/backend/cuda/kernel_compiler_args.h"
#include "server/backend/cuda/nvrtc_library.h"

extern char** environ;

namespace {

using namespace tessera::cuda;  // NOLINT: a small program
using tessera::ReadAll;
using tessera::WriteAll;

constexpr char kMagic[] = "TESSERA-FAKE-HOST-MODULE\n";

std::string FileText(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// FNV-1a, 64 bits: a cache key for a test's temporary files.
std::string Digest(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

// The entry points of a generated kernel: `extern "C" __global__ void [__launch_bounds__(N)]
// NAME(`.
std::vector<std::string> EntryPoints(const std::string& source) {
  std::vector<std::string> names;
  const std::string marker = "extern \"C\" __global__ void ";
  for (size_t at = source.find(marker); at != std::string::npos; at = source.find(marker, at + 1)) {
    size_t p = at + marker.size();
    if (source.compare(p, 18, "__launch_bounds__(") == 0) p = source.find(')', p) + 2;
    const size_t end = source.find('(', p);
    if (end != std::string::npos) names.push_back(source.substr(p, end - p));
  }
  return names;
}

// Runs argv with stdout and stderr to `log`; its exit status (-1: it did not run or died).
int Run(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The host build of `source` (cached), or "" with the compiler's output in `*error`.
std::string HostModule(const std::string& source, std::string* error) {
  const std::vector<std::string> entries = EntryPoints(source);
  if (entries.empty()) {
    *error = "the source has no extern \"C\" __global__ entry point";
    return "";
  }
  std::string text = source;
  text += "\n// Appended by tessera-fake-kernel-compiler: the module's entry table.\n";
  text += "#include \"tests/fake_cuda/driver/host_module.h\"\n";
  text += "extern \"C\" __attribute__((visibility(\"default\"))) const TesseraFakeHostEntry\n";
  text += "    TESSERA_FAKE_HOST_ENTRIES[] = {\n";
  for (const std::string& e : entries) {
    text += "        TesseraFakeEntryOf<decltype(&" + e + ")>::Make(\"" + e + "\", &" + e + "),\n";
  }
  text += "        {nullptr, nullptr, nullptr, 0, 0}};\n";
  const std::vector<std::string> flags = {
      "-std=c++17", "-O1", "-fPIC", "-shared", "-fvisibility=hidden", "-fno-exceptions", "-include",
      TESSERA_FAKE_DEVICE_HEADER, "-I", TESSERA_SOURCE_DIR, "-isystem", TESSERA_CUDA_INCLUDE_DIR,
      // As the catalog's kernels are built for the fake (tests/CMakeLists.txt): every load
      // and store calls the fake's check.
      "-fno-sanitize=all", "-fsanitize=kernel-address",
      "--param=asan-instrumentation-with-call-threshold=0", "--param=asan-stack=0",
      "--param=asan-globals=0"};
  std::string key_text = TESSERA_FAKE_CXX;
  for (const std::string& f : flags) key_text += " " + f;
  key_text += FileText(TESSERA_FAKE_DEVICE_HEADER) +
              FileText(TESSERA_SOURCE_DIR "/tests/fake_cuda/driver/host_module.h") + text;
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                          "/tessera-fake-kernels-" + std::to_string(getuid());
  mkdir(dir.c_str(), 0700);
  const std::string base = dir + "/" + Digest(key_text);
  const std::string module = base + ".so";
  if (access(module.c_str(), R_OK) == 0) return module;
  // One host build per source: a compilation of the same kernel for another architecture,
  // running meanwhile, waits for this one's module (the lock goes when this process exits).
  const int lock = open((base + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (lock >= 0) flock(lock, LOCK_EX);
  if (access(module.c_str(), R_OK) == 0) return module;
  const std::string mine = base + "." + std::to_string(getpid());
  const int fd = open((mine + ".cc").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const bool written = fd >= 0 && WriteAll(fd, text);
  if (fd >= 0) close(fd);
  if (!written) {
    *error = "cannot write " + mine + ".cc: " + std::strerror(errno);
    return "";
  }
  std::vector<std::string> args = {TESSERA_FAKE_CXX};
  args.insert(args.end(), flags.begin(), flags.end());
  args.insert(args.end(), {mine + ".cc", TESSERA_FAKE_GLUE_OBJECT, "-o", mine + ".so",
                           "-L" TESSERA_FAKE_CUDA_LIB_DIR, "-l:libcuda.so.1"});
  const int status = Run(args, mine + ".log");
  std::string log = FileText((mine + ".log").c_str());
  std::remove((mine + ".cc").c_str());
  std::remove((mine + ".log").c_str());
  if (status != 0 || std::rename((mine + ".so").c_str(), module.c_str()) != 0) {
    std::remove((mine + ".so").c_str());
    *error = "the host build failed (status " + std::to_string(status) + "):\n" + log;
    return "";
  }
  return module;
}

}  // namespace

int main(int argc, char** argv) {
  KernelCompilerArgs args;
  if (const char* unknown = ParseKernelCompilerArgs(argc, argv, &args); unknown != nullptr) {
    std::fprintf(stderr, "tessera-fake-kernel-compiler: unknown argument %s\n", unknown);
    return kCompilerUsage;
  }
  if (!args.AsksOneThing()) return kCompilerUsage;
  std::string error;
  std::unique_ptr<NvrtcLibrary> nvrtc = NvrtcLibrary::Load(&error);
  if (nvrtc == nullptr) {
    std::fprintf(stderr, "cannot load NVRTC (libnvrtc.so.13): %s\n", error.c_str());
    return kCompilerNoNvrtc;
  }
  if (args.version) return WriteAll(1, nvrtc->Version() + " + fake host modules\n") ? 0 : 1;
  if (args.name.rfind("fake_compiler_hang", 0) == 0) {
    std::this_thread::sleep_for(std::chrono::hours(1));
  }
  std::string source, image;
  if (!ReadAll(0, &source)) return kCompilerUsage;
  const int status = nvrtc->Compile(source, args.arch, args.name, &image, &error);
  if (status != kCompilerOk) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return status;
  }
  if (const char* log = std::getenv("TESSERA_FAKE_KERNEL_COMPILER_LOG"); log != nullptr && *log) {
    const std::vector<std::string> entries = EntryPoints(source);
    const std::string line = "nvrtc sm_" + std::to_string(args.arch) + " " +
                             (entries.empty() ? "?" : entries[0]) + " " +
                             std::to_string(image.size()) + "\n";
    const int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0) {
      WriteAll(fd, line);
      close(fd);
    }
  }
  const std::string module = HostModule(source, &error);
  if (module.empty()) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return kCompilerRejected;
  }
  return WriteAll(1, kMagic + module + "\n" + std::string(1, '\0')) ? kCompilerOk : kCompilerUsage;
}
