#include "server/core/tenant_runtime.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

#include "server/common/status_macros.h"
#include "server/common/telemetry.h"
#include "server/core/token.h"
#include "server/core/validation.h"

namespace tessera {
namespace {

absl::StatusOr<std::string> NewId(absl::string_view prefix) {
  ASSIGN_OR_RETURN(std::string random, RandomToken(16));  // 128 bits: unguessable
  return absl::StrCat(prefix, random);
}

// `note`: TenantRuntime::set_moved_note's, explaining why a handle from before a move is gone.
absl::Status NotFound(absl::string_view handle, absl::string_view note) {
  return absl::NotFoundError(absl::StrCat("tensor \"", handle.substr(0, 64), "\" not found", note));
}

// The gate a quota asks for (unset fields, as in tests that skip NormalizeQuota, take the
// defaults NormalizeQuota would give).
RequestGate RequestGateFor(const Quota& quota) {
  const uint32_t in_flight = quota.max_requests_in_flight != 0 ? quota.max_requests_in_flight
                                                               : kDefaultMaxRequestsInFlight;
  const double rate = quota.requests_per_second != 0
                          ? quota.requests_per_second
                          : DefaultRequestsPerSecond(quota.compute_share_percent);
  return RequestGate(in_flight, rate, RequestGate::BurstFor(in_flight, rate));
}

}  // namespace

absl::Status TenantRuntime::InUse(absl::string_view handle, absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat("tensor \"", handle, "\" is in use by ", what,
                   "; wait for it (WaitJob, Synchronize) and try again"));
}

absl::string_view JobStateName(JobState state) {
  switch (state) {
    case JobState::kQueued:
      return "QUEUED";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kSucceeded:
      return "SUCCEEDED";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
  }
  return "?";
}

TenantRuntime::TenantRuntime(std::string tenant_id, Quota quota,
                             std::unique_ptr<TenantContext> context,
                             std::shared_ptr<JobScheduler> scheduler, int device)
    : tenant_id_(std::move(tenant_id)),
      quota_(quota),
      context_info_(context->info()),
      ledger_(MemoryLedger::Create(tenant_id_, quota.device_memory_bytes)),
      requests_(RequestGateFor(quota)),
      scheduler_(scheduler != nullptr
                     ? std::move(scheduler)
                     : JobScheduler::Create({.device_in_flight = std::vector<int>(
                                                 static_cast<size_t>(device) + 1, 0),
                                             .stream_in_flight = 1})),
      queue_(scheduler_->AddTenant(device, quota_, ledger_)),
      context_(std::move(context)) {
  running_on_stream_.assign(std::max<size_t>(1, quota_.max_streams), 0);
}

TenantRuntime::~TenantRuntime() { Close("the tenant is gone"); }

absl::Status TenantRuntime::CheckOpen() const {
  if (closed_.empty()) return absl::OkStatus();
  return absl::Status(closed_code_, absl::StrCat("tenant \"", tenant_id_, "\" ", closed_));
}

std::shared_ptr<TenantContext> TenantRuntime::ContextOrNull() const {
  absl::MutexLock lock(&mu_);
  return context_;
}

absl::StatusOr<TenantRuntime::Tensor*> TenantRuntime::FindLocked(absl::string_view handle) {
  auto it = tensors_.find(handle);
  if (it == tensors_.end()) return NotFound(handle, moved_note_);
  return &it->second;
}

absl::StatusOr<TenantRuntime::Tensor*> TenantRuntime::FindLiveLocked(absl::string_view handle) {
  ASSIGN_OR_RETURN(Tensor * t, FindLocked(handle));
  if (t->buffer->lost()) {
    return absl::DataLossError(absl::StrCat(
        "tensor \"", handle,
        "\" was lost when the tenant's GPU context faulted (device memory is volatile); "
        "delete it and create it again"));
  }
  return t;
}

