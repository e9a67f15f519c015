#include "server/service/transfer_reactors.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

#include "server/common/status_macros.h"
#include "server/core/validation.h"
#include "server/service/call.h"
#include "server/service/compute_convert.h"
#include "server/service/transfer_wire.h"

namespace tessera {
namespace {

constexpr int64_t kDefaultChunkBytes = 1 << 20;
constexpr int64_t kMinChunkBytes = 4 << 10;

// Lets a closing tenant cancel a transfer's call: the runtime keeps a hook that calls
// TryCancel while the reactor lives, and nothing once it is done.
class TransferCanceller {
 public:
  TransferCanceller(grpc::CallbackServerContext* context, std::shared_ptr<TenantRuntime> runtime)
      : state_(std::make_shared<State>()), runtime_(std::move(runtime)) {
    state_->context = context;
    hook_ = runtime_->AddTransferHook([state = state_]() {
      absl::MutexLock lock(&state->mu);
      if (state->context != nullptr) state->context->TryCancel();
    });
  }
  ~TransferCanceller() {
    {
      absl::MutexLock lock(&state_->mu);
      state_->context = nullptr;
    }
    runtime_->RemoveTransferHook(hook_);
  }

 private:
  struct State {
    absl::Mutex mu;
    grpc::CallbackServerContext* context ABSL_GUARDED_BY(mu) = nullptr;
  };
  std::shared_ptr<State> state_;
  std::shared_ptr<TenantRuntime> runtime_;
  uint64_t hook_ = 0;
};

// A download's reply blocks, reused: a block gRPC has let go of (it may hold a reply's slices
// until the transport has sent them, past the write's completion) takes the next chunk, so a
// download faults in a few blocks' pages instead of every chunk's (256 faults per 1 MiB
// chunk with 4 KiB pages). Shared by the reactor and the slices it lent, whichever goes last.
class ReplyBlocks : public std::enable_shared_from_this<ReplyBlocks> {
 public:
  explicit ReplyBlocks(size_t block_bytes) : block_bytes_(block_bytes) {}
  ~ReplyBlocks() {
    for (void* block : free_) std::free(block);
  }

  // A block's first `n` (at most block_bytes) bytes as a slice that brings the block back when
  // gRPC releases it; the caller writes them through `*into` before sending the slice.
  absl::StatusOr<grpc::Slice> Take(size_t n, uint8_t** into) {
    void* block = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (!free_.empty()) {
        block = free_.back();
        free_.pop_back();
      }
    }
    if (block == nullptr) block = std::malloc(block_bytes_);
    if (block == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host memory: cannot allocate a ", block_bytes_, "-byte reply"));
    }
    *into = static_cast<uint8_t*>(block);
    return grpc::Slice(block, n, &ReplyBlocks::Return, new Lent{shared_from_this(), block});
  }

 private:
  static constexpr size_t kKeep = 2;  // the replies a download holds: one sent, one filled
  struct Lent {
    std::shared_ptr<ReplyBlocks> blocks;
    void* block;
  };
  static void Return(void* lent_ptr) {
    std::unique_ptr<Lent> lent(static_cast<Lent*>(lent_ptr));  // may end the pool: after
    ReplyBlocks& blocks = *lent->blocks;
    {
      absl::MutexLock lock(&blocks.mu_);
      if (blocks.free_.size() < kKeep) {
        blocks.free_.push_back(lent->block);
        return;
      }
    }
    std::free(lent->block);
  }

  const size_t block_bytes_;
  absl::Mutex mu_;
  std::vector<void*> free_ ABSL_GUARDED_BY(mu_);
};

// Uploads: a header, then chunks; answered once the client half-closes. Reactions only
// hand work to the transfer executor: chunks are copied (into a staging copy that commits
// only when every byte arrived and the client is still there) off gRPC's threads, straight
// from the slices gRPC received them in (FindChunk). Two message buffers: gRPC reads the next
// chunk into one while the executor copies the other, so the connection is never idle for a
// copy and at most two chunks are held per upload. The executor runs one task of an upload
// at a time (`busy_`), in the order read.
class WriteTensorReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  WriteTensorReactor(grpc::CallbackServerContext* context, const Authenticator* auth,
                     FairExecutor* transfers, grpc::ByteBuffer* response)
      : context_(context),
        log_(context, "WriteTensor"),
        transfers_(transfers),
        response_(response) {
    absl::StatusOr<std::shared_ptr<TenantRuntime>> runtime = auth->AuthenticateTenant(*context);
    if (!runtime.ok()) {
      Answer(runtime.status());
      return;
    }
    runtime_ = *std::move(runtime);
    canceller_.emplace(context, runtime_);
    log_.set_tenant(runtime_->tenant_id());
    StartRead(&buffers_[0]);
  }

