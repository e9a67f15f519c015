// The CLI's parsers and formatters (client/cli/parse.h, client/cli/format.h).
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "client/cli/format.h"
#include "client/cli/parse.h"

namespace tessera::cli {
namespace {

using ::testing::HasSubstr;

// ---- ParseSize ---------------------------------------------------------------------------------

TEST(ParseSizeTest, BinaryAndDecimalUnitsAsKubernetesReadsThem) {
  struct Case {
    const char* text;
    uint64_t bytes;
    SizeUnits units;
  };
  for (const Case& c : std::vector<Case>{
           {"0", 0, SizeUnits::kBytes},
           {"1073741824", uint64_t{1} << 30, SizeUnits::kBytes},
           {"512B", 512, SizeUnits::kBytes},
           {"1Ki", 1024, SizeUnits::kBinary},
           {"1KiB", 1024, SizeUnits::kBinary},
           {"512Mi", uint64_t{512} << 20, SizeUnits::kBinary},
           {"2Gi", uint64_t{2} << 30, SizeUnits::kBinary},
           {"1GiB", uint64_t{1} << 30, SizeUnits::kBinary},
           {"1Ti", uint64_t{1} << 40, SizeUnits::kBinary},
           {"1Pi", uint64_t{1} << 50, SizeUnits::kBinary},
           {"1Ei", uint64_t{1} << 60, SizeUnits::kBinary},
           {"1k", 1000, SizeUnits::kDecimal},
           {"1K", 1000, SizeUnits::kDecimal},
           {"1kB", 1000, SizeUnits::kDecimal},
           {"500M", 500'000'000, SizeUnits::kDecimal},
           {"1G", 1'000'000'000, SizeUnits::kDecimal},
           {"1GB", 1'000'000'000, SizeUnits::kDecimal},
           {"2T", 2'000'000'000'000, SizeUnits::kDecimal},
           {"1E", 1'000'000'000'000'000'000, SizeUnits::kDecimal},
           {"1.5G", 1'500'000'000, SizeUnits::kDecimal},
           {"1.5Gi", uint64_t{3} << 29, SizeUnits::kBinary},
           {"0.5Ki", 512, SizeUnits::kBinary},
           {".5Ki", 512, SizeUnits::kBinary},
           {"2.000Gi", uint64_t{2} << 30, SizeUnits::kBinary},
           {" 8 Gi ", uint64_t{8} << 30, SizeUnits::kBinary},
           {"8gi", uint64_t{8} << 30, SizeUnits::kBinary},  // unambiguous in any case
           {"8gib", uint64_t{8} << 30, SizeUnits::kBinary},
           {"3g", 3'000'000'000, SizeUnits::kDecimal},
           {"9223372036854775807", 9223372036854775807u, SizeUnits::kBytes},
           {"7Ei", uint64_t{7} << 60, SizeUnits::kBinary},
       }) {
    absl::StatusOr<Size> size = ParseSize(c.text);
    ASSERT_TRUE(size.ok()) << c.text << ": " << size.status();
    EXPECT_EQ(size->bytes, c.bytes) << c.text;
    EXPECT_EQ(size->units, c.units) << c.text;
  }
}

TEST(ParseSizeTest, RefusesWithTheSyntax) {
  for (const char* bad :
       {"", "lots", "Gi", "-1", "-1Gi", "1XB", "1 GiBs", "1e3", "1.2.3", "1,000", "0.3Ki", "1.5",
        "8Ei", "9223372036854775808", "99999999999999999999", "1m", "1mi?", "0x10"}) {
    absl::StatusOr<Size> size = ParseSize(bad);
    EXPECT_FALSE(size.ok()) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(size.status())) << bad;
    EXPECT_THAT(size.status().message(), HasSubstr("Ki, Mi, Gi, Ti")) << bad;
  }
  EXPECT_THAT(ParseSize("1m").status().message(), HasSubstr("milli"));
  EXPECT_THAT(ParseSize("0.3Ki").status().message(), HasSubstr("whole number of bytes"));
  EXPECT_THAT(ParseSize("8Ei").status().message(), HasSubstr("2^63-1"));
  EXPECT_THAT(ParseSize("lots").status().message(), HasSubstr("\"lots\" is not a size"));
}

// ---- ParseTimeout, ParseLabels, ParsePriority --------------------------------------------------

TEST(ParseTimeoutTest, DurationsAndPlainSeconds) {
  EXPECT_EQ(*ParseTimeout("30s"), absl::Seconds(30));
  EXPECT_EQ(*ParseTimeout("500ms"), absl::Milliseconds(500));
  EXPECT_EQ(*ParseTimeout("1m30s"), absl::Seconds(90));
  EXPECT_EQ(*ParseTimeout("10"), absl::Seconds(10));
  EXPECT_EQ(*ParseTimeout("2.5"), absl::Milliseconds(2500));
  EXPECT_EQ(*ParseTimeout("inf"), absl::InfiniteDuration());
  for (const char* bad : {"", "soon", "0", "-1s", "0s", "10 parsecs"}) {
    EXPECT_FALSE(ParseTimeout(bad).ok()) << bad;
  }
  EXPECT_THAT(ParseTimeout("soon").status().message(), HasSubstr("30s"));
}

TEST(ParseLabelsTest, KeyValuePairs) {
  auto labels = ParseLabels({"team=ml", "env=dev", "", "expr=a=b"});
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ(*labels,
            (std::map<std::string, std::string>{{"team", "ml"}, {"env", "dev"}, {"expr", "a=b"}}));
  EXPECT_TRUE(ParseLabels({}).ok());
  EXPECT_THAT(ParseLabels({"team"}).status().message(), HasSubstr("not key=value"));
  EXPECT_FALSE(ParseLabels({"=x"}).ok());
  EXPECT_THAT(ParseLabels({"a=1", "a=2"}).status().message(), HasSubstr("twice"));
}

TEST(ParsePriorityTest, NormalLowOrDefault) {
  EXPECT_EQ(*ParsePriority(""), v1::PRIORITY_UNSPECIFIED);
  EXPECT_EQ(*ParsePriority("normal"), v1::PRIORITY_NORMAL);
  EXPECT_EQ(*ParsePriority("low"), v1::PRIORITY_LOW);
  EXPECT_THAT(ParsePriority("high").status().message(), HasSubstr("normal or low"));
}

// ---- ParseAttr, ParseAttrs, AttrHint -----------------------------------------------------------

TEST(ParseAttrTest, EachType) {
  EXPECT_EQ(ParseAttr("true")->b(), true);
  EXPECT_EQ(ParseAttr("false")->value_case(), v1::AttrValue::kB);
  EXPECT_EQ(ParseAttr("3")->i(), 3);
  EXPECT_EQ(ParseAttr("-7")->i(), -7);
  EXPECT_EQ(ParseAttr("2.5")->f(), 2.5);
  EXPECT_EQ(ParseAttr("1e-5")->f(), 1e-5);
  EXPECT_EQ(ParseAttr("-inf")->f(), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(ParseAttr("relu")->s(), "relu");
  EXPECT_EQ(ParseAttr("\"3\"")->s(), "3");
  EXPECT_EQ(ParseAttr("'[1]'")->s(), "[1]");
  EXPECT_EQ(ParseAttr("")->s(), "");
  EXPECT_EQ(ParseAttr(" 3")->s(), " 3");  // ParseAttrs strips; blanks inside are kept

  absl::StatusOr<v1::AttrValue> ints = ParseAttr("[0, 1,-2]");
  ASSERT_TRUE(ints.ok());
  EXPECT_THAT(ints->ints().values(), ::testing::ElementsAre(0, 1, -2));
  absl::StatusOr<v1::AttrValue> floats = ParseAttr("[0.5,2]");
  ASSERT_TRUE(floats.ok());
  EXPECT_THAT(floats->floats().values(), ::testing::ElementsAre(0.5, 2.0));
  absl::StatusOr<v1::AttrValue> empty = ParseAttr("[]");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->has_ints());
  EXPECT_EQ(empty->ints().values_size(), 0);
}

TEST(ParseAttrTest, RefusesListsThatAreNotNumbers) {
  // Once read as [0]: a list item that is not a number (docs/fuzzing.md, cli_attr).
  absl::StatusOr<v1::AttrValue> letters = ParseAttr("[a]");
  ASSERT_FALSE(letters.ok());
  EXPECT_THAT(letters.status().message(), HasSubstr("list item \"a\""));
  EXPECT_THAT(letters.status().message(), HasSubstr("[0,1]"));
  EXPECT_FALSE(ParseAttr("[1,,2]").ok());
  EXPECT_FALSE(ParseAttr("[1,2").ok());
  EXPECT_THAT(ParseAttr("[1,2").status().message(), HasSubstr("without closing"));
}

TEST(ParseAttrsTest, ItemsFromOneOrMoreFlags) {
  absl::StatusOr<Attrs> attrs = ParseAttrs({"axes=[0]; keepdims = true", "value=2.5;"});
  ASSERT_TRUE(attrs.ok()) << attrs.status();
  EXPECT_EQ(attrs->values.size(), 3u);
  EXPECT_EQ(attrs->values.at("keepdims").b(), true);
  EXPECT_EQ(attrs->values.at("value").f(), 2.5);
  EXPECT_EQ(attrs->written.at("axes"), "[0]");
  EXPECT_TRUE(ParseAttrs({}).ok());
  EXPECT_THAT(ParseAttrs({"axes"}).status().message(), HasSubstr("is not k=v"));
  EXPECT_THAT(ParseAttrs({"=1"}).status().message(), HasSubstr("is not k=v"));
  EXPECT_THAT(ParseAttrs({"a=1;a=2"}).status().message(), HasSubstr("twice"));
  EXPECT_TRUE(ParseAttrs({std::string(64, 'k') + "=1"}).ok());
  EXPECT_THAT(ParseAttrs({std::string(65, 'k') + "=1"}).status().message(),
              HasSubstr("the limit is 64"));
  EXPECT_THAT(ParseAttrs({"axes=[x]"}).status().message(), HasSubstr("axes: list item"));
}

TEST(AttrHintTest, ShowsHowToWriteTheType) {
  const std::map<std::string, std::string> written = {{"axes", "1"}, {"value", "x"}};
  EXPECT_THAT(AttrHint("sum attribute axes must be ints; got int", written),
              HasSubstr("--attr='axes=[1]'"));
  EXPECT_THAT(AttrHint("attrs: sum attribute axes must be ints; got int", written),
              HasSubstr("a list of ints"));
  EXPECT_THAT(AttrHint("scale attribute value must be float; got string", written),
              HasSubstr("--attr='value=0.5'"));
  EXPECT_THAT(AttrHint("fill attribute shape (ints) is required", {}),
              HasSubstr("--attr='shape=[0,1]'"));
  EXPECT_THAT(AttrHint("x attribute mode must be string; got int", {{"mode", "3"}}),
              HasSubstr("mode=\"3\""));
  EXPECT_THAT(AttrHint("reshape attribute n must be int; got ints", {{"n", "[4]"}}),
              HasSubstr("--attr='n=4'"));
  EXPECT_EQ(AttrHint("add input 0 (a) has dtype i32; accepted: f32", written), "");
  EXPECT_EQ(AttrHint("sum has no attribute \"foo\"; its attributes: axes", written), "");
}

// ---- DefinedName -------------------------------------------------------------------------------

TEST(DefinedNameTest, ReadsTheNameAfterBlanksAndComments) {
  EXPECT_EQ(DefinedName("kernel swish(x: f32) -> (y: f32) { y = x }"), "swish");
  EXPECT_EQ(DefinedName("# a comment\n\n  kernel k_2 (x: f32)"), "k_2");
  // Once "": a comment between "kernel" and the name (docs/fuzzing.md, cli_attr).
  EXPECT_EQ(DefinedName("kernel#c\nk(x: f32)"), "k");
  EXPECT_EQ(DefinedName("kernel\n  # why\n  k(x: f32)"), "k");
  EXPECT_EQ(DefinedName("kernels(x)"), "");
  EXPECT_EQ(DefinedName("kernel 2x(x)"), "");
  EXPECT_EQ(DefinedName("func k(x)"), "");
  EXPECT_EQ(DefinedName(""), "");
  EXPECT_EQ(DefinedName("kernel"), "");
}

// ---- Formatting --------------------------------------------------------------------------------

TEST(FormatTest, Bytes) {
  EXPECT_EQ(GroupThousands(0), "0");
  EXPECT_EQ(GroupThousands(999), "999");
  EXPECT_EQ(GroupThousands(1000), "1,000");
  EXPECT_EQ(GroupThousands(1073741824), "1,073,741,824");
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(uint64_t{2} << 30), "2 GiB");
  EXPECT_EQ(FormatBytes(uint64_t{3} << 29), "1.5 GiB");
  EXPECT_EQ(FormatBytes(25952256), "24.8 MiB");
  EXPECT_EQ(FormatBytes((uint64_t{1} << 30) - 1), "1.0 GiB");  // not "1024.0 MiB"
  EXPECT_EQ(FormatBytes(1'000'000'000, SizeUnits::kDecimal), "1 GB");
  EXPECT_EQ(FormatBytes(1'500'000'000, SizeUnits::kDecimal), "1.5 GB");
  EXPECT_EQ(FormatBytes(1'000'000'000), "953.7 MiB");
  EXPECT_EQ(FormatBytesExact(1'000'000'000, SizeUnits::kDecimal), "1 GB (1,000,000,000 bytes)");
  EXPECT_EQ(FormatBytesExact(uint64_t{1} << 30, SizeUnits::kBinary), "1 GiB (1,073,741,824 bytes)");
  EXPECT_EQ(FormatBytesExact(1), "1 byte");
  EXPECT_EQ(FormatBytesExact(512), "512 bytes");
}

TEST(FormatTest, Durations) {
  EXPECT_EQ(HumanDuration(absl::ZeroDuration()), "0 s");
  EXPECT_EQ(HumanDuration(absl::Nanoseconds(812)), "812 ns");
  EXPECT_EQ(HumanDuration(absl::Nanoseconds(12345)), "12.3 µs");
  EXPECT_EQ(HumanDuration(absl::Nanoseconds(24750300)), "24.8 ms");
  EXPECT_EQ(HumanDuration(absl::Microseconds(999700)), "1 s");
  EXPECT_EQ(HumanDuration(absl::Milliseconds(2350)), "2.35 s");
  EXPECT_EQ(HumanDuration(absl::Seconds(65)), "1m05s");
  EXPECT_EQ(HumanDuration(absl::Seconds(3 * 3600 + 130)), "3h02m10s");
  EXPECT_EQ(HumanDuration(absl::Hours(50)), "2d02h");
  EXPECT_EQ(HumanDuration(-absl::Milliseconds(5)), "-5 ms");
  EXPECT_EQ(HumanDuration(absl::InfiniteDuration()), "inf");
}

TEST(FormatTest, ProgressShowsRateAndEta) {
  const uint64_t mib = uint64_t{1} << 20;
  const std::string half = FormatProgress("put", 128 * mib, 256 * mib, absl::Seconds(1));
  EXPECT_THAT(half, HasSubstr("put [=========="));
  EXPECT_THAT(half, HasSubstr(" 50%"));
  EXPECT_THAT(half, HasSubstr("128 MiB / 256 MiB"));
  EXPECT_THAT(half, HasSubstr("128 MiB/s"));
  EXPECT_THAT(half, HasSubstr("ETA 0:01"));
  EXPECT_THAT(FormatProgress("get", 0, 256 * mib, absl::ZeroDuration()), HasSubstr("ETA --:--"));
  const std::string done = FormatProgress("put", 256 * mib, 256 * mib, absl::Milliseconds(500));
  EXPECT_THAT(done, HasSubstr("100%"));
  EXPECT_THAT(done, HasSubstr("256 MiB in 500 ms (512 MiB/s)"));
}

}  // namespace
}  // namespace tessera::cli
