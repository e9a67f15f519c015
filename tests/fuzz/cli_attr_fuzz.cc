// The CLI's parsers of user text (client/cli/main.cc): ParseAttr, which turns each value of
// `tessera run --attr="k=v;k2=v2"` into a tessera.v1.AttrValue, and DefinedName, which reads
// the kernel name from a `tessera kernel define --file` file before it is sent.
//
// Both are private to main.cc (an anonymous namespace in the program's one file), so this
// target compiles main.cc into itself with its main() renamed; it runs nothing else of it.
// The input is split as RunCommand splits --attr (';' between items, the first '=' between
// key and value) and is also read as a kernel definition file.
//
// Properties: every value ParseAttr produces is set (the server refuses an unset one as "has
// no value") and converts (AttrsFromProto) unless it is past the server's size limits; a list
// holds only the numbers written in it; and DefinedName names the kernel that ParseSource reads
// from the same text.
#include <cstdint>
#include <string>
#include <vector>

// main.cc ignores two results that clang (not GCC) marks [[nodiscard]]: absl::SimpleAtoi and
// absl::SimpleAtod in ParseAttr.
#ifdef __clang__
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wunused-result"
#endif
#define main tessera_cli_main
#include "client/cli/main.cc"
#undef main
#ifdef __clang__
#pragma clang diagnostic pop
#endif

#include "absl/strings/escaping.h"

#include "kernels/expr/compile.h"
#include "server/service/compute_convert.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void CheckAttr(absl::string_view text) {
  const tessera::v1::AttrValue value = ParseAttr(text);
  FUZZ_CHECK(value.value_case() != tessera::v1::AttrValue::VALUE_NOT_SET, "no value for \"",
             absl::CHexEscape(text), "\"");
  // Known finding (docs/fuzzing.md): ParseAttr reads a list item that is not a number as 0.
  if ((value.has_ints() || value.has_floats()) && !tessera::fuzz::SkipKnownFindings()) {
    // "[...]": each item must have been a number; anything else is a string.
    absl::string_view inner = text;
    FUZZ_CHECK(absl::ConsumePrefix(&inner, "[") && absl::ConsumeSuffix(&inner, "]"),
               "a list from \"", absl::CHexEscape(text), "\"");
    for (absl::string_view item : absl::StrSplit(inner, ',', absl::SkipWhitespace())) {
      double d;
      FUZZ_CHECK(absl::SimpleAtod(item, &d), "ParseAttr(\"", absl::CHexEscape(text),
                 "\") read the list item \"", absl::CHexEscape(item), "\" as a number");
    }
  }
  google::protobuf::Map<std::string, tessera::v1::AttrValue> attrs;
  attrs["k"] = value;
  // The server may refuse a value past its limits (string bytes, list values), nothing else.
  absl::StatusOr<tessera::kernels::Attrs> converted = tessera::AttrsFromProto(attrs, "attrs");
  FUZZ_CHECK(converted.ok() || (absl::IsInvalidArgument(converted.status()) &&
                                absl::StrContains(converted.status().message(), "the limit is")),
             converted.status().ToString());
}

void CheckDefinedName(absl::string_view text) {
  const std::string named = DefinedName(text);
  absl::StatusOr<tessera::kernels::expr::Definition> parsed =
      tessera::kernels::expr::ParseSource(text);
  if (!parsed.ok()) return;
  // Known finding (docs/fuzzing.md): DefinedName stops at a comment between "kernel" and NAME.
  if (tessera::fuzz::SkipKnownFindings()) return;
  FUZZ_CHECK(named == parsed->name, "DefinedName reads \"", absl::CHexEscape(named),
             "\" from a file that defines \"", parsed->name, "\"");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  for (absl::string_view item : absl::StrSplit(input, ';', absl::SkipWhitespace())) {
    std::vector<std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() != 2) continue;
    CheckAttr(absl::StripAsciiWhitespace(kv[1]));
  }
  CheckAttr(input);
  CheckDefinedName(input);
  return 0;
}
