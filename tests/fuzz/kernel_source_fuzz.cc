// The tenant-defined kernel language front end (kernels/expr: lexer, the .tk text parser
// ParseSource, the checker and program builder Compile), from source text to a program that
// both backends accept and the CPU backend runs (kernel_checks.h says what is checked).
//
// An input that starts with "kernel" is a whole definition as DefineKernel's `source` carries
// it. Any other input is a body: its first byte picks one of the signatures below, so that
// the fuzzer spends its time in the expression checker rather than in the header.
#include <cstdint>
#include <iterator>
#include <string>

#include "absl/strings/match.h"

#include "kernels/expr/compile.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/kernel_checks.h"

namespace {

constexpr absl::string_view kSignatures[] = {
    "kernel k(x: f32, y: f32) -> (out: f32) params(alpha: float = 1.5, n: int = 2)",
    "kernel k(x: i64, y: i32) -> (out: i64) params(n: int = 3)",
    "kernel k(x: f16, m: bool) -> (out: f32, flag: bool)",
    "kernel k(x: f64[2], b: bf16) -> (out: f64) params(eps: float = 1e-5)",
    "kernel k(x: u8, y: f32) -> (out: u8)",
    "kernel k(x: f32[2]) -> (out: i64) params(t: float)",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  std::string source;
  if (absl::StartsWith(input, "kernel")) {
    source = std::string(input);
  } else {
    if (input.empty()) return 0;
    const absl::string_view signature =
        kSignatures[static_cast<uint8_t>(input[0]) % std::size(kSignatures)];
    source = absl::StrCat(signature, "\n{\n", input.substr(1), "\n}\n");
  }
  absl::StatusOr<tessera::kernels::expr::Definition> definition =
      tessera::kernels::expr::ParseSource(source);
  if (!definition.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(definition.status()), definition.status().ToString());
    FUZZ_CHECK(definition.status().message().size() <= 2048, "an error message of ",
               definition.status().message().size(), " bytes");
    return 0;
  }
  // Attributes a launch of a reduction may carry (the signatures' parameters take defaults).
  tessera::kernels::Attrs attrs;
  if (size % 3 == 1) attrs["axes"] = std::vector<int64_t>{-1};
  if (size % 3 == 2) attrs["keepdims"] = true;
  if (absl::StrContains(source, "params(t: float)")) attrs["t"] = 0.25;
  uint64_t seed = 0;
  for (size_t i = 0; i < size; ++i) seed = seed * 131 + data[i];
  tessera::fuzz::CheckDefinition(*std::move(definition), {}, std::move(attrs), seed);
  return 0;
}
