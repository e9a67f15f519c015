#ifndef TESSERA_SERVER_CORE_TENANT_RUNTIME_H_
#define TESSERA_SERVER_CORE_TENANT_RUNTIME_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

#include "kernels/registry.h"
#include "server/backend/backend.h"
#include "server/common/shared_memory.h"
#include "server/common/tenant.h"
#include "server/core/job_scheduler.h"
#include "server/core/kernel_library.h"
#include "server/core/memory_ledger.h"
#include "server/core/request_gate.h"

namespace tessera {

struct TensorInfo {
  std::string handle;
  kernels::TensorMeta meta;
  uint64_t size_bytes = 0;
  absl::Time create_time;
};

/// A job's life: kQueued (in the core's stream queue: cancellable, may expire) -> kRunning
/// (released to the backend) -> kSucceeded / kFailed; or kQueued -> kCancelled (CancelJob,
/// TerminateTenantWork, a waiting client that went away, tenant closed, or its deadline
/// passed: then `error` is DEADLINE_EXCEEDED).
enum class JobState { kQueued, kRunning, kSucceeded, kFailed, kCancelled };

/// A consistent copy of a job.
struct JobInfo {
  std::string id;
  JobState state = JobState::kQueued;
  int stream = 0;
  std::vector<TensorInfo> outputs;
  /// For kFailed / kCancelled.
  absl::Status error;
  int failed_step = -1;
  absl::Time enqueue_time, start_time, end_time;
  /// The kernel of a one-step job, "program" for several steps (a metrics label).
  std::string kernel;
  /// When a still-queued job expires; InfiniteFuture: never.
  absl::Time deadline = absl::InfiniteFuture();
};

/// An input of a launch: a tensor handle, or output `output` of an earlier step.
struct Operand {
  std::string handle;
  int step = -1;
  int output = 0;
};

/// An output of a launch: a new tensor with the inferred type and shape, an existing
/// tensor, or a new tensor of a given spec (checked against inference).
struct OutputSpec {
  enum class Kind { kInfer, kHandle, kCreate };
  Kind kind = Kind::kInfer;
  std::string handle;
  kernels::TensorMeta create;
};

struct LaunchSpec {
  std::string kernel;
  std::vector<Operand> inputs;
  /// Empty: one inferred tensor per kernel output.
  std::vector<OutputSpec> outputs;
  kernels::Attrs attrs;
};

/// A tenant's shared-memory region (a client's memfd mapped in the server).
struct RegionInfo {
  std::string handle;
  uint64_t size_bytes = 0;
  absl::Time create_time;
  /// Region transfers using it now.
  uint32_t transfers = 0;
};

struct UsageInfo {
  uint64_t memory_used_bytes = 0, memory_peak_bytes = 0, memory_quota_bytes = 0;
  /// memory_used_bytes by use: tensors (with uncommitted WriteTensor copies), running jobs'
  /// scratch, ReadTensor staging.
  uint64_t memory_tensor_bytes = 0, memory_scratch_bytes = 0, memory_staging_bytes = 0;
  uint64_t tensors = 0;
  uint64_t jobs_queued = 0, jobs_running = 0, jobs_succeeded = 0, jobs_failed = 0,
           jobs_cancelled = 0;
  /// Of jobs_cancelled: those whose deadline passed while queued.
  uint64_t jobs_expired = 0;
  absl::Duration busy_time;
  /// The tenant's RequestGate: calls in flight now, calls refused past its call quotas.
  RequestGate::Counts requests;
  /// Shared-memory regions and their bytes, against quota.max_region_bytes.
  uint64_t regions = 0, region_bytes = 0, region_quota_bytes = 0;
};

inline constexpr size_t kMaxProgramSteps = 256;
/// Finished jobs kept for WaitJob/CancelJob per tenant; older ones are forgotten.
inline constexpr size_t kFinishedJobsKept = 4096;

/// A tenant's data plane: its tensors (bytes counted exactly against the memory quota), its
/// jobs on its streams, and its execution context. Tensor handles are unguessable; handles
/// and job ids are scoped to this tenant. Every launch is validated completely (kernel registry,
/// handles, quota, queue depth) before anything is enqueued.
///
/// Thread-safe. Shared by the tenant table and in-flight calls; Close() (deregistration,
/// shutdown) makes every later call fail and releases the context.
class TenantRuntime : public std::enable_shared_from_this<TenantRuntime> {
 public:
  /// `scheduler` releases the tenant's jobs on `device` (nullptr: a private scheduler with
  /// one job in flight per stream, for tests).
  TenantRuntime(std::string tenant_id, Quota quota, std::unique_ptr<TenantContext> context,
                std::shared_ptr<JobScheduler> scheduler = nullptr, int device = 0);
  ~TenantRuntime();

