// How the `tessera` CLI writes numbers for people: bytes, sizes, durations, rates and the
// transfer progress line. Pure functions, unit tested in tests/unit/client/cli_parse_test.cc.
#ifndef TESSERA_CLIENT_CLI_FORMAT_H_
#define TESSERA_CLIENT_CLI_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

#include "client/cli/parse.h"

namespace tessera::cli {

/// "1,073,741,824".
std::string GroupThousands(uint64_t n);

/// A byte count in the largest unit of `units` that keeps the value at least 1: "512 B",
/// "2 GiB", "24.8 MiB" (binary: KiB, MiB, ... for kBinary and kBytes) or "1 GB", "1.5 GB"
/// (decimal: kB, MB, ... for kDecimal). A whole number when exact, else one decimal.
std::string FormatBytes(uint64_t bytes, SizeUnits units = SizeUnits::kBinary);

/// FormatBytes with the exact count: "1 GB (1,000,000,000 bytes)", "1 GiB (1,073,741,824
/// bytes)", "512 bytes".
std::string FormatBytesExact(uint64_t bytes, SizeUnits units = SizeUnits::kBinary);

/// A duration with three significant digits in the unit that suits it: "812 ns", "12.3 µs",
/// "24.8 ms", "2.35 s", "1m05s", "3h02m10s".
std::string HumanDuration(absl::Duration duration);

/// A time in UTC to the second: "2026-11-29T10:56:02Z".
std::string FormatUtc(absl::Time t);

/// Bytes per second: "1.2 GiB/s"; "-" when `elapsed` is zero.
std::string FormatRate(uint64_t bytes, absl::Duration elapsed);

/// One progress line (no newline): the label, a bar, the percentage, bytes done of total,
/// the rate and the time left, e.g.
///   "put [=========>          ]  45%  115 MiB / 256 MiB  1.2 GiB/s  ETA 0:02"
/// and when done == total:
///   "put [====================] 100%  256 MiB in 230 ms (1.1 GiB/s)"
std::string FormatProgress(absl::string_view label, uint64_t done, uint64_t total,
                           absl::Duration elapsed);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_FORMAT_H_
