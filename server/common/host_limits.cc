#include "server/common/host_limits.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include <sched.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tessera {
namespace {

std::optional<std::string> ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return std::string(absl::StripAsciiWhitespace(line));
}

// The group's directory and its ancestors up to the mount, innermost first. Without a
// cgroup namespace a container sees its host path in /proc/self/cgroup while its own group
// is mounted at the root: then only the root is looked at.
std::vector<std::string> GroupAndAncestors(const std::string& mount, const std::string& path) {
  std::vector<std::string> dirs;
  std::filesystem::path dir = std::filesystem::path(mount + path).lexically_normal();
  const std::filesystem::path root = std::filesystem::path(mount).lexically_normal();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return {root.string()};
  while (true) {
    dirs.push_back(dir.string());
    if (dir == root || !dir.has_relative_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
    if (dir.string().size() < root.string().size()) break;
  }
  return dirs;
}

struct Limit {
  double value = 0;  // CPUs, or bytes
  std::string source;
};

void TakeSmaller(std::optional<Limit>& best, double value, std::string source) {
  if (!best.has_value() || value < best->value) best = Limit{value, std::move(source)};
}

// cgroup v2: cpu.max is "QUOTA PERIOD" or "max PERIOD"; memory.max is bytes or "max".
void ReadV2(const std::vector<std::string>& dirs, std::optional<Limit>& cpu,
            std::optional<Limit>& memory) {
  for (const std::string& dir : dirs) {
    if (std::optional<std::string> line = ReadFirstLine(dir + "/cpu.max")) {
      std::vector<std::string> parts = absl::StrSplit(*line, ' ', absl::SkipEmpty());
      double quota = 0, period = 0;
      if (parts.size() == 2 && absl::SimpleAtod(parts[0], &quota) &&
          absl::SimpleAtod(parts[1], &period) && quota > 0 && period > 0) {
        TakeSmaller(cpu, quota / period,
                    absl::StrCat("cgroup cpu.max ", parts[0], "/", parts[1], " at ", dir));
      }
    }
    if (std::optional<std::string> line = ReadFirstLine(dir + "/memory.max")) {
      uint64_t bytes = 0;
      if (absl::SimpleAtoi(*line, &bytes) && bytes > 0) {
        TakeSmaller(memory, static_cast<double>(bytes),
                    absl::StrCat("cgroup memory.max ", bytes, " at ", dir));
      }
    }
  }
}

// cgroup v1: cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us; memory.limit_in_bytes (a
// value near 2^63 means none; anything above physical memory is no limit either).
void ReadV1Cpu(const std::vector<std::string>& dirs, std::optional<Limit>& cpu) {
  for (const std::string& dir : dirs) {
    std::optional<std::string> quota_text = ReadFirstLine(dir + "/cpu.cfs_quota_us");
    std::optional<std::string> period_text = ReadFirstLine(dir + "/cpu.cfs_period_us");
    double quota = 0, period = 0;
    if (quota_text && period_text && absl::SimpleAtod(*quota_text, &quota) &&
        absl::SimpleAtod(*period_text, &period) && quota > 0 && period > 0) {
      TakeSmaller(
          cpu, quota / period,
          absl::StrCat("cgroup cpu.cfs_quota_us ", *quota_text, "/", *period_text, " at ", dir));
    }
  }
}

void ReadV1Memory(const std::vector<std::string>& dirs, std::optional<Limit>& memory) {
  for (const std::string& dir : dirs) {
    std::optional<std::string> line = ReadFirstLine(dir + "/memory.limit_in_bytes");
    uint64_t bytes = 0;
    if (line && absl::SimpleAtoi(*line, &bytes) && bytes > 0) {
      TakeSmaller(memory, static_cast<double>(bytes),
                  absl::StrCat("cgroup memory.limit_in_bytes ", bytes, " at ", dir));
    }
  }
}

uint32_t AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<uint32_t>(n);
  }
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<uint32_t>(online) : 1;
}

uint64_t PhysicalMemory() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

}  // namespace

HostLimits ReadHostLimits(const HostPaths& paths) {
  const uint32_t affinity = paths.affinity_cpus != 0 ? paths.affinity_cpus : AffinityCpus();
  const uint64_t physical =
      paths.physical_memory_bytes != 0 ? paths.physical_memory_bytes : PhysicalMemory();

  std::optional<Limit> cpu, memory;
  std::ifstream groups(paths.proc_self_cgroup);
  const bool unified = std::filesystem::exists(paths.cgroup_root + "/cgroup.controllers");
  for (std::string line; std::getline(groups, line);) {
    // hierarchy-id:controllers:path (the path may itself hold ':').
    std::vector<std::string> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    const std::string& path = fields[2];
    if (fields[0] == "0" && fields[1].empty()) {
      if (unified) ReadV2(GroupAndAncestors(paths.cgroup_root, path), cpu, memory);
      continue;
    }
    std::vector<std::string> controllers = absl::StrSplit(fields[1], ',');
    auto has = [&](const char* c) {
      return std::find(controllers.begin(), controllers.end(), c) != controllers.end();
    };
    if (has("cpu")) {
      for (const char* mount : {"cpu", "cpu,cpuacct", "cpuacct,cpu"}) {
        const std::string m = absl::StrCat(paths.cgroup_root, "/", mount);
        if (std::filesystem::is_directory(m)) {
          ReadV1Cpu(GroupAndAncestors(m, path), cpu);
          break;
        }
      }
    }
    if (has("memory")) {
      const std::string m = paths.cgroup_root + "/memory";
      if (std::filesystem::is_directory(m)) ReadV1Memory(GroupAndAncestors(m, path), memory);
    }
  }

  HostLimits limits;
  limits.cpus = std::max<uint32_t>(1, affinity);
  limits.cpus_source = absl::StrCat(affinity, " CPU(s) in the affinity mask");
  if (cpu.has_value()) {
    // A fractional quota (1.5 CPUs) still keeps two threads busy part of the time.
    const auto quota_cpus = static_cast<uint32_t>(std::max(1.0, std::ceil(cpu->value - 1e-9)));
    if (quota_cpus < limits.cpus) {
      limits.cpus = quota_cpus;
      limits.cpus_source = absl::StrCat(quota_cpus, " CPU(s) from the ", cpu->source);
    }
  }
  limits.memory_bytes = physical;
  limits.memory_source = "physical memory";
  if (memory.has_value() && (physical == 0 || memory->value < static_cast<double>(physical))) {
    limits.memory_bytes = static_cast<uint64_t>(memory->value);
    limits.memory_source = memory->source;
  }
  return limits;
}

}  // namespace tessera
