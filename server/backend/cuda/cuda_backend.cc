#include "server/backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include <stdlib.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

#include "kernels/expr/user_kernel.h"
#include "server/backend/cuda/ops.h"
#include "server/backend/cuda/resources.h"
#include "server/backend/mps_probe.h"
#include "server/common/logging.h"
#include "server/common/status_macros.h"

namespace tessera::cuda {
namespace {

// Pinned staging for host<->device copies: two buffers, so filling one overlaps the DMA of
// the other.
constexpr uint64_t kStagingBytes = 8ull << 20;
// cuBLAS's workspace, ours so that its size is known and charged to the tenant: a job with a
// matmul reserves it from the tenant's quota (32 MiB is what cuBLAS itself takes on Hopper).
constexpr uint64_t kCublasWorkspaceBytes = 32ull << 20;
// Timing events kept per context for reuse: two per job in flight, with room to spare.
constexpr size_t kSpareEvents = 64;
// Tenant-defined kernels loaded per context at most (the least recently launched one not in
// use is unloaded to make room).
constexpr size_t kMaxUserModules = 256;

}  // namespace

namespace {

void CUDA_CB WakeBackend(void* backend);

// "0-4, 7, 9-10".
std::string GroupList(const std::vector<int>& groups) {
  std::string out;
  for (size_t i = 0; i < groups.size();) {
    size_t j = i;
    while (j + 1 < groups.size() && groups[j + 1] == groups[j] + 1) ++j;
    absl::StrAppend(&out, out.empty() ? "" : ", ", groups[i]);
    if (j > i) absl::StrAppend(&out, "-", groups[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

// The outputs of `step` that are also its inputs and so are computed into a temporary
// (none when the kernel is safe in place), largest first: the i-th takes temporary slot i.
std::vector<size_t> StagedOutputs(const Step& step) {
  std::vector<size_t> staged;
  if (AliasSafe(step.plan)) return staged;
  for (size_t k = 0; k < step.outputs.size(); ++k) {
    for (const auto& in : step.inputs) {
      if (in.get() == step.outputs[k].get()) {
        staged.push_back(k);
        break;
      }
    }
  }
  std::stable_sort(staged.begin(), staged.end(), [&](size_t a, size_t b) {
    return step.outputs[a]->size() > step.outputs[b]->size();
  });
  return staged;
}

// A job's temporaries: slot i is as large as the i-th largest staged output of any step.
// Steps run in order on one stream and each copies its temporary back before the next
// starts, so every step reuses the same slots.
std::vector<uint64_t> TempSlots(const std::vector<Step>& steps) {
  std::vector<uint64_t> slots;
  for (const Step& step : steps) {
    const std::vector<size_t> staged = StagedOutputs(step);
    if (slots.size() < staged.size()) slots.resize(staged.size(), 0);
    for (size_t i = 0; i < staged.size(); ++i) {
      slots[i] =
          std::max<uint64_t>(slots[i], std::max<uint64_t>(step.outputs[staged[i]]->size(), 1));
    }
  }
  return slots;
}

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
  static void Deliver(std::vector<Finished>& finished) {
    for (Finished& f : finished) {
      f.steps.clear();
      f.temps.clear();
      std::move(f.done)(std::move(f.result));
    }
    finished.clear();
  }

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

  CudaContext(CudaBackend* backend, ContextRequest request, ContextPlan plan)
      : backend_(backend),
        driver_(*backend->driver_),
        request_(std::move(request)),
        plan_(std::move(plan)),
        handle_(std::make_shared<Handle>()) {
    pending_.resize(std::max<uint32_t>(1, request_.quota.max_streams));
    waiting_.resize(pending_.size());
    absl::MutexLock lock(&handle_->mu);
    handle_->context = this;
  }

  ~CudaContext() override {
    {
      absl::MutexLock lock(&handle_->mu);  // waits for a callback inside this context
      handle_->context = nullptr;
    }
    ReleaseHostRanges();
    backend_->Unregister(this);
    std::vector<Finished> finished;
    {
      absl::MutexLock lock(&mu_);
      if (current_ != nullptr && !current_->lost.load()) {
        for (const Stream& s : current_->streams) {
          ScopedContext scoped(driver_, current_->context);
          driver_.cuStreamSynchronize(s.get());
        }
      }
      PollLocked(finished);
      for (auto& queue : waiting_) {
        for (Waiting& w : queue) {
          finished.push_back(
              {std::move(w.done),
               ExecResult{absl::CancelledError("the tenant's context closed while the job waited "
                                               "for its kernels to compile"),
                          -1},
               std::move(w.steps)});
        }
        queue.clear();
      }
    }
    Deliver(finished);
  }

  const ContextInfo& info() const override { return info_; }
  int device() const { return request_.device_index; }
  CudaBackend* backend() const { return backend_; }

  /// Creates the first incarnation; fixes info().
  absl::Status Start() {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::shared_ptr<Incarnation>> inc = Build();
    if (!inc.ok()) return inc.status();
    current_ = *std::move(inc);
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<DeviceBuffer>> Allocate(uint64_t bytes) override {
    return AllocateOnDevice(bytes, /*zero=*/true);
  }

  absl::StatusOr<std::shared_ptr<DeviceBuffer>> AllocateForOverwrite(uint64_t bytes) override {
    return AllocateOnDevice(bytes, /*zero=*/false);
  }

  // One DMA from `src` when it lies in a registered range (RegisterHost), else staged.
  absl::Status CopyIn(DeviceBuffer& dst, uint64_t offset, const void* src,
                      uint64_t bytes) override {
    auto& buffer = static_cast<CudaBuffer&>(dst);
    return Woken(Transfer(
        buffer, src, bytes,
        [&](Incarnation& inc) {
          return driver_.cuMemcpyHtoDAsync(buffer.ptr() + offset, src, bytes, inc.copy.get());
        },
        [&](Incarnation& inc, int slot, uint64_t done, uint64_t n) {
          std::memcpy(inc.staging[slot].get(), static_cast<const char*>(src) + done, n);
          return driver_.cuMemcpyHtoDAsync(buffer.ptr() + offset + done, inc.staging[slot].get(), n,
                                           inc.copy.get());
        },
        nullptr));
  }

  // Gathers the pieces into the pinned staging buffers: one staged copy, as for CopyIn.
  absl::Status CopyInPieces(DeviceBuffer& dst, uint64_t offset,
                            absl::Span<const absl::string_view> pieces) override {
    auto& buffer = static_cast<CudaBuffer&>(dst);
    uint64_t bytes = 0;
    for (absl::string_view piece : pieces) bytes += piece.size();
    size_t index = 0, position = 0;  // where the next staged byte comes from
    return Woken(Transfer(
        buffer, /*host=*/nullptr, bytes, /*direct=*/nullptr,
        [&](Incarnation& inc, int slot, uint64_t done, uint64_t n) {
          char* staged = static_cast<char*>(inc.staging[slot].get());
          for (uint64_t filled = 0; filled < n;) {
            const uint64_t take = std::min<uint64_t>(n - filled, pieces[index].size() - position);
            std::memcpy(staged + filled, pieces[index].data() + position, take);
            filled += take;
            position += take;
            if (position == pieces[index].size()) {
              ++index;
              position = 0;
            }
          }
          return driver_.cuMemcpyHtoDAsync(buffer.ptr() + offset + done, staged, n, inc.copy.get());
        },
        nullptr));
  }

  // One DMA into `dst` when it lies in a registered range (RegisterHost), else staged.
  absl::Status CopyOut(const DeviceBuffer& src, uint64_t offset, void* dst,
                       uint64_t bytes) override {
    const auto& buffer = static_cast<const CudaBuffer&>(src);
    return Woken(Transfer(
        buffer, dst, bytes,
        [&](Incarnation& inc) {
          return driver_.cuMemcpyDtoHAsync(dst, buffer.ptr() + offset, bytes, inc.copy.get());
        },
        [&](Incarnation& inc, int slot, uint64_t done, uint64_t n) {
          return driver_.cuMemcpyDtoHAsync(inc.staging[slot].get(), buffer.ptr() + offset + done, n,
                                           inc.copy.get());
        },
        [&](Incarnation& inc, int slot, uint64_t done, uint64_t n) {
          std::memcpy(static_cast<char*>(dst) + done, inc.staging[slot].get(), n);
        }));
  }

  // Pins the range in the current incarnation (see HostRange). The pages are pinned for this
  // context only (no CU_MEMHOSTREGISTER_PORTABLE): a region is one tenant's.
  absl::StatusOr<std::unique_ptr<HostRegistration>> RegisterHost(void* base,
                                                                 uint64_t bytes) override {
    const std::string what =
        absl::StrCat("registering ", bytes, " bytes of host memory with tenant ",
                     request_.tenant_id, "'s GPU context (cuMemHostRegister)");
    const auto start = reinterpret_cast<uintptr_t>(base);
    if (base == nullptr || bytes == 0 || bytes > UINTPTR_MAX - start) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": not a host memory range"));
    }
    absl::StatusOr<std::shared_ptr<Incarnation>> inc = Current();
    if (!inc.ok()) return inc.status();
    CUresult r = CUDA_SUCCESS;
    {
      absl::MutexLock copy(&copy_mu_);
      if (OverlapsLocked(start, bytes)) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": the range overlaps one registered before"));
      }
      absl::ReaderMutexLock use(&(*inc)->use_mu);
      if ((*inc)->context == nullptr) return Lost();
      r = PinLocked(**inc, start, bytes);
      if (r == CUDA_SUCCESS) host_ranges_.emplace(start, HostRange{bytes, *inc, true});
    }
    if (r == CUDA_SUCCESS) return std::make_unique<Registration>(handle_, start);
    if (r == CUDA_ERROR_NOT_SUPPORTED) {
      // The platform cannot pin this memory (cuda.h: e.g. flags the device lacks): the range
      // still works, through the staging buffers.
      spdlog::info("tenant {}: {} is not supported here; copies from the range are staged",
                   request_.tenant_id, what);
      return nullptr;
    }
    if (ClassifyCudaError(r).sticky) return Woken(FailedUnlocked(r, what));
    const absl::Status status = driver_.Check(r, what);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      return absl::ResourceExhaustedError(
          absl::StrCat(status.message(),
                       "; the host cannot pin that much more memory for the GPU: unregister a "
                       "region or register a smaller one"));
    }
    return absl::UnavailableError(status.message());
  }

  absl::Status Woken(absl::Status status) {
    if (!status.ok()) backend_->Wake();
    return status;
  }

  // In-place temporaries live until the job completes (the GPU runs the steps
  // asynchronously), so they add up over the steps; a matmul needs the cuBLAS workspace.
  // A job's in-place outputs go through temporaries that later steps reuse in stream order
  // (TempSlots): the job needs the largest step's, not the sum over its steps.
  uint64_t ScratchBytes(const std::vector<Step>& steps) const override {
    uint64_t total = 0;
    bool blas = false;
    for (const Step& step : steps) blas = blas || UsesCublas(step.plan);
    for (uint64_t slot : TempSlots(steps)) total += slot;
    return total + (blas ? kCublasWorkspaceBytes : 0);
  }

  // A job goes to its stream's waiting queue, which is drained at once unless a job there
  // needs a tenant-defined kernel that is not compiled yet: that one (and those behind it,
  // which must run after it) wait for KernelImages' callback (OnImage), holding no thread.
  void Enqueue(int stream, std::vector<Step> steps,
               absl::AnyInvocable<void(ExecResult) &&> done) override {
    Followups followups;
    {
      absl::MutexLock lock(&mu_);
      const size_t s = static_cast<size_t>(stream) % waiting_.size();
      waiting_[s].push_back(Waiting{stream, std::move(steps), std::move(done)});
      DrainLocked(s, followups);
    }
    Finish(backend_, request_.tenant_id, handle_, followups);
  }

  absl::Duration busy_time() const override {
    absl::MutexLock lock(&mu_);
    return busy_;
  }

  /// Collects finished jobs into `finished`; returns the sticky error that faulted this
  /// context since the last call, wherever it was seen (a job, an allocation, a copy), so
  /// that the backend looks at the rest of the device once per fault.
  CUresult Poll(std::vector<Finished>& finished, bool& busy) {
    absl::MutexLock lock(&mu_);
    PollLocked(finished);
    for (const auto& queue : pending_) busy = busy || !queue.empty();
    const CUresult fault = unreported_fault_;
    unreported_fault_ = CUDA_SUCCESS;
    return fault;
  }

  /// Whether this context reports a sticky error now (after a fault elsewhere on its
  /// device); if so it is faulted like one of its own.
  void CheckSticky(std::vector<Finished>& finished) {
    absl::MutexLock lock(&mu_);
    if (current_ == nullptr || current_->lost.load()) return;
    ScopedContext scoped(driver_, current_->context);
    CUresult r = driver_.cuStreamQuery(current_->copy.get());
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY && ClassifyCudaError(r).sticky) {
      FaultLocked(r, finished);
    }
  }

  /// Faults this context with `error`, found elsewhere in the process (a process-fatal
  /// error reaches every context, whatever the driver says of this one yet).
  void FaultWith(CUresult error, std::vector<Finished>& finished) {
    absl::MutexLock lock(&mu_);
    FaultLocked(error, finished);
    // Jobs waiting for a tenant-defined kernel's image would never run either.
    const absl::Status fatal = backend_->fatal();
    if (fatal.ok()) return;
    for (auto& queue : waiting_) {
      for (Waiting& w : queue) {
        finished.push_back({std::move(w.done), ExecResult{fatal, -1}, std::move(w.steps)});
      }
      queue.clear();
    }
  }

  absl::Status InjectFault(int stream) {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::shared_ptr<Incarnation>> inc = CurrentLocked();
    if (!inc.ok()) return inc.status();
    absl::StatusOr<CUkernel> kernel = backend_->kernels_->Find("tessera_test_fault");
    if (!kernel.ok()) return kernel.status();
    ScopedContext scoped(driver_, (*inc)->context);
    int64_t address = 8;  // never mapped
    void* params[] = {&address};
    return driver_.Check(
        driver_.cuLaunchKernel(reinterpret_cast<CUfunction>(*kernel), 1, 1, 1, kTestFaultBlock, 1,
                               1, 0, (*inc)->streams.at(stream).get(), params, nullptr),
        "launching the test fault");
  }

 private:
  // A buffer on this context's device; zero-filled on the copy stream when `zero`.
  absl::StatusOr<std::shared_ptr<DeviceBuffer>> AllocateOnDevice(uint64_t bytes, bool zero) {
    absl::StatusOr<std::shared_ptr<Incarnation>> inc = Current();
    if (!inc.ok()) return inc.status();
    CUresult r = CUDA_SUCCESS;
    std::shared_ptr<CudaBuffer> buffer;
    {
      absl::MutexLockMaybe copy(zero ? &copy_mu_ : nullptr);  // the copy stream zero-fills it
      absl::ReaderMutexLock use(&(*inc)->use_mu);
      if ((*inc)->context == nullptr) return Lost();
      ScopedContext scoped(driver_, (*inc)->context);
      CUdeviceptr ptr = 0;
      const uint64_t size = std::max<uint64_t>(bytes, 1);
      r = driver_.cuMemAlloc(&ptr, size);
      if (r == CUDA_SUCCESS) {
        buffer = std::make_shared<CudaBuffer>(*inc, ptr, bytes);
        if (zero) {
          r = driver_.cuMemsetD8Async(ptr, 0, size, (*inc)->copy.get());
          if (r == CUDA_SUCCESS) r = driver_.cuStreamSynchronize((*inc)->copy.get());
        }
      }
    }
    if (r != CUDA_SUCCESS) {
      buffer.reset();
      return Woken(FailedUnlocked(r, absl::StrCat("allocating ", bytes, " bytes on GPU ", device(),
                                                  zero ? " (and zero-filling it)" : "")));
    }
    return std::shared_ptr<DeviceBuffer>(std::move(buffer));
  }

  struct Pending {
    std::shared_ptr<Incarnation> inc;
    Event start, end;  // destroyed with the job, in its context
    std::vector<Step> steps;
    std::vector<std::shared_ptr<DeviceBuffer>> temps;
    absl::AnyInvocable<void(ExecResult) &&> done;
    ExecResult result;
  };

  CUresult CreateEvent(Event& event, unsigned int flags) const {
    CUevent e = nullptr;
    CUresult r = driver_.cuEventCreate(&e, flags);
    if (r == CUDA_SUCCESS) event = Event(driver_, e);
    return r;
  }
  // A job's timing event: a finished job's, or a new one (in `inc`'s context, current).
  CUresult TakeEvent(Incarnation& inc, Event& event) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (inc.spare_events.empty()) return CreateEvent(event, CU_EVENT_DEFAULT);
    event = std::move(inc.spare_events.back());
    inc.spare_events.pop_back();
    return CUDA_SUCCESS;
  }

  static void Abandon(Pending& p) {
    p.start.Abandon();
    p.end.Abandon();
  }

  absl::Status Failed(CUresult r, absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Status status = driver_.Check(r, what);
    if (ClassifyCudaError(r).sticky) {
      std::vector<Finished> finished;
      FaultLocked(r, finished);
      // Callbacks must not run under mu_; these jobs' owners are told by the completion
      // thread instead.
      for (Finished& f : finished) orphaned_.push_back(std::move(f));
    }
    return status;
  }

  // Creates an incarnation per plan_; a green context that cannot be made falls back to a
  // plain one with the reason recorded.
  absl::StatusOr<std::shared_ptr<Incarnation>> Build() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const CudaBackend::Gpu& gpu = backend_->gpus_[request_.device_index];
    auto inc = std::make_shared<Incarnation>(driver_);
    const std::string who =
        absl::StrCat("tenant ", request_.tenant_id, "'s context on GPU ", request_.device_index);
    ContextInfo info{.kind = plan_.kind,
                     .reason = plan_.reason,
                     .compute_share_enforced = plan_.compute_share_enforced};
    CUresult r = CUDA_SUCCESS;
    if (plan_.kind == ContextKind::kMps) {
      CUexecAffinityParam affinity{};
      affinity.type = CU_EXEC_AFFINITY_TYPE_SM_COUNT;
      affinity.param.smCount.val = static_cast<unsigned int>(plan_.sm_count);
      CUctxCreateParams params{};
      params.execAffinityParams = &affinity;
      params.numExecAffinityParams = 1;
      r = driver_.cuCtxCreate(&inc->context, &params, 0, gpu.device);
      if (r != CUDA_SUCCESS) return driver_.Check(r, absl::StrCat("creating ", who));
      CUexecAffinityParam actual{};
      if (driver_.cuCtxGetExecAffinity(&actual, CU_EXEC_AFFINITY_TYPE_SM_COUNT) == CUDA_SUCCESS) {
        inc->sms = static_cast<int>(actual.param.smCount.val);
        info.reason = absl::StrCat(info.reason, "; the driver granted ", inc->sms, " SMs");
      }
      CUcontext popped = nullptr;
      driver_.cuCtxPopCurrent(&popped);
    } else if (plan_.kind == ContextKind::kGreen) {
      int shared = 0;
      std::vector<int> groups =
          backend_->AcquireSmGroups(request_.device_index, plan_.sm_count, shared);
      std::vector<CUdevResource> parts;
      for (int g : groups) parts.push_back(gpu.sm_groups[static_cast<size_t>(g)]);
      CUdevResourceDesc desc = nullptr;
      r = parts.empty() ? CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION
                        : driver_.cuDevResourceGenerateDesc(
                              &desc, parts.data(), static_cast<unsigned int>(parts.size()));
      if (r == CUDA_SUCCESS) {
        r = driver_.cuGreenCtxCreate(&inc->green, desc, gpu.device, CU_GREEN_CTX_DEFAULT_STREAM);
      }
      if (r == CUDA_SUCCESS) r = driver_.cuCtxFromGreenCtx(&inc->context, inc->green);
      if (r == CUDA_SUCCESS) {
        inc->sms = 0;
        for (const CUdevResource& part : parts) inc->sms += static_cast<int>(part.sm.smCount);
        inc->owner = backend_;
        inc->device = request_.device_index;
        inc->sm_groups = groups;
        info.reason = absl::StrCat(info.reason, "; the driver granted ", inc->sms,
                                   " SMs: SM groups ", GroupList(groups), " of ",
                                   gpu.sm_groups.size(), " (", gpu.group_sms, " SMs each)",
                                   shared == 0 ? ""
                                               : absl::StrCat(", ", shared,
                                                              " of them shared with other "
                                                              "tenants (the device is "
                                                              "overcommitted)"));
      } else {
        backend_->ReleaseSmGroups(request_.device_index, groups);
        if (inc->green != nullptr) driver_.cuGreenCtxDestroy(inc->green);
        inc->green = nullptr;
        inc->context = nullptr;
        info = ContextInfo{
            .kind = ContextKind::kFallback,
            .reason = absl::StrCat("plain per-tenant context; compute share ",
                                   request_.quota.compute_share_percent,
                                   "% is advisory: creating a green context with ", plan_.sm_count,
                                   " SMs failed (", driver_.ErrorName(r), ")"),
            .compute_share_enforced = false};
        plan_.kind = ContextKind::kFallback;
      }
    }
    if (inc->context == nullptr) {
      r = driver_.cuCtxCreate(&inc->context, nullptr, 0, gpu.device);
      if (r != CUDA_SUCCESS) return driver_.Check(r, absl::StrCat("creating ", who));
      CUcontext popped = nullptr;
      driver_.cuCtxPopCurrent(&popped);
      inc->sms = gpu.sms;
    }
    if (inc->sms <= 0) inc->sms = gpu.sms;
    {
      ScopedContext scoped(driver_, inc->context);
      // Every catalog kernel now, while the context is idle: loaded lazily at a first launch,
      // one could wait for the tenant's queued work under mu_ (KernelTable).
      RETURN_IF_ERROR(backend_->kernels_->LoadIntoCurrentContext());
      int least = 0, greatest = 0;
      driver_.cuCtxGetStreamPriorityRange(&least, &greatest);
      const int priority = request_.quota.priority == Priority::kLow ? least : greatest;
      for (size_t i = 0; i < pending_.size(); ++i) {
        CUstream s = nullptr;
        r = inc->green != nullptr
                ? driver_.cuGreenCtxStreamCreate(&s, inc->green, CU_STREAM_NON_BLOCKING, priority)
                : driver_.cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, priority);
        if (r != CUDA_SUCCESS) return driver_.Check(r, absl::StrCat("creating streams for ", who));
        inc->streams.emplace_back(driver_, s);
      }
      CUstream copy = nullptr;
      r = inc->green != nullptr
              ? driver_.cuGreenCtxStreamCreate(&copy, inc->green, CU_STREAM_NON_BLOCKING, greatest)
              : driver_.cuStreamCreateWithPriority(&copy, CU_STREAM_NON_BLOCKING, greatest);
      if (r != CUDA_SUCCESS) return driver_.Check(r, absl::StrCat("creating streams for ", who));
      inc->copy = Stream(driver_, copy);
    }
    if (!started_) {
      info_ = std::move(info);
      started_ = true;
    }
    return inc;
  }

  // The live incarnation, rebuilt after a fault. UNAVAILABLE while it cannot be.
  absl::StatusOr<std::shared_ptr<Incarnation>> CurrentLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (current_ != nullptr && !current_->lost.load()) return current_;
    if (absl::Status fatal = backend_->fatal(); !fatal.ok()) return fatal;
    absl::StatusOr<std::shared_ptr<Incarnation>> rebuilt = Build();
    if (!rebuilt.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "tenant ", request_.tenant_id, "'s GPU context faulted and cannot be rebuilt yet (",
          rebuilt.status().message(), "); retry in a few seconds"));
    }
    spdlog::info("tenant {}: GPU context on device {} rebuilt after a fault", request_.tenant_id,
                 request_.device_index);
    current_ = *std::move(rebuilt);
    return current_;
  }

  // Copies `bytes` between `buffer` and host memory at `host`: with one DMA (`direct`) when
  // the host range lies in a registered range pinned in the current incarnation, else through
  // the context's two pinned staging buffers (`issue`, `drain`: one filled while the other's
  // DMA runs). Serialized per context by copy_mu_; mu_ is taken only to look up the
  // incarnation and to record a fault, so jobs are enqueued and completed meanwhile.
  template <typename Direct, typename Issue, typename Drain>
  absl::Status Transfer(const CudaBuffer& buffer, const void* host, uint64_t bytes, Direct direct,
                        Issue issue, Drain drain) {
    std::shared_ptr<Incarnation> current;
    {
      absl::MutexLock lock(&mu_);
      if (buffer.lost()) {
        return absl::DataLossError("the tensor was lost when its GPU context faulted");
      }
      if (current_ == nullptr || buffer.incarnation() != current_.get()) {
        return absl::DataLossError("the tensor belongs to a GPU context that no longer exists");
      }
      current = current_;
    }
    CUresult r = CUDA_SUCCESS;
    const char* what = "copying tensor data";
    {
      absl::MutexLock copy(&copy_mu_);
      absl::ReaderMutexLock use(&current->use_mu);
      if (current->context == nullptr) return Lost();
      bool copied = false;
      if constexpr (!std::is_same_v<Direct, std::nullptr_t>) {
        if (PinnedLocked(current, host, bytes)) {
          what = "copying tensor data from or to registered host memory";
          r = DirectLocked(*current, direct);
          copied = true;
        }
      }
      if (!copied) r = StageLocked(*current, issue, drain, bytes, what);
    }
    return r == CUDA_SUCCESS ? absl::OkStatus() : FailedUnlocked(r, what);
  }

  template <typename Direct>
  CUresult DirectLocked(Incarnation& inc, Direct& direct) ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_) {
    ScopedContext scoped(driver_, inc.context);
    CUresult r = direct(inc);
    return r == CUDA_SUCCESS ? driver_.cuStreamSynchronize(inc.copy.get()) : r;
  }

  template <typename Issue, typename Drain>
  CUresult StageLocked(Incarnation& inc, Issue& issue, Drain& drain, uint64_t bytes,
                       const char*& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_) {
    ScopedContext scoped(driver_, inc.context);
    for (int i = 0; i < 2; ++i) {
      if (inc.staging[i]) continue;
      what = "allocating pinned staging memory";
      void* pinned = nullptr;
      CUresult r = driver_.cuMemHostAlloc(&pinned, kStagingBytes, 0);
      if (r == CUDA_SUCCESS) inc.staging[i] = PinnedMemory(driver_, pinned);
      if (r == CUDA_SUCCESS) r = CreateEvent(inc.staging_done[i], CU_EVENT_DISABLE_TIMING);
      if (r != CUDA_SUCCESS) return r;
    }
    what = "copying tensor data";
    struct Chunk {
      uint64_t done, n;
    };
    std::optional<Chunk> previous;
    int slot = 0;
    for (uint64_t done = 0; done < bytes; done += kStagingBytes, slot ^= 1) {
      const uint64_t n = std::min(kStagingBytes, bytes - done);
      CUresult r = driver_.cuEventSynchronize(inc.staging_done[slot].get());  // slot free again
      if (r == CUDA_SUCCESS) r = issue(inc, slot, done, n);
      if (r == CUDA_SUCCESS) {
        r = driver_.cuEventRecord(inc.staging_done[slot].get(), inc.copy.get());
      }
      if (r != CUDA_SUCCESS) return r;
      if constexpr (!std::is_same_v<Drain, std::nullptr_t>) {
        if (previous) {
          r = driver_.cuEventSynchronize(inc.staging_done[slot ^ 1].get());
          if (r != CUDA_SUCCESS) return r;
          drain(inc, slot ^ 1, previous->done, previous->n);
        }
        previous = Chunk{done, n};
      }
    }
    CUresult r = driver_.cuStreamSynchronize(inc.copy.get());
    if (r != CUDA_SUCCESS) return r;
    if constexpr (!std::is_same_v<Drain, std::nullptr_t>) {
      if (previous) drain(inc, slot ^ 1, previous->done, previous->n);
    }
    return CUDA_SUCCESS;
  }

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
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_) {
    auto next = host_ranges_.lower_bound(start);
    if (next != host_ranges_.end() && next->first - start < bytes) return true;
    if (next == host_ranges_.begin()) return false;
    auto before = std::prev(next);
    return start - before->first < before->second.bytes;
  }

  // `inc` is in use (its use_mu held shared, its context alive).
  CUresult PinLocked(Incarnation& inc, uintptr_t base, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_) {
    ScopedContext scoped(driver_, inc.context);
    return driver_.cuMemHostRegister(reinterpret_cast<void*>(base), bytes, 0);
  }

  void UnpinLocked(uintptr_t base, const HostRange& range) ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_) {
    if (!range.pinned) return;
    absl::ReaderMutexLock use(&range.inc->use_mu);
    // A faulted incarnation's pins went with its context.
    if (range.inc->context == nullptr || range.inc->lost.load()) return;
    ScopedContext scoped(driver_, range.inc->context);
    CUresult r = driver_.cuMemHostUnregister(reinterpret_cast<void*>(base));
    if (r != CUDA_SUCCESS) {
      spdlog::warn("tenant {}: {}", request_.tenant_id,
                   driver_
                       .Check(r, absl::StrCat("unregistering ", range.bytes,
                                              " bytes of host memory (cuMemHostUnregister)"))
                       .message());
    }
  }

  /// Whether [host, host + bytes) lies inside one registered range pinned in `current` (its
  /// use_mu held shared), pinning the range there first if it was pinned in an earlier
  /// incarnation (current_ changes only when one is lost).
  bool PinnedLocked(const std::shared_ptr<Incarnation>& current, const void* host, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_) {
    const auto start = reinterpret_cast<uintptr_t>(host);
    auto it = host_ranges_.upper_bound(start);
    if (bytes == 0 || it == host_ranges_.begin()) return false;
    --it;
    HostRange& range = it->second;
    const uint64_t offset = start - it->first;
    if (offset >= range.bytes || bytes > range.bytes - offset) return false;
    if (range.inc != current) {  // pinned in an incarnation lost since, with its pins
      const CUresult r = PinLocked(*current, it->first, range.bytes);
      range.inc = current;
      range.pinned = r == CUDA_SUCCESS;
      if (!range.pinned) {
        spdlog::warn(
            "tenant {}: pinning a registered {}-byte host range again in the rebuilt "
            "GPU context failed ({}); copies from it are staged",
            request_.tenant_id, range.bytes, driver_.ErrorName(r));
      }
    }
    return range.pinned;
  }

  void UnregisterHost(uintptr_t base) ABSL_LOCKS_EXCLUDED(copy_mu_) {
    absl::MutexLock copy(&copy_mu_);
    auto it = host_ranges_.find(base);
    if (it == host_ranges_.end()) return;
    UnpinLocked(it->first, it->second);
    host_ranges_.erase(it);
  }

  // Registrations outlive their context only when the caller breaks backend.h's contract;
  // their ranges are unpinned here, so that nothing of the tenant's stays pinned.
  void ReleaseHostRanges() ABSL_LOCKS_EXCLUDED(copy_mu_) {
    absl::MutexLock copy(&copy_mu_);
    if (host_ranges_.empty()) return;
    spdlog::error(
        "tenant {}: its GPU context was destroyed with {} host registration(s) still alive (they "
        "must go first); unregistered them",
        request_.tenant_id, host_ranges_.size());
    for (const auto& [base, range] : host_ranges_) UnpinLocked(base, range);
    host_ranges_.clear();
  }

  static absl::Status Lost() {
    return absl::UnavailableError(
        "the tenant's GPU context faulted during the operation; retry once it is rebuilt");
  }

  /// Failed(), for callers that do not hold mu_.
  absl::Status FailedUnlocked(CUresult r, absl::string_view what) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return Failed(r, what);
  }

  /// The live incarnation (rebuilt after a fault), taken briefly under mu_.
  absl::StatusOr<std::shared_ptr<Incarnation>> Current() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return CurrentLocked();
  }

  // Launches `steps` on `stream` as one job. With `failure` (a step that cannot run: its
  // kernel did not compile), the steps before that one run and the job then ends with it.
  void EnqueueLocked(int stream, std::vector<Step> steps,
                     absl::AnyInvocable<void(ExecResult) &&> done, std::vector<Finished>& failed,
                     ExecResult failure = {absl::OkStatus(), -1})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<std::shared_ptr<Incarnation>> inc = CurrentLocked();
    if (!inc.ok()) {
      failed.push_back({std::move(done), ExecResult{inc.status(), 0}});
      return;
    }
    for (const Step& step : steps) {
      for (const auto* list : {&step.inputs, &step.outputs}) {
        for (const auto& b : *list) {
          if (b->lost() || static_cast<const CudaBuffer&>(*b).incarnation() != inc->get()) {
            failed.push_back(
                {std::move(done),
                 ExecResult{absl::DataLossError("a tensor of this job was lost when the tenant's "
                                                "GPU context faulted; delete and recreate it"),
                            0}});
            return;
          }
        }
      }
    }
    Incarnation& current = **inc;
    ScopedContext scoped(driver_, current.context);
    Pending p;  // its events are destroyed on every early return
    p.inc = *inc;
    p.done = std::move(done);
    CUstream s = current.streams.at(static_cast<size_t>(stream) % current.streams.size()).get();
    CUresult r = TakeEvent(current, p.start);
    if (r == CUDA_SUCCESS) r = TakeEvent(current, p.end);
    if (r == CUDA_SUCCESS) r = driver_.cuEventRecord(p.start.get(), s);
    if (r != CUDA_SUCCESS) {
      absl::Status status = Failed(r, "starting a job");
      if (current.lost.load()) Abandon(p);
      failed.push_back({std::move(p.done), ExecResult{status, 0}});
      return;
    }
    const size_t runnable =
        failure.status.ok() ? steps.size() : static_cast<size_t>(failure.failed_step);
    p.result = std::move(failure);
    const std::vector<uint64_t> slots = TempSlots(steps);
    for (size_t i = 0; i < runnable; ++i) {
      absl::Status launched = LaunchStep(current, s, steps[i], slots, p.temps);
      if (!launched.ok()) {
        p.result = ExecResult{launched, static_cast<int>(i)};
        break;
      }
    }
    if (current.lost.load()) {  // a sticky error while launching: the job is already failed
      Abandon(p);               // destroyed with the context
      failed.push_back({std::move(p.done), p.result, std::move(steps), std::move(p.temps)});
      return;
    }
    r = driver_.cuEventRecord(p.end.get(), s);
    if (r == CUDA_SUCCESS) r = driver_.cuLaunchHostFunc(s, WakeBackend, backend_);
    if (r != CUDA_SUCCESS) {
      absl::Status status = Failed(r, "finishing a job");
      if (current.lost.load()) Abandon(p);
      failed.push_back(
          {std::move(p.done), ExecResult{status, 0}, std::move(steps), std::move(p.temps)});
      return;
    }
    p.steps = std::move(steps);
    pending_[static_cast<size_t>(stream) % pending_.size()].push_back(std::move(p));
  }

  // Launches `step` on `s`. An output that is also an input is computed into temporary slot
  // i (TempSlots: `slots`, allocated into `temps` at first use and reused by later steps in
  // stream order), then copied back.
  absl::Status LaunchStep(Incarnation& inc, CUstream s, const Step& step,
                          const std::vector<uint64_t>& slots,
                          std::vector<std::shared_ptr<DeviceBuffer>>& temps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<CUdeviceptr> in, out;
    std::vector<CUdeviceptr> staged_to(step.outputs.size(), 0);
    for (const auto& b : step.inputs) in.push_back(static_cast<const CudaBuffer&>(*b).ptr());
    for (const auto& b : step.outputs) out.push_back(static_cast<const CudaBuffer&>(*b).ptr());
    const std::vector<size_t> staged = StagedOutputs(step);
    for (size_t i = 0; i < staged.size(); ++i) {
      const size_t k = staged[i];
      const uint64_t bytes = step.outputs[k]->size();
      if (i == temps.size()) {
        CUdeviceptr temp = 0;
        CUresult r = driver_.cuMemAlloc(&temp, slots.at(i));
        if (r != CUDA_SUCCESS) return Failed(r, "allocating a temporary for an in-place launch");
        temps.push_back(std::make_shared<CudaBuffer>(current_, temp, slots[i]));
      }
      const CUdeviceptr temp = static_cast<const CudaBuffer&>(*temps[i]).ptr();
      // matmul's beta reads the output's prior contents.
      CUresult r = driver_.cuMemcpyDtoDAsync(temp, out[k], bytes, s);
      if (r != CUDA_SUCCESS) return Failed(r, "staging an in-place launch");
      staged_to[k] = out[k];
      out[k] = temp;
    }
    if (UsesCublas(step.plan) && !inc.blas) {
      cublasStatus_t created = inc.blas.Create(driver_, kCublasWorkspaceBytes);
      if (created != CUBLAS_STATUS_SUCCESS) {
        return absl::ResourceExhaustedError(
            absl::StrCat("creating the tenant's cuBLAS handle: ", cublasGetStatusName(created)));
      }
    }
    CUfunction user = nullptr;
    if (step.plan.kernel->op == kernels::Op::kUser) {
      auto it = step.plan.user == nullptr ? inc.user_modules.end()
                                          : inc.user_modules.find(step.plan.user->program.hash);
      if (it == inc.user_modules.end()) {
        return absl::InternalError(absl::StrCat("kernel ", step.plan.kernel->name,
                                                " is not loaded in the tenant's context"));
      }
      it->second.last_use = ++inc.user_clock;
      user = it->second.function;
    }
    LaunchTarget target{&driver_, backend_->kernels_.get(), s, &inc.blas, inc.sms, user};
    absl::Status status = RunStep(target, step.plan, in, out);
    if (!status.ok()) {
      // A launch error that is sticky faults the context like an asynchronous one.
      return status;
    }
    for (size_t k = 0; k < out.size(); ++k) {
      if (staged_to[k] == 0) continue;
      CUresult r = driver_.cuMemcpyDtoDAsync(staged_to[k], out[k], step.outputs[k]->size(), s);
      if (r != CUDA_SUCCESS) return Failed(r, "finishing an in-place launch");
    }
    return absl::OkStatus();
  }

  void PollLocked(std::vector<Finished>& finished) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (Finished& f : orphaned_) finished.push_back(std::move(f));
    orphaned_.clear();
    for (auto& queue : pending_) {
      while (!queue.empty()) {
        Pending& p = queue.front();
        if (p.inc->lost.load()) break;  // failed by FaultLocked
        ScopedContext scoped(driver_, p.inc->context);
        CUresult r = driver_.cuEventQuery(p.end.get());
        if (r == CUDA_ERROR_NOT_READY) break;
        if (r != CUDA_SUCCESS) {
          if (ClassifyCudaError(r).sticky) {
            FaultLocked(r, finished);
            return;
          }
          p.result = ExecResult{driver_.Check(r, "running a job"), 0};
        } else {
          float ms = 0;
          if (driver_.cuEventElapsedTime(&ms, p.start.get(), p.end.get()) == CUDA_SUCCESS) {
            p.result.run_time = absl::Microseconds(static_cast<int64_t>(ms * 1000.0f));
            busy_ += p.result.run_time;
          }
        }
        for (Event* e : {&p.start, &p.end}) {
          if (p.inc->spare_events.size() < kSpareEvents) {
            p.inc->spare_events.push_back(std::move(*e));
          } else {
            e->Reset();
          }
        }
        finished.push_back(
            {std::move(p.done), std::move(p.result), std::move(p.steps), std::move(p.temps)});
        queue.pop_front();
      }
    }
  }

  // A sticky error: every queued job fails, the tensors are lost, the context is destroyed;
  // the next use builds a new one.
  void FaultLocked(CUresult error, std::vector<Finished>& finished)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (current_ == nullptr || current_->lost.exchange(true)) return;
    absl::Status status =
        driver_.Check(error, absl::StrCat("tenant ", request_.tenant_id,
                                          "'s GPU context on device ", request_.device_index));
    spdlog::warn("{}", status.message());
    {
      // The queued jobs' events go before the context: a green context's would outlive it.
      ScopedContext scoped(driver_, current_->context);
      for (auto& queue : pending_) {
        for (Pending& p : queue) {
          finished.push_back(
              {std::move(p.done), ExecResult{status, 0}, std::move(p.steps), std::move(p.temps)});
        }
        queue.clear();
      }
    }
    current_->Destroy();
    unreported_fault_ = error;
  }

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
                     const std::shared_ptr<Handle>& handle, Followups& followups) {
    for (FetchRequest& f : followups.fetches) {
      backend->images_->Fetch(
          f.kernel, ArchOfKey(f.key), tenant,
          [backend, tenant, handle, key = f.key](absl::StatusOr<KernelImage> image) {
            Followups next;
            {
              absl::MutexLock lock(&handle->mu);
              if (handle->context == nullptr) return;  // the context went meanwhile
              handle->context->OnImage(key, std::move(image), next);
            }
            Finish(backend, tenant, handle, next);
          });
    }
    Deliver(followups.finished);
    backend->Wake();
  }

  static int ArchOfKey(const std::string& key) {
    int arch = 0;
    const size_t at = key.rfind("/sm_");
    if (at != std::string::npos) absl::SimpleAtoi(key.substr(at + 4), &arch);
    return arch;
  }

  /// KernelImages' answer for `key`: the jobs that asked get the image or fail with the
  /// error, and every stream is drained again.
  void OnImage(const std::string& key, absl::StatusOr<KernelImage> image, Followups& followups)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    fetching_.erase(key);
    for (auto& queue : waiting_) {
      for (Waiting& w : queue) {
        auto it = w.missing.find(key);
        if (it == w.missing.end()) continue;
        if (image.ok()) {
          w.images[key] = *image;
        } else if (w.failure.status.ok() || it->second < w.failure.failed_step) {
          w.failure = ExecResult{image.status(), it->second};  // the earliest step's failure
        }
        w.missing.erase(it);
      }
    }
    for (size_t s = 0; s < waiting_.size(); ++s) DrainLocked(s, followups);
  }

  /// Launches the jobs at the front of stream `s`'s waiting queue whose kernels are loaded (or
  /// can be now), fails those that cannot run, and stops at the first that waits for images.
  void DrainLocked(size_t s, Followups& followups) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::deque<Waiting>& queue = waiting_[s];
    while (!queue.empty()) {
      Waiting& front = queue.front();
      if (!PrepareLocked(front, followups.fetches)) return;
      Waiting w = std::move(front);
      queue.pop_front();
      if (!w.failure.status.ok() && w.failure.failed_step <= 0) {
        followups.finished.push_back({std::move(w.done), w.failure, std::move(w.steps)});
        continue;
      }
      // The steps before a failed one run first, as for a failed launch.
      EnqueueLocked(w.stream, std::move(w.steps), std::move(w.done), followups.finished,
                    std::move(w.failure));
    }
  }

  /// Loads the tenant-defined kernels of `w` (those before a step that failed) into the
  /// current incarnation from the images at hand; true when none is missing, false when images
  /// were asked for (added to `fetches` unless already asked). A kernel that cannot be had
  /// fails its step (w.failure); the steps before it still run.
  bool PrepareLocked(Waiting& w, std::vector<FetchRequest>& fetches)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto runnable = [&] {
      return w.failure.status.ok() ? w.steps.size()
                                   : static_cast<size_t>(std::max(0, w.failure.failed_step));
    };
    bool user = false;
    for (size_t i = 0; i < runnable(); ++i) {
      user = user || w.steps[i].plan.kernel->op == kernels::Op::kUser;
    }
    if (!user) return true;
    absl::StatusOr<std::shared_ptr<Incarnation>> inc = CurrentLocked();
    if (!inc.ok()) return true;  // EnqueueLocked fails the job with the reason
    const int arch = backend_->gpus_[static_cast<size_t>(request_.device_index)].arch;
    for (size_t i = 0; i < runnable(); ++i) {
      const kernels::Plan& plan = w.steps[i].plan;
      if (plan.kernel->op != kernels::Op::kUser) continue;
      if (plan.user == nullptr) {
        w.failure = ExecResult{
            absl::InternalError(absl::StrCat("kernel ", plan.kernel->name,
                                             " reached the CUDA backend without its program")),
            static_cast<int>(i)};
        break;
      }
      const kernels::expr::Program& program = plan.user->program;
      if ((*inc)->user_modules.count(program.hash) != 0) continue;
      absl::StatusOr<std::shared_ptr<const GeneratedKernel>> kernel =
          backend_->images_->Generate(program);
      if (!kernel.ok()) {
        w.failure = ExecResult{kernel.status(), static_cast<int>(i)};
        break;
      }
      const std::string key = absl::StrCat((*kernel)->digest, "/sm_", arch);
      KernelImage image;
      if (auto it = w.images.find(key); it != w.images.end()) image = it->second;
      if (image == nullptr) image = backend_->images_->Find(**kernel, arch);
      if (image != nullptr) {
        absl::Status loaded = LoadUserModuleLocked(**inc, program.hash, **kernel, *image);
        if (!loaded.ok()) {
          w.failure = ExecResult{std::move(loaded), static_cast<int>(i)};
          break;
        }
        continue;
      }
      w.missing.emplace(key, static_cast<int>(i));
      if (fetching_.insert(key).second) fetches.push_back({*kernel, key});
    }
    // Images of steps after a failed one are not waited for.
    for (auto it = w.missing.begin(); it != w.missing.end();) {
      it = static_cast<size_t>(it->second) >= runnable() ? w.missing.erase(it) : std::next(it);
    }
    return w.missing.empty();
  }

  /// Loads `image` into `inc` as the module of program `hash`, first unloading the least
  /// recently launched module that no queued job uses when the context has too many.
  absl::Status LoadUserModuleLocked(Incarnation& inc, const std::string& hash,
                                    const GeneratedKernel& kernel, const std::string& image)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ScopedContext scoped(driver_, inc.context);
    if (inc.user_modules.size() >= kMaxUserModules) {
      std::set<std::string> in_use;
      for (const auto& queue : pending_) {
        for (const Pending& p : queue) {
          for (const Step& step : p.steps) {
            if (step.plan.user != nullptr) in_use.insert(step.plan.user->program.hash);
          }
        }
      }
      auto victim = inc.user_modules.end();
      for (auto it = inc.user_modules.begin(); it != inc.user_modules.end(); ++it) {
        if (in_use.count(it->first) == 0 &&
            (victim == inc.user_modules.end() || it->second.last_use < victim->second.last_use)) {
          victim = it;
        }
      }
      if (victim != inc.user_modules.end()) inc.user_modules.erase(victim);
    }
    CUmodule module = nullptr;
    CUresult r = driver_.cuModuleLoadData(&module, image.data());
    if (r != CUDA_SUCCESS) {
      return Failed(r, absl::StrCat("loading kernel ", kernel.name, " into the tenant's context"));
    }
    UserModule loaded;
    loaded.module = Module(driver_, module);
    r = driver_.cuModuleGetFunction(&loaded.function, module, kernel.kernel.entry.c_str());
    if (r != CUDA_SUCCESS) {
      absl::Status status = Failed(r, absl::StrCat("finding ", kernel.kernel.entry, " in kernel ",
                                                   kernel.name, "'s module"));
      if (inc.lost.load()) loaded.module.Abandon();  // went with the faulted context
      return status;
    }
    inc.user_modules.emplace(hash, std::move(loaded));
    return absl::OkStatus();
  }

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

