#ifndef TESSERA_TESTS_FUZZ_FUZZ_UTIL_H_
#define TESSERA_TESTS_FUZZ_FUZZ_UTIL_H_

// Shared by the fuzz targets (tests/fuzz, docs/fuzzing.md): property checks that abort (so
// libFuzzer and the standalone driver report them as crashes), structured inputs, and a run
// of a validated launch on the CPU kernels.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

#include "kernels/registry.h"

/// Aborts with the condition and a message when a property of the code under test fails.
#define FUZZ_CHECK(cond, ...)                                                                   \
  do {                                                                                          \
    if (!(cond)) ::tessera::fuzz::Fail(__FILE__, __LINE__, #cond, ::absl::StrCat(__VA_ARGS__)); \
  } while (0)

namespace tessera::fuzz {

[[noreturn]] inline void Fail(const char* file, int line, const char* cond,
                              const std::string& message) {
  std::fprintf(stderr, "\n==fuzz== property failed at %s:%d: %s\n==fuzz== ", file, line, cond);
  std::fwrite(message.data(), 1, message.size(), stderr);  // all of it, NULs included
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::abort();
}

/// True when $TESSERA_FUZZ_SKIP_KNOWN is set (to anything but 0): the targets then pass over
/// inputs that reach a finding already reported and not yet fixed (docs/fuzzing.md lists them),
/// so that a long run can look for others. Off by default: ctest and plain runs report them.
bool SkipKnownFindings();

/// Parses `data` as `message` (false when the bytes are not one). Protobuf's own logging of
/// malformed input (invalid UTF-8 in strings) is silenced: it is the expected case here.
bool ParseMessage(const uint8_t* data, size_t size, google::protobuf::Message* message);

/// Runs a validated plan on the CPU kernels (what the CPU backend runs) with inputs filled
/// from `seed`, when its tensors hold at most `max_elements` elements in all; every buffer is
/// a separate allocation of exactly its byte size, so that ASan catches any access past one.
/// A failure of the run (the kernels never fail on a validated plan) is a finding.
void RunPlanOnCpu(const kernels::Plan& plan, uint64_t seed, int64_t max_elements = 2048);

}  // namespace tessera::fuzz

#endif  // TESSERA_TESTS_FUZZ_FUZZ_UTIL_H_
