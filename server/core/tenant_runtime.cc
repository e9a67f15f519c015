#include "server/core/tenant_runtime.h"

#include <utility>

#include "absl/strings/str_cat.h"

#include "server/common/status_macros.h"
#include "server/core/admission.h"
#include "server/core/token.h"

namespace tessera {
namespace {

absl::StatusOr<std::string> NewId(absl::string_view prefix) {
  ASSIGN_OR_RETURN(std::string random, RandomToken(16));  // 128 bits: unguessable
  return absl::StrCat(prefix, random);
}

absl::Status NotFound(absl::string_view handle) {
  return absl::NotFoundError(absl::StrCat("tensor \"", handle.substr(0, 64), "\" not found"));
}

absl::Status InUse(absl::string_view handle, absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat("tensor \"", handle, "\" is in use by ", what,
                   "; wait for it (WaitJob, Synchronize) and try again"));
}

}  // namespace

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
                             std::unique_ptr<TenantContext> context)
    : tenant_id_(std::move(tenant_id)),
      quota_(quota),
      context_info_(context->info()),
      context_(std::move(context)) {}

TenantRuntime::~TenantRuntime() { Close("the tenant is gone"); }

absl::Status TenantRuntime::CheckOpen() const {
  if (closed_.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("tenant \"", tenant_id_, "\" ", closed_));
}

std::shared_ptr<TenantContext> TenantRuntime::ContextOrNull() const {
  absl::MutexLock lock(&mu_);
  return context_;
}

absl::Status TenantRuntime::CheckQuotaLocked(uint64_t bytes, absl::string_view what) const {
  if (bytes <= quota_.device_memory_bytes - std::min(used_bytes_, quota_.device_memory_bytes)) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("tenant \"", tenant_id_, "\" memory quota: ", used_bytes_, " bytes used + ",
                   bytes, " ", what, " > quota.device_memory_bytes ", quota_.device_memory_bytes,
                   "; delete tensors to free memory"));
}

absl::StatusOr<TenantRuntime::Tensor*> TenantRuntime::FindLocked(absl::string_view handle) {
  auto it = tensors_.find(handle);
  if (it == tensors_.end()) return NotFound(handle);
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

absl::StatusOr<TensorInfo> TenantRuntime::AddTensorLocked(const kernels::TensorMeta& meta,
                                                          std::shared_ptr<DeviceBuffer>* buffer) {
  ASSIGN_OR_RETURN(int64_t size, kernels::ByteSize(meta, "shape"));
  uint64_t bytes = static_cast<uint64_t>(size);
  RETURN_IF_ERROR(CheckQuotaLocked(bytes, "requested"));
  ASSIGN_OR_RETURN(*buffer, context_->Allocate(bytes));
  ASSIGN_OR_RETURN(std::string handle, NewId("tn_"));
  used_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, used_bytes_);
  TensorInfo info{handle, meta, bytes, absl::Now()};
  tensors_.emplace(handle, Tensor{info, *buffer});
  return info;
}

absl::StatusOr<TensorInfo> TenantRuntime::CreateTensor(const kernels::TensorMeta& meta,
                                                       absl::string_view data) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckOpen());
  ASSIGN_OR_RETURN(int64_t size, kernels::ByteSize(meta, "spec.shape"));
  if (!data.empty() && data.size() != static_cast<uint64_t>(size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data is ", data.size(), " bytes; ", kernels::MetaString(meta), " needs exactly ", size));
  }
  std::shared_ptr<DeviceBuffer> buffer;
  ASSIGN_OR_RETURN(TensorInfo info, AddTensorLocked(meta, &buffer));
  if (!data.empty()) {
    absl::Status copied = context_->CopyIn(*buffer, 0, data.data(), data.size());
    if (!copied.ok()) {
      used_bytes_ -= info.size_bytes;
      tensors_.erase(info.handle);
      return copied;
    }
  }
  return info;
}