namespace {
void CUDA_CB WakeBackend(void* backend) { static_cast<CudaBackend*>(backend)->Wake(); }

// The driver as compiled images depend on it (part of their cache key): its CUDA version
// and, where the kernel module says, the NVIDIA driver's own version.
std::string DriverDescription(int cuda_version) {
  std::string module_version;
  std::ifstream("/sys/module/nvidia/version") >> module_version;
  return absl::StrCat("cuda ", cuda_version, ", nvidia ",
                      module_version.empty() ? "unknown" : module_version);
}
}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const CudaModuleOptions& options) {
  const char* pipe_env = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  MpsProbe probe = ProbeMps(pipe_env);
  absl::StatusOr<MpsChoice> choice = DecideMps(options.mps, probe);
  if (!choice.ok()) return choice.status();
  if (choice->decision != MpsDecision::kMps && probe.daemon_running) {
    // The driver joins a running daemon at cuInit whatever we decide; point it at an empty
    // private directory so that --mps=off (or a daemon we cannot use) really means no MPS.
    char dir[] = "/tmp/tessera-no-mps-XXXXXX";
    if (mkdtemp(dir) != nullptr) setenv("CUDA_MPS_PIPE_DIRECTORY", dir, 1);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Driver> driver, Driver::Load());
  std::unique_ptr<CudaBackend> backend(new CudaBackend());
  int count = 0;
  RETURN_IF_ERROR(driver->Check(driver->cuDeviceGetCount(&count), "counting CUDA devices"));
  if (count == 0) return absl::FailedPreconditionError("the CUDA driver reports no device");
  bool mps_connected = false;
  for (int i = 0; i < count; ++i) {
    Gpu gpu;
    RETURN_IF_ERROR(driver->Check(driver->cuDeviceGet(&gpu.device, i), "opening a CUDA device"));
    char name[256] = {};
    driver->cuDeviceGetName(name, sizeof(name), gpu.device);
    size_t memory = 0;
    driver->cuDeviceTotalMem(&memory, gpu.device);
    driver->cuDeviceGetAttribute(&gpu.sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, gpu.device);
    driver->cuDeviceGetAttribute(&gpu.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                 gpu.device);
    int cc_minor = 0;
    driver->cuDeviceGetAttribute(&cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                 gpu.device);
    gpu.arch = gpu.cc_major * 10 + cc_minor;
    int mps_enabled = 0;
    driver->cuDeviceGetAttribute(&mps_enabled, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, gpu.device);
    mps_connected = mps_connected || mps_enabled != 0;
    if (!driver->green_entry_points) {
      gpu.green.why_not =
          absl::StrCat("the driver (CUDA ", driver->version / 1000, ".",
                       driver->version % 1000 / 10, ") lacks the green-context entry points");
    } else {
      CUdevResource sm{};
      CUresult r = driver->cuDeviceGetDevResource(gpu.device, &sm, CU_DEV_RESOURCE_TYPE_SM);
      if (r != CUDA_SUCCESS) {
        gpu.green.why_not =
            absl::StrCat("querying the device's SM resource failed: ", driver->ErrorName(r));
      } else {
        // Split once into the smallest groups; each green context takes whole groups.
        const unsigned int smallest = sm.sm.minSmPartitionSize;
        unsigned int groups = 0;
        r = driver->cuDevSmResourceSplitByCount(nullptr, &groups, &sm, nullptr, 0, smallest);
        if (r == CUDA_SUCCESS && groups > 0) {
          gpu.sm_groups.resize(groups);
          r = driver->cuDevSmResourceSplitByCount(gpu.sm_groups.data(), &groups, &sm, nullptr, 0,
                                                  smallest);
          gpu.sm_groups.resize(r == CUDA_SUCCESS ? groups : 0);
        }
        if (gpu.sm_groups.empty()) {
          gpu.green.why_not = absl::StrCat(
              "splitting the device's ", sm.sm.smCount, " SMs into groups of ", smallest,
              " failed: ",
              driver->ErrorName(r == CUDA_SUCCESS ? CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION : r));
        } else {
          gpu.green.available = true;
          gpu.green.min_partition = static_cast<int>(sm.sm.minSmPartitionSize);
          gpu.green.alignment = static_cast<int>(sm.sm.smCoscheduledAlignment);
          gpu.group_sms = static_cast<int>(gpu.sm_groups[0].sm.smCount);
        }
      }
    }
    backend->gpus_.push_back(gpu);
    backend->devices_.push_back(DeviceInfo{.index = i,
                                           .name = name,
                                           .memory_bytes = memory,
                                           .context_limit = 0,
                                           .compute_units = static_cast<uint32_t>(gpu.sms),
                                           .max_in_flight = 256});
  }
  MpsState mps{choice->decision, choice->reason};
  if (choice->decision == MpsDecision::kMps && !mps_connected) {
    std::string why = absl::StrCat(
        "a control daemon was found (", probe.summary,
        ") but the driver did not connect to it (CU_DEVICE_ATTRIBUTE_MPS_ENABLED is 0)");
    if (options.mps == "require") {
      return absl::FailedPreconditionError(absl::StrCat("--mps=require: ", why));
    }
    mps = MpsState{MpsDecision::kFallback, absl::StrCat(why, "; using per-tenant contexts")};
  }
  if (mps.decision == MpsDecision::kMps) {
    for (size_t i = 0; i < backend->devices_.size(); ++i) {
      backend->devices_[i].context_limit = MpsClientContextLimit(backend->gpus_[i].cc_major);
    }
  }
  {
    absl::MutexLock lock(&backend->groups_mu_);
    for (const Gpu& gpu : backend->gpus_) backend->group_users_.emplace_back(gpu.sm_groups.size());
  }
  backend->mps_ = std::move(mps);
  backend->mps_mode_ = options.mps;
  ASSIGN_OR_RETURN(backend->kernels_, KernelTable::Load(*driver));
  backend->images_ = std::make_unique<KernelImages>(KernelImagesOptions{
      .cache_dir = options.kernel_cache_dir,
      .driver = DriverDescription(driver->version),
      .compiler = KernelCompiler::DefaultBinary(),
      .limits = KernelCompiler::DefaultLimits(),
      .workers = static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 4, 2u, 4u))});
  driver->on_process_fatal = [b = backend.get()](CUresult error) { b->ReportProcessFatal(error); };
  backend->driver_ = std::move(driver);
  backend->completer_ = std::thread([b = backend.get()] { b->CompletionLoop(); });
  return backend;
}