absl::StatusOr<std::shared_ptr<DeviceBuffer>> TenantRuntime::AllocateCharged(
    const kernels::TensorMeta& meta, absl::string_view what, NewBytes new_bytes,
    MemoryCharge* from) {
  ASSIGN_OR_RETURN(int64_t size, kernels::ByteSize(meta, "shape"));
  const uint64_t bytes = static_cast<uint64_t>(size);
  MemoryCharge charge;
  if (from != nullptr) {
    charge = from->Split(bytes);
  } else {
    ASSIGN_OR_RETURN(charge, ledger_->Reserve(MemoryUse::kTensors, bytes, what));
  }
  std::shared_ptr<TenantContext> context = ContextOrNull();
  if (context == nullptr) {
    absl::MutexLock lock(&mu_);
    return CheckOpen().ok() ? absl::FailedPreconditionError("the tenant is closed") : CheckOpen();
  }
  ASSIGN_OR_RETURN(std::shared_ptr<DeviceBuffer> buffer,
                   new_bytes == NewBytes::kZero ? context->Allocate(bytes)
                                                : context->AllocateForOverwrite(bytes));
  return ChargedBuffer(std::move(buffer), std::move(charge));
}

absl::StatusOr<TensorInfo> TenantRuntime::InsertLocked(const kernels::TensorMeta& meta,
                                                       std::shared_ptr<DeviceBuffer> buffer) {
  RETURN_IF_ERROR(CheckOpen());
  ASSIGN_OR_RETURN(std::string handle, NewId("tn_"));
  TensorInfo info{handle, meta, buffer->size(), absl::Now()};
  tensors_.emplace(handle, Tensor{info, std::move(buffer)});
  return info;
}

absl::StatusOr<TensorInfo> TenantRuntime::CreateTensor(const kernels::TensorMeta& meta,
                                                       absl::string_view data) {
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckOpen());
  }
  ASSIGN_OR_RETURN(int64_t size, kernels::ByteSize(meta, "spec.shape"));
  if (!data.empty() && data.size() != static_cast<uint64_t>(size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data is ", data.size(), " bytes; ", kernels::MetaString(meta), " needs exactly ", size));
  }
  // Allocate and fill with no lock held; the tensor exists only once it is complete.
  ASSIGN_OR_RETURN(
      std::shared_ptr<DeviceBuffer> buffer,
      AllocateCharged(meta, "requested", data.empty() ? NewBytes::kZero : NewBytes::kOverwritten));
  if (!data.empty()) {
    std::shared_ptr<TenantContext> context = ContextOrNull();
    if (context == nullptr) return absl::FailedPreconditionError("the tenant is closed");
    RETURN_IF_ERROR(context->CopyIn(*buffer, 0, data.data(), data.size()));
  }
  absl::MutexLock lock(&mu_);
  return InsertLocked(meta, std::move(buffer));
}

absl::StatusOr<TensorInfo> TenantRuntime::GetTensor(absl::string_view handle) const {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckOpen());
  auto it = tensors_.find(handle);
  if (it == tensors_.end()) return NotFound(handle, moved_note_);
  return it->second.info;
}

TenantRuntime::TensorPage TenantRuntime::ListTensors(absl::string_view after, size_t limit) const {
  TensorPage page;
  absl::MutexLock lock(&mu_);
  auto it = after.empty() ? tensors_.begin() : tensors_.upper_bound(after);
  for (; it != tensors_.end() && page.tensors.size() < limit; ++it) {
    page.tensors.push_back(it->second.info);
  }
  if (it != tensors_.end() && !page.tensors.empty()) page.last_handle = page.tensors.back().handle;
  return page;
}

absl::StatusOr<uint64_t> TenantRuntime::DeleteTensor(absl::string_view handle) {
  std::shared_ptr<DeviceBuffer> freed;  // freed after the lock is released
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckOpen());
  ASSIGN_OR_RETURN(Tensor * t, FindLocked(handle));
  if (t->job_readers + t->job_writers > 0) return InUse(handle, "a queued or running job");
  if (t->transfers > 0) return InUse(handle, "a ReadTensor or WriteTensor in progress");
  uint64_t bytes = t->info.size_bytes;
  freed = std::move(t->buffer);
  tensors_.erase(tensors_.find(handle));
  return bytes;
}

// ---- jobs --------------------------------------------------------------------------------------

