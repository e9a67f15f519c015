#ifndef TESSERA_SERVER_BACKEND_CUDA_CUDA_BACKEND_H_
#define TESSERA_SERVER_BACKEND_CUDA_CUDA_BACKEND_H_

#include <memory>
#include <set>
#include <thread>
#include <vector>

#include <cuda.h>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "server/backend/backend.h"
#include "server/backend/cuda/driver.h"
#include "server/backend/cuda/kernel_images.h"
#include "server/backend/cuda/launch.h"
#include "server/backend/cuda_module.h"
#include "server/backend/gpu_policy.h"

namespace tessera::cuda {

class CudaContext;

/// The completion thread's name (/proc/<pid>/task/<tid>/comm), so that its CPU time can be
/// read apart from the rest of the process.
inline constexpr char kCompletionThreadName[] = "cuda-completion";

/// While jobs are in flight, the completion thread polls them back to back for kCompletionSpin
/// after the last job was enqueued or finished (a job that ends meanwhile is seen within a
/// poll, a microsecond or two), then waits between polls an eighth of the time since then,
/// within [kCompletionMinPoll, kCompletionMaxPoll]: a job that runs T is seen at most about
/// T/8 late, and a long job costs a few polls per millisecond. With nothing in flight the
/// thread sleeps until a job is enqueued.
inline constexpr absl::Duration kCompletionSpin = absl::Microseconds(50);
inline constexpr absl::Duration kCompletionMinPoll = absl::Microseconds(10);
inline constexpr absl::Duration kCompletionMaxPoll = absl::Milliseconds(1);

/// How long the completion thread waits before its next poll, `since_progress` after the
/// last job was enqueued or finished, while jobs are in flight (zero: poll now).
absl::Duration CompletionPollDelay(absl::Duration since_progress);

/// The CUDA backend: one context per tenant (MPS client, green or plain, per gpu_policy),
/// `max_streams` prioritized streams each, completions collected by one thread that polls the
/// jobs in flight (CompletionPollDelay; or is woken by a host function per job with
/// CudaModuleOptions::completion "host_function"): no thread waits per job. Tenant-defined kernels
/// are compiled per GPU architecture on KernelImages' threads; a job that needs one waits for it
/// (and the jobs behind it on its stream wait too) without holding any thread. All methods are
/// thread-safe.
class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaModuleOptions& options);
  ~CudaBackend() override;

  absl::string_view name() const override { return "cuda"; }
  const std::vector<DeviceInfo>& devices() const override { return devices_; }
  MpsState mps() const override ABSL_LOCKS_EXCLUDED(mps_mu_);
  absl::StatusOr<std::unique_ptr<TenantContext>> CreateContext(
      const ContextRequest& request) override;
  /// Two: the GPU starts a stream's next job as soon as the previous one ends.
  int stream_in_flight() const override { return 2; }
  void SetFatalHandler(absl::AnyInvocable<void(const absl::Status&)> handler) override
      ABSL_LOCKS_EXCLUDED(fatal_mu_);
  /// OK until a process-fatal CUDA error (ClassifyCudaError's process_fatal); then the
  /// UNAVAILABLE status every later use of the backend gets.
  absl::Status fatal() const ABSL_LOCKS_EXCLUDED(fatal_mu_);

  /// Test hook (see cuda_module.h).
  absl::Status InjectFault(TenantContext& context, int stream);
  /// Wakes the completion thread; safe from a CUDA host function (takes only wake_mu_).
  void Wake() ABSL_LOCKS_EXCLUDED(wake_mu_);
  /// A process-fatal error seen anywhere (Driver::on_process_fatal): the completion thread
  /// stops the backend (OnProcessFatal) even when no context is left to report it. Takes
  /// only wake_mu_.
  void ReportProcessFatal(CUresult error) ABSL_LOCKS_EXCLUDED(wake_mu_);

 private:
  friend class CudaContext;
  struct Gpu {
    CUdevice device = 0;
    int sms = 0;
    int cc_major = 0;
    int arch = 0;  // compute capability as NVRTC names it: 90 for sm_90
    GreenSupport green;
    // One split of the device into equal SM groups of the smallest partition; a green
    // context combines several (resources of one split may share a descriptor).
    std::vector<CUdevResource> sm_groups;
    int group_sms = 0;
  };

  friend struct Incarnation;
  /// SM groups for a green context of `sm_count` SMs on `device` (PickSmGroups); `shared`:
  /// how many of them other green contexts already use.
  std::vector<int> AcquireSmGroups(int device, int sm_count, int& shared)
      ABSL_LOCKS_EXCLUDED(groups_mu_);
  void ReleaseSmGroups(int device, const std::vector<int>& groups) ABSL_LOCKS_EXCLUDED(groups_mu_);

  CudaBackend() = default;
  void Register(CudaContext* context) ABSL_LOCKS_EXCLUDED(mu_);
  void Unregister(CudaContext* context) ABSL_LOCKS_EXCLUDED(mu_);
  /// Calls `visit` for each registered context with no backend lock held; a context is not
  /// unregistered (destroyed) while it is visited. Only the completion thread calls it.
  void ForEachContext(absl::FunctionRef<void(CudaContext&)> visit) ABSL_LOCKS_EXCLUDED(mu_);
  /// Collects finished jobs, detects faults, runs the callbacks (with no lock held).
  void CompletionLoop();
  /// After a sticky fault on `device`: re-probe MPS and fault every other context there
  /// that reports the error too.
  void OnDeviceFault(int device, CUresult error) ABSL_LOCKS_EXCLUDED(mu_, mps_mu_);
  /// After a process-fatal error: every context in the process has it (NVIDIA: the process
  /// must be relaunched), so every context is faulted, nothing is rebuilt, and the fatal
  /// handler is told once. Completion thread only.
  void OnProcessFatal(int device, CUresult error) ABSL_LOCKS_EXCLUDED(mu_, fatal_mu_);

  std::unique_ptr<Driver> driver_;
  std::unique_ptr<KernelTable> kernels_;
  // Compiled tenant-defined kernels; destroyed first (its threads call into contexts' handles).
  std::unique_ptr<KernelImages> images_;
  std::vector<DeviceInfo> devices_;
  std::vector<Gpu> gpus_;
  std::string mps_mode_;
  // CudaModuleOptions::completion == "host_function".
  bool host_function_completion_ = false;
  // CudaModuleOptions::graphs.
  bool graphs_ = true;
  // CudaModuleOptions::single_launch_graphs.
  bool single_launch_graphs_ = false;

  mutable absl::Mutex mps_mu_;
  MpsState mps_ ABSL_GUARDED_BY(mps_mu_);

  // Host functions take only wake_mu_, so they never wait behind polling.
  absl::Mutex wake_mu_;
  absl::CondVar wake_;
  bool woken_ ABSL_GUARDED_BY(wake_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(wake_mu_) = false;
  CUresult reported_fatal_ ABSL_GUARDED_BY(wake_mu_) = CUDA_SUCCESS;
  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(wake_mu_);
  std::set<CudaContext*> contexts_ ABSL_GUARDED_BY(mu_);
  // The context the completion thread is visiting without mu_ (see ForEachContext).
  CudaContext* polling_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Mutex groups_mu_;
  // Per device, per SM group: the live green contexts using it.
  std::vector<std::vector<int>> group_users_ ABSL_GUARDED_BY(groups_mu_);
  std::thread completer_;

  mutable absl::Mutex fatal_mu_;
  absl::Status fatal_ ABSL_GUARDED_BY(fatal_mu_);
  absl::AnyInvocable<void(const absl::Status&)> fatal_handler_ ABSL_GUARDED_BY(fatal_mu_);
};

/// The benchmark hook behind cuda_module.h's kCudaModuleContextHandle (`context` must come
/// from a CudaBackend): its current incarnation's CUcontext, or null.
void* RawContextOf(TenantContext& context);

/// The test hook behind cuda_module.h's kCudaModuleInjectFault (`context` must come from a
/// CudaBackend).
absl::Status InjectFaultInto(TenantContext& context, int stream);

}  // namespace tessera::cuda

#endif  // TESSERA_SERVER_BACKEND_CUDA_CUDA_BACKEND_H_