absl::StatusOr<TensorInfo> TenantRuntime::GetTensor(absl::string_view handle) const {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckOpen());
  auto it = tensors_.find(handle);
  if (it == tensors_.end()) return NotFound(handle);
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
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckOpen());
  ASSIGN_OR_RETURN(Tensor * t, FindLocked(handle));
  if (t->job_readers + t->job_writers > 0) return InUse(handle, "a queued or running job");
  if (t->transfers > 0) return InUse(handle, "a ReadTensor or WriteTensor in progress");
  uint64_t bytes = t->info.size_bytes;
  used_bytes_ -= bytes;
  tensors_.erase(tensors_.find(handle));
  return bytes;
}

// ---- transfers ---------------------------------------------------------------------------------

TenantRuntime::Writer::Writer(std::shared_ptr<TenantRuntime> runtime, TensorInfo info,
                              std::shared_ptr<DeviceBuffer> buffer, bool created)
    : runtime_(std::move(runtime)),
      info_(std::move(info)),
      buffer_(std::move(buffer)),
      created_(created) {}

TenantRuntime::Writer::~Writer() {
  if (!finished_) runtime_->EndTransfer(info_.handle, /*delete_tensor=*/created_);
}

absl::Status TenantRuntime::Writer::Write(uint64_t offset, absl::string_view data) {
  if (offset > info_.size_bytes || data.size() > info_.size_bytes - offset) {
    return absl::InvalidArgumentError(absl::StrCat("chunk at offset ", offset, " of ", data.size(),
                                                   " bytes extends past the end (",
                                                   info_.size_bytes, " bytes)"));
  }
  if (data.empty()) return absl::OkStatus();
  uint64_t end = offset + data.size();
  auto next = ranges_.lower_bound(offset);
  bool overlaps = (next != ranges_.end() && next->first < end) ||
                  (next != ranges_.begin() && std::prev(next)->second > offset);
  if (overlaps) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk [", offset, ", ", end, ") overlaps bytes already written"));
  }
  std::shared_ptr<TenantContext> context = runtime_->ContextOrNull();
  if (context == nullptr) return absl::FailedPreconditionError("the tenant is closed");
  RETURN_IF_ERROR(context->CopyIn(*buffer_, offset, data.data(), data.size()));
  ranges_.emplace(offset, end);
  written_ += data.size();
  return absl::OkStatus();
}

absl::StatusOr<TensorInfo> TenantRuntime::Writer::Finish() {
  if (written_ != info_.size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("received ", written_, " bytes; ",
                                                   kernels::MetaString(info_.meta),
                                                   " needs exactly ", info_.size_bytes));
  }
  finished_ = true;
  runtime_->EndTransfer(info_.handle, /*delete_tensor=*/false);
  return info_;
}

absl::StatusOr<std::unique_ptr<TenantRuntime::Writer>> TenantRuntime::BeginWrite(
    const std::string& handle, const std::optional<kernels::TensorMeta>& create) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckOpen());
  std::shared_ptr<DeviceBuffer> buffer;
  TensorInfo info;
  if (create.has_value()) {
    ASSIGN_OR_RETURN(info, AddTensorLocked(*create, &buffer));
  } else {
    ASSIGN_OR_RETURN(Tensor * t, FindLiveLocked(handle));
    if (t->job_readers + t->job_writers > 0) return InUse(handle, "a queued or running job");
    if (t->transfers > 0) return InUse(handle, "a ReadTensor or WriteTensor in progress");
    info = t->info;
    buffer = t->buffer;
  }
  tensors_.find(info.handle)->second.transfers++;
  return std::unique_ptr<Writer>(
      new Writer(shared_from_this(), std::move(info), std::move(buffer), create.has_value()));
}

TenantRuntime::Reader::Reader(std::shared_ptr<TenantRuntime> runtime, TensorInfo info,
                              std::shared_ptr<DeviceBuffer> buffer)
    : runtime_(std::move(runtime)), info_(std::move(info)), buffer_(std::move(buffer)) {}

