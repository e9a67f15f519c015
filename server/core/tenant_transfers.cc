// TenantRuntime's transfers: uploads into a staging copy that commits whole, downloads,
// and the hooks a closing tenant uses to cancel them (the tensors and jobs are in
// tenant_runtime.cc).
#include <utility>

#include "absl/strings/str_cat.h"

#include "server/common/status_macros.h"
#include "server/core/tenant_runtime.h"

namespace tessera {
namespace {

// Most separate written ranges an upload may hold at once (chunks that are not adjacent to
// each other): bounds the bookkeeping of an upload sent in tiny, scattered chunks.
constexpr size_t kMaxUploadRanges = 16384;

}  // namespace

// ---- transfers ---------------------------------------------------------------------------------

TenantRuntime::Writer::Writer(std::shared_ptr<TenantRuntime> runtime, TensorInfo info,
                              std::shared_ptr<DeviceBuffer> staging, bool created)
    : runtime_(std::move(runtime)),
      info_(std::move(info)),
      staging_(std::move(staging)),
      created_(created) {}

TenantRuntime::Writer::~Writer() {
  if (!finished_ && !created_) runtime_->EndTransfer(info_.handle);
}

absl::Status TenantRuntime::Writer::Write(uint64_t offset, absl::string_view data) {
  return Write(offset, absl::MakeConstSpan(&data, 1));
}

absl::Status TenantRuntime::Writer::Write(uint64_t offset,
                                          absl::Span<const absl::string_view> pieces) {
  if (finished_) return absl::FailedPreconditionError("the upload is already committed");
  uint64_t size = 0;
  for (absl::string_view piece : pieces) size += piece.size();
  if (offset > info_.size_bytes || size > info_.size_bytes - offset) {
    return absl::InvalidArgumentError(absl::StrCat("chunk at offset ", offset, " of ", size,
                                                   " bytes extends past the end (",
                                                   info_.size_bytes, " bytes)"));
  }
  if (size == 0) return absl::OkStatus();
  uint64_t end = offset + size;
  auto next = ranges_.lower_bound(offset);
  bool overlaps = (next != ranges_.end() && next->first < end) ||
                  (next != ranges_.begin() && std::prev(next)->second > offset);
  if (overlaps) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk [", offset, ", ", end, ") overlaps bytes already written"));
  }
  // Written ranges are kept merged, so in-order (or reverse-order) chunks cost one entry in
  // all; only chunks that leave gaps between them add entries, and those are bounded.
  const bool joins_previous = next != ranges_.begin() && std::prev(next)->second == offset;
  const bool joins_next = next != ranges_.end() && next->first == end;
  if (!joins_previous && !joins_next && ranges_.size() >= kMaxUploadRanges) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk at offset ", offset, " would make more than ", kMaxUploadRanges,
                     " separate written ranges (the limit); send chunks in order, or next to "
                     "ones already sent"));
  }
  std::shared_ptr<TenantContext> context = runtime_->ContextOrNull();
  if (context == nullptr) return absl::FailedPreconditionError("the tenant is closed");
  RETURN_IF_ERROR(pieces.size() == 1 ? context->CopyIn(*staging_, offset, pieces[0].data(), size)
                                     : context->CopyInPieces(*staging_, offset, pieces));
  uint64_t start = offset;
  if (joins_previous) {
    auto previous = std::prev(next);
    start = previous->first;
    ranges_.erase(previous);
  }
  uint64_t stop = end;
  if (joins_next) {
    stop = next->second;
    ranges_.erase(next);
  }
  ranges_.emplace(start, stop);
  written_ += size;
  return absl::OkStatus();
}