CudaBackend::~CudaBackend() {
  images_.reset();  // stops compilations; no callback runs after this
  {
    absl::MutexLock lock(&wake_mu_);
    stopping_ = true;
    wake_.Signal();
  }
  if (completer_.joinable()) completer_.join();
}

MpsState CudaBackend::mps() const {
  absl::MutexLock lock(&mps_mu_);
  return mps_;
}

absl::StatusOr<std::unique_ptr<TenantContext>> CudaBackend::CreateContext(
    const ContextRequest& request) {
  if (request.device_index < 0 || static_cast<size_t>(request.device_index) >= gpus_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("device_index ", request.device_index,
                                                   " is not a GPU of this host (0..",
                                                   gpus_.size() - 1, ")"));
  }
  RETURN_IF_ERROR(fatal());
  const Gpu& gpu = gpus_[request.device_index];
  MpsState mps = this->mps();
  ContextPlan plan = PlanContext(mps.decision, mps.reason, gpu.green,
                                 request.quota.compute_share_percent, gpu.sms);
  auto context = std::make_unique<CudaContext>(this, request, std::move(plan));
  RETURN_IF_ERROR(context->Start());
  spdlog::info("tenant {}: {} context on GPU {}: {}", request.tenant_id,
               ContextKindName(context->info().kind), request.device_index, context->info().reason);
  Register(context.get());
  return std::unique_ptr<TenantContext>(std::move(context));
}

