#ifndef TESSERA_SERVER_COMMON_HOST_LIMITS_H_
#define TESSERA_SERVER_COMMON_HOST_LIMITS_H_

// What this process may use of the host: CPUs and memory after the scheduler affinity mask
// and the control group's limits (cgroup v2 cpu.max / memory.max, or v1 cpu.cfs_quota_us /
// memory.limit_in_bytes, for the process's own group and every ancestor). A container with
// `resources.limits.cpu: 4` on a 64-core node gets 4, not 64, so pools sized from it do not
// oversubscribe the quota (which the kernel enforces by throttling the whole group).
#include <cstdint>
#include <string>

namespace tessera {

struct HostLimits {
  /// CPUs the process may keep busy: min(affinity mask, ceil(cgroup quota / period)), >= 1.
  uint32_t cpus = 1;
  /// Where `cpus` comes from, for logs ("4 CPUs (cgroup cpu.max 400000/100000 at /...)").
  std::string cpus_source;
  /// min(physical memory, the cgroup's memory limit); 0 when unknown.
  uint64_t memory_bytes = 0;
  std::string memory_source;
};

/// Where ReadHostLimits looks; tests point these at a fake tree.
struct HostPaths {
  /// The process's groups, "hierarchy-id:controllers:path" per line.
  std::string proc_self_cgroup = "/proc/self/cgroup";
  /// Where the cgroup file systems are mounted (v2 at the root, v1 one directory per
  /// controller: cpu or cpu,cpuacct, memory).
  std::string cgroup_root = "/sys/fs/cgroup";
  /// CPUs in the affinity mask and physical memory; 0: read from this host.
  uint32_t affinity_cpus = 0;
  uint64_t physical_memory_bytes = 0;
};

/// Reads the limits. Never fails: what cannot be read is treated as unlimited (and said so
/// in the source strings).
HostLimits ReadHostLimits(const HostPaths& paths = {});

}  // namespace tessera

#endif  // TESSERA_SERVER_COMMON_HOST_LIMITS_H_
