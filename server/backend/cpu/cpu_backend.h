#ifndef TESSERA_SERVER_BACKEND_CPU_CPU_BACKEND_H_
#define TESSERA_SERVER_BACKEND_CPU_CPU_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/backend/backend.h"
#include "server/backend/cpu/host_memory.h"
#include "server/backend/cpu/scheduler.h"

namespace tessera {

/// The CPU backend: one device ("cpu") whose capacity is a configured amount of host
/// memory; tenants share a fixed worker pool by weighted fair queueing with their compute
/// share as the weight. Buffers are host memory; freed large ones are kept for reuse up to an
/// eighth of `memory_bytes`, at most kMaxKeptMappingBytes (HostMappingCache).
class CpuBackend final : public Backend {
 public:
  struct Options {
    /// Host memory tenants may reserve, bytes (> 0).
    uint64_t memory_bytes = 0;
    /// Worker threads (> 0).
    uint32_t worker_threads = 1;
    /// The workers' nice value, 0..19 (CpuScheduler).
    int worker_nice = 0;
    /// Why the CPU backend serves, e.g. "--backend=cpu"; reported in each context.
    std::string reason;
  };

  static constexpr uint64_t kMaxKeptMappingBytes = uint64_t{1} << 30;

  explicit CpuBackend(Options options);
  /// Every context must have been destroyed first.
  ~CpuBackend() override;

  absl::string_view name() const override { return "cpu"; }
  const std::vector<DeviceInfo>& devices() const override { return devices_; }
  MpsState mps() const override;
  absl::StatusOr<std::unique_ptr<TenantContext>> CreateContext(
      const ContextRequest& request) override;

 private:
  const Options options_;
  const std::vector<DeviceInfo> devices_;
  CpuScheduler scheduler_;
  const std::shared_ptr<HostMappingCache> mappings_;
};

/// Physical memory of this host in bytes (0 if unknown).
uint64_t PhysicalMemoryBytes();

}  // namespace tessera

#endif  // TESSERA_SERVER_BACKEND_CPU_CPU_BACKEND_H_
