// The `tessera` CLI's parsers of user text (client/cli/parse.cc): ParseAttr and ParseAttrs
// (`tessera run --attr="k=v;k2=v2"`), AttrHint, DefinedName (the kernel name of a
// `tessera kernel define --file` file), ParseSize, ParseTimeout, ParseLabels and
// ParsePriority. The input is given to each: whole, as --attr flags (one per line) and as
// --labels items (split on ',').
//
// Properties: refusals are INVALID_ARGUMENT; an attribute value is set, a list holds only the
// numbers written in it, and the server's converter (AttrsFromProto) takes the values unless
// they pass its size limits; DefinedName names the kernel that ParseSource reads from the
// same text; a size is at most 2^63-1 bytes and FormatBytes' exact output of it reads back as
// the same size; a timeout is positive; labels have non-empty keys.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

#include "client/cli/format.h"
#include "client/cli/parse.h"
#include "kernels/expr/compile.h"
#include "server/service/compute_convert.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

namespace cli = tessera::cli;

void CheckRefusal(const absl::Status& status) {
  FUZZ_CHECK(absl::IsInvalidArgument(status), status.ToString());
}

void CheckValues(const google::protobuf::Map<std::string, tessera::v1::AttrValue>& values) {
  for (const auto& [key, value] : values) {
    FUZZ_CHECK(value.value_case() != tessera::v1::AttrValue::VALUE_NOT_SET, "no value for ", key);
  }
  // The server may refuse what is past its limits (name and string bytes, list values, entry
  // count), nothing else.
  absl::StatusOr<tessera::kernels::Attrs> converted = tessera::AttrsFromProto(values, "attrs");
  const absl::string_view message = converted.status().message();
  FUZZ_CHECK(converted.ok() || (absl::IsInvalidArgument(converted.status()) &&
                                (absl::StrContains(message, "the limit is") ||
                                 absl::StrContains(message, "the range is"))),
             converted.status().ToString());
}

void CheckAttr(absl::string_view text) {
  absl::StatusOr<tessera::v1::AttrValue> value = cli::ParseAttr(text);
  if (!value.ok()) {
    CheckRefusal(value.status());
    return;
  }
  if (value->has_ints() || value->has_floats()) {
    absl::string_view inner = text;
    FUZZ_CHECK(absl::ConsumePrefix(&inner, "[") && absl::ConsumeSuffix(&inner, "]"),
               "a list from text that is not one");
    const int size =
        value->has_ints() ? value->ints().values_size() : value->floats().values_size();
    int items = 0;
    if (!absl::StripAsciiWhitespace(inner).empty()) {
      for (absl::string_view item : absl::StrSplit(inner, ',')) {
        double d;
        FUZZ_CHECK(absl::SimpleAtod(item, &d), "a list item that is not a number");
        ++items;
      }
    }
    FUZZ_CHECK(items == size, "a list of ", items, " items read as ", size, " values");
  }
  google::protobuf::Map<std::string, tessera::v1::AttrValue> values;
  values["k"] = *value;
  CheckValues(values);
}

void CheckAttrs(const std::vector<std::string>& flags) {
  absl::StatusOr<cli::Attrs> attrs = cli::ParseAttrs(flags);
  if (!attrs.ok()) {
    CheckRefusal(attrs.status());
    return;
  }
  FUZZ_CHECK(attrs->values.size() == attrs->written.size(), "values and written differ");
  CheckValues(attrs->values);
  for (const char* message :
       {"sum attribute axes must be ints; got int", "fill attribute shape (ints) is required",
        "softmax attribute axis must be int; got float"}) {
    (void)cli::AttrHint(message, attrs->written);
  }
}

void CheckDefinedName(absl::string_view text) {
  const std::string named = cli::DefinedName(text);
  absl::StatusOr<tessera::kernels::expr::Definition> parsed =
      tessera::kernels::expr::ParseSource(text);
  if (!parsed.ok()) return;
  FUZZ_CHECK(named == parsed->name, "DefinedName reads \"", named, "\" from a file that defines \"",
             parsed->name, "\"");
}

void CheckSize(absl::string_view text) {
  absl::StatusOr<cli::Size> size = cli::ParseSize(text);
  if (!size.ok()) {
    CheckRefusal(size.status());
    return;
  }
  FUZZ_CHECK(size->bytes <= static_cast<uint64_t>(INT64_MAX), "size ", size->bytes);
  const std::string formatted = cli::FormatBytes(size->bytes, size->units);
  if (absl::StrContains(formatted, '.')) return;  // rounded for people; exact otherwise
  absl::StatusOr<cli::Size> again = cli::ParseSize(formatted);
  FUZZ_CHECK(again.ok() && again->bytes == size->bytes, "FormatBytes(", size->bytes, ") is \"",
             formatted, "\", which ParseSize reads as ",
             again.ok() ? absl::StrCat(again->bytes) : again.status().ToString());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  CheckAttr(input);
  CheckAttrs(absl::StrSplit(input, '\n'));
  (void)cli::AttrHint(input, {{"axes", "1"}, {"shape", "[2"}});
  CheckDefinedName(input);
  CheckSize(input);

  absl::StatusOr<absl::Duration> timeout = cli::ParseTimeout(input);
  if (timeout.ok()) {
    FUZZ_CHECK(*timeout > absl::ZeroDuration(), "timeout ", absl::FormatDuration(*timeout));
  } else {
    CheckRefusal(timeout.status());
  }
  absl::StatusOr<std::map<std::string, std::string>> labels =
      cli::ParseLabels(absl::StrSplit(input, ','));
  if (labels.ok()) {
    for (const auto& [key, value] : *labels) FUZZ_CHECK(!key.empty(), "an empty label key");
  } else {
    CheckRefusal(labels.status());
  }
  absl::StatusOr<tessera::v1::Priority> priority = cli::ParsePriority(input);
  if (!priority.ok()) CheckRefusal(priority.status());
  return 0;
}
