// The `tessera` CLI's parsers of user text: sizes, durations, labels, priorities, kernel
// attributes and kernel definition names. Pure functions (no I/O, no RPC), so they are unit
// tested (tests/unit/client/cli_parse_test.cc) and fuzzed (tests/fuzz/cli_attr_fuzz.cc)
// directly. Every error is INVALID_ARGUMENT with a message that shows the expected syntax.
#ifndef TESSERA_CLIENT_CLI_PARSE_H_
#define TESSERA_CLIENT_CLI_PARSE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "google/protobuf/map.h"

#include "common/byte_size.h"
#include "tessera/v1/compute.pb.h"
#include "tessera/v1/tenant_admin.pb.h"

namespace tessera::cli {

// Sizes: the server's parser (common/byte_size.h), so the CLI and tessera-server's
// flags read "2G" and "2Gi" alike.
using ::tessera::kSizeSyntax;
using ::tessera::ParseSize;
using ::tessera::SizeUnits;
using Size = ::tessera::ParsedSize;

/// Parses a deadline such as "30s", "500ms", "1m30s" (absl::ParseDuration) or a plain number
/// of seconds ("10", "2.5"). Must be positive; "inf" waits for ever.
absl::StatusOr<absl::Duration> ParseTimeout(absl::string_view text);

/// "key=value" items (from --labels=k=v,k2=v2) as a map. An empty item is skipped; an item
/// without '=' or with an empty key is refused, as is a key given twice.
absl::StatusOr<std::map<std::string, std::string>> ParseLabels(
    const std::vector<std::string>& items);

/// "normal" or "low"; "" is PRIORITY_UNSPECIFIED (the server's default, normal).
absl::StatusOr<v1::Priority> ParsePriority(absl::string_view text);

/// The syntax of one --attr value, in words.
inline constexpr char kAttrSyntax[] =
    "k=v;k2=v2 where v is an int (3), a float (2.5, 1e-5, inf), a bool (true, false), a list "
    "of ints ([0,1]) or floats ([0.5,2]), or a string (text; quote it, \"3\", to keep digits "
    "a string)";

/// One attribute value as written after "k=" in --attr: "true"/"false" a bool; an integer an
/// int; a number (including inf, -inf, nan) a float; "[...]" a list, of ints when every item
/// is an integer and of floats when every item is a number ("[]" is an empty int list);
/// '...' or "..." a string (so "3" can be a string); anything else a string as written.
/// Refused: a list item that is not a number, a '[' without its ']'.
absl::StatusOr<v1::AttrValue> ParseAttr(absl::string_view text);

/// The attributes of a launch, from one or more --attr flags, each "k=v;k2=v2".
struct Attrs {
  google::protobuf::Map<std::string, v1::AttrValue> values;
  /// Each attribute's value as the user wrote it (for AttrHint).
  std::map<std::string, std::string> written;
};
/// Refused: an item without '=', an empty key or one over 64 bytes (the server's limit), a key
/// given twice, a value ParseAttr refuses.
absl::StatusOr<Attrs> ParseAttrs(const std::vector<std::string>& flags);

/// For the server's INVALID_ARGUMENT message about an attribute ("sum attribute axes must be
/// ints; got int", "fill attribute shape (ints) is required"), a line that shows how to write
/// it on the command line, from what the user wrote: "write a list: --attr='axes=[1]'". ""
/// when the message is not about an attribute's type.
std::string AttrHint(absl::string_view server_message,
                     const std::map<std::string, std::string>& written);

/// The NAME in "kernel NAME(" at the start of a kernel definition, skipping blanks and '#'
/// comments as the kernel language does (also between "kernel" and NAME); "" when the text
/// does not start that way.
std::string DefinedName(absl::string_view text);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_PARSE_H_
