#include "server/backend/cuda/cuda_context.h"

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
#include <variant>

#include <stdlib.h>

#include "absl/base/casts.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

void CUDA_CB WakeBackend(void* backend) { static_cast<CudaBackend*>(backend)->Wake(); }

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

namespace {

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

// What a program's launches on stream `stream` depend on besides its tensors' addresses: each
// step's kernel (a tenant-defined kernel's program), operand types and shapes, and attributes
// (floats by their bits). The stream is part of it: a matmul's graph node uses that stream's
// cuBLAS workspace.
std::string ProgramKey(const std::vector<Step>& steps, int stream) {
  std::string key = absl::StrCat("s", stream);
  for (const Step& step : steps) {
    absl::StrAppend(&key, ";", step.plan.kernel->name);
    if (step.plan.user != nullptr) absl::StrAppend(&key, "#", step.plan.user->program.hash);
    for (const auto* metas : {&step.plan.inputs, &step.plan.outputs}) {
      absl::StrAppend(&key, "|");
      for (const kernels::TensorMeta& m : *metas) {
        absl::StrAppend(&key, static_cast<int>(m.dtype), "[", absl::StrJoin(m.shape, ","), "]");
      }
    }
    for (const auto& [name, value] : step.plan.attrs) {
      absl::StrAppend(&key, "|", name, "=");
      std::visit(
          [&](const auto& v) {
            using V = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<V, double>) {
              absl::StrAppend(&key, absl::Hex(absl::bit_cast<uint64_t>(v)));
            } else if constexpr (std::is_same_v<V, std::vector<double>>) {
              for (double d : v) absl::StrAppend(&key, absl::Hex(absl::bit_cast<uint64_t>(d)), ",");
            } else if constexpr (std::is_same_v<V, std::vector<int64_t>>) {
              absl::StrAppend(&key, absl::StrJoin(v, ","));
            } else if constexpr (std::is_same_v<V, std::string>) {
              absl::StrAppend(&key, v.size(), ":", v);
            } else {
              absl::StrAppend(&key, v);
            }
          },
          value);
    }
  }
  return key;
}

// Every step's input addresses, then its output addresses.
std::vector<CUdeviceptr> ProgramAddresses(const std::vector<Step>& steps) {
  std::vector<CUdeviceptr> addresses;
  for (const Step& step : steps) {
    for (const auto* list : {&step.inputs, &step.outputs}) {
      for (const auto& b : *list) addresses.push_back(static_cast<const CudaBuffer&>(*b).ptr());
    }
  }
  return addresses;
}

}  // namespace

void CudaContext::Deliver(std::vector<Finished>& finished) {
  for (Finished& f : finished) {
    f.steps.clear();
    f.temps.clear();
    std::move(f.done)(std::move(f.result));
  }
  finished.clear();
}

CudaContext::CudaContext(CudaBackend* backend, ContextRequest request, ContextPlan plan)
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