  void OnReadDone(bool ok) override {
    int full = -1;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;  // answered already (a failed chunk); nothing more to do
      if (!ok) {
        ended_ = true;
        if (busy_) return;  // the running task completes the call when it ends
        busy_ = true;
      } else if (busy_) {
        waiting_ = true;  // both buffers taken: handed over when the running task ends
        return;
      } else {
        busy_ = true;
        full = TakeReadLocked();
      }
    }
    if (full < 0) return Post([this] { Complete(); });
    CopyAndReadNext(full);
  }
  void OnCancel() override { cancelled_.store(true); }
  void OnDone() override { delete this; }  // an unfinished writer commits nothing

 private:
  // Queues `task` on the transfer executor; when the executor refuses it, answers the call.
  void Post(absl::AnyInvocable<void() &&> task) {
    absl::Status queued =
        transfers_->Schedule(runtime_->tenant_id(), TransferWeight(*runtime_), std::move(task));
    if (!queued.ok()) Answer(queued);
  }

  // The buffer gRPC just filled; gRPC reads into the other one from now on.
  int TakeReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int full = reading_;
    reading_ ^= 1;
    return full;
  }

  // Queues the copy of buffer `full` and reads the next message into the other. The read
  // starts first: a copy that fails answers the call, and after that (with no read in
  // flight) gRPC may end the reactor at once.
  void CopyAndReadNext(int full) {
    StartRead(&buffers_[full ^ 1]);
    Post([this, full] { Consume(full); });
  }

  // On the executor: copies buffer `index`, then hands the executor the message read
  // meanwhile (a task of its own, so that tenants still take turns chunk by chunk), or
  // completes the call when the stream has ended.
  void Consume(int index) {
    absl::Status status = ConsumeMessage(buffers_[index]);
    buffers_[index].Clear();  // the chunk's bytes are in the staging copy now
    if (!status.ok()) return Answer(status);
    int next = -1;
    {
      absl::MutexLock lock(&mu_);
      if (waiting_) {
        waiting_ = false;
        next = TakeReadLocked();
      } else if (!ended_) {
        busy_ = false;
        return;
      }
    }
    if (next < 0) return Complete();
    CopyAndReadNext(next);
  }

  // A chunk in the form every client sends is copied from gRPC's slices where it lies; any
  // other message (the header, a chunk with its fields in another order or unknown ones) is
  // parsed by protobuf.
  absl::Status ConsumeMessage(const grpc::ByteBuffer& message) {
    ++messages_;
    if (writer_ != nullptr) {
      ChunkView chunk;
      absl::StatusOr<bool> found = FindChunk(message, &chunk);
      if (!found.ok()) return NotARequest(found.status().message());
      if (*found) return WriteChunk(chunk.offset, chunk.pieces, chunk.size);
    }
    v1::WriteTensorRequest request;
    if (!ParseMessage(message, &request)) {
      return NotARequest(
          "protobuf cannot parse it (truncated or corrupt, or a string that is not UTF-8)");
    }
    if (writer_ == nullptr) return BeginUpload(request);
    if (!request.has_chunk()) {
      return absl::InvalidArgumentError("after the header, every message must be a chunk");
    }
    const absl::string_view data = request.chunk().data();
    return WriteChunk(request.chunk().offset(), absl::MakeConstSpan(&data, 1), data.size());
  }

  absl::Status BeginUpload(const v1::WriteTensorRequest& request) {
    if (!request.has_header()) {
      return absl::InvalidArgumentError("the first message must be a header");
    }
    const v1::WriteHeader& header = request.header();
    std::optional<kernels::TensorMeta> create;
    if (header.has_create()) {
      ASSIGN_OR_RETURN(create, MetaFromProto(header.create(), "header.create"));
    } else if (header.handle().empty()) {
      return absl::InvalidArgumentError("header needs a handle or a create spec");
    } else {
      RETURN_IF_ERROR(CheckReference(header.handle(), "header.handle", "a tensor handle"));
    }
    ASSIGN_OR_RETURN(writer_, runtime_->BeginWrite(header.handle(), create));
    return absl::OkStatus();
  }

  absl::Status WriteChunk(uint64_t offset, absl::Span<const absl::string_view> data,
                          uint64_t size) {
    if (size == 0) {
      return absl::InvalidArgumentError("chunk.data is empty; every chunk carries bytes");
    }
    return writer_->Write(offset, data);
  }

  absl::Status NotARequest(absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "message ", messages_, " of the upload is not a tessera.v1.WriteTensorRequest: ", why));
  }

  // The client stopped sending: half-closed (commit) or gone (commit nothing).
  void Complete() {
    if (cancelled_.load() || context_->IsCancelled()) {
      return Answer(absl::CancelledError("the client cancelled the upload; nothing was written"));
    }
    if (writer_ == nullptr) return Answer(absl::InvalidArgumentError("no header was sent"));
    const bool created = writer_->info().handle.empty();
    absl::StatusOr<TensorInfo> info = writer_->Finish();
    if (!info.ok()) return Answer(info.status());
    if (cancelled_.load() && created) {
      // Gone while committing: the new tensor's handle would reach nobody.
      (void)runtime_->DeleteTensor(info->handle);
      return Answer(absl::CancelledError("the client cancelled the upload; nothing was written"));
    }
    v1::TensorInfo reply;
    TensorInfoToProto(*info, &reply);
    SerializeMessage(reply, response_);
    Answer(absl::OkStatus());
  }

  // Ends the call with `status` (OK: the commit above succeeded). The writer is released
  // before the answer goes out, so a client's next call never finds the tensor still held by
  // this upload. A read may still be in flight: its OnReadDone sees `finished_` and does
  // nothing, and OnDone waits for it.
  void Answer(const absl::Status& status) {
    writer_.reset();
    {
      absl::MutexLock lock(&mu_);
      finished_ = true;
    }
    Finish(log_.Finish(status));
  }

  grpc::CallbackServerContext* const context_;
  CallLog log_;
  FairExecutor* const transfers_;
  grpc::ByteBuffer* const response_;
  grpc::ByteBuffer buffers_[2];
  absl::Mutex mu_;
  int reading_ ABSL_GUARDED_BY(mu_) = 0;       // the buffer gRPC reads into
  bool busy_ ABSL_GUARDED_BY(mu_) = false;     // an executor task of this upload is queued or runs
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;  // buffers_[reading_] holds a read message
  bool ended_ ABSL_GUARDED_BY(mu_) = false;    // the client stopped sending
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<TenantRuntime> runtime_;
  std::optional<TransferCanceller> canceller_;
  std::unique_ptr<TenantRuntime::Writer> writer_;
  uint64_t messages_ = 0;  // consumed so far, the header included (executor tasks, in turn)
  std::atomic<bool> cancelled_{false};
};