// What Submit has taken and gives back unless the job is committed: the pins on existing
// tensors (job reader/writer counts) and the new outputs' buffers (freed with their charge).
class TenantRuntime::Pins {
 public:
  explicit Pins(TenantRuntime* runtime) : runtime_(runtime) {}
  ~Pins() {
    if (committed_ || (reads_.empty() && writes_.empty())) return;
    absl::MutexLock lock(&runtime_->mu_);
    for (const std::string& h : reads_) {
      if (auto it = runtime_->tensors_.find(h); it != runtime_->tensors_.end()) {
        it->second.job_readers--;
      }
    }
    for (const std::string& h : writes_) {
      if (auto it = runtime_->tensors_.find(h); it != runtime_->tensors_.end()) {
        it->second.job_writers--;
      }
    }
  }
  void Read(Tensor& t) {
    t.job_readers++;
    reads_.push_back(t.info.handle);
  }
  void Write(Tensor& t) {
    t.job_writers++;
    writes_.push_back(t.info.handle);
  }
  /// The job now holds the pins (released by ReleaseLocked).
  void Commit(Job& job) {
    job.reads = reads_;
    job.writes = writes_;
    committed_ = true;
  }

 private:
  TenantRuntime* const runtime_;
  std::vector<std::string> reads_, writes_;
  bool committed_ = false;
};

// What Submit resolved under the lock: per step, the existing tensors' buffers (nullptr: an
// earlier step's output, or a new tensor) and the validated plans.
struct TenantRuntime::Resolution {
  struct StepRefs {
    std::vector<std::shared_ptr<DeviceBuffer>> inputs;
    std::vector<std::shared_ptr<DeviceBuffer>> outputs;
    std::vector<TensorInfo> output_infos;  // of existing outputs
  };
  std::vector<StepRefs> steps;
  std::vector<kernels::Plan> plans;
  std::shared_ptr<TenantContext> context;
};

// What Submit allocated with no lock held: the backend's steps, the new outputs (to be
// recorded at commit) and the scratch the job needs to run.
struct TenantRuntime::Prepared {
  std::vector<Step> exec;
  std::vector<std::pair<kernels::TensorMeta, std::shared_ptr<DeviceBuffer>>> created;
  uint64_t scratch = 0;
};

uint64_t TenantRuntime::WaitingLocked() const { return queued_ + handed_ahead_; }

absl::Status TenantRuntime::CheckQueueLocked() const {
  if (WaitingLocked() < quota_.max_queued_jobs) return absl::OkStatus();
  const std::string ahead =
      handed_ahead_ == 0
          ? ""
          : absl::StrCat(", ", handed_ahead_,
                         " of them handed to the device behind the job running on its stream");
  return telemetry::WithRefusalReason(
      absl::ResourceExhaustedError(absl::StrCat(
          "tenant \"", tenant_id_, "\" has ", WaitingLocked(), " jobs waiting to start", ahead,
          " (", running_ - handed_ahead_, " more running); quota.max_queued_jobs is ",
          quota_.max_queued_jobs, "; wait for some to finish")),
      "queue_depth");
}

absl::StatusOr<JobInfo> TenantRuntime::Submit(int64_t stream, std::vector<LaunchSpec> steps,
                                              bool program, JobCallback on_done,
                                              absl::Time deadline) {
  Pins pins(this);  // given back unless the job is committed
  Resolution resolution;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(ResolveLocked(stream, steps, program, pins, resolution));
  }
  ASSIGN_OR_RETURN(Prepared prepared, Prepare(steps, resolution));
  JobInfo accepted;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(accepted, CommitLocked(stream, deadline, std::move(prepared), resolution, pins,
                                            std::move(on_done)));
  }
  // Release whatever may run now (possibly this job, possibly on this thread).
  scheduler_->Dispatch();
  return accepted;
}

absl::StatusOr<kernels::Plan> TenantRuntime::PrepareStep(const std::string& kernel,
                                                         std::vector<kernels::TensorMeta> inputs,
                                                         const kernels::Attrs& attrs,
                                                         const kernels::OutputHints& hints) const {
  const kernels::Registry& catalog = kernels::Registry::Global();
  if (catalog.Find(kernel) != nullptr)
    return catalog.Prepare(kernel, std::move(inputs), attrs, hints);
  KernelLibrary::Kernel user = kernels_.Find(kernel);
  if (user == nullptr) {
    // The same answer whether or not another tenant has such a kernel.
    return absl::NotFoundError(absl::StrCat(
        "kernel \"", kernel.substr(0, 64), "\" not found: neither one of the catalog's ",
        catalog.kernels().size(), " kernels nor one of this tenant's ", kernels_.size(),
        " (ListKernels lists both)"));
  }
  absl::StatusOr<kernels::Plan> plan =
      kernels::PrepareKernel(user->def, std::move(inputs), attrs, hints);
  if (plan.ok()) plan->user = std::move(user);
  return plan;
}

