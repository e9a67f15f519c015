#include "server/common/host_limits.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/testing/sizes.h"
#include "tests/testing/temp_dir.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

using testing::kGiB;

// A fake /proc/self/cgroup and /sys/fs/cgroup tree.
class HostLimitsTest : public ::testing::Test {
 protected:
  void Write(const std::string& relative, const std::string& text) {
    const std::filesystem::path path = dir_.File(relative);
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  HostLimits Read() {
    return ReadHostLimits({.proc_self_cgroup = dir_.File("proc_self_cgroup"),
                           .cgroup_root = dir_.File("cgroup"),
                           .affinity_cpus = 64,
                           .physical_memory_bytes = 256 * kGiB});
  }

  testing::TempDir dir_;
};

TEST_F(HostLimitsTest, NoGroupLimitsMeansTheAffinityMaskAndPhysicalMemory) {
  Write("proc_self_cgroup", "0::/\n");
  Write("cgroup/cgroup.controllers", "cpu memory\n");
  Write("cgroup/cpu.max", "max 100000\n");
  Write("cgroup/memory.max", "max\n");
  HostLimits limits = Read();
  EXPECT_EQ(limits.cpus, 64u);
  EXPECT_THAT(limits.cpus_source, HasSubstr("affinity mask"));
  EXPECT_EQ(limits.memory_bytes, 256 * kGiB);
  EXPECT_EQ(limits.memory_source, "physical memory");
}

TEST_F(HostLimitsTest, CgroupV2TakesTheTightestQuotaOfTheGroupAndItsAncestors) {
  Write("proc_self_cgroup", "0::/kubepods/pod1/c1\n");
  Write("cgroup/cgroup.controllers", "cpu memory\n");
  // The container may use 2.5 CPUs (3 threads busy part of the time), its pod 4; memory is
  // limited by the pod only.
  Write("cgroup/kubepods/pod1/c1/cpu.max", "250000 100000\n");
  Write("cgroup/kubepods/pod1/c1/memory.max", "max\n");
  Write("cgroup/kubepods/pod1/cpu.max", "400000 100000\n");
  Write("cgroup/kubepods/pod1/memory.max", "4294967296\n");
  HostLimits limits = Read();
  EXPECT_EQ(limits.cpus, 3u);
  EXPECT_THAT(limits.cpus_source, HasSubstr("cpu.max 250000/100000"));
  EXPECT_EQ(limits.memory_bytes, 4 * kGiB);
  EXPECT_THAT(limits.memory_source, HasSubstr("memory.max 4294967296"));
}

TEST_F(HostLimitsTest, AContainerWithoutACgroupNamespaceReadsItsGroupAtTheMountRoot) {
  // The host path in /proc/self/cgroup does not exist inside the container's mount.
  Write("proc_self_cgroup", "0::/system.slice/docker-abc.scope\n");
  Write("cgroup/cgroup.controllers", "cpu memory\n");
  Write("cgroup/cpu.max", "200000 100000\n");
  EXPECT_EQ(Read().cpus, 2u);
}

TEST_F(HostLimitsTest, CgroupV1QuotaAndMemoryLimit) {
  Write("proc_self_cgroup", "4:memory:/pod\n3:cpu,cpuacct:/pod\n0::/\n");
  Write("cgroup/cpu,cpuacct/pod/cpu.cfs_quota_us", "150000\n");
  Write("cgroup/cpu,cpuacct/pod/cpu.cfs_period_us", "100000\n");
  Write("cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  Write("cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  Write("cgroup/memory/pod/memory.limit_in_bytes", "8589934592\n");
  Write("cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  HostLimits limits = Read();
  EXPECT_EQ(limits.cpus, 2u);
  EXPECT_THAT(limits.cpus_source, HasSubstr("cpu.cfs_quota_us 150000/100000"));
  EXPECT_EQ(limits.memory_bytes, 8 * kGiB);
}

TEST_F(HostLimitsTest, ASmallQuotaStillGivesOneCpuAndAQuotaAboveTheMaskIsIgnored) {
  Write("proc_self_cgroup", "0::/a\n");
  Write("cgroup/cgroup.controllers", "cpu\n");
  Write("cgroup/a/cpu.max", "10000 100000\n");
  EXPECT_EQ(Read().cpus, 1u);
  Write("cgroup/a/cpu.max", "12800000 100000\n");  // 128 CPUs of quota, 64 in the mask
  EXPECT_EQ(Read().cpus, 64u);
}

TEST_F(HostLimitsTest, UnreadableFilesMeanNoLimit) {
  HostLimits limits = Read();  // no files at all
  EXPECT_EQ(limits.cpus, 64u);
  EXPECT_EQ(limits.memory_bytes, 256 * kGiB);
}

TEST_F(HostLimitsTest, ThisHostGivesAtLeastOneCpuAndSomeMemory) {
  HostLimits limits = ReadHostLimits();
  EXPECT_GE(limits.cpus, 1u);
  EXPECT_GT(limits.memory_bytes, 0u);
}

}  // namespace
}  // namespace tessera
