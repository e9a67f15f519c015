#ifndef TESSERA_SERVER_BACKEND_CUDA_CUDA_CONTEXT_H_
#define TESSERA_SERVER_BACKEND_CUDA_CUDA_CONTEXT_H_

// One tenant's context on a GPU (TenantContext over the CUDA driver): allocations and copies,
// jobs launched on the tenant's streams, their completion, faults and rebuilding.
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

#include "server/backend/backend.h"
#include "server/backend/cuda/cuda_backend.h"
#include "server/backend/cuda/resources.h"

namespace tessera::cuda {

/// Programs kept as CUDA graphs per tenant context, and programs remembered as seen once.
inline constexpr size_t kMaxProgramsPerContext = 32;
inline constexpr size_t kMaxProgramSightings = 256;

/// A tenant's CUDA context: an MPS client context, a green context or a plain one
/// (ContextPlan), rebuilt after a sticky fault (each build an Incarnation).
///
/// Threads and locks:
/// - `copy_mu_` serializes the copy stream, the pinned staging buffers and the registered
///   host ranges: Allocate (zero-filling), CopyIn, CopyInPieces, CopyOut, RegisterHost and a
///   Registration's release take it. Never taken by the completion thread.
/// - `mu_` guards the incarnation (its graphs, modules and spare events included), the
///   streams' waiting and pending jobs and the busy time; a program's capture as a CUDA graph
///   runs under it (LaunchProgramLocked):
///   Enqueue, Poll, CheckSticky, FaultWith, InjectFault, Start and busy_time take it; the
///   *Locked methods require it. It is never held while a job's callback runs (Deliver is
///   called with no lock held).
/// - Order: `copy_mu_` before `mu_` (ABSL_ACQUIRED_BEFORE), then an incarnation's `use_mu`
///   (shared by allocations and copies, exclusive in Incarnation::Destroy). The Handle's `mu`
///   (image callbacks, host registrations) is taken before either.
/// - Enqueue is called by the core with no lock of the core held; Poll, CheckSticky and
///   FaultWith by the backend's completion thread (CudaBackend::CompletionLoop).
class CudaContext final : public TenantContext {
 public:
  /// A job that ended, with its callback and what it held.
  struct Finished {
    absl::AnyInvocable<void(ExecResult) &&> done;
    ExecResult result;
    // Released with the callback, outside every lock (freeing device memory may wait for
    // the device).
    std::vector<Step> steps;
    std::vector<std::shared_ptr<DeviceBuffer>> temps;
  };

  /// Calls each finished job's callback after releasing what the job held (its buffers and
  /// temporaries), so that a context the callback destroys has nothing of it left; no lock
  /// may be held.
  static void Deliver(std::vector<Finished>& finished);

  /// What image callbacks (on KernelImages' threads) and host registrations reach a context
  /// through: null once the context is going. Taken before the context's copy_mu_ and mu_,
  /// never while delivering jobs.
  struct Handle {
    absl::Mutex mu;
    CudaContext* context ABSL_GUARDED_BY(mu) = nullptr;
  };

  /// An image to ask KernelImages for, on behalf of a context.
  struct FetchRequest {
    std::shared_ptr<const GeneratedKernel> kernel;
    std::string key;
  };

  /// What a context leaves for its caller to do with no lock held.
  struct Followups {
    std::vector<Finished> finished;
    std::vector<FetchRequest> fetches;
  };

  CudaContext(CudaBackend* backend, ContextRequest request, ContextPlan plan);

  ~CudaContext() override;

  const ContextInfo& info() const override;

  int device() const;

  CudaBackend* backend() const;

  /// Creates the first incarnation; fixes info().
  absl::Status Start();

  absl::StatusOr<std::shared_ptr<DeviceBuffer>> Allocate(uint64_t bytes) override;

  absl::StatusOr<std::shared_ptr<DeviceBuffer>> AllocateForOverwrite(uint64_t bytes) override;

  // One DMA from `src` when it lies in a registered range (RegisterHost), else staged.
  absl::Status CopyIn(DeviceBuffer& dst, uint64_t offset, const void* src, uint64_t bytes) override;

  // Gathers the pieces into the pinned staging buffers: one staged copy, as for CopyIn.
  absl::Status CopyInPieces(DeviceBuffer& dst, uint64_t offset,
                            absl::Span<const absl::string_view> pieces) override;

