#include "server/core/admission.h"

#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/testing/sizes.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

using testing::kGiB;

DeviceLoad Device(int index, uint64_t memory, uint64_t reserved = 0, uint32_t contexts = 0,
                  uint32_t limit = 0) {
  return DeviceLoad{DeviceInfo{.index = index,
                               .name = "dev" + std::to_string(index),
                               .memory_bytes = memory,
                               .context_limit = limit},
                    reserved, contexts};
}

TEST(ReservableBytesTest, ScalesAndSaturates) {
  EXPECT_EQ(ReservableBytes(8 * kGiB, 1.0), 8 * kGiB);
  EXPECT_EQ(ReservableBytes(8 * kGiB, 1.5), 12 * kGiB);
  EXPECT_EQ(ReservableBytes(8 * kGiB, 0.5), 4 * kGiB);
  EXPECT_EQ(ReservableBytes(3, 0.5), 1u);  // rounded down
  EXPECT_EQ(ReservableBytes(std::numeric_limits<uint64_t>::max(), 100.0),
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(ReservableBytes(8 * kGiB, 0.0), 0u);
}

TEST(ChooseDeviceTest, ExactFitIsAdmittedOneByteMoreIsNot) {
  std::vector<DeviceLoad> devices = {Device(0, 8 * kGiB, 6 * kGiB, 3)};
  EXPECT_EQ(*ChooseDevice(devices, 1.0, 2 * kGiB, std::nullopt), 0);
  absl::Status refused = ChooseDevice(devices, 1.0, 2 * kGiB + 1, std::nullopt).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  // The message carries the numbers: request, reserved, reservable, overcommit, free.
  EXPECT_THAT(refused.message(), HasSubstr("2147483649 bytes"));
  EXPECT_THAT(refused.message(), HasSubstr("6442450944 bytes) reserved"));
  EXPECT_THAT(refused.message(), HasSubstr("8589934592 bytes) reservable"));
  EXPECT_THAT(refused.message(), HasSubstr("memory_overcommit 1"));
  EXPECT_THAT(refused.message(), HasSubstr("2147483648 bytes) unreserved"));
}

TEST(ChooseDeviceTest, OvercommitRaisesTheLimit) {
  std::vector<DeviceLoad> devices = {Device(0, 8 * kGiB, 8 * kGiB, 1)};
  EXPECT_EQ(ChooseDevice(devices, 1.0, kGiB, std::nullopt).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*ChooseDevice(devices, 1.5, 4 * kGiB, std::nullopt), 0);
  EXPECT_EQ(ChooseDevice(devices, 1.5, 4 * kGiB + 1, std::nullopt).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(ChooseDeviceTest, OverReservedDeviceRefusesWithoutUnderflow) {
  // Possible after a restart on a smaller device: reserved exceeds reservable.
  std::vector<DeviceLoad> devices = {Device(0, 4 * kGiB, 6 * kGiB, 2)};
  EXPECT_EQ(ChooseDevice(devices, 1.0, 1, std::nullopt).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(ChooseDeviceTest, PicksTheDeviceWithMostUnreservedMemory) {
  std::vector<DeviceLoad> devices = {Device(0, 80 * kGiB, 70 * kGiB), Device(1, 40 * kGiB, 0),
                                     Device(2, 80 * kGiB, 50 * kGiB)};
  EXPECT_EQ(*ChooseDevice(devices, 1.0, kGiB, std::nullopt), 1);
  // Ties go to the lowest index.
  std::vector<DeviceLoad> tied = {Device(0, 8 * kGiB), Device(1, 8 * kGiB)};
  EXPECT_EQ(*ChooseDevice(tied, 1.0, kGiB, std::nullopt), 0);
}

TEST(ChooseDeviceTest, HonoursTheRequestedDevice) {
  std::vector<DeviceLoad> devices = {Device(0, 8 * kGiB), Device(1, 8 * kGiB, 7 * kGiB)};
  EXPECT_EQ(*ChooseDevice(devices, 1.0, kGiB, 1), 1);
  EXPECT_EQ(ChooseDevice(devices, 1.0, kGiB + 1, 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  absl::Status out_of_range = ChooseDevice(devices, 1.0, kGiB, 2).status();
  EXPECT_EQ(out_of_range.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out_of_range.message(), HasSubstr("device_index is 2; the range is 0..1"));
}

TEST(ChooseDeviceTest, ContextLimitIsEnforced) {
  // 48 MPS client contexts per device on Volta and later.
  std::vector<DeviceLoad> full = {Device(0, 80 * kGiB, 0, 48, 48)};
  absl::Status s = ChooseDevice(full, 1.0, kGiB, std::nullopt).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("limit is 48"));
  EXPECT_EQ(ChooseDevice(full, 1.0, kGiB, 0).status().code(), absl::StatusCode::kResourceExhausted);
  // A full device is skipped in automatic placement even if it has the most memory.
  std::vector<DeviceLoad> mixed = {Device(0, 80 * kGiB, 0, 48, 48),
                                   Device(1, 40 * kGiB, 0, 47, 48)};
  EXPECT_EQ(*ChooseDevice(mixed, 1.0, kGiB, std::nullopt), 1);
}

TEST(FormatBytesTest, HumanAndExact) {
  EXPECT_EQ(FormatBytes(512), "512 bytes");
  EXPECT_EQ(FormatBytes(kGiB), "1.00 GiB (1073741824 bytes)");
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

FleetNode Node(const std::string& name, std::vector<uint64_t> free, bool draining = false,
               uint32_t tenants = 0, uint32_t limit = 0) {
  FleetNode node{.name = name, .address = name + ":1", .draining = draining};
  for (size_t i = 0; i < free.size(); ++i) {
    node.devices.push_back({.index = static_cast<int>(i),
                            .memory_bytes = 100,
                            .free_memory_bytes = free[i],
                            .tenants = tenants,
                            .context_limit = limit});
  }
  return node;
}

TEST(ChooseNodeTest, SpreadTakesTheMostFreePackTheLeastThatFits) {
  const std::vector<FleetNode> nodes = {Node("a", {30}), Node("b", {80, 10}), Node("c", {50})};
  EXPECT_EQ(ChooseNode(nodes, 20, 0, Placement::kSpread), 1u);
  EXPECT_EQ(ChooseNode(nodes, 20, 0, Placement::kPack), 0u);
  EXPECT_EQ(ChooseNode(nodes, 40, 0, Placement::kPack), 2u);
  EXPECT_EQ(ChooseNode(nodes, 81, 0, Placement::kSpread), std::nullopt);
  // Ties go to the first node.
  EXPECT_EQ(ChooseNode({Node("a", {50}), Node("b", {50})}, 10, 0, Placement::kSpread), 0u);
}

TEST(ChooseNodeTest, DrainingNodesAndFullMpsClientLimitsTakeNoTenant) {
  EXPECT_EQ(
      ChooseNode({Node("a", {90}, /*draining=*/true), Node("b", {20})}, 10, 0, Placement::kSpread),
      1u);
  EXPECT_EQ(ChooseNode({Node("a", {90}, false, /*tenants=*/48, /*limit=*/48), Node("b", {20})}, 10,
                       0, Placement::kSpread),
            1u);
  EXPECT_EQ(ChooseNode({Node("a", {90}, true)}, 10, 0, Placement::kPack), std::nullopt);
}

// Compute shares: a device whose tenants' shares leave room for the new one comes first, even
// with less free memory; only memory counts when no device has room for the share.
TEST(ChooseNodeTest, ADeviceWithRoomForTheComputeShareComesFirst) {
  std::vector<FleetNode> nodes = {Node("a", {90}), Node("b", {40})};
  nodes[0].devices[0].share_percent = 80;
  nodes[1].devices[0].share_percent = 50;
  EXPECT_EQ(ChooseNode(nodes, 10, 25, Placement::kSpread), 1u);
  EXPECT_EQ(ChooseNode(nodes, 10, 20, Placement::kSpread), 0u);
  EXPECT_EQ(ChooseNode(nodes, 10, 60, Placement::kSpread), 0u);  // none has room: memory decides
  EXPECT_EQ(ChooseNode(nodes, 50, 25, Placement::kSpread), 0u);  // b's memory does not fit
}

}  // namespace
}  // namespace tessera