absl::Status InjectFaultInto(TenantContext& context, int stream) {
  auto& cuda = static_cast<CudaContext&>(context);
  return cuda.backend()->InjectFault(context, stream);
}

absl::Status CudaBackend::InjectFault(TenantContext& context, int stream) {
  absl::Status s = static_cast<CudaContext&>(context).InjectFault(stream);
  Wake();
  return s;
}

void CudaBackend::Wake() {
  absl::MutexLock lock(&wake_mu_);
  woken_ = true;
  wake_.Signal();
}

void CudaBackend::ReportProcessFatal(CUresult error) {
  absl::MutexLock lock(&wake_mu_);
  if (reported_fatal_ == CUDA_SUCCESS) reported_fatal_ = error;
  woken_ = true;
  wake_.Signal();
}

std::vector<int> CudaBackend::AcquireSmGroups(int device, int sm_count, int& shared) {
  absl::MutexLock lock(&groups_mu_);
  std::vector<int>& users = group_users_[static_cast<size_t>(device)];
  std::vector<int> picked =
      PickSmGroups(users, gpus_[static_cast<size_t>(device)].group_sms, sm_count);
  shared = 0;
  for (int g : picked) shared += users[static_cast<size_t>(g)]++ > 0 ? 1 : 0;
  return picked;
}