  const std::string& tenant_id() const { return tenant_id_; }
  /// For a tenant a fleet moved here after its home was lost (TenantTable::Adopt): appended
  /// to the NOT_FOUND of a tensor or job handle, saying that those from before the move are
  /// gone. Set before the runtime is shared.
  void set_moved_note(std::string note) { moved_note_ = std::move(note); }
  const Quota& quota() const { return quota_; }
  const ContextInfo& context_info() const { return context_info_; }
  /// Every byte the tenant's work holds; outlives the runtime while any of it is held.
  const std::shared_ptr<MemoryLedger>& ledger() const { return ledger_; }
  /// The tenant's own kernels (DefineKernel; TenantTable persists them). Launches find a
  /// name in the catalog first, then here.
  KernelLibrary& kernels() { return kernels_; }
  /// The bound on the tenant's calls in flight and their rate (quota.max_requests_in_flight,
  /// quota.requests_per_second). The adapters take a ticket per call after authentication.
  RequestGate& requests() { return requests_; }
  const KernelLibrary& kernels() const { return kernels_; }

  // ---- tensors ----
  /// A new tensor, zero-filled or holding `data` (which must be exactly its size).
  absl::StatusOr<TensorInfo> CreateTensor(const kernels::TensorMeta& meta, absl::string_view data)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<TensorInfo> GetTensor(absl::string_view handle) const ABSL_LOCKS_EXCLUDED(mu_);
  struct TensorPage {
    std::vector<TensorInfo> tensors;
    std::string last_handle;  // set when more follow
  };
  TensorPage ListTensors(absl::string_view after, size_t limit) const ABSL_LOCKS_EXCLUDED(mu_);
  /// Frees the tensor; FAILED_PRECONDITION while a job or a transfer uses it.
  absl::StatusOr<uint64_t> DeleteTensor(absl::string_view handle) ABSL_LOCKS_EXCLUDED(mu_);

  /// An upload in progress. Bytes go to a staging copy of the tensor (charged to the quota
  /// until it commits); Finish() commits it: a new tensor appears, or an existing one's
  /// contents are replaced at once. A writer destroyed unfinished (error, refusal, client
  /// gone) commits nothing: an existing tensor keeps its previous contents. Chunks may come in
  /// any order but may not overlap; Finish() requires every byte written. Write() copies
  /// synchronously: call it off gRPC's callback threads. Not thread-safe (one call at a time).
  class Writer {
   public:
    ~Writer();
    const TensorInfo& info() const { return info_; }
    absl::Status Write(uint64_t offset, absl::string_view data);
    /// One chunk given as `pieces` laid end to end from `offset` (a message's bytes where
    /// gRPC received them), checked and copied as the one chunk they are.
    absl::Status Write(uint64_t offset, absl::Span<const absl::string_view> pieces);
    absl::StatusOr<TensorInfo> Finish();

   private:
    friend class TenantRuntime;
    Writer(std::shared_ptr<TenantRuntime> runtime, TensorInfo info,
           std::shared_ptr<DeviceBuffer> staging, bool created);
    std::shared_ptr<TenantRuntime> runtime_;
    TensorInfo info_;
    std::shared_ptr<DeviceBuffer> staging_;
    bool created_;
    bool finished_ = false;
    uint64_t written_ = 0;
    std::map<uint64_t, uint64_t> ranges_;  // start -> end of written ranges
  };
  /// Writes into an existing tensor (`handle`) or a new one (`create`). FAILED_PRECONDITION
  /// while a job writes the tensor or another transfer uses it; RESOURCE_EXHAUSTED when the
  /// staging copy does not fit the quota. Allocates: call it off gRPC's callback threads.
  absl::StatusOr<std::unique_ptr<Writer>> BeginWrite(
      const std::string& handle, const std::optional<kernels::TensorMeta>& create)
      ABSL_LOCKS_EXCLUDED(mu_);

  /// A download in progress; the tensor cannot be deleted or written meanwhile.
  class Reader {
   public:
    ~Reader();
    const TensorInfo& info() const { return info_; }
    /// Copies synchronously: call it off gRPC's callback threads.
    absl::Status Read(uint64_t offset, uint64_t bytes, void* dst);
    /// The tensor's bytes in place, where the backend keeps them in host memory (the CPU
    /// backend; null on a GPU): a download may send them without copying. The pointer keeps
    /// the memory alive, not the tensor: its bytes are fixed only while this Reader lives.
    std::shared_ptr<const uint8_t> HostBytes() const;
    /// OK while the tenant is open; FAILED_PRECONDITION once it closed (as Read answers).
    absl::Status CheckOpen() const;

