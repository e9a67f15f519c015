#include "server/backend/sm_share.h"

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(SmShareTest, ShareOfTheDeviceRoundedUpWithinOneToAll) {
  // 84 SMs, the MPS guide's example device.
  EXPECT_EQ(AffinitySmCount(10, 84), 9);  // 8.4 rounds up
  EXPECT_EQ(AffinitySmCount(50, 84), 42);
  EXPECT_EQ(AffinitySmCount(100, 84), 84);
  EXPECT_EQ(AffinitySmCount(1, 84), 1);  // 0.84 never rounds to nothing
  // 132 SMs (an H100 SXM).
  EXPECT_EQ(AffinitySmCount(25, 132), 33);
  EXPECT_EQ(AffinitySmCount(33, 132), 44);  // 43.56 rounds up
  // Out-of-range inputs stay bounded.
  EXPECT_EQ(AffinitySmCount(0, 132), 1);
  EXPECT_EQ(AffinitySmCount(250, 132), 132);
  EXPECT_EQ(AffinitySmCount(50, 0), 0);
  EXPECT_EQ(AffinitySmCount(50, -4), 0);
}

}  // namespace
}  // namespace tessera