void CudaBackend::ReleaseSmGroups(int device, const std::vector<int>& groups) {
  absl::MutexLock lock(&groups_mu_);
  for (int g : groups) --group_users_[static_cast<size_t>(device)][static_cast<size_t>(g)];
}

void CudaBackend::Register(CudaContext* context) {
  absl::MutexLock lock(&mu_);
  contexts_.insert(context);
}

void CudaBackend::Unregister(CudaContext* context) {
  absl::MutexLock lock(&mu_);
  contexts_.erase(context);
  std::pair<CudaBackend*, CudaContext*> waiting(this, context);
  mu_.Await(absl::Condition(
      +[](std::pair<CudaBackend*, CudaContext*>* p)
           ABSL_NO_THREAD_SAFETY_ANALYSIS { return p->first->polling_ != p->second; },
      &waiting));
}

void CudaBackend::ForEachContext(absl::FunctionRef<void(CudaContext&)> visit) {
  std::vector<CudaContext*> snapshot;
  {
    absl::MutexLock lock(&mu_);
    snapshot.assign(contexts_.begin(), contexts_.end());
  }
  for (CudaContext* c : snapshot) {
    {
      absl::MutexLock lock(&mu_);
      if (contexts_.count(c) == 0) continue;  // unregistered meanwhile
      polling_ = c;
    }
    visit(*c);
    absl::MutexLock lock(&mu_);
    polling_ = nullptr;
  }
}