   private:
    friend class TenantRuntime;
    Reader(std::shared_ptr<TenantRuntime> runtime, TensorInfo info,
           std::shared_ptr<DeviceBuffer> buffer);
    std::shared_ptr<TenantRuntime> runtime_;
    TensorInfo info_;
    std::shared_ptr<DeviceBuffer> buffer_;
  };
  /// FAILED_PRECONDITION while a queued or running job writes the tensor.
  absl::StatusOr<std::unique_ptr<Reader>> BeginRead(absl::string_view handle)
      ABSL_LOCKS_EXCLUDED(mu_);

  /// Host memory for transfer chunks, charged to the memory quota while held.
  absl::StatusOr<MemoryCharge> ReserveStaging(uint64_t bytes) {
    return ledger_->Reserve(MemoryUse::kStaging, bytes, "of transfer staging");
  }

  /// `cancel` is called (once, from Close, with no lock held) when the tenant closes while
  /// the transfer is in progress; returns an id for RemoveTransferHook.
  uint64_t AddTransferHook(absl::AnyInvocable<void() &&> cancel) ABSL_LOCKS_EXCLUDED(mu_);
  void RemoveTransferHook(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- shared-memory regions (tenant_regions.cc) ----
  /// OK when a region of `size` bytes would fit quota.max_region_bytes and the region count
  /// now (BeginRegion's early answer; AddRegion checks again). RESOURCE_EXHAUSTED otherwise.
  absl::Status CheckRegionFits(uint64_t size) const ABSL_LOCKS_EXCLUDED(mu_);
  /// Adopts a mapped region: registers it with the context for direct copies, charges its
  /// bytes and returns its new handle. RESOURCE_EXHAUSTED past quota.max_region_bytes or
  /// kMaxRegionsPerTenant; the context's refusal; FAILED_PRECONDITION once closed. May block
  /// on the device: call it off gRPC's callback threads.
  absl::StatusOr<RegionInfo> AddRegion(std::unique_ptr<SharedMemory> memory)
      ABSL_LOCKS_EXCLUDED(mu_);
  /// Unmaps a region; returns its bytes. NOT_FOUND; FAILED_PRECONDITION while a transfer
  /// uses it (nothing is unmapped).
  absl::StatusOr<uint64_t> UnregisterRegion(absl::string_view handle) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<RegionInfo> ListRegions() const ABSL_LOCKS_EXCLUDED(mu_);
  /// Writes a tensor (`handle`, or a new one of `create`) whole from `length` bytes of
  /// `region` at `offset` (0: the tensor's size): BeginWrite, one copy, commit. Errors as
  /// BeginWrite, plus NOT_FOUND (region) and INVALID_ARGUMENT (ranges). Copies synchronously:
  /// call it off gRPC's callback threads.
  absl::StatusOr<TensorInfo> WriteFromRegion(const std::string& handle,
                                             const std::optional<kernels::TensorMeta>& create,
                                             absl::string_view region, uint64_t offset,
                                             uint64_t length) ABSL_LOCKS_EXCLUDED(mu_);
  struct RegionRead {
    TensorInfo info;
    uint64_t bytes = 0;
  };
  /// Copies bytes [offset, offset + length) of a tensor (length 0: to its end) into `region`
  /// at `region_offset`. Errors as BeginRead, plus NOT_FOUND (region) and INVALID_ARGUMENT
  /// (ranges). Copies synchronously: call it off gRPC's callback threads.
  absl::StatusOr<RegionRead> ReadIntoRegion(absl::string_view handle, uint64_t offset,
                                            uint64_t length, absl::string_view region,
                                            uint64_t region_offset) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- jobs ----
  using JobCallback = absl::AnyInvocable<void(const JobInfo&) &&>;

  /// Validates and enqueues `steps` as one job on `stream`: resolve (every step checked,
  /// the tensors it uses pinned), allocate new outputs, commit (rolled back on any failure),
  /// enqueue. `program` prefixes errors with the failing step ("steps[2] (matmul): ...").
  /// `on_done`, when given, is attached before the job is enqueued and called once it
  /// finishes, on any thread (possibly before Submit returns); on error it is destroyed unrun.
  /// A job still queued at `deadline` ends kCancelled with DEADLINE_EXCEEDED. Errors:
  /// INVALID_ARGUMENT, NOT_FOUND (a handle), RESOURCE_EXHAUSTED (queue depth, memory quota),
  /// FAILED_PRECONDITION. Allocates: call it off gRPC's callback threads for large outputs.
  absl::StatusOr<JobInfo> Submit(int64_t stream, std::vector<LaunchSpec> steps, bool program,
                                 JobCallback on_done = nullptr,
                                 absl::Time deadline = absl::InfiniteFuture())
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<JobInfo> GetJob(absl::string_view id) const ABSL_LOCKS_EXCLUDED(mu_);
  /// Cancels a queued job (it will not run); a running or finished job is returned as is.
  absl::StatusOr<JobInfo> CancelJob(absl::string_view id) ABSL_LOCKS_EXCLUDED(mu_);
  /// Cancels every queued job (running ones finish); returns how many were cancelled.
  uint64_t CancelQueuedJobs() ABSL_LOCKS_EXCLUDED(mu_);

  /// Calls `callback` once the job has finished (at once if it has), on any thread.
  absl::Status WhenJobDone(absl::string_view id, JobCallback callback) ABSL_LOCKS_EXCLUDED(mu_);
  /// Calls `callback(n)` once every job enqueued so far on `stream` (all streams when
  /// nullopt) has finished; n counts those jobs.
  absl::Status WhenIdle(std::optional<int64_t> stream,
                        absl::AnyInvocable<void(uint64_t) &&> callback) ABSL_LOCKS_EXCLUDED(mu_);

  UsageInfo Usage() const ABSL_LOCKS_EXCLUDED(mu_);

  /// Refuses new work (FAILED_PRECONDITION naming `why`), cancels queued jobs and transfers,
  /// waits for running jobs, drops every tensor and releases the context. Memory still
  /// referenced by a transfer that has not noticed yet stays charged to ledger() until it is
  /// freed. Idempotent.
  /// Later calls fail with `code` (FAILED_PRECONDITION for a deregistered tenant: do not
  /// retry; UNAVAILABLE at shutdown: retry elsewhere or later).
  void Close(absl::string_view why, absl::StatusCode code = absl::StatusCode::kFailedPrecondition)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Tensor {
    TensorInfo info;
    std::shared_ptr<DeviceBuffer> buffer;
    int job_readers = 0;  // queued or running jobs reading it
    int job_writers = 0;  // queued or running jobs writing it
    int transfers = 0;    // ReadTensor/WriteTensor in progress
  };
  struct Job {
    JobInfo info;
    std::vector<std::string> reads, writes;  // handles whose counts this job holds
    bool released = false;
    std::vector<JobCallback> waiters;
    uint64_t ticket = 0;     // the scheduler's id while queued
    std::vector<Step> exec;  // handed to the backend at release
  };
  struct Region {
    RegionInfo info;  // info.transfers guarded by mu_
    // Declared in destruction order, reversed: the registration goes first, then the
    // mapping, then this reference, which keeps the context alive while it is registered.
    std::shared_ptr<TenantContext> context;
    std::unique_ptr<SharedMemory> memory;
    std::unique_ptr<TenantContext::HostRegistration> registration;
  };
  class RegionPin;  // a transfer's use of a region
  /// RESOURCE_EXHAUSTED when a region of `size` bytes would pass quota.max_region_bytes or
  /// kMaxRegionsPerTenant.
  absl::Status RegionFitsLocked(uint64_t size) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  /// Pins region `handle` for a transfer: NOT_FOUND, or FAILED_PRECONDITION once closed.
  absl::StatusOr<std::unique_ptr<RegionPin>> PinRegion(absl::string_view handle)
      ABSL_LOCKS_EXCLUDED(mu_);
  class Pins;  // Submit's RAII rollback
  struct Resolution;
  struct Prepared;

  /// Submit's steps: resolve (validate, pin), prepare (allocate, no lock), commit (record,
  /// enqueue).
  /// The plan of one step: a catalog kernel, else one of the tenant's (plan.user set), else
  /// NOT_FOUND. Takes only the kernel library's lock.
  absl::StatusOr<kernels::Plan> PrepareStep(const std::string& kernel,
                                            std::vector<kernels::TensorMeta> inputs,
                                            const kernels::Attrs& attrs,
                                            const kernels::OutputHints& hints) const;
  absl::Status ResolveLocked(int64_t stream, const std::vector<LaunchSpec>& steps, bool program,
                             Pins& pins, Resolution& resolution) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Prepared> Prepare(const std::vector<LaunchSpec>& steps, Resolution& resolution)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<JobInfo> CommitLocked(int64_t stream, absl::Time deadline, Prepared prepared,
                                       const Resolution& resolution, Pins& pins,
                                       JobCallback on_done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  /// Jobs accepted that have not started: queued, or handed to the device behind a job still
  /// running on their stream (a GPU keeps the next job in flight; the CPU backend never does).
  uint64_t WaitingLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  /// RESOURCE_EXHAUSTED when max_queued_jobs are waiting (WaitingLocked): the same bound on
  /// every backend.
  absl::Status CheckQueueLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  absl::Status CheckOpen() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  /// FAILED_PRECONDITION: `handle` is used by `what`.
  static absl::Status InUse(absl::string_view handle, absl::string_view what);
  absl::StatusOr<Tensor*> FindLocked(absl::string_view handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  /// FindLocked, but DATA_LOSS for a tensor whose memory a context fault destroyed.
  absl::StatusOr<Tensor*> FindLiveLocked(absl::string_view handle)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  /// What a new buffer holds: zeros, or whatever (TenantContext::AllocateForOverwrite) for
  /// a caller that writes every byte before the buffer becomes a tensor.
  enum class NewBytes { kZero, kOverwritten };
  /// A charged buffer for `meta` (quota first, then the device). With `from`, the charge is
  /// split from it instead of reserved anew.
  absl::StatusOr<std::shared_ptr<DeviceBuffer>> AllocateCharged(const kernels::TensorMeta& meta,
                                                                absl::string_view what,
                                                                NewBytes bytes,
                                                                MemoryCharge* from = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  /// Records a new tensor; returns its info.
  absl::StatusOr<TensorInfo> InsertLocked(const kernels::TensorMeta& meta,
                                          std::shared_ptr<DeviceBuffer> buffer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  /// Marks `job` finished; returns its waiters to call outside the lock.
  std::vector<JobCallback> FinishLocked(Job& job, JobState state, absl::Status error,
                                        int failed_step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  /// The scheduler released `job`: hand it to the context.
  void Run(const std::shared_ptr<Job>& job, MemoryCharge scratch) ABSL_LOCKS_EXCLUDED(mu_);
  /// The scheduler dropped queued `job` (deadline, memory).
  void Drop(const std::shared_ptr<Job>& job, absl::Status why) ABSL_LOCKS_EXCLUDED(mu_);
  /// The backend finished `job`.
  void Done(const std::shared_ptr<Job>& job, ExecResult result) ABSL_LOCKS_EXCLUDED(mu_);
  /// Tells the metrics layer (server/common/telemetry.h) of a job that finished.
  void Report(const JobInfo& info) const;
  void EndTransfer(const std::string& handle) ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<TenantContext> ContextOrNull() const ABSL_LOCKS_EXCLUDED(mu_);

  const std::string tenant_id_;
  std::string moved_note_;  // set_moved_note; constant once shared
  const Quota quota_;
  const ContextInfo context_info_;
  const std::shared_ptr<MemoryLedger> ledger_;
  KernelLibrary kernels_;
  RequestGate requests_;
  const std::shared_ptr<JobScheduler> scheduler_;
  const std::shared_ptr<JobScheduler::Queue> queue_;

  // Lock order: mu_ may be held while calling queue_ (its scheduler mutex) and ledger_ (a
  // leaf); never while calling the context, the scheduler's Dispatch/Completed, or a callback.
  mutable absl::Mutex mu_;
  std::shared_ptr<TenantContext> context_ ABSL_GUARDED_BY(mu_);
  std::string closed_ ABSL_GUARDED_BY(mu_);  // why, once closed
  absl::StatusCode closed_code_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kFailedPrecondition;
  std::map<std::string, Tensor, std::less<>> tensors_ ABSL_GUARDED_BY(mu_);
  // Hashed: a job is added, looked up and dropped (the oldest of kFinishedJobsKept) per call.
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> finished_order_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, absl::AnyInvocable<void() &&>> transfer_hooks_ ABSL_GUARDED_BY(mu_);
  uint64_t hook_counter_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::shared_ptr<Region>, std::less<>> regions_ ABSL_GUARDED_BY(mu_);
  uint64_t region_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t job_counter_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  // Released jobs not finished, per stream; above 1, the rest wait behind the first.
  std::vector<uint32_t> running_on_stream_ ABSL_GUARDED_BY(mu_);
  uint64_t handed_ahead_ ABSL_GUARDED_BY(mu_) = 0;  // sum of (running_on_stream_ - 1)+
  uint64_t succeeded_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t expired_ ABSL_GUARDED_BY(mu_) = 0;
};

absl::string_view JobStateName(JobState state);

}  // namespace tessera

#endif  // TESSERA_SERVER_CORE_TENANT_RUNTIME_H_