TenantRuntime::Reader::~Reader() { runtime_->EndTransfer(info_.handle, false); }

absl::Status TenantRuntime::Reader::Read(uint64_t offset, uint64_t bytes, void* dst) {
  std::shared_ptr<TenantContext> context = runtime_->ContextOrNull();
  if (context == nullptr) return absl::FailedPreconditionError("the tenant is closed");
  return context->CopyOut(*buffer_, offset, dst, bytes);
}

absl::StatusOr<std::unique_ptr<TenantRuntime::Reader>> TenantRuntime::BeginRead(
    absl::string_view handle) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckOpen());
  ASSIGN_OR_RETURN(Tensor * t, FindLiveLocked(handle));
  if (t->job_writers > 0) return InUse(handle, "a queued or running job that writes it");
  t->transfers++;
  return std::unique_ptr<Reader>(new Reader(shared_from_this(), t->info, t->buffer));
}

void TenantRuntime::EndTransfer(const std::string& handle, bool delete_tensor) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(handle);
  if (it == tensors_.end()) return;  // released by Close
  it->second.transfers--;
  if (delete_tensor && it->second.transfers == 0) {
    used_bytes_ -= it->second.info.size_bytes;
    tensors_.erase(it);
  }
}

// ---- jobs --------------------------------------------------------------------------------------

