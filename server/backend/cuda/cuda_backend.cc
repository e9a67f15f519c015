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

#include <pthread.h>
#include <stdlib.h>
#include <sys/prctl.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

#include "kernels/expr/user_kernel.h"
#include "server/backend/cuda/cuda_context.h"
#include "server/backend/cuda/ops.h"
#include "server/backend/cuda/resources.h"
#include "server/backend/mps_probe.h"
#include "server/common/logging.h"
#include "server/common/status_macros.h"

namespace tessera::cuda {

namespace {

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
  backend->host_function_completion_ = options.completion == "host_function";
  backend->graphs_ = options.graphs;
  backend->single_launch_graphs_ = options.single_launch_graphs;
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

void* RawContextOf(TenantContext& context) {
  return static_cast<CudaContext&>(context).raw_context();
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
  pthread_setname_np(pthread_self(), kCompletionThreadName);
  // Timed waits of microseconds: the default timer slack (50 us) would stretch each one.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  bool busy = false;
  // The last time a job was enqueued or finished: polls are spaced by how long ago that was.
  absl::Time progress = absl::Now();
  // Whether an enqueue restarted the spin since the last job finished.
  bool respun = false;
  for (;;) {
    std::vector<CudaContext::Finished> finished;
    std::vector<int> faulted;
    std::vector<CUresult> errors;
    CUresult reported = CUDA_SUCCESS;
    {
      absl::MutexLock lock(&wake_mu_);
      if (!woken_ && !stopping_) {
        if (!busy) {
          // Nothing in flight: sleep until a job is enqueued (Enqueue wakes this thread).
          wake_.WaitWithTimeout(&wake_mu_, absl::Seconds(1));
        } else if (host_function_completion_) {
          // Host functions wake this loop as jobs finish; the short timeout also catches
          // faults, after which a stream's host functions may never run.
          wake_.WaitWithTimeout(&wake_mu_, absl::Milliseconds(2));
        } else {
          const absl::Duration wait = CompletionPollDelay(absl::Now() - progress);
          if (wait > absl::ZeroDuration()) wake_.WaitWithTimeout(&wake_mu_, wait);
        }
      }
      if (stopping_) return;
      // An enqueued job starts the spin again, but only once between two finished jobs: a
      // tenant enqueuing often behind long jobs would otherwise keep the thread spinning.
      if (std::exchange(woken_, false) && (!busy || !respun)) {
        progress = absl::Now();
        respun = busy;
      }
      reported = std::exchange(reported_fatal_, CUDA_SUCCESS);
    }
    if (busy && !host_function_completion_ &&
        CompletionPollDelay(absl::Now() - progress) == absl::ZeroDuration()) {
      std::this_thread::yield();  // spinning: leave the core to a thread that has work
    }
    busy = false;
    ForEachContext([&](CudaContext& c) {
      CUresult r = c.Poll(finished, busy);
      if (r != CUDA_SUCCESS) {
        faulted.push_back(c.device());
        errors.push_back(r);
      }
    });
    if (!finished.empty()) {
      progress = absl::Now();
      respun = false;
    }
    CudaContext::Deliver(finished);
    for (size_t i = 0; i < faulted.size(); ++i) OnDeviceFault(faulted[i], errors[i]);
    // One no remaining context reported (its context was destroyed, or never created).
    if (reported != CUDA_SUCCESS) OnProcessFatal(-1, reported);
  }
}

absl::Duration CompletionPollDelay(absl::Duration since_progress) {
  if (since_progress < kCompletionSpin) return absl::ZeroDuration();
  return std::clamp(since_progress / 8, kCompletionMinPoll, kCompletionMaxPoll);
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