absl::Status TenantRuntime::ResolveLocked(int64_t stream, const std::vector<LaunchSpec>& steps,
                                          bool program, Pins& pins, Resolution& r) {
  RETURN_IF_ERROR(CheckOpen());
  r.steps.resize(steps.size());
  if (stream < 0 || stream >= quota_.max_streams) {
    return absl::InvalidArgumentError(absl::StrCat("stream is ", stream, "; the tenant has ",
                                                   quota_.max_streams, " streams (0..",
                                                   quota_.max_streams - 1, ")"));
  }
  if (steps.empty() || steps.size() > kMaxProgramSteps) {
    return absl::InvalidArgumentError(
        absl::StrCat("a program has 1..", kMaxProgramSteps, " steps; got ", steps.size()));
  }
  if (WaitingLocked() >= quota_.max_queued_jobs) return CheckQueueLocked();
  for (size_t i = 0; i < steps.size(); ++i) {
    const LaunchSpec& spec = steps[i];
    auto fail = [&](const absl::Status& s) {
      return program ? absl::Status(s.code(), absl::StrCat("steps[", i, "] (", spec.kernel,
                                                           "): ", s.message()))
                     : s;
    };
    std::vector<kernels::TensorMeta> metas;
    for (size_t k = 0; k < spec.inputs.size(); ++k) {
      const Operand& op = spec.inputs[k];
      if (op.step >= 0) {
        // Named in full (not prefixed by `fail`): the adapter's field path.
        const std::string field = absl::StrCat("steps[", i, "].inputs[", k, "].step_output");
        if (static_cast<size_t>(op.step) >= i) {
          return absl::InvalidArgumentError(
              i == 0 ? absl::StrCat(field, ".step is ", op.step,
                                    ", not an earlier step: step 0 has none")
                     : absl::StrCat(field, ".step is ", op.step,
                                    ", not an earlier step: the range is 0..", i - 1));
        }
        const size_t outputs = r.plans[op.step].outputs.size();
        if (op.output < 0 || static_cast<size_t>(op.output) >= outputs) {
          return absl::InvalidArgumentError(
              absl::StrCat(field, ".output is ", op.output, "; steps[", op.step, "] (",
                           steps[op.step].kernel, ") has ", outputs, " output(s)",
                           outputs == 0 ? "" : absl::StrCat(": 0..", outputs - 1)));
        }
        metas.push_back(r.plans[op.step].outputs[op.output]);
        r.steps[i].inputs.push_back(nullptr);
      } else {
        absl::StatusOr<Tensor*> t = FindLiveLocked(op.handle);
        if (!t.ok()) return fail(t.status());
        metas.push_back((*t)->info.meta);
        r.steps[i].inputs.push_back((*t)->buffer);
        pins.Read(**t);
      }
    }
    kernels::OutputHints hints;
    std::vector<Tensor*> existing;
    for (size_t k = 0; k < spec.outputs.size(); ++k) {
      const OutputSpec& out = spec.outputs[k];
      if (out.kind == OutputSpec::Kind::kHandle) {
        absl::StatusOr<Tensor*> t = FindLiveLocked(out.handle);
        if (!t.ok()) return fail(t.status());
        if ((*t)->transfers > 0) {
          return fail(InUse(out.handle, "a ReadTensor or WriteTensor in progress"));
        }
        for (Tensor* e : existing) {
          if (e == *t) {
            return fail(absl::InvalidArgumentError(
                absl::StrCat("outputs[", k, "] repeats tensor \"", out.handle, "\"")));
          }
        }
        existing.push_back(*t);
        hints.push_back((*t)->info.meta);
      } else {
        existing.push_back(nullptr);
        hints.push_back(out.kind == OutputSpec::Kind::kCreate
                            ? std::optional<kernels::TensorMeta>(out.create)
                            : std::nullopt);
      }
    }
    absl::StatusOr<kernels::Plan> plan =
        PrepareStep(spec.kernel, std::move(metas), spec.attrs, hints);
    if (!plan.ok()) return fail(plan.status());
    if (!spec.outputs.empty() && spec.outputs.size() != plan->outputs.size()) {
      return fail(
          absl::InvalidArgumentError(absl::StrCat(spec.kernel, " has ", plan->outputs.size(),
                                                  " output(s); ", spec.outputs.size(), " given")));
    }
    existing.resize(plan->outputs.size(), nullptr);
    for (Tensor* t : existing) {
      r.steps[i].outputs.push_back(t == nullptr ? nullptr : t->buffer);
      r.steps[i].output_infos.push_back(t == nullptr ? TensorInfo{} : t->info);
      if (t != nullptr) pins.Write(*t);
    }
    r.plans.push_back(*std::move(plan));
  }
  r.context = context_;
  return absl::OkStatus();
}