absl::StatusOr<JobInfo> TenantRuntime::Submit(int64_t stream, std::vector<LaunchSpec> steps,
                                              bool program, JobCallback on_done) {
  absl::MutexLock submit_lock(&submit_mu_);
  std::shared_ptr<Job> job;
  std::vector<Step> exec;
  std::shared_ptr<TenantContext> context;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckOpen());
    if (stream < 0 || stream >= quota_.max_streams) {
      return absl::InvalidArgumentError(absl::StrCat("stream is ", stream, "; the tenant has ",
                                                     quota_.max_streams, " streams (0..",
                                                     quota_.max_streams - 1, ")"));
    }
    if (steps.empty() || steps.size() > kMaxProgramSteps) {
      return absl::InvalidArgumentError(
          absl::StrCat("a program has 1..", kMaxProgramSteps, " steps; got ", steps.size()));
    }
    if (queued_ >= quota_.max_queued_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant \"", tenant_id_, "\" has ", queued_, " jobs queued; quota.max_queued_jobs is ",
          quota_.max_queued_jobs, "; wait for some to finish"));
    }
    // Validate every step before allocating anything.
    struct Resolved {
      std::vector<Tensor*> inputs;   // nullptr: an earlier step's output
      std::vector<Tensor*> outputs;  // nullptr: a new tensor
    };
    std::vector<Resolved> resolved(steps.size());
    std::vector<kernels::Plan> plans;
    uint64_t new_bytes = 0;
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
          if (static_cast<size_t>(op.step) >= i || op.output < 0 ||
              static_cast<size_t>(op.output) >= plans[op.step].outputs.size()) {
            return fail(absl::InvalidArgumentError(
                absl::StrCat("inputs[", k, "] refers to output ", op.output, " of step ", op.step,
                             ", which is not an earlier step's output")));
          }
          metas.push_back(plans[op.step].outputs[op.output]);
          resolved[i].inputs.push_back(nullptr);
        } else {
          absl::StatusOr<Tensor*> t = FindLiveLocked(op.handle);
          if (!t.ok()) return fail(t.status());
          metas.push_back((*t)->info.meta);
          resolved[i].inputs.push_back(*t);
        }
      }
      kernels::OutputHints hints;
      for (size_t k = 0; k < spec.outputs.size(); ++k) {
        const OutputSpec& out = spec.outputs[k];
        if (out.kind == OutputSpec::Kind::kHandle) {
          absl::StatusOr<Tensor*> t = FindLiveLocked(out.handle);
          if (!t.ok()) return fail(t.status());
          if ((*t)->transfers > 0) {
            return fail(InUse(out.handle, "a ReadTensor or WriteTensor in progress"));
          }
          for (size_t j = 0; j < k; ++j) {
            if (resolved[i].outputs[j] == *t) {
              return fail(absl::InvalidArgumentError(
                  absl::StrCat("outputs[", k, "] repeats tensor \"", out.handle, "\"")));
            }
          }
          hints.push_back((*t)->info.meta);
          resolved[i].outputs.push_back(*t);
        } else {
          if (out.kind == OutputSpec::Kind::kCreate) {
            hints.push_back(out.create);
          } else {
            hints.push_back(std::nullopt);
          }
          resolved[i].outputs.push_back(nullptr);
        }
      }
      absl::StatusOr<kernels::Plan> plan =
          kernels::Registry::Global().Prepare(spec.kernel, std::move(metas), spec.attrs, hints);
      if (!plan.ok()) return fail(plan.status());
      if (!spec.outputs.empty() && spec.outputs.size() != plan->outputs.size()) {
        return fail(absl::InvalidArgumentError(absl::StrCat(spec.kernel, " has ",
                                                            plan->outputs.size(), " output(s); ",
                                                            spec.outputs.size(), " given")));
      }
      resolved[i].outputs.resize(plan->outputs.size(), nullptr);
      for (size_t k = 0; k < plan->outputs.size(); ++k) {
        if (resolved[i].outputs[k] == nullptr) {
          new_bytes += static_cast<uint64_t>(*kernels::ByteSize(plan->outputs[k]));
        }
      }
      plans.push_back(*std::move(plan));
    }
    RETURN_IF_ERROR(CheckQuotaLocked(new_bytes, "for new outputs"));
    // Everything is valid: create the outputs, take the tensors, record the job. Job ids
    // are looked up only in this tenant's table, so a counter serves (tensor handles, which
    // are shared with clients as capabilities, stay random).
    std::string job_id = absl::StrCat("job_", ++job_counter_);
    job = std::make_shared<Job>();
    job->info.id = job_id;
    job->info.stream = static_cast<int>(stream);
    job->info.enqueue_time = absl::Now();
    std::vector<std::string> created;
    for (size_t i = 0; i < steps.size(); ++i) {
      Step step;
      for (size_t k = 0; k < resolved[i].inputs.size(); ++k) {
        Tensor* t = resolved[i].inputs[k];
        if (t == nullptr) {
          const Operand& op = steps[i].inputs[k];
          step.inputs.push_back(exec[op.step].outputs[op.output]);
        } else {
          step.inputs.push_back(t->buffer);
          t->job_readers++;
          job->reads.push_back(t->info.handle);
        }
      }
      for (size_t k = 0; k < resolved[i].outputs.size(); ++k) {
        Tensor* t = resolved[i].outputs[k];
        if (t == nullptr) {
          std::shared_ptr<DeviceBuffer> buffer;
          absl::StatusOr<TensorInfo> info = AddTensorLocked(plans[i].outputs[k], &buffer);
          if (!info.ok()) {  // the device itself is out of memory: undo what was taken
            ReleaseLocked(*job);
            for (const std::string& h : created) {
              used_bytes_ -= tensors_.find(h)->second.info.size_bytes;
              tensors_.erase(h);
            }
            return info.status();
          }
          created.push_back(info->handle);
          t = &tensors_.find(info->handle)->second;
        }
        step.outputs.push_back(t->buffer);
        t->job_writers++;
        job->writes.push_back(t->info.handle);
        job->info.outputs.push_back(t->info);
      }
      step.plan = std::move(plans[i]);
      exec.push_back(std::move(step));
    }
    if (on_done != nullptr) job->waiters.push_back(std::move(on_done));
    jobs_.emplace(job_id, job);
    queued_++;
    context = context_;
  }
  JobInfo accepted = job->info;
  std::weak_ptr<TenantRuntime> weak = weak_from_this();
  auto start = [weak, job]() -> bool {
    std::shared_ptr<TenantRuntime> self = weak.lock();
    if (self == nullptr) return false;
    absl::MutexLock lock(&self->mu_);
    if (job->info.state != JobState::kQueued) return false;  // cancelled
    job->info.state = JobState::kRunning;
    job->info.start_time = absl::Now();
    self->queued_--;
    self->running_++;
    return true;
  };
  auto done = [weak, job](ExecResult result) {
    std::shared_ptr<TenantRuntime> self = weak.lock();
    if (self == nullptr) return;
    std::vector<JobCallback> waiters;
    JobInfo info;
    {
      absl::MutexLock lock(&self->mu_);
      if (job->info.state == JobState::kRunning) {
        self->running_--;
        JobState state = result.status.ok()                 ? JobState::kSucceeded
                         : absl::IsCancelled(result.status) ? JobState::kCancelled
                                                            : JobState::kFailed;
        waiters = self->FinishLocked(*job, state, result.status, result.failed_step);
      } else if (job->info.state == JobState::kQueued) {  // the context closed first
        self->queued_--;
        waiters = self->FinishLocked(*job, JobState::kCancelled, result.status, -1);
      }
      info = job->info;
    }
    for (JobCallback& w : waiters) std::move(w)(info);
  };
  context->Enqueue(static_cast<int>(stream), std::move(exec), std::move(start), std::move(done));
  return accepted;
}