void CudaBackend::CompletionLoop() {
  // Host functions wake this loop as jobs finish; a short timeout while work is queued also
  // catches faults, after which a stream's host functions may never run.
  bool busy = false;
  for (;;) {
    std::vector<CudaContext::Finished> finished;
    std::vector<int> faulted;
    std::vector<CUresult> errors;
    CUresult reported = CUDA_SUCCESS;
    {
      absl::MutexLock lock(&wake_mu_);
      if (!woken_ && !stopping_) {
        wake_.WaitWithTimeout(&wake_mu_, busy ? absl::Milliseconds(2) : absl::Seconds(1));
      }
      if (stopping_) return;
      woken_ = false;
      reported = std::exchange(reported_fatal_, CUDA_SUCCESS);
    }
    busy = false;
    ForEachContext([&](CudaContext& c) {
      CUresult r = c.Poll(finished, busy);
      if (r != CUDA_SUCCESS) {
        faulted.push_back(c.device());
        errors.push_back(r);
      }
    });
    CudaContext::Deliver(finished);
    for (size_t i = 0; i < faulted.size(); ++i) OnDeviceFault(faulted[i], errors[i]);
    // One no remaining context reported (its context was destroyed, or never created).
    if (reported != CUDA_SUCCESS) OnProcessFatal(-1, reported);
  }
}