absl::StatusOr<TenantRuntime::Prepared> TenantRuntime::Prepare(const std::vector<LaunchSpec>& steps,
                                                               Resolution& r) {
  // The new outputs are charged all at once, so that a refusal names the job's whole need.
  uint64_t new_bytes = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    for (size_t k = 0; k < r.steps[i].outputs.size(); ++k) {
      if (r.steps[i].outputs[k] == nullptr) {
        new_bytes += static_cast<uint64_t>(*kernels::ByteSize(r.plans[i].outputs[k]));
      }
    }
  }
  ASSIGN_OR_RETURN(MemoryCharge charge,
                   ledger_->Reserve(MemoryUse::kTensors, new_bytes, "for new outputs"));
  Prepared p;
  for (size_t i = 0; i < steps.size(); ++i) {
    Step step;
    for (size_t k = 0; k < r.steps[i].inputs.size(); ++k) {
      if (r.steps[i].inputs[k] != nullptr) {
        step.inputs.push_back(r.steps[i].inputs[k]);
      } else {
        const Operand& op = steps[i].inputs[k];
        step.inputs.push_back(p.exec[op.step].outputs[op.output]);
      }
    }
    for (size_t k = 0; k < r.steps[i].outputs.size(); ++k) {
      std::shared_ptr<DeviceBuffer> buffer = r.steps[i].outputs[k];
      if (buffer == nullptr) {
        ASSIGN_OR_RETURN(buffer,
                         AllocateCharged(r.plans[i].outputs[k], "for new outputs", NewBytes::kZero,
                                         &charge));  // freed with `p` on failure
        p.created.emplace_back(r.plans[i].outputs[k], buffer);
      }
      step.outputs.push_back(std::move(buffer));
    }
    step.plan = std::move(r.plans[i]);
    p.exec.push_back(std::move(step));
  }
  p.scratch = r.context->ScratchBytes(p.exec);
  RETURN_IF_ERROR(ledger_->CheckFitsBesideTensors(p.scratch, "of scratch the job needs to run"));
  return p;
}

absl::StatusOr<JobInfo> TenantRuntime::CommitLocked(int64_t stream, absl::Time deadline, Prepared p,
                                                    const Resolution& r, Pins& pins,
                                                    JobCallback on_done) {
  RETURN_IF_ERROR(CheckOpen());
  RETURN_IF_ERROR(CheckQueueLocked());
  // The new tensors and the job appear together.
  auto job = std::make_shared<Job>();
  size_t next_created = 0;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    for (size_t k = 0; k < r.steps[i].outputs.size(); ++k) {
      if (r.steps[i].outputs[k] != nullptr) {
        job->info.outputs.push_back(r.steps[i].output_infos[k]);
        continue;
      }
      auto& [meta, buffer] = p.created[next_created++];
      ASSIGN_OR_RETURN(std::string handle, NewId("tn_"));
      TensorInfo info{handle, meta, buffer->size(), absl::Now()};
      job->info.outputs.push_back(info);
      Tensor& t = tensors_.emplace(handle, Tensor{info, buffer}).first->second;
      pins.Write(t);
    }
  }
  // Job ids are looked up only in this tenant's table, so a counter serves (tensor handles,
  // which are shared with clients as capabilities, stay random).
  job->info.id = absl::StrCat("job_", ++job_counter_);
  job->info.stream = static_cast<int>(stream);
  job->info.enqueue_time = absl::Now();
  job->info.deadline = deadline;
  job->info.kernel = p.exec.size() == 1 ? p.exec[0].plan.kernel->name : "program";
  job->exec = std::move(p.exec);
  pins.Commit(*job);
  if (on_done != nullptr) job->waiters.push_back(std::move(on_done));
  jobs_.emplace(job->info.id, job);
  queued_++;
  // The job joins its stream's queue in acceptance order (the scheduler's mutex nests here).
  auto ticket = std::make_unique<JobTicket>();
  ticket->stream = static_cast<int>(stream);
  ticket->deadline = deadline;
  ticket->scratch_bytes = p.scratch;
  std::weak_ptr<TenantRuntime> weak = weak_from_this();
  ticket->release = [weak, job](MemoryCharge scratch) {
    if (std::shared_ptr<TenantRuntime> self = weak.lock()) self->Run(job, std::move(scratch));
  };
  ticket->drop = [weak, job](absl::Status why) {
    if (std::shared_ptr<TenantRuntime> self = weak.lock()) self->Drop(job, std::move(why));
  };
  job->ticket = queue_->Enqueue(std::move(ticket));
  return job->info;
}

