#include "common/byte_size.h"

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(ByteSizeTest, ParsesPlainBinaryAndDecimalUnitsAsKubernetes) {
  EXPECT_EQ(*ParseByteSize("0"), 0u);
  EXPECT_EQ(*ParseByteSize("1048576"), 1048576u);
  EXPECT_EQ(*ParseByteSize("512B"), 512u);
  EXPECT_EQ(*ParseByteSize("4K"), 4000u);
  EXPECT_EQ(*ParseByteSize("4Ki"), 4096u);
  EXPECT_EQ(*ParseByteSize("4KiB"), 4096u);
  EXPECT_EQ(*ParseByteSize("512MiB"), uint64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("2G"), 2'000'000'000u);
  EXPECT_EQ(*ParseByteSize("2GB"), 2'000'000'000u);
  EXPECT_EQ(*ParseByteSize("2Gi"), uint64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize("1.5GiB"), uint64_t{3} << 29);
  EXPECT_EQ(*ParseByteSize(" 8 gib "), uint64_t{8} << 30);
  EXPECT_EQ(*ParseByteSize("1PiB"), uint64_t{1} << 50);
}

TEST(ByteSizeTest, RefusesGarbageAndOverflow) {
  for (const char* bad :
       {"", "GiB", "-1", "1XB", "1 GiBs", "abc", "1e3", "99999999999P", "18446744073709551616"}) {
    EXPECT_FALSE(ParseByteSize(bad).ok()) << bad;
  }
}

TEST(ByteSizeTest, WorksAsAFlagType) {
  ByteSize size;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("2GiB", &size, &error));
  EXPECT_EQ(size.bytes, uint64_t{2} << 30);
  EXPECT_FALSE(AbslParseFlag("lots", &size, &error));
  EXPECT_NE(error.find("not a size"), std::string::npos);
  EXPECT_NE(error.find("Gi"), std::string::npos);
  EXPECT_EQ(AbslUnparseFlag(ByteSize{4096}), "4096");
}

}  // namespace
}  // namespace tessera