void CudaBackend::OnDeviceFault(int device, CUresult error) {
  if (!fatal().ok()) return;  // every context has been faulted already
  {
    absl::MutexLock lock(&mps_mu_);
    if (mps_.decision == MpsDecision::kMps || ClassifyCudaError(error).mps_server) {
      // Under MPS a fatal fault is reported to every client on the GPU and the server stays
      // in FAULT until they have gone; look again at the daemon (first, so that the reason
      // is there by the time the other tenants see their contexts fault).
      MpsProbe probe = ProbeMps(std::getenv("CUDA_MPS_PIPE_DIRECTORY"));
      mps_.reason =
          absl::StrCat("MPS server fault on GPU ", device, " (", driver_->ErrorName(error),
                       "); re-probed: ", probe.summary,
                       "; tenant contexts there are rebuilt when the server is ACTIVE again");
      spdlog::warn("{}", mps_.reason);
    }
  }
  if (ClassifyCudaError(error).process_fatal) {
    OnProcessFatal(device, error);
    return;
  }
  std::vector<CudaContext::Finished> finished;
  ForEachContext([&](CudaContext& c) {
    if (c.device() == device) c.CheckSticky(finished);
  });
  CudaContext::Deliver(finished);
}

void CudaBackend::SetFatalHandler(absl::AnyInvocable<void(const absl::Status&)> handler) {
  absl::MutexLock lock(&fatal_mu_);
  fatal_handler_ = std::move(handler);
}

absl::Status CudaBackend::fatal() const {
  absl::MutexLock lock(&fatal_mu_);
  return fatal_;
}

void CudaBackend::OnProcessFatal(int device, CUresult error) {
  absl::AnyInvocable<void(const absl::Status&)> handler;
  absl::Status why;
  {
    absl::MutexLock lock(&fatal_mu_);
    if (!fatal_.ok()) return;
    fatal_ = absl::UnavailableError(
        absl::StrCat("the GPU backend stopped after a fatal fault",
                     device >= 0 ? absl::StrCat(" on GPU ", device) : std::string(), " (",
                     driver_->ErrorName(error),
                     "): CUDA cannot continue in this server process (the driver requires it to be "
                     "relaunched); the server restarts, retry once it is back"));
    why = fatal_;
    handler = std::move(fatal_handler_);
  }
  spdlog::error("{}", why.message());
  std::vector<CudaContext::Finished> finished;
  ForEachContext([&](CudaContext& c) { c.FaultWith(error, finished); });
  CudaContext::Deliver(finished);
  if (handler) handler(why);
}

}  // namespace tessera::cuda