void TenantRuntime::Run(const std::shared_ptr<Job>& job, MemoryCharge scratch) {
  std::shared_ptr<TenantContext> context;
  std::vector<Step> exec;
  {
    absl::MutexLock lock(&mu_);
    if (job->info.state == JobState::kQueued) {
      job->info.state = JobState::kRunning;
      job->info.start_time = absl::Now();
      queued_--;
      running_++;
      if (running_on_stream_[static_cast<size_t>(job->info.stream)]++ > 0) handed_ahead_++;
      context = context_;
      exec = std::move(job->exec);
    }
  }
  const int stream = job->info.stream;
  if (context == nullptr) {  // closed (or finished) meanwhile: nothing runs
    Done(job, ExecResult{absl::CancelledError("the tenant's context is closing"), -1});
    queue_->Completed(stream, absl::ZeroDuration());
    return;
  }
  std::weak_ptr<TenantRuntime> weak = weak_from_this();
  std::shared_ptr<JobScheduler::Queue> queue = queue_;
  context->Enqueue(
      stream, std::move(exec),
      [weak, job, queue, stream, scratch = std::move(scratch)](ExecResult result) mutable {
        absl::Duration run_time = result.run_time;
        // Before the job's waiters hear of it: a client's next GetUsage must not see the
        // finished job's scratch still charged.
        scratch.Release();
        if (std::shared_ptr<TenantRuntime> self = weak.lock()) {
          self->Done(job, std::move(result));
        }
        queue->Completed(stream, run_time);
      });
}

void TenantRuntime::Drop(const std::shared_ptr<Job>& job, absl::Status why) {
  std::vector<JobCallback> waiters;
  JobInfo info;
  {
    absl::MutexLock lock(&mu_);
    if (job->info.state != JobState::kQueued) return;
    queued_--;
    if (absl::IsDeadlineExceeded(why)) expired_++;
    waiters = FinishLocked(*job, JobState::kCancelled, std::move(why), -1);
    info = job->info;
  }
  Report(info);
  for (JobCallback& w : waiters) std::move(w)(info);
}

void TenantRuntime::Done(const std::shared_ptr<Job>& job, ExecResult result) {
  std::vector<JobCallback> waiters;
  JobInfo info;
  {
    absl::MutexLock lock(&mu_);
    if (job->info.state != JobState::kRunning) return;
    running_--;
    if (--running_on_stream_[static_cast<size_t>(job->info.stream)] > 0) handed_ahead_--;
    JobState state = result.status.ok()                 ? JobState::kSucceeded
                     : absl::IsCancelled(result.status) ? JobState::kCancelled
                                                        : JobState::kFailed;
    waiters = FinishLocked(*job, state, result.status, result.failed_step);
    info = job->info;
  }
  Report(info);
  for (JobCallback& w : waiters) std::move(w)(info);
}