  // One DMA into `dst` when it lies in a registered range (RegisterHost), else staged.
  absl::Status CopyOut(const DeviceBuffer& src, uint64_t offset, void* dst,
                       uint64_t bytes) override;

  // Pins the range in the current incarnation (see HostRange). The pages are pinned for this
  // context only (no CU_MEMHOSTREGISTER_PORTABLE): a region is one tenant's.
  absl::StatusOr<std::unique_ptr<HostRegistration>> RegisterHost(void* base,
                                                                 uint64_t bytes) override;

  absl::Status Woken(absl::Status status);

  // A job's in-place outputs go through temporaries that later steps reuse in stream order
  // (TempSlots): the job needs the largest step's, not the sum over its steps; a matmul
  // needs the cuBLAS workspace besides.
  uint64_t ScratchBytes(const std::vector<Step>& steps) const override;

  // A job goes to its stream's waiting queue, which is drained at once unless a job there
  // needs a tenant-defined kernel that is not compiled yet: that one (and those behind it,
  // which must run after it) wait for KernelImages' callback (OnImage), holding no thread.
  void Enqueue(int stream, std::vector<Step> steps,
               absl::AnyInvocable<void(ExecResult) &&> done) override;

  absl::Duration busy_time() const override;

  /// Collects finished jobs into `finished`; returns the sticky error that faulted this
  /// context since the last call, wherever it was seen (a job, an allocation, a copy), so
  /// that the backend looks at the rest of the device once per fault.
  CUresult Poll(std::vector<Finished>& finished, bool& busy);

  /// Whether this context reports a sticky error now (after a fault elsewhere on its
  /// device); if so it is faulted like one of its own.
  void CheckSticky(std::vector<Finished>& finished);

  /// Faults this context with `error`, found elsewhere in the process (a process-fatal
  /// error reaches every context, whatever the driver says of this one yet).
  void FaultWith(CUresult error, std::vector<Finished>& finished);

  absl::Status InjectFault(int stream);

  /// The current incarnation's driver context (null when there is none), for a benchmark's
  /// baseline (RawContextOf). Takes mu_.
  CUcontext raw_context() const;

 private:
  // A buffer on this context's device; zero-filled on the copy stream when `zero`.
  absl::StatusOr<std::shared_ptr<DeviceBuffer>> AllocateOnDevice(uint64_t bytes, bool zero);

  struct Pending {
    std::shared_ptr<Incarnation> inc;
    Event start, end;  // destroyed with the job, in its context
    std::vector<Step> steps;
    std::vector<std::shared_ptr<DeviceBuffer>> temps;
    absl::AnyInvocable<void(ExecResult) &&> done;
    ExecResult result;
  };

  CUresult CreateEvent(Event& event, unsigned int flags) const;

  // A job's timing event: a finished job's, or a new one (in `inc`'s context, current).
  CUresult TakeEvent(Incarnation& inc, Event& event) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static void Abandon(Pending& p);

  absl::Status Failed(CUresult r, absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Creates an incarnation per plan_; a green context that cannot be made falls back to a
  // plain one with the reason recorded.
  absl::StatusOr<std::shared_ptr<Incarnation>> Build() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The live incarnation, rebuilt after a fault. UNAVAILABLE while it cannot be.
  absl::StatusOr<std::shared_ptr<Incarnation>> CurrentLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Copies `bytes` between `buffer` and host memory at `host`: with one DMA (`direct`) when
  // the host range lies in a registered range pinned in the current incarnation, else through
  // the context's two pinned staging buffers (`issue`, `drain`: one filled while the other's
  // DMA runs). Serialized per context by copy_mu_; mu_ is taken only to look up the
  // incarnation and to record a fault, so jobs are enqueued and completed meanwhile.
  template <typename Direct, typename Issue, typename Drain>
  absl::Status Transfer(const CudaBuffer& buffer, const void* host, uint64_t bytes, Direct direct,
                        Issue issue, Drain drain);

  template <typename Direct>
  CUresult DirectLocked(Incarnation& inc, Direct& direct) ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_);

