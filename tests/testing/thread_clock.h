#ifndef TESSERA_TESTS_TESTING_THREAD_CLOCK_H_
#define TESSERA_TESTS_TESTING_THREAD_CLOCK_H_

// CPU time of one thread of this process, found by its name: how a test or benchmark reads
// what a backend's own thread (the CUDA completion thread, "cuda-completion") spends.
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <time.h>

namespace tessera::testing {

/// The CPU clock of this process's thread named `name` (/proc/self/task/*/comm), if any.
inline std::optional<clockid_t> ThreadClock(const std::string& name) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(entry.path() / "comm");
    std::string line;
    std::getline(comm, line);
    if (line != name) continue;
    const unsigned tid = static_cast<unsigned>(std::stoul(entry.path().filename().string()));
    // Linux's per-thread scheduler clock (CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED), as glibc's
    // pthread_getcpuclockid builds it (a negative id); readable for any thread of this process.
    return static_cast<clockid_t>((~tid << 3) | 6u);
  }
  return std::nullopt;
}

/// `clock`'s reading in seconds.
inline double ClockSeconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_THREAD_CLOCK_H_
