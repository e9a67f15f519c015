#include "kernels/dtype.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tessera::kernels {
namespace {

// Reference rounding: every finite value of the 16-bit format, sorted, searched for the
// nearest; ties go to the even bit pattern; beyond the largest finite (by half an ulp or
// more, as IEEE defines overflow) is infinity.
class NearestTable {
 public:
  explicit NearestTable(float (*decode)(uint16_t)) {
    for (uint32_t bits = 0; bits < 0x10000; ++bits) {
      float v = decode(static_cast<uint16_t>(bits));
      if (std::isfinite(v) && !(v == 0 && std::signbit(v))) {
        values_.push_back({static_cast<double>(v), static_cast<uint16_t>(bits)});
      }
    }
    std::sort(values_.begin(), values_.end());
    max_ = values_.back().first;
    ulp_at_max_ = max_ - values_[values_.size() - 2].first;
    inf_bits_ = 0;
    for (uint32_t bits = 0; bits < 0x10000; ++bits) {
      float v = decode(static_cast<uint16_t>(bits));
      if (std::isinf(v) && v > 0) inf_bits_ = static_cast<uint16_t>(bits);
    }
  }

  uint16_t Round(double x) const {
    uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    double a = std::fabs(x);
    if (a >= max_ + ulp_at_max_ / 2) return sign | inf_bits_;
    auto hi = std::lower_bound(values_.begin(), values_.end(), std::make_pair(a, uint16_t{0}));
    if (hi == values_.end()) return sign | values_.back().second;
    if (hi->first == a || hi == values_.begin()) return sign | hi->second;
    auto lo = hi - 1;
    double dl = a - lo->first, dh = hi->first - a;
    if (dl < dh) return sign | lo->second;
    if (dh < dl) return sign | hi->second;
    return sign | ((lo->second & 1) == 0 ? lo->second : hi->second);
  }

 private:
  std::vector<std::pair<double, uint16_t>> values_;
  double max_ = 0, ulp_at_max_ = 0;
  uint16_t inf_bits_ = 0;
};

TEST(F16Test, EveryHalfRoundTrips) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    float f = F16ToF32(static_cast<uint16_t>(bits));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f)))) << bits;
    } else {
      EXPECT_EQ(F32ToF16(f), bits) << bits;
      EXPECT_EQ(F64ToF16(static_cast<double>(f)), bits) << bits;
    }
  }
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
}

TEST(F16Test, RoundsToNearestEvenLikeTheReference) {
  NearestTable table(F16ToF32);
  std::mt19937 gen(7);
  std::uniform_int_distribution<uint32_t> bits_dist;
  std::vector<float> samples = {65519.0f,
                                65520.0f,
                                65504.0f,
                                1e-8f,
                                2.98e-8f,
                                3e-8f,
                                std::ldexp(1.0f, -25),
                                std::ldexp(3.0f, -26),
                                1.00048828125f,
                                1.000732421875f,
                                -2.5f,
                                0.0f,
                                -0.0f};
  for (int i = 0; i < 200000; ++i) {
    float f = std::bit_cast<float>(bits_dist(gen));
    if (std::isfinite(f) && std::fabs(f) < 1e6f) samples.push_back(f);
  }
  // Exact midpoints between neighbouring halves (ties) in every binade.
  for (uint32_t bits = 0; bits < 0x7bff; bits += 7) {
    double lo = F16ToF32(static_cast<uint16_t>(bits));
    double hi = F16ToF32(static_cast<uint16_t>(bits + 1));
    samples.push_back(static_cast<float>((lo + hi) / 2));
  }
  for (float f : samples) {
    uint16_t expected = table.Round(f);
    ASSERT_EQ(F32ToF16(f), expected) << f;
  }
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(F32ToF16(-1e9f), 0xfc00);
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(std::nanf("")))));
}

TEST(F64ToHalfTest, RoundsOnceNotTwice) {
  NearestTable half(F16ToF32);
  NearestTable bf16(BF16ToF32);
  std::mt19937_64 gen(11);
  std::uniform_real_distribution<double> dist(-70000, 70000);
  for (int i = 0; i < 100000; ++i) {
    double d = dist(gen);
    ASSERT_EQ(F64ToF16(d), half.Round(d)) << d;
    ASSERT_EQ(F64ToBF16(d), bf16.Round(d)) << d;
  }
  // A value just above a half tie whose nearest float is the tie itself: rounding through
  // f32 naively would round to even (down); the correct result rounds up.
  double tie = (1.0 + 1.0 / 1024 / 2);  // halfway between 1 and 1 + 2^-10
  double above = tie + std::ldexp(1.0, -40);
  EXPECT_EQ(F64ToF16(above), 0x3c01);
  EXPECT_EQ(F32ToF16(static_cast<float>(above)), 0x3c00);  // what double rounding gives
}

TEST(BF16Test, RoundsToNearestEvenLikeTheReference) {
  NearestTable table(BF16ToF32);
  std::mt19937 gen(3);
  std::uniform_int_distribution<uint32_t> bits_dist;
  for (int i = 0; i < 200000; ++i) {
    float f = std::bit_cast<float>(bits_dist(gen));
    if (!std::isfinite(f)) continue;
    ASSERT_EQ(F32ToBF16(f), table.Round(f)) << f;
  }
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    float f = BF16ToF32(static_cast<uint16_t>(bits));
    if (!std::isnan(f)) {
      ASSERT_EQ(F32ToBF16(f), bits);
    }
  }
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(std::nanf("")))));
}

TEST(DTypeTest, NamesSizesAndWireValues) {
  for (DType d : kAllDTypes) {
    EXPECT_EQ(DTypeFromName(DTypeName(d)), d);
    EXPECT_EQ(DTypeFromInt(static_cast<int>(d)), d);
  }
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  EXPECT_FALSE(DTypeFromInt(0).has_value());
  EXPECT_FALSE(DTypeFromInt(9).has_value());
  EXPECT_FALSE(DTypeFromName("float32").has_value());
}

}  // namespace
}  // namespace tessera::kernels