  template <typename Issue, typename Drain>
  CUresult StageLocked(Incarnation& inc, Issue& issue, Drain& drain, uint64_t bytes,
                       const char*& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_);

  // ---- Registered host ranges (RegisterHost) ----------------------------------------------
  //
  // A range is pinned in the incarnation it was registered in. After a fault the new
  // incarnation's first copy inside the range pins it there again (once: a refusal leaves the
  // range staged in that incarnation) and copies directly. Pinning and unpinning happen under
  // copy_mu_, with the incarnation's use_mu held shared, so a copy never sees half of either.

  struct HostRange {
    uint64_t bytes = 0;
    // The incarnation last pinned in (or refused to pin it, `pinned` false).
    std::shared_ptr<Incarnation> inc;
    bool pinned = false;
  };

  /// What RegisterHost returns: unpins its range when destroyed, unless the context went
  /// first (and unpinned it).
  class Registration final : public HostRegistration {
   public:
    Registration(std::shared_ptr<Handle> handle, uintptr_t base)
        : handle_(std::move(handle)), base_(base) {}
    ~Registration() override {
      absl::MutexLock lock(&handle_->mu);
      if (handle_->context != nullptr) handle_->context->UnregisterHost(base_);
    }

   private:
    const std::shared_ptr<Handle> handle_;
    const uintptr_t base_;
  };

  bool OverlapsLocked(uintptr_t start, uint64_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_);

  // `inc` is in use (its use_mu held shared, its context alive).
  CUresult PinLocked(Incarnation& inc, uintptr_t base, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_);

  void UnpinLocked(uintptr_t base, const HostRange& range) ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_);

  /// Whether [host, host + bytes) lies inside one registered range pinned in `current` (its
  /// use_mu held shared), pinning the range there first if it was pinned in an earlier
  /// incarnation (current_ changes only when one is lost).
  bool PinnedLocked(const std::shared_ptr<Incarnation>& current, const void* host, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_);

  void UnregisterHost(uintptr_t base) ABSL_LOCKS_EXCLUDED(copy_mu_);

  // Registrations outlive their context only when the caller breaks backend.h's contract;
  // their ranges are unpinned here, so that nothing of the tenant's stays pinned.
  void ReleaseHostRanges() ABSL_LOCKS_EXCLUDED(copy_mu_);

  static absl::Status Lost();

  /// Failed(), for callers that do not hold mu_.
  absl::Status FailedUnlocked(CUresult r, absl::string_view what) ABSL_LOCKS_EXCLUDED(mu_);

  /// The live incarnation (rebuilt after a fault), taken briefly under mu_.
  absl::StatusOr<std::shared_ptr<Incarnation>> Current() ABSL_LOCKS_EXCLUDED(mu_);

