// The client's .npy reader (client/npy.cc, ParseNpy): what `tessera tensor put` reads from a
// user's file. Properties: it never crashes; an accepted array's byte count is exactly its
// element count times its dtype's size (the shape is what the server will be told); and
// FormatNpy writes it back to a file that parses to the same array.
#include <algorithm>
#include <cstdint>
#include <optional>

#include "absl/strings/str_join.h"

#include "kernels/dtype.h"
#include "tessera/npy.h"
#include "tests/fuzz/fuzz_util.h"

namespace {
__extension__ using Uint128 = unsigned __int128;  // GCC's -Wpedantic: an extension
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tessera::NpyArray> array = tessera::ParseNpy(bytes);
  if (!array.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(array.status()), array.status().ToString());
    return 0;
  }
  std::optional<tessera::kernels::DType> dtype =
      tessera::kernels::DTypeFromInt(static_cast<int>(array->dtype));
  FUZZ_CHECK(dtype.has_value(), "ParseNpy returned dtype ", static_cast<int>(array->dtype));

  // The exact byte count, without overflow (saturated past 2^64, which no data size equals).
  constexpr Uint128 kPast64 = static_cast<Uint128>(1) << 64;
  Uint128 expected = tessera::kernels::DTypeSize(*dtype);
  for (int64_t d : array->shape) {
    FUZZ_CHECK(d >= 0, "negative dimension ", d);
    expected = std::min(expected * static_cast<uint64_t>(d), kPast64);
  }
  FUZZ_CHECK(expected == array->data.size(), "ParseNpy accepted shape [",
             absl::StrJoin(array->shape, ", "), "] of ", tessera::kernels::DTypeName(*dtype), " (",
             tessera::kernels::DTypeSize(*dtype), " bytes each) with ", array->data.size(),
             " bytes of data");

  absl::StatusOr<std::string> written = tessera::FormatNpy(*array);
  FUZZ_CHECK(written.ok(), "FormatNpy refused a parsed array: ", written.status().ToString());
  absl::StatusOr<tessera::NpyArray> again = tessera::ParseNpy(*written);
  FUZZ_CHECK(again.ok(), "ParseNpy refused FormatNpy's output: ", again.status().ToString());
  FUZZ_CHECK(
      again->dtype == array->dtype && again->shape == array->shape && again->data == array->data,
      "FormatNpy/ParseNpy round trip changed shape [", absl::StrJoin(array->shape, ", "), "] to [",
      absl::StrJoin(again->shape, ", "), "]");
  return 0;
}