CudaContext::~CudaContext() {
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

const ContextInfo& CudaContext::info() const { return info_; }

int CudaContext::device() const { return request_.device_index; }

CudaBackend* CudaContext::backend() const { return backend_; }

absl::Status CudaContext::Start() {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<Incarnation>> inc = Build();
  if (!inc.ok()) return inc.status();
  current_ = *std::move(inc);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<DeviceBuffer>> CudaContext::Allocate(uint64_t bytes) {
  return AllocateOnDevice(bytes, /*zero=*/true);
}

absl::StatusOr<std::shared_ptr<DeviceBuffer>> CudaContext::AllocateForOverwrite(uint64_t bytes) {
  return AllocateOnDevice(bytes, /*zero=*/false);
}

absl::Status CudaContext::CopyIn(DeviceBuffer& dst, uint64_t offset, const void* src,
                                 uint64_t bytes) {
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

absl::Status CudaContext::CopyInPieces(DeviceBuffer& dst, uint64_t offset,
                                       absl::Span<const absl::string_view> pieces) {
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

absl::Status CudaContext::CopyOut(const DeviceBuffer& src, uint64_t offset, void* dst,
                                  uint64_t bytes) {
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

absl::StatusOr<std::unique_ptr<TenantContext::HostRegistration>> CudaContext::RegisterHost(
    void* base, uint64_t bytes) {
  const std::string what = absl::StrCat("registering ", bytes, " bytes of host memory with tenant ",
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

absl::Status CudaContext::Woken(absl::Status status) {
  if (!status.ok()) backend_->Wake();
  return status;
}

uint64_t CudaContext::ScratchBytes(const std::vector<Step>& steps) const {
  uint64_t total = 0;
  bool blas = false;
  for (const Step& step : steps) blas = blas || UsesCublas(step.plan);
  for (uint64_t slot : TempSlots(steps)) total += slot;
  return total + (blas ? kCublasWorkspaceBytes : 0);
}

void CudaContext::Enqueue(int stream, std::vector<Step> steps,
                          absl::AnyInvocable<void(ExecResult) &&> done) {
  Followups followups;
  {
    absl::MutexLock lock(&mu_);
    const size_t s = static_cast<size_t>(stream) % waiting_.size();
    waiting_[s].push_back(Waiting{stream, std::move(steps), std::move(done)});
    DrainLocked(s, followups);
  }
  Finish(backend_, request_.tenant_id, handle_, followups);
}

CUcontext CudaContext::raw_context() const {
  absl::MutexLock lock(&mu_);
  return current_ == nullptr || current_->lost.load() ? nullptr : current_->context;
}

absl::Duration CudaContext::busy_time() const {
  absl::MutexLock lock(&mu_);
  return busy_;
}

CUresult CudaContext::Poll(std::vector<Finished>& finished, bool& busy) {
  absl::MutexLock lock(&mu_);
  PollLocked(finished);
  for (const auto& queue : pending_) busy = busy || !queue.empty();
  const CUresult fault = unreported_fault_;
  unreported_fault_ = CUDA_SUCCESS;
  return fault;
}

void CudaContext::CheckSticky(std::vector<Finished>& finished) {
  absl::MutexLock lock(&mu_);
  if (current_ == nullptr || current_->lost.load()) return;
  ScopedContext scoped(driver_, current_->context);
  CUresult r = driver_.cuStreamQuery(current_->copy.get());
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY && ClassifyCudaError(r).sticky) {
    FaultLocked(r, finished);
  }
}

void CudaContext::FaultWith(CUresult error, std::vector<Finished>& finished) {
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

absl::Status CudaContext::InjectFault(int stream) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<Incarnation>> inc = CurrentLocked();
  if (!inc.ok()) return inc.status();
  absl::StatusOr<CUkernel> kernel = backend_->kernels_->Find("tessera_test_fault");
  if (!kernel.ok()) return kernel.status();
  ScopedContext scoped(driver_, (*inc)->context);
  int64_t address = 8;  // never mapped
  void* params[] = {&address};
  return driver_.Check(
      driver_.cuLaunchKernel(reinterpret_cast<CUfunction>(*kernel), 1, 1, 1, kTestFaultBlock, 1, 1,
                             0, (*inc)->streams.at(stream).get(), params, nullptr),
      "launching the test fault");
}

absl::StatusOr<std::shared_ptr<DeviceBuffer>> CudaContext::AllocateOnDevice(uint64_t bytes,
                                                                            bool zero) {
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

CUresult CudaContext::CreateEvent(Event& event, unsigned int flags) const {
  CUevent e = nullptr;
  CUresult r = driver_.cuEventCreate(&e, flags);
  if (r == CUDA_SUCCESS) event = Event(driver_, e);
  return r;
}

CUresult CudaContext::TakeEvent(Incarnation& inc, Event& event) const {
  if (inc.spare_events.empty()) return CreateEvent(event, CU_EVENT_DEFAULT);
  event = std::move(inc.spare_events.back());
  inc.spare_events.pop_back();
  return CUDA_SUCCESS;
}

void CudaContext::Abandon(Pending& p) {
  p.start.Abandon();
  p.end.Abandon();
}

absl::Status CudaContext::Failed(CUresult r, absl::string_view what) {
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

absl::StatusOr<std::shared_ptr<Incarnation>> CudaContext::Build() {
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
                      : driver_.cuDevResourceGenerateDesc(&desc, parts.data(),
                                                          static_cast<unsigned int>(parts.size()));
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
      info.reason = absl::StrCat(info.reason, "; the driver granted ", inc->sms, " SMs: SM groups ",
                                 GroupList(groups), " of ", gpu.sm_groups.size(), " (",
                                 gpu.group_sms, " SMs each)",
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

absl::StatusOr<std::shared_ptr<Incarnation>> CudaContext::CurrentLocked() {
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

template <typename Direct, typename Issue, typename Drain>
absl::Status CudaContext::Transfer(const CudaBuffer& buffer, const void* host, uint64_t bytes,
                                   Direct direct, Issue issue, Drain drain) {
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
CUresult CudaContext::DirectLocked(Incarnation& inc, Direct& direct) {
  ScopedContext scoped(driver_, inc.context);
  CUresult r = direct(inc);
  return r == CUDA_SUCCESS ? driver_.cuStreamSynchronize(inc.copy.get()) : r;
}

template <typename Issue, typename Drain>
CUresult CudaContext::StageLocked(Incarnation& inc, Issue& issue, Drain& drain, uint64_t bytes,
                                  const char*& what) {
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

bool CudaContext::OverlapsLocked(uintptr_t start, uint64_t bytes) const {
  auto next = host_ranges_.lower_bound(start);
  if (next != host_ranges_.end() && next->first - start < bytes) return true;
  if (next == host_ranges_.begin()) return false;
  auto before = std::prev(next);
  return start - before->first < before->second.bytes;
}

CUresult CudaContext::PinLocked(Incarnation& inc, uintptr_t base, uint64_t bytes) {
  ScopedContext scoped(driver_, inc.context);
  return driver_.cuMemHostRegister(reinterpret_cast<void*>(base), bytes, 0);
}

void CudaContext::UnpinLocked(uintptr_t base, const HostRange& range) {
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

bool CudaContext::PinnedLocked(const std::shared_ptr<Incarnation>& current, const void* host,
                               uint64_t bytes) {
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

void CudaContext::UnregisterHost(uintptr_t base) {
  absl::MutexLock copy(&copy_mu_);
  auto it = host_ranges_.find(base);
  if (it == host_ranges_.end()) return;
  UnpinLocked(it->first, it->second);
  host_ranges_.erase(it);
}

void CudaContext::ReleaseHostRanges() {
  absl::MutexLock copy(&copy_mu_);
  if (host_ranges_.empty()) return;
  spdlog::error(
      "tenant {}: its GPU context was destroyed with {} host registration(s) still alive (they "
      "must go first); unregistered them",
      request_.tenant_id, host_ranges_.size());
  for (const auto& [base, range] : host_ranges_) UnpinLocked(base, range);
  host_ranges_.clear();
}

absl::Status CudaContext::Lost() {
  return absl::UnavailableError(
      "the tenant's GPU context faulted during the operation; retry once it is rebuilt");
}

absl::Status CudaContext::FailedUnlocked(CUresult r, absl::string_view what) {
  absl::MutexLock lock(&mu_);
  return Failed(r, what);
}

absl::StatusOr<std::shared_ptr<Incarnation>> CudaContext::Current() {
  absl::MutexLock lock(&mu_);
  return CurrentLocked();
}

void CudaContext::EnqueueLocked(int stream, std::vector<Step> steps,
                                absl::AnyInvocable<void(ExecResult) &&> done,
                                std::vector<Finished>& failed, ExecResult failure) {
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
  absl::Status as_graph;
  const bool graph_sized = steps.size() > 1 || backend_->single_launch_graphs_;
  if (p.result.status.ok() && slots.empty() && graph_sized && backend_->graphs_ &&
      LaunchProgramLocked(current, s, stream, steps, as_graph)) {
    if (!as_graph.ok()) p.result = ExecResult{as_graph, 0};
  } else {
    for (size_t i = 0; i < runnable; ++i) {
      absl::Status launched = LaunchStep(current, s, steps[i], slots, p.temps);
      if (!launched.ok()) {
        p.result = ExecResult{launched, static_cast<int>(i)};
        break;
      }
    }
  }
  if (current.lost.load()) {  // a sticky error while launching: the job is already failed
    Abandon(p);               // destroyed with the context
    failed.push_back({std::move(p.done), p.result, std::move(steps), std::move(p.temps)});
    return;
  }
  r = driver_.cuEventRecord(p.end.get(), s);
  if (r == CUDA_SUCCESS && backend_->host_function_completion_) {
    r = driver_.cuLaunchHostFunc(s, WakeBackend, backend_);
  }
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

absl::Status CudaContext::LaunchStep(Incarnation& inc, CUstream s, const Step& step,
                                     const std::vector<uint64_t>& slots,
                                     std::vector<std::shared_ptr<DeviceBuffer>>& temps) {
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

bool CudaContext::LaunchProgramLocked(Incarnation& inc, CUstream s, int stream,
                                      const std::vector<Step>& steps, absl::Status& status) {
  std::string key = ProgramKey(steps, stream);
  std::vector<CUdeviceptr> addresses = ProgramAddresses(steps);
  // A program the driver would not capture, instantiate or launch is not tried again (until
  // the sightings are forgotten): it runs step by step.
  auto never = [&] {
    inc.programs.erase(key);
    if (inc.program_sightings.size() >= kMaxProgramSightings) inc.program_sightings.clear();
    inc.program_sightings[key] = -1;
    return false;
  };
  // Launches `exec`; a refusal that is not sticky falls back to step by step.
  auto launch = [&](CUgraphExec exec) {
    CUresult r = driver_.cuGraphLaunch(exec, s);
    if (r == CUDA_SUCCESS) return true;
    if (!ClassifyCudaError(r).sticky) return never();
    status = Failed(r, "launching a program's graph");
    return true;
  };
  auto it = inc.programs.find(key);
  if (it == inc.programs.end()) {
    // The first run goes step by step: it loads the kernels, creates the cuBLAS handle and
    // the stream's workspace (none of which may happen during a capture), and a program run
    // once is never captured.
    if (inc.program_sightings.size() >= kMaxProgramSightings) inc.program_sightings.clear();
    int& seen = inc.program_sightings[key];
    if (seen < 0 || ++seen < 2) return false;
  } else if (it->second.addresses == addresses) {
    it->second.last_use = ++inc.program_clock;
    TouchUserModulesLocked(inc, steps);
    return launch(it->second.exec.get());
  }
  for (const Step& step : steps) {
    if (UsesCublas(step.plan) && (!inc.blas || !inc.blas.HasWorkspace(s))) return false;
  }
  // Captured in this thread's mode: the backend's other threads (the completion thread's
  // polls, copies) are not restricted meanwhile. Nothing between the beginning and the end
  // of the capture allocates or faults the context (no temporaries, no new handle).
  CUresult r = driver_.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  if (r != CUDA_SUCCESS) {
    if (!ClassifyCudaError(r).sticky) return never();
    status = Failed(r, "capturing a program");
    return true;
  }
  std::vector<std::shared_ptr<DeviceBuffer>> no_temps;
  absl::Status launched;
  for (const Step& step : steps) {
    launched = LaunchStep(inc, s, step, {}, no_temps);
    if (!launched.ok()) break;
  }
  CUgraph captured = nullptr;
  r = driver_.cuStreamEndCapture(s, &captured);
  Graph graph(driver_, captured);  // a host object: destroyed here whatever happens
  if (r != CUDA_SUCCESS) {
    // The stream's state is unknown: the job fails rather than launch into a capture.
    never();
    status = Failed(r, "ending a program's capture");
    if (status.ok()) status = absl::InternalError("ending a program's capture failed");
    return true;
  }
  if (!launched.ok()) return never();  // nothing ran: step by step reports the failing step
  if (it != inc.programs.end()) {
    CUgraphExecUpdateResultInfo info{};
    if (driver_.cuGraphExecUpdate(it->second.exec.get(), graph.get(), &info) == CUDA_SUCCESS) {
      it->second.addresses = std::move(addresses);
      it->second.last_use = ++inc.program_clock;
      TouchUserModulesLocked(inc, steps);
      return launch(it->second.exec.get());
    }
    inc.programs.erase(it);  // another shape of graph (cuBLAS chose other kernels): anew
  }
  CUgraphExec exec = nullptr;
  r = driver_.cuGraphInstantiateWithFlags(&exec, graph.get(), 0);
  if (r != CUDA_SUCCESS) {
    if (!ClassifyCudaError(r).sticky) return never();
    status = Failed(r, "instantiating a program's graph");
    return true;
  }
  if (inc.programs.size() >= kMaxProgramsPerContext) {
    auto victim = std::min_element(
        inc.programs.begin(), inc.programs.end(),
        [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
    inc.programs.erase(victim);
  }
  inc.program_sightings.erase(key);
  CapturedProgram& program = inc.programs[key];
  program.exec = GraphExec(driver_, exec);
  program.addresses = std::move(addresses);
  program.last_use = ++inc.program_clock;
  TouchUserModulesLocked(inc, steps);
  return launch(exec);
}

void CudaContext::TouchUserModulesLocked(Incarnation& inc, const std::vector<Step>& steps) {
  for (const Step& step : steps) {
    if (step.plan.user == nullptr) continue;
    auto it = inc.user_modules.find(step.plan.user->program.hash);
    if (it != inc.user_modules.end()) it->second.last_use = ++inc.user_clock;
  }
}

void CudaContext::PollLocked(std::vector<Finished>& finished) {
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

void CudaContext::FaultLocked(CUresult error, std::vector<Finished>& finished) {
  if (current_ == nullptr || current_->lost.exchange(true)) return;
  absl::Status status =
      driver_.Check(error, absl::StrCat("tenant ", request_.tenant_id, "'s GPU context on device ",
                                        request_.device_index));
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

void CudaContext::Finish(CudaBackend* backend, const std::string& tenant,
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

int CudaContext::ArchOfKey(const std::string& key) {
  int arch = 0;
  const size_t at = key.rfind("/sm_");
  if (at != std::string::npos) absl::SimpleAtoi(key.substr(at + 4), &arch);
  return arch;
}

void CudaContext::OnImage(const std::string& key, absl::StatusOr<KernelImage> image,
                          Followups& followups) {
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

void CudaContext::DrainLocked(size_t s, Followups& followups) {
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

bool CudaContext::PrepareLocked(Waiting& w, std::vector<FetchRequest>& fetches) {
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

absl::Status CudaContext::LoadUserModuleLocked(Incarnation& inc, const std::string& hash,
                                               const GeneratedKernel& kernel,
                                               const std::string& image) {
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
    if (victim != inc.user_modules.end()) {
      inc.programs.clear();  // a graph may launch the module's function
      inc.user_modules.erase(victim);
    }
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
    absl::Status status = Failed(
        r, absl::StrCat("finding ", kernel.kernel.entry, " in kernel ", kernel.name, "'s module"));
    if (inc.lost.load()) loaded.module.Abandon();  // went with the faulted context
    return status;
  }
  inc.user_modules.emplace(hash, std::move(loaded));
  return absl::OkStatus();
}

}  // namespace tessera::cuda