// Downloads: chunks of at most chunk_bytes, each a reply of a small encoded prefix
// (ReadReplyPrefix) and a slice of the chunk's bytes. Where the chunk comes from depends on
// where the tensor lies:
// - In host memory (the CPU backend), the slice is the tensor's own bytes, lent to gRPC, which
//   sends them from there: no copy on this side and no executor task; the next reply is made
//   as the last write completes (on gRPC's thread: it takes no lock but the tenant's). gRPC may
//   hold a slice past its write's completion, until the socket has taken its bytes, so the
//   tensor stays pinned (the Reader kept) until every lent slice is back, and only then does
//   the final OK go out, after the reactor let go of the tensor's memory: a client that
//   writes or deletes the tensor once its download ended never changes bytes still to be
//   sent, and a deleted tensor's memory is freed at once. A download that fails unpins at
//   once (its client trusts none of its bytes); the memory lives until the last slice is
//   back, and so does the reactor.
// - Elsewhere (a GPU), each chunk is read by the transfer executor straight into a slice of a
//   reply block. One write in flight while the executor fills the next reply, so the
//   connection never waits for a fill; the executor runs one fill of a download at a time, in
//   order. What the stream holds is charged to the tenant's memory quota as transfer staging:
//   two chunks, the one in flight and the one filled or being filled.
class ReadTensorReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  ReadTensorReactor(grpc::CallbackServerContext* context, const Authenticator* auth,
                    FairExecutor* transfers, const grpc::ByteBuffer& request,
                    int64_t max_message_bytes)
      : log_(context, "ReadTensor"), transfers_(transfers) {
    absl::Status status = Start(auth, context, request, max_message_bytes);
    if (!status.ok()) {
      Done(status);
      return;
    }
    if (lending_) {
      SendInPlace();
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      filling_ = true;
    }
    Post();
  }

  // The next reply goes out at once if it is ready, and the one after is filled meanwhile.
  void OnWriteDone(bool ok) override {
    if (lending_) return InPlaceWriteDone(ok);
    bool write = false, fill = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok && failure_.ok()) failure_ = absl::CancelledError("the client stopped reading");
      if (!failure_.ok() || (!filling_ && !ready_.has_value())) {
        if (filling_) return;  // the fill in progress ends the call
      } else if (ready_.has_value()) {
        reply_ = *std::move(ready_);
        ready_.reset();
        writing_ = write = true;
        fill = filling_ = !filled_all_;  // no fill runs while a reply is ready
      } else {
        return;  // the fill in progress starts the write
      }
    }
    if (!write) return Done();
    StartWrite(&reply_);
    if (fill) Post();
  }

  // Ends a download waiting for its lent slices; one whose last write is still to complete
  // ends there instead (reactions may run concurrently: the flag keeps the cancel for it).
  // Anything else in flight fails on its own (OnWriteDone(false)).
  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (!draining_) return;
      draining_ = false;
    }
    Done(absl::CancelledError("the download was cancelled"));
  }

  void OnDone() override {
    canceller_.reset();  // the context ends here; a slice still lent may keep this object
    runtime_.reset();
    Unref();
  }

 private:
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // In place: makes and sends the next reply (the caller owns reply_: no write is in flight).
  void SendInPlace() {
    absl::Status status = NextInPlace(&reply_);
    if (!status.ok()) return Done(status);
    StartWrite(&reply_);
  }

  void InPlaceWriteDone(bool ok) {
    reply_.Clear();  // gRPC holds what it still needs of the reply
    if (!ok) return Done(absl::CancelledError("the client stopped reading"));
    if (position_ < end_) return SendInPlace();
    bool cancelled = false;
    {
      absl::MutexLock lock(&mu_);
      cancelled = cancelled_;
      if (lent_ > 0 && !cancelled) {
        draining_ = true;  // the last slice back ends the call (Returned)
        return;
      }
    }
    Done(cancelled ? absl::CancelledError("the download was cancelled") : absl::OkStatus());
  }

  // The next reply, its chunk a slice of the tensor's bytes lent to gRPC (Returned).
  absl::Status NextInPlace(grpc::ByteBuffer* out) {
    RETURN_IF_ERROR(reader_->CheckOpen());
    const uint64_t n = std::min<uint64_t>(static_cast<uint64_t>(chunk_bytes_), end_ - position_);
    grpc::Slice data;
    if (n > 0) {
      {
        absl::MutexLock lock(&mu_);
        ++lent_;
      }
      refs_.fetch_add(1, std::memory_order_relaxed);
      data = grpc::Slice(const_cast<uint8_t*>(host_.get() + position_), n,
                         &ReadTensorReactor::Returned, this);
    }
    Compose(std::move(data), n, out);
    return absl::OkStatus();
  }

  // gRPC let go of a lent slice, on whatever thread dropped it (inside its transport, maybe):
  // the last one back ends a drained download, from the executor (the call's one task there,
  // so within the tenant's quota never refused; only a stopped executor leaves it to this
  // thread).
  static void Returned(void* self) {
    auto* reactor = static_cast<ReadTensorReactor*>(self);
    bool finish = false;
    std::shared_ptr<const uint8_t> host;  // after a failed download, the last slice's
    {
      absl::MutexLock lock(&reactor->mu_);
      finish = --reactor->lent_ == 0 && reactor->draining_;
      if (finish) reactor->draining_ = false;
      if (reactor->lent_ == 0 && reactor->ended_) host = std::move(reactor->host_);
    }
    if (finish) {
      reactor->refs_.fetch_add(1, std::memory_order_relaxed);
      auto end = [reactor] {
        reactor->Done(absl::OkStatus());
        reactor->Unref();
      };
      absl::Status queued = reactor->transfers_->Schedule(reactor->runtime_->tenant_id(),
                                                          TransferWeight(*reactor->runtime_), end);
      if (!queued.ok()) end();
    }
    reactor->Unref();
  }

  absl::Status Start(const Authenticator* auth, grpc::CallbackServerContext* context,
                     const grpc::ByteBuffer& bytes, int64_t max_message_bytes) {
    // As gRPC answers any other method's request that does not parse (docs/api.md).
    v1::ReadTensorRequest request;
    if (!ParseMessage(bytes, &request)) {
      return absl::UnimplementedError(
          "the request does not parse as a tessera.v1.ReadTensorRequest");
    }
    ASSIGN_OR_RETURN(runtime_, auth->AuthenticateTenant(*context));
    log_.set_tenant(runtime_->tenant_id());
    int64_t max_chunk = max_message_bytes / 2;
    chunk_bytes_ = request.chunk_bytes() == 0 ? std::min(kDefaultChunkBytes, max_chunk)
                                              : static_cast<int64_t>(request.chunk_bytes());
    if (chunk_bytes_ < kMinChunkBytes || chunk_bytes_ > max_chunk) {
      return absl::InvalidArgumentError(absl::StrCat("chunk_bytes is ", chunk_bytes_,
                                                     "; the range is ", kMinChunkBytes, "..",
                                                     max_chunk, " (--max_message_bytes / 2)"));
    }
    RETURN_IF_ERROR(CheckReference(request.handle(), "handle", "a tensor handle"));
    ASSIGN_OR_RETURN(reader_, runtime_->BeginRead(request.handle()));
    uint64_t size = reader_->info().size_bytes;
    if (request.offset() > size || request.length() > size - request.offset()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "offset ", request.offset(), " + length ", request.length(), " is outside the tensor's ",
          size, " bytes (offset 0..", size, ", offset + length <= ", size, ")"));
    }
    position_ = request.offset();
    end_ = request.length() == 0 ? size : request.offset() + request.length();
    // Never more than the range, and smaller chunks when the quota has little room left.
    chunk_bytes_ = std::min<int64_t>(chunk_bytes_, std::max<uint64_t>(end_ - position_, 1));
    canceller_.emplace(context, runtime_);
    host_ = reader_->HostBytes();
    lending_ = host_ != nullptr;
    if (lending_) return absl::OkStatus();  // sent from where it lies: no staging
    absl::StatusOr<MemoryCharge> charge = runtime_->ReserveStaging(2 * chunk_bytes_);
    while (!charge.ok() && chunk_bytes_ > kMinChunkBytes) {
      chunk_bytes_ = std::max(kMinChunkBytes, chunk_bytes_ / 4);
      charge = runtime_->ReserveStaging(2 * chunk_bytes_);
    }
    if (!charge.ok()) return charge.status();
    staging_ = *std::move(charge);
    blocks_ = std::make_shared<ReplyBlocks>(static_cast<size_t>(chunk_bytes_));
    return absl::OkStatus();
  }

  // Queues a fill (the caller has set filling_).
  void Post() {
    absl::Status queued =
        transfers_->Schedule(runtime_->tenant_id(), TransferWeight(*runtime_), [this] { Fill(); });
    if (!queued.ok()) Filled(queued, grpc::ByteBuffer());
  }

  // On the executor: fills the next reply.
  void Fill() {
    grpc::ByteBuffer reply;
    absl::Status status = NextReply(&reply);
    Filled(status, std::move(reply));
  }

  // Sends `reply` when no write is in flight, else keeps it for OnWriteDone; then fills the
  // one after while this one is written. At most two replies are held: one in flight and one
  // filled or being filled.
  void Filled(const absl::Status& status, grpc::ByteBuffer reply) {
    bool write = false, fill = false;
    {
      absl::MutexLock lock(&mu_);
      filling_ = false;
      if (!status.ok() && failure_.ok()) failure_ = status;
      if (!failure_.ok()) {
        if (writing_) return;  // OnWriteDone ends the call
      } else {
        filled_all_ = position_ >= end_;
        if (writing_) {
          ready_ = std::move(reply);
          return;
        }
        reply_ = std::move(reply);
        writing_ = write = true;
        fill = filling_ = !filled_all_;
      }
    }
    if (!write) return Done();
    StartWrite(&reply_);
    if (fill) Post();
  }

  // The next reply, its chunk read from the tensor into the slice it is sent in (the only
  // copy on this side).
  absl::Status NextReply(grpc::ByteBuffer* out) {
    const uint64_t n = std::min<uint64_t>(static_cast<uint64_t>(chunk_bytes_), end_ - position_);
    grpc::Slice data;
    if (n > 0) {
      uint8_t* into = nullptr;
      ASSIGN_OR_RETURN(data, blocks_->Take(n, &into));
      RETURN_IF_ERROR(reader_->Read(position_, n, into));
    }
    Compose(std::move(data), n, out);
    return absl::OkStatus();
  }

  // A reply of the next `n` bytes in `data` (the tensor's info first in the first reply).
  void Compose(grpc::Slice data, uint64_t n, grpc::ByteBuffer* out) {
    std::optional<v1::TensorInfo> info;
    if (first_) {
      TensorInfoToProto(reader_->info(), &info.emplace());
      first_ = false;
    }
    const grpc::Slice reply[] = {
        grpc::Slice(ReadReplyPrefix(info.has_value() ? &*info : nullptr, position_, n)),
        std::move(data)};
    *out = grpc::ByteBuffer(reply, n > 0 ? 2 : 1);
    position_ += n;
  }

  // Ends the call with failure_ (OK: every reply was sent) once nothing is in flight. The
  // reader and the staging charge are released before the final status goes out (see
  // WriteTensorReactor::Answer): a client's next GetUsage never sees this download.
  void Done() {
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      status = failure_;
    }
    Done(status);
  }
  void Done(const absl::Status& status) {
    reader_.reset();
    staging_.Release();
    std::shared_ptr<const uint8_t> host;  // the tensor's memory, let go of before the answer
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
      if (lent_ == 0) host = std::move(host_);  // else the last slice back lets go of it
    }
    host.reset();
    Finish(log_.Finish(status));
  }

  CallLog log_;
  FairExecutor* const transfers_;
  std::shared_ptr<TenantRuntime> runtime_;
  std::unique_ptr<TenantRuntime::Reader> reader_;
  std::optional<TransferCanceller> canceller_;
  MemoryCharge staging_;
  int64_t chunk_bytes_ = 0;
  std::shared_ptr<ReplyBlocks> blocks_;  // what replies' chunks are read into (copying)
  bool lending_ = false;  // the replies lend the tensor's bytes (host_), set by Start
  // The tensor's bytes in place, or null; held while a slice is lent or the call runs (the
  // flow of writes reads it unlocked; Done and Returned let go of it under mu_). Its memory is
  // the tensor's, charged to the quota until freed: a deleted tensor's bytes must not outlive
  // the call's answer.
  std::shared_ptr<const uint8_t> host_;
  std::atomic<int> refs_{1};         // gRPC's until OnDone, and one per lent slice
  uint64_t position_ = 0, end_ = 0;  // the next fill's; fills run one at a time, in order
  bool first_ = true;
  grpc::ByteBuffer reply_;  // the write in flight (gRPC reads it until OnWriteDone)
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;                   // a write is in flight
  bool filling_ ABSL_GUARDED_BY(mu_) = false;                   // a fill is queued or runs
  bool filled_all_ ABSL_GUARDED_BY(mu_) = false;                // the last reply has been filled
  std::optional<grpc::ByteBuffer> ready_ ABSL_GUARDED_BY(mu_);  // filled, to go next
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  int lent_ ABSL_GUARDED_BY(mu_) = 0;            // slices gRPC holds (lending)
  bool draining_ ABSL_GUARDED_BY(mu_) = false;   // every reply sent; ends when lent_ is 0
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;  // OnCancel ran (lending)
  bool ended_ ABSL_GUARDED_BY(mu_) = false;      // Done ran: the last slice back drops host_
};

}  // namespace

double TransferWeight(const TenantRuntime& runtime) {
  return static_cast<double>(std::max<uint32_t>(1, runtime.quota().compute_share_percent));
}

grpc::ServerReadReactor<grpc::ByteBuffer>* NewWriteTensorReactor(
    grpc::CallbackServerContext* context, const Authenticator* auth, FairExecutor* transfers,
    grpc::ByteBuffer* response) {
  return new WriteTensorReactor(context, auth, transfers, response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewReadTensorReactor(
    grpc::CallbackServerContext* context, const Authenticator* auth, FairExecutor* transfers,
    const grpc::ByteBuffer& request, int64_t max_message_bytes) {
  return new ReadTensorReactor(context, auth, transfers, request, max_message_bytes);
}

}  // namespace tessera