void TenantRuntime::Report(const JobInfo& info) const {
  const bool ran = info.start_time >= info.enqueue_time;  // never released: the epoch
  telemetry::JobFinished(telemetry::JobSample{
      .tenant = tenant_id_,
      .kernel = info.kernel,
      .outcome = info.state == JobState::kSucceeded ? "succeeded"
                 : info.state == JobState::kFailed  ? "failed"
                                                    : "cancelled",
      .queue_wait = (ran ? info.start_time : info.end_time) - info.enqueue_time,
      .run_time = ran ? info.end_time - info.start_time : absl::ZeroDuration(),
      .ran = ran});
}

void TenantRuntime::ReleaseLocked(Job& job) {
  if (job.released) return;
  job.released = true;
  job.exec.clear();
  for (const std::string& h : job.reads) {
    if (auto it = tensors_.find(h); it != tensors_.end()) it->second.job_readers--;
  }
  for (const std::string& h : job.writes) {
    if (auto it = tensors_.find(h); it != tensors_.end()) it->second.job_writers--;
  }
}

std::vector<TenantRuntime::JobCallback> TenantRuntime::FinishLocked(Job& job, JobState state,
                                                                    absl::Status error,
                                                                    int failed_step) {
  ReleaseLocked(job);
  job.info.state = state;
  job.info.end_time = absl::Now();
  if (state != JobState::kSucceeded) {
    job.info.error = std::move(error);
    job.info.failed_step = failed_step;
  }
  (state == JobState::kSucceeded ? succeeded_
   : state == JobState::kFailed  ? failed_
                                 : cancelled_)++;
  finished_order_.push_back(job.info.id);
  while (finished_order_.size() > kFinishedJobsKept) {
    jobs_.erase(finished_order_.front());
    finished_order_.pop_front();
  }
  return std::move(job.waiters);
}

absl::StatusOr<JobInfo> TenantRuntime::GetJob(absl::string_view id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("job \"", id.substr(0, 64), "\" not found", moved_note_));
  }
  return it->second->info;
}

absl::StatusOr<JobInfo> TenantRuntime::CancelJob(absl::string_view id) {
  std::shared_ptr<Job> job;
  uint64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) {
      return absl::NotFoundError(
          absl::StrCat("job \"", id.substr(0, 64), "\" not found", moved_note_));
    }
    job = it->second;
    if (job->info.state != JobState::kQueued) return job->info;
    ticket = job->ticket;
  }
  // Still queued: take it from the scheduler unless it is being released right now.
  const bool removed = queue_->Cancel(ticket);
  std::vector<JobCallback> waiters;
  JobInfo info;
  {
    absl::MutexLock lock(&mu_);
    if (removed && job->info.state == JobState::kQueued) {
      queued_--;
      waiters = FinishLocked(*job, JobState::kCancelled,
                             absl::CancelledError("cancelled while queued; it did not run"), -1);
    }
    info = job->info;
  }
  for (JobCallback& w : waiters) std::move(w)(info);
  return info;
}

uint64_t TenantRuntime::CancelQueuedJobs() {
  std::vector<std::string> queued;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, job] : jobs_) {
      if (job->info.state == JobState::kQueued) queued.push_back(id);
    }
  }
  uint64_t cancelled = 0;
  for (const std::string& id : queued) {
    absl::StatusOr<JobInfo> info = CancelJob(id);
    if (info.ok() && info->state == JobState::kCancelled) ++cancelled;
  }
  return cancelled;
}

absl::Status TenantRuntime::WhenJobDone(absl::string_view id, JobCallback callback) {
  JobInfo info;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) {
      return absl::NotFoundError(
          absl::StrCat("job \"", id.substr(0, 64), "\" not found", moved_note_));
    }
    Job& job = *it->second;
    if (job.info.state == JobState::kQueued || job.info.state == JobState::kRunning) {
      job.waiters.push_back(std::move(callback));
      return absl::OkStatus();
    }
    info = job.info;
  }
  std::move(callback)(info);
  return absl::OkStatus();
}