  // Launches `steps` on `stream` as one job. With `failure` (a step that cannot run: its
  // kernel did not compile), the steps before that one run and the job then ends with it.
  void EnqueueLocked(int stream, std::vector<Step> steps,
                     absl::AnyInvocable<void(ExecResult) &&> done, std::vector<Finished>& failed,
                     ExecResult failure = {absl::OkStatus(), -1})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Launches `step` on `s`. An output that is also an input is computed into temporary slot
  // i (TempSlots: `slots`, allocated into `temps` at first use and reused by later steps in
  // stream order), then copied back.
  absl::Status LaunchStep(Incarnation& inc, CUstream s, const Step& step,
                          const std::vector<uint64_t>& slots,
                          std::vector<std::shared_ptr<DeviceBuffer>>& temps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  /// Launches the steps of a program (several steps, none staged through a temporary) on `s`,
  /// stream index `stream`, as one CUDA graph: the second run of the same steps (ProgramKey:
  /// kernels, shapes, attributes, stream) captures and instantiates them, later runs launch
  /// the graph as it is when the tensors' addresses are the same, or after updating its nodes
  /// from a new capture (cuGraphExecUpdate) when they are not. False when it launched nothing
  /// (the first run; a capture, instantiation or launch the driver refused without a fault,
  /// after which the program is not tried as a graph again): the caller launches step by
  /// step. True otherwise, with `status` the failure if any (a sticky error, or a capture that
  /// could not be ended: the job then fails as a whole, no step ran). At most
  /// kMaxProgramsPerContext graphs per incarnation, least recently used evicted; destroyed with the
  /// incarnation.
  bool LaunchProgramLocked(Incarnation& inc, CUstream s, int stream, const std::vector<Step>& steps,
                           absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  /// Marks the tenant-defined kernels `steps` launch as used now (a graph launches them
  /// without LaunchStep), so that the least recently launched module is unloaded first.
  void TouchUserModulesLocked(Incarnation& inc, const std::vector<Step>& steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void PollLocked(std::vector<Finished>& finished) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A sticky error: every queued job fails, the tensors are lost, the context is destroyed;
  // the next use builds a new one.
  void FaultLocked(CUresult error, std::vector<Finished>& finished)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Tenant-defined kernels ------------------------------------------------------------

  /// A job not yet launched: it, or a job before it on its stream, waits for kernel images.
  struct Waiting {
    int stream = 0;
    std::vector<Step> steps;
    absl::AnyInvocable<void(ExecResult) &&> done;
    // Images asked for (by key), with the step needing each; images received for them.
    std::map<std::string, int> missing;
    std::map<std::string, KernelImage> images;
    ExecResult failure{absl::OkStatus(), -1};
  };

  /// Delivers jobs and starts fetches left by a context (which may be gone meanwhile), then
  /// wakes the completion thread. No lock held.
  static void Finish(CudaBackend* backend, const std::string& tenant,
                     const std::shared_ptr<Handle>& handle, Followups& followups);

  static int ArchOfKey(const std::string& key);

  /// KernelImages' answer for `key`: the jobs that asked get the image or fail with the
  /// error, and every stream is drained again.
  void OnImage(const std::string& key, absl::StatusOr<KernelImage> image, Followups& followups)
      ABSL_LOCKS_EXCLUDED(mu_);

  /// Launches the jobs at the front of stream `s`'s waiting queue whose kernels are loaded (or
  /// can be now), fails those that cannot run, and stops at the first that waits for images.
  void DrainLocked(size_t s, Followups& followups) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  /// Loads the tenant-defined kernels of `w` (those before a step that failed) into the
  /// current incarnation from the images at hand; true when none is missing, false when images
  /// were asked for (added to `fetches` unless already asked). A kernel that cannot be had
  /// fails its step (w.failure); the steps before it still run.
  bool PrepareLocked(Waiting& w, std::vector<FetchRequest>& fetches)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  /// Loads `image` into `inc` as the module of program `hash`, first unloading the least
  /// recently launched module that no queued job uses when the context has too many.
  absl::Status LoadUserModuleLocked(Incarnation& inc, const std::string& hash,
                                    const GeneratedKernel& kernel, const std::string& image)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  friend class CudaBackend;

  CudaBackend* backend_;

  const Driver& driver_;

  const ContextRequest request_;

  ContextPlan plan_;

  ContextInfo info_;

  bool started_ = false;

  const std::shared_ptr<Handle> handle_;

  // Serializes the context's use of its copy stream and pinned staging (Allocate, CopyIn,
  // CopyOut) and of its registered host ranges. Taken before mu_, never by the completion
  // thread.
  absl::Mutex copy_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  // By start address; disjoint.
  std::map<uintptr_t, HostRange> host_ranges_ ABSL_GUARDED_BY(copy_mu_);

  mutable absl::Mutex mu_;

  std::shared_ptr<Incarnation> current_ ABSL_GUARDED_BY(mu_);

  std::vector<std::deque<Pending>> pending_ ABSL_GUARDED_BY(mu_);

  // Per stream: jobs not launched yet, in Enqueue order (see Enqueue).
  std::vector<std::deque<Waiting>> waiting_ ABSL_GUARDED_BY(mu_);

  // Image keys asked of KernelImages and not answered yet.
  std::set<std::string> fetching_ ABSL_GUARDED_BY(mu_);

  std::vector<Finished> orphaned_ ABSL_GUARDED_BY(mu_);

  absl::Duration busy_ ABSL_GUARDED_BY(mu_);

  // The sticky error of the last fault, until Poll reports it to the backend.
  CUresult unreported_fault_ ABSL_GUARDED_BY(mu_) = CUDA_SUCCESS;
};

}  // namespace tessera::cuda

#endif  // TESSERA_SERVER_BACKEND_CUDA_CUDA_CONTEXT_H_