absl::StatusOr<TensorInfo> TenantRuntime::Writer::Finish() {
  if (finished_) return absl::FailedPreconditionError("the upload is already committed");
  if (written_ != info_.size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("received ", written_, " bytes; ",
                                                   kernels::MetaString(info_.meta),
                                                   " needs exactly ", info_.size_bytes));
  }
  std::shared_ptr<DeviceBuffer> replaced;  // the old contents, freed after the lock
  TenantRuntime& rt = *runtime_;
  absl::MutexLock lock(&rt.mu_);
  if (created_) {
    ASSIGN_OR_RETURN(info_, rt.InsertLocked(info_.meta, std::move(staging_)));
    finished_ = true;
    return info_;
  }
  RETURN_IF_ERROR(rt.CheckOpen());
  ASSIGN_OR_RETURN(Tensor * t, rt.FindLocked(info_.handle));
  // The transfer pin kept jobs from writing it and other transfers away; jobs that read it
  // meanwhile read the previous contents, which stay whole until this swap.
  replaced = std::exchange(t->buffer, std::move(staging_));
  t->transfers--;
  finished_ = true;
  return t->info;
}

absl::StatusOr<std::unique_ptr<TenantRuntime::Writer>> TenantRuntime::BeginWrite(
    const std::string& handle, const std::optional<kernels::TensorMeta>& create) {
  TensorInfo info;
  if (create.has_value()) {
    ASSIGN_OR_RETURN(int64_t size, kernels::ByteSize(*create, "header.create.shape"));
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckOpen());
    info.meta = *create;
    info.size_bytes = static_cast<uint64_t>(size);
  } else {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckOpen());
    ASSIGN_OR_RETURN(Tensor * t, FindLiveLocked(handle));
    if (t->job_readers + t->job_writers > 0) return InUse(handle, "a queued or running job");
    if (t->transfers > 0) return InUse(handle, "a ReadTensor or WriteTensor in progress");
    info = t->info;
    t->transfers++;
  }
  // Finish commits only once every byte is written, so the buffer need not be zeroed first.
  absl::StatusOr<std::shared_ptr<DeviceBuffer>> staging = AllocateCharged(
      info.meta, create.has_value() ? "for the new tensor" : "for the upload's staging copy",
      NewBytes::kOverwritten);
  if (!staging.ok()) {
    if (!create.has_value()) EndTransfer(info.handle);
    return staging.status();
  }
  return std::unique_ptr<Writer>(
      new Writer(shared_from_this(), std::move(info), *std::move(staging), create.has_value()));
}

TenantRuntime::Reader::Reader(std::shared_ptr<TenantRuntime> runtime, TensorInfo info,
                              std::shared_ptr<DeviceBuffer> buffer)
    : runtime_(std::move(runtime)), info_(std::move(info)), buffer_(std::move(buffer)) {}

TenantRuntime::Reader::~Reader() { runtime_->EndTransfer(info_.handle); }

absl::Status TenantRuntime::Reader::Read(uint64_t offset, uint64_t bytes, void* dst) {
  std::shared_ptr<TenantContext> context = runtime_->ContextOrNull();
  if (context == nullptr) return absl::FailedPreconditionError("the tenant is closed");
  return context->CopyOut(*buffer_, offset, dst, bytes);
}

std::shared_ptr<const uint8_t> TenantRuntime::Reader::HostBytes() const {
  const void* bytes = buffer_->host_data();
  if (bytes == nullptr) return nullptr;
  return std::shared_ptr<const uint8_t>(buffer_, static_cast<const uint8_t*>(bytes));
}

absl::Status TenantRuntime::Reader::CheckOpen() const {
  if (runtime_->ContextOrNull() == nullptr) {
    return absl::FailedPreconditionError("the tenant is closed");
  }
  return absl::OkStatus();
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

void TenantRuntime::EndTransfer(const std::string& handle) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(handle);
  if (it == tensors_.end()) return;  // released by Close
  it->second.transfers--;
}

uint64_t TenantRuntime::AddTransferHook(absl::AnyInvocable<void() &&> cancel) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = ++hook_counter_;
  transfer_hooks_.emplace(id, std::move(cancel));
  return id;
}

void TenantRuntime::RemoveTransferHook(uint64_t id) {
  absl::AnyInvocable<void() &&> hook;  // destroyed after the lock is released
  absl::MutexLock lock(&mu_);
  auto it = transfer_hooks_.find(id);
  if (it == transfer_hooks_.end()) return;
  hook = std::move(it->second);
  transfer_hooks_.erase(it);
}

}  // namespace tessera