void TenantRuntime::ReleaseLocked(Job& job) {
  if (job.released) return;
  job.released = true;
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
    return absl::NotFoundError(absl::StrCat("job \"", id.substr(0, 64), "\" not found"));
  }
  return it->second->info;
}

absl::StatusOr<JobInfo> TenantRuntime::CancelJob(absl::string_view id) {
  std::vector<JobCallback> waiters;
  JobInfo info;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("job \"", id.substr(0, 64), "\" not found"));
    }
    std::shared_ptr<Job> job = it->second;
    if (job->info.state == JobState::kQueued) {
      queued_--;
      waiters = FinishLocked(*job, JobState::kCancelled,
                             absl::CancelledError("cancelled by CancelJob while queued"), -1);
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
      return absl::NotFoundError(absl::StrCat("job \"", id.substr(0, 64), "\" not found"));
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
      return absl::InvalidArgumentError(
          absl::StrCat("stream is ", *stream, "; the tenant has ", quota_.max_streams, " streams"));
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
  {
    absl::MutexLock lock(&mu_);
    u.memory_used_bytes = used_bytes_;
    u.memory_peak_bytes = peak_bytes_;
    u.memory_quota_bytes = quota_.device_memory_bytes;
    u.tensors = tensors_.size();
    u.jobs_queued = queued_;
    u.jobs_running = running_;
    u.jobs_succeeded = succeeded_;
    u.jobs_failed = failed_;
    u.jobs_cancelled = cancelled_;
    context = context_;
  }
  u.busy_time = context != nullptr ? context->busy_time() : absl::ZeroDuration();
  return u;
}

void TenantRuntime::Close(absl::string_view why) {
  absl::MutexLock submit_lock(&submit_mu_);
  std::vector<std::pair<std::vector<JobCallback>, JobInfo>> to_notify;
  std::shared_ptr<TenantContext> context;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.empty()) return;
    closed_ = std::string(why);
    for (auto& [id, job] : jobs_) {
      if (job->info.state == JobState::kQueued) {
        queued_--;
        auto waiters =
            FinishLocked(*job, JobState::kCancelled,
                         absl::CancelledError(absl::StrCat("cancelled: tenant ", why)), -1);
        to_notify.emplace_back(std::move(waiters), job->info);
      }
    }
    context = std::move(context_);
  }
  for (auto& [waiters, info] : to_notify) {
    for (JobCallback& w : waiters) std::move(w)(info);
  }
  // Destroying the context waits for running jobs (their completions still find us).
  context.reset();
  absl::MutexLock lock(&mu_);
  tensors_.clear();
  used_bytes_ = 0;
}

}  // namespace tessera