absl::Status TenantRuntime::WhenIdle(std::optional<int64_t> stream,
                                     absl::AnyInvocable<void(uint64_t) &&> callback) {
  struct Latch {
    absl::Mutex mu;
    uint64_t remaining ABSL_GUARDED_BY(mu) = 0;
    uint64_t total = 0;
    absl::AnyInvocable<void(uint64_t) &&> callback;
  };
  auto latch = std::make_shared<Latch>();
  latch->callback = std::move(callback);
  std::vector<std::shared_ptr<Job>> pending;
  {
    absl::MutexLock lock(&mu_);
    if (stream.has_value() && (*stream < 0 || *stream >= quota_.max_streams)) {
      return absl::InvalidArgumentError(absl::StrCat("stream is ", *stream, "; the tenant has ",
                                                     quota_.max_streams, " streams (0..",
                                                     quota_.max_streams - 1, ")"));
    }
    for (const auto& [id, job] : jobs_) {
      bool active = job->info.state == JobState::kQueued || job->info.state == JobState::kRunning;
      if (active && (!stream.has_value() || job->info.stream == *stream)) pending.push_back(job);
    }
    latch->total = pending.size();
    {
      absl::MutexLock latch_lock(&latch->mu);
      latch->remaining = pending.size() + 1;  // +1 released below, after registration
    }
    for (const auto& job : pending) {
      job->waiters.push_back([latch](const JobInfo&) {
        bool last;
        {
          absl::MutexLock l(&latch->mu);
          last = --latch->remaining == 0;
        }
        if (last) std::move(latch->callback)(latch->total);
      });
    }
  }
  bool last;
  {
    absl::MutexLock l(&latch->mu);
    last = --latch->remaining == 0;
  }
  if (last) std::move(latch->callback)(latch->total);
  return absl::OkStatus();
}

UsageInfo TenantRuntime::Usage() const {
  std::shared_ptr<TenantContext> context;
  UsageInfo u;
  const MemoryLedger::Snapshot memory = ledger_->snapshot();
  u.memory_used_bytes = memory.used;
  u.memory_peak_bytes = memory.peak;
  u.memory_quota_bytes = memory.quota;
  u.memory_tensor_bytes = memory.tensors;
  u.memory_scratch_bytes = memory.scratch;
  u.memory_staging_bytes = memory.staging;
  {
    absl::MutexLock lock(&mu_);
    u.tensors = tensors_.size();
    u.jobs_queued = queued_;
    u.jobs_running = running_;
    u.jobs_succeeded = succeeded_;
    u.jobs_failed = failed_;
    u.jobs_cancelled = cancelled_;
    u.jobs_expired = expired_;
    u.regions = regions_.size();
    u.region_bytes = region_bytes_;
    context = context_;
  }
  u.busy_time = context != nullptr ? context->busy_time() : absl::ZeroDuration();
  u.requests = requests_.counts();
  u.region_quota_bytes =
      quota_.max_region_bytes != 0 ? quota_.max_region_bytes : quota_.device_memory_bytes;
  return u;
}

void TenantRuntime::Close(absl::string_view why, absl::StatusCode code) {
  std::vector<std::pair<std::vector<JobCallback>, JobInfo>> to_notify;
  std::vector<absl::AnyInvocable<void() &&>> hooks;
  std::shared_ptr<TenantContext> context;
  std::map<std::string, std::shared_ptr<Region>, std::less<>> regions;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.empty()) return;
    closed_ = std::string(why);
    closed_code_ = code;
    // Nothing queued is released from now on; running jobs finish in the context.
    queue_->Close();
    for (auto& [id, job] : jobs_) {
      if (job->info.state == JobState::kQueued) {
        queued_--;
        auto waiters =
            FinishLocked(*job, JobState::kCancelled,
                         absl::CancelledError(absl::StrCat("cancelled: tenant ", why)), -1);
        to_notify.emplace_back(std::move(waiters), job->info);
      }
    }
    for (auto& [id, hook] : transfer_hooks_) hooks.push_back(std::move(hook));
    transfer_hooks_.clear();
    context = std::move(context_);
    regions.swap(regions_);
    region_bytes_ = 0;
  }
  for (auto& [waiters, info] : to_notify) {
    for (JobCallback& w : waiters) std::move(w)(info);
  }
  for (auto& hook : hooks) std::move(hook)();
  // Regions are unregistered and unmapped before the context goes (one a transfer still
  // pins goes when that transfer ends, and keeps the context alive until then).
  regions.clear();
  // Destroying the context waits for running jobs (their completions still find us).
  context.reset();
  std::map<std::string, Tensor, std::less<>> dropped;  // freed after the lock is released
  absl::MutexLock lock(&mu_);
  dropped.swap(tensors_);
}

}  // namespace tessera
