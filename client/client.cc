#include "tessera/client.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/proto_buffer_reader.h"

#include "client/host_pages.h"
#include "client/read_sink.h"
#include "client/region_pool.h"
#include "wire/chunk_prefix.h"
#include "wire/slice_cursor.h"

namespace tessera {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": cannot read"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// A streaming call's own completion queue, driven one operation at a time: start an
// operation with a null tag, then Wait for it. Shut down and drained when it goes.
class CallQueue {
 public:
  /// `cancel`, when it has a watch with a finite period, has it called at least every period
  /// (1 ms at the least) while the call runs: on waits that time out, and after an operation
  /// that completes once the period has passed, so a call that never stalls is watched too.
  explicit CallQueue(const Canceller* cancel = nullptr)
      : watch_(cancel != nullptr && cancel->watch() && cancel->period() != absl::InfiniteDuration()
                   ? cancel
                   : nullptr),
        period_(watch_ == nullptr ? absl::ZeroDuration()
                                  : std::max(watch_->period(), absl::Milliseconds(1))),
        next_watch_(absl::Now() + period_) {}
  CallQueue(const CallQueue&) = delete;
  CallQueue& operator=(const CallQueue&) = delete;
  ~CallQueue() {
    queue_.Shutdown();
    void* tag = nullptr;
    for (bool ok = false; queue_.Next(&tag, &ok);) {
    }
  }
  grpc::CompletionQueue* get() { return &queue_; }
  /// Whether the operation started last succeeded.
  bool Wait() {
    void* tag = nullptr;
    bool ok = false;
    if (watch_ == nullptr) return queue_.Next(&tag, &ok) && ok;
    for (;;) {
      const grpc::CompletionQueue::NextStatus status =
          queue_.AsyncNext(&tag, &ok, absl::ToChronoTime(next_watch_));
      if (status == grpc::CompletionQueue::SHUTDOWN) return false;
      const absl::Time now = absl::Now();
      if (now >= next_watch_) {
        next_watch_ = now + period_;
        watch_->watch()();
      }
      if (status == grpc::CompletionQueue::GOT_EVENT) return ok;
    }
  }

 private:
  const Canceller* const watch_;  // null: no watch
  const absl::Duration period_;
  absl::Time next_watch_;
  grpc::CompletionQueue queue_;
};

// Slices that refer to a caller's bytes instead of copying them, counted: gRPC may hold a
// message's slices past the write's completion (until the transport has sent them), so the
// caller's bytes are its own again only once Returned().
class LentBytes {
 public:
  LentBytes() = default;
  LentBytes(const LentBytes&) = delete;
  LentBytes& operator=(const LentBytes&) = delete;
  ~LentBytes() { WaitReturned(); }

  grpc::Slice Lend(const char* data, size_t n) {
    {
      absl::MutexLock lock(&mu_);
      ++lent_;
    }
    // gRPC only reads through it: the slice type is mutable, the bytes are not written.
    return grpc::Slice(const_cast<char*>(data), n, &LentBytes::Return, this);
  }
  /// Blocks until gRPC has released every slice Lend made.
  void WaitReturned() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* lent) { return *lent == 0; }, &lent_));
  }

 private:
  static void Return(void* self) {
    auto* lent = static_cast<LentBytes*>(self);
    absl::MutexLock lock(&lent->mu_);
    --lent->lent_;
  }
  absl::Mutex mu_;
  int lent_ ABSL_GUARDED_BY(mu_) = 0;
};

// PATH of a "unix:PATH" or "unix://PATH" address (gRPC's forms); "" for any other.
std::string UnixSocketPath(absl::string_view address) {
  if (absl::ConsumePrefix(&address, "unix://") || absl::ConsumePrefix(&address, "unix:")) {
    return std::string(address);
  }
  return "";
}

// The server's limit on CreateTensorRequest.data (docs/api.md, "Bad requests"): larger
// data is refused here, before it is sent, with the same advice the server would give.
constexpr size_t kMaxCreateTensorDataBytes = size_t{16} << 20;

// The payload that carries the retry hint on an absl::Status (the server uses the same key).
constexpr char kRetryAfterMsPayload[] = "type.tessera.dev/retry-after-ms";

using wire::SliceCursor;

// One ReadTensorResponse: its `info` when it has one, and its chunk's `offset` and data, which
// `pieces` show where gRPC received them (in `slices`), so that Download copies each byte once.
// Not copied or moved once filled.
struct ReadReply {
  std::optional<v1::TensorInfo> info;
  uint64_t offset = 0;
  std::vector<absl::string_view> pieces;
  std::vector<grpc::Slice> slices;
  v1::ReadTensorResponse parsed;  // a message of another form, parsed by protobuf
};

// The server's form, `info` (first reply only) then `chunk { offset data }`, read by hand.
// False for anything else (fields in another order, unknown or repeated ones).
bool ReadServersForm(const grpc::ByteBuffer& message, ReadReply* reply) {
  if (!message.Dump(&reply->slices).ok()) return false;
  SliceCursor in(reply->slices, message.Length());
  uint8_t tag = 0;
  uint64_t length = 0;
  if (!in.ReadByte(&tag)) return false;
  if (tag == ((1 << 3) | 2)) {  // info
    std::vector<absl::string_view> pieces;
    if (!in.ReadVarint(&length) || length > in.left()) return false;
    in.Take(length, &pieces);
    std::string bytes;
    for (absl::string_view piece : pieces) bytes.append(piece.data(), piece.size());
    if (!reply->info.emplace().ParseFromString(bytes) || !in.ReadByte(&tag)) return false;
  }
  if (tag != ((2 << 3) | 2) || !in.ReadVarint(&length) || length != in.left()) return false;
  bool has_offset = false;
  while (in.ReadByte(&tag)) {
    if (tag == ((1 << 3) | 0) && !has_offset) {  // offset
      if (!in.ReadVarint(&reply->offset)) return false;
      has_offset = true;
    } else if (tag == ((2 << 3) | 2)) {  // data, last
      if (!in.ReadVarint(&length) || length != in.left()) return false;
      in.Take(length, &reply->pieces);
      return true;
    } else {
      return false;
    }
  }
  return true;  // no data
}

// Reads one reply; false when it is not a ReadTensorResponse at all.
bool ReadReplyFrom(const grpc::ByteBuffer& message, ReadReply* reply) {
  if (!message.Valid()) return true;  // no bytes: the empty message
  if (ReadServersForm(message, reply)) return true;
  *reply = ReadReply();
  grpc::ByteBuffer bytes(message);
  grpc::ProtoBufferReader reader(&bytes);
  if (!reader.status().ok() || !reply->parsed.ParseFromZeroCopyStream(&reader)) return false;
  if (reply->parsed.has_info()) reply->info = reply->parsed.info();
  reply->offset = reply->parsed.chunk().offset();
  reply->pieces.push_back(reply->parsed.chunk().data());
  return true;
}

// WriteTensor: the header as protobuf writes it, then each chunk as its encoded prefix and a
// slice that refers to the caller's bytes (lent through `lent`), which gRPC sends from where
// they lie: no copy here. One operation at a time on a queue of the call's own.
grpc::Status StreamWrite(const std::shared_ptr<grpc::Channel>& channel,
                         grpc::ClientContext* context, const v1::WriteHeader& header,
                         absl::string_view data, size_t chunk_bytes,
                         const Client::Progress& progress, const Canceller* cancel, LentBytes* lent,
                         v1::TensorInfo* response) {
  grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer> stub(channel);
  CallQueue queue(cancel);
  auto call = stub.PrepareCall(context, "/tessera.v1.Compute/WriteTensor", queue.get());
  call->StartCall(nullptr);
  bool ok = queue.Wait();
  if (ok) {
    v1::WriteTensorRequest first;
    *first.mutable_header() = header;
    grpc::Slice slice(first.SerializeAsString());
    call->Write(grpc::ByteBuffer(&slice, 1), nullptr);
    ok = queue.Wait();
  }
  for (size_t offset = 0; ok && offset < data.size(); offset += chunk_bytes) {
    const size_t n = std::min(chunk_bytes, data.size() - offset);
    std::string prefix;
    wire::AppendChunkPrefix(offset, n, &prefix);
    grpc::Slice slices[] = {grpc::Slice(prefix), lent->Lend(data.data() + offset, n)};
    call->Write(grpc::ByteBuffer(slices, 2), nullptr);
    ok = queue.Wait();
    if (ok && progress) progress(offset + n, data.size());
  }
  if (ok) {
    call->WritesDone(nullptr);
    ok = queue.Wait();
  }
  grpc::ByteBuffer reply;
  if (ok) {
    call->Read(&reply, nullptr);
    ok = queue.Wait();
  }
  grpc::Status status;
  call->Finish(&status, nullptr);
  queue.Wait();
  if (!status.ok()) return status;
  grpc::ProtoBufferReader reader(&reply);
  if (!ok || !reader.status().ok() || !response->ParseFromZeroCopyStream(&reader)) {
    return grpc::Status(grpc::StatusCode::DATA_LOSS,
                        "WriteTensor returned a reply that is not a TensorInfo");
  }
  return grpc::Status::OK;
}

// ReadTensor into `sink`. Replies are read as gRPC received them (ByteBuffer) and their data
// appended from there: one copy, where a generated reader would parse each into a string first.
// One operation at a time on a queue of the call's own, each waited for.
grpc::Status StreamRead(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context,
                        const v1::ReadTensorRequest& request, const Client::Progress& progress,
                        const Canceller* cancel, client_internal::ReadSink* sink) {
  grpc::TemplatedGenericStub<v1::ReadTensorRequest, grpc::ByteBuffer> stub(channel);
  CallQueue queue(cancel);
  auto done = [&queue] { return queue.Wait(); };
  auto call = stub.PrepareCall(context, "/tessera.v1.Compute/ReadTensor", queue.get());
  call->StartCall(nullptr);
  bool open = done();
  if (open) {
    call->WriteLast(request, grpc::WriteOptions(), nullptr);
    open = done();
  }
  bool started = false;
  uint64_t total = 0;
  uint64_t received = 0;
  grpc::Status broken;
  auto data_loss = [](absl::string_view what) {
    return grpc::Status(grpc::StatusCode::DATA_LOSS, absl::StrCat("ReadTensor returned ", what));
  };
  for (grpc::ByteBuffer message; open;) {
    call->Read(&message, nullptr);
    if (!done()) break;
    ReadReply reply;
    if (!ReadReplyFrom(message, &reply)) {
      broken = data_loss("a message that is not a ReadTensorResponse");
    } else if (reply.offset != request.offset() + received) {
      broken = data_loss("chunks out of order");
    } else if (reply.info.has_value() && !started) {
      started = true;
      total =
          request.length() != 0 ? request.length() : reply.info->size_bytes() - request.offset();
      const absl::Status start = sink->Start(*reply.info, total);
      if (!start.ok()) {
        broken =
            grpc::Status(static_cast<grpc::StatusCode>(start.code()), std::string(start.message()));
      }
    } else if (!started) {
      broken = data_loss("data before the tensor's TensorInfo");
    }
    uint64_t size = 0;
    for (absl::string_view piece : reply.pieces) size += piece.size();
    if (broken.ok() && size > total - received) broken = data_loss("more bytes than it announced");
    if (!broken.ok()) {
      context->TryCancel();
      break;
    }
    for (absl::string_view piece : reply.pieces) sink->Append(piece);
    received += size;
    if (progress) progress(received, total);
  }
  grpc::Status status;
  call->Finish(&status, nullptr);
  done();
  if (!broken.ok()) return broken;
  if (status.ok() && !started) return data_loss("no messages");
  if (status.ok() && received != total) {
    return data_loss(absl::StrCat(received, " of the ", total, " bytes it announced"));
  }
  return status;
}

// Download's result: a string reserved for the whole (huge pages) and appended to.
class StringSink : public client_internal::ReadSink {
 public:
  absl::Status Start(const v1::TensorInfo&, uint64_t bytes) override {
    bytes_.clear();  // (a second attempt starts over)
    client_internal::ReserveForFill(&bytes_, bytes);
    return absl::OkStatus();
  }
  void Append(absl::string_view piece) override { bytes_.append(piece.data(), piece.size()); }
  std::string Take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

// DownloadTo's: the caller's memory, asked for once the size is known.
class DestinationSink : public client_internal::ReadSink {
 public:
  explicit DestinationSink(Client::Destination destination) : destination_(destination) {}
  absl::Status Start(const v1::TensorInfo& info, uint64_t bytes) override {
    info_ = info;
    absl::StatusOr<char*> out = destination_(info, bytes);
    if (!out.ok()) return out.status();
    if (*out == nullptr && bytes != 0) {
      return absl::InvalidArgumentError("DownloadTo's destination returned no memory");
    }
    out_ = *out;
    written_ = 0;  // (a second attempt starts over)
    return absl::OkStatus();
  }
  void Append(absl::string_view piece) override {
    if (piece.empty()) return;
    std::memcpy(out_ + written_, piece.data(), piece.size());
    written_ += piece.size();
  }
  v1::TensorInfo& info() { return info_; }

 private:
  Client::Destination destination_;
  v1::TensorInfo info_;
  char* out_ = nullptr;
  uint64_t written_ = 0;
};

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::Status FromGrpcStatus(const grpc::Status& status, const grpc::ClientContext& context) {
  absl::Status result = FromGrpcStatus(status);
  if (result.ok()) return result;
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find("grpc-retry-pushback-ms");
  int64_t ms = 0;
  if (it != trailers.end() &&
      absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &ms) && ms >= 0) {
    result.SetPayload(kRetryAfterMsPayload, absl::Cord(absl::StrCat(ms)));
  }
  return result;
}

std::optional<absl::Duration> JobRunTime(const v1::Job& job) {
  if (!job.has_start_time() || !job.has_end_time()) return std::nullopt;
  return absl::Seconds(job.end_time().seconds() - job.start_time().seconds()) +
         absl::Nanoseconds(job.end_time().nanos() - job.start_time().nanos());
}

std::optional<absl::Duration> RetryAfter(const absl::Status& status) {
  const auto payload = status.GetPayload(kRetryAfterMsPayload);
  int64_t ms = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &ms)) return std::nullopt;
  return absl::Milliseconds(ms);
}

struct Client::Connection {
  std::string address;
  std::string unix_socket_path;  // of `address`
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::TenantAdmin::Stub> admin;
  std::unique_ptr<v1::Compute::Stub> compute;
};

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  if (options.address.empty()) return absl::InvalidArgumentError("address is empty");
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("tls_cert_file and tls_key_file must be given together");
  }
  if (options.tls_cert_pem.empty() != options.tls_key_pem.empty()) {
    return absl::InvalidArgumentError("tls_cert_pem and tls_key_pem must be given together");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options.tls || !options.tls_ca_file.empty() || !options.tls_cert_file.empty() ||
      !options.tls_ca_pem.empty() || !options.tls_cert_pem.empty()) {
    options.tls = true;
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_ca_pem;
    ssl.pem_cert_chain = options.tls_cert_pem;
    ssl.pem_private_key = options.tls_key_pem;
    if (!options.tls_ca_file.empty()) {
      absl::StatusOr<std::string> ca = ReadFile(options.tls_ca_file, "tls_ca_file");
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *std::move(ca);
    }
    if (!options.tls_cert_file.empty()) {
      absl::StatusOr<std::string> cert = ReadFile(options.tls_cert_file, "tls_cert_file");
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadFile(options.tls_key_file, "tls_key_file");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  const std::string seed = options.address;
  auto client = std::unique_ptr<Client>(new Client(options, seed, credentials));
  if (!client->follows_) return client;
  // One question: is the tenant at home here? (Compute.Locate; docs/fleet.md, "Reaching a
  // tenant's home"). Not counted against the tenant's request quotas. Any answer but another
  // node leaves the client as it is.
  std::optional<std::string> home = client->AskHome();
  if (!home.has_value() || *home == seed) return client;
  // One hop: the home answers for itself. Still a client that follows redirects, whose calls
  // say so (NewContext).
  options.address = *std::move(home);
  return std::unique_ptr<Client>(new Client(std::move(options), seed, std::move(credentials)));
}

Client::Client(ClientOptions options, std::string seed_address,
               std::shared_ptr<grpc::ChannelCredentials> credentials)
    : options_(std::move(options)),
      credentials_(std::move(credentials)),
      follows_(options_.follow_home && absl::StartsWith(options_.token, "tsk_")),
      seed_(Open(seed_address, credentials_)),
      unix_socket_path_(UnixSocketPath(options_.address)),
      connection_(options_.address == seed_address ? seed_ : Open(options_.address, credentials_)),
      regions_(std::make_unique<RegionPool>()) {}

Client::~Client() {
  // Unregistered while the stubs still exist.
  regions_->TakeAll().clear();
}

std::shared_ptr<const Client::Connection> Client::Open(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // the server enforces its own limit
  auto connection = std::make_shared<Connection>();
  connection->address = address;
  connection->unix_socket_path = UnixSocketPath(address);
  connection->channel = grpc::CreateCustomChannel(address, credentials, args);
  connection->admin = v1::TenantAdmin::NewStub(connection->channel);
  connection->compute = v1::Compute::NewStub(connection->channel);
  return connection;
}

std::shared_ptr<const Client::Connection> Client::Current() const {
  absl::MutexLock lock(&mu_);
  return connection_;
}

std::shared_ptr<grpc::Channel> Client::channel() const { return Current()->channel; }

std::string Client::address() const { return Current()->address; }

std::string Client::unix_socket_path() const { return Current()->unix_socket_path; }

std::unique_ptr<grpc::ClientContext> Client::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  if (options_.timeout != absl::InfiniteDuration()) {
    context->set_deadline(std::chrono::system_clock::now() +
                          absl::ToChronoMilliseconds(options_.timeout));
  }
  if (!options_.token.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", options_.token));
  }
  // A node that is not the tenant's home answers the redirect rather than forwarding the
  // call (docs/api.md, "Forwarding and redirects"): this client follows it (Run).
  if (follows_) context->AddMetadata("tessera-follow-home", "1");
  return context;
}

// ---- Following the tenant's home (docs/api.md, "After a move") --------------------------------

void Canceller::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (grpc::ClientContext* context : contexts_) context->TryCancel();
}

bool Canceller::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool Canceller::Attach(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  contexts_.push_back(context);
  return true;
}

void Canceller::Detach(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  contexts_.erase(std::find(contexts_.begin(), contexts_.end(), context));
}

absl::Status Client::Run(Attempt attempt, Canceller* cancel) {
  std::shared_ptr<const Connection> connection = Current();
  for (int tries = 0;; ++tries) {
    std::unique_ptr<grpc::ClientContext> context = NewContext();
    if (cancel != nullptr && !cancel->Attach(context.get())) {
      return absl::CancelledError("cancelled before it started");
    }
    const grpc::Status status = attempt(*connection, context.get());
    if (cancel != nullptr) cancel->Detach(context.get());
    if (status.ok()) return absl::OkStatus();
    // One switch per call at most: a second answer is the caller's.
    std::shared_ptr<const Connection> again =
        tries == 0 ? FollowAfter(connection, status, *context) : nullptr;
    if (again == nullptr) return FromGrpcStatus(status, *context);
    connection = std::move(again);
  }
}

template <typename Response, typename Call>
absl::StatusOr<Response> Client::Unary(Call call) {
  Response response;
  absl::Status status = Run([&](const Connection& connection, grpc::ClientContext* context) {
    response.Clear();
    return call(connection, context, &response);
  });
  if (!status.ok()) return status;
  return response;
}

std::shared_ptr<const Client::Connection> Client::FollowAfter(
    const std::shared_ptr<const Connection>& used, const grpc::Status& status,
    const grpc::ClientContext& context) {
  if (!follows_) return nullptr;
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    // The redirect: refused before it ran, so running it again is safe.
    const auto& trailers = context.GetServerTrailingMetadata();
    auto it = trailers.find("tessera-home-address");
    if (it == trailers.end() || it->second.empty()) return nullptr;
    const std::string home(it->second.data(), it->second.size());
    if (home == used->address) return nullptr;
    return SwitchTo(used, home);
  }
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE && Current() == used) {
    // The home may be gone (its tenants move to other nodes): the seed knows where to.
    std::optional<std::string> home = AskHome();
    if (home.has_value() && *home != used->address) SwitchTo(used, *home);
  }
  return nullptr;
}

std::optional<std::string> Client::AskHome() const {
  std::unique_ptr<grpc::ClientContext> context = NewContext();
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(std::min(options_.timeout, absl::Seconds(5))));
  v1::Location location;
  if (!seed_->compute->Locate(context.get(), v1::LocateRequest(), &location).ok()) {
    return std::nullopt;
  }
  if (location.here()) return seed_->address;
  if (location.address().empty()) return std::nullopt;
  return location.address();
}

std::shared_ptr<const Client::Connection> Client::SwitchTo(
    const std::shared_ptr<const Connection>& used, const std::string& address) {
  std::shared_ptr<const Connection> next =
      address == seed_->address ? seed_ : Open(address, credentials_);
  {
    absl::MutexLock lock(&mu_);
    if (connection_ != used) return connection_;  // another call switched first
    connection_ = next;
  }
  // Regions live on the node the client first reached: from now on transfers stream.
  regions_->MarkUnavailable();
  return next;
}

absl::StatusOr<v1::RegisterTenantResponse> Client::RegisterTenant(
    const v1::RegisterTenantRequest& request) {
  return Unary<v1::RegisterTenantResponse>([&](const Connection& c, auto* context, auto* response) {
    return c.admin->RegisterTenant(context, request, response);
  });
}

absl::StatusOr<v1::Tenant> Client::GetTenant(absl::string_view tenant_id) {
  v1::GetTenantRequest request;
  request.set_tenant_id(std::string(tenant_id));
  return Unary<v1::Tenant>([&](const Connection& c, auto* context, auto* response) {
    return c.admin->GetTenant(context, request, response);
  });
}

absl::StatusOr<v1::ListTenantsResponse> Client::ListTenants(int32_t page_size,
                                                            absl::string_view page_token) {
  v1::ListTenantsRequest request;
  request.set_page_size(page_size);
  request.set_page_token(std::string(page_token));
  return Unary<v1::ListTenantsResponse>([&](const Connection& c, auto* context, auto* response) {
    return c.admin->ListTenants(context, request, response);
  });
}

absl::StatusOr<std::vector<v1::Tenant>> Client::ListAllTenants() {
  std::vector<v1::Tenant> tenants;
  std::string token;
  do {
    absl::StatusOr<v1::ListTenantsResponse> page = ListTenants(0, token);
    if (!page.ok()) return page.status();
    for (v1::Tenant& tenant : *page->mutable_tenants()) tenants.push_back(std::move(tenant));
    token = page->next_page_token();
  } while (!token.empty());
  return tenants;
}

absl::StatusOr<v1::Tenant> Client::UpdateTenant(const v1::Tenant& tenant,
                                                const std::vector<std::string>& paths) {
  v1::UpdateTenantRequest request;
  *request.mutable_tenant() = tenant;
  for (const std::string& path : paths) request.mutable_update_mask()->add_paths(path);
  return Unary<v1::Tenant>([&](const Connection& c, auto* context, auto* response) {
    return c.admin->UpdateTenant(context, request, response);
  });
}

absl::StatusOr<v1::DeregisterTenantResponse> Client::DeregisterTenant(absl::string_view tenant_id) {
  v1::DeregisterTenantRequest request;
  request.set_tenant_id(std::string(tenant_id));
  return Unary<v1::DeregisterTenantResponse>(
      [&](const Connection& c, auto* context, auto* response) {
        return c.admin->DeregisterTenant(context, request, response);
      });
}

absl::StatusOr<v1::RotateTenantKeyResponse> Client::RotateTenantKey(absl::string_view tenant_id) {
  v1::RotateTenantKeyRequest request;
  request.set_tenant_id(std::string(tenant_id));
  return Unary<v1::RotateTenantKeyResponse>(
      [&](const Connection& c, auto* context, auto* response) {
        return c.admin->RotateTenantKey(context, request, response);
      });
}

absl::StatusOr<v1::ListNodesResponse> Client::ListNodes() {
  v1::ListNodesRequest request;
  return Unary<v1::ListNodesResponse>([&](const Connection& c, auto* context, auto* response) {
    return c.admin->ListNodes(context, request, response);
  });
}

absl::Status Client::DrainNode(const std::string& name, bool undo, bool move_tenants) {
  v1::DrainNodeRequest request;
  request.set_name(name);
  request.set_undo(undo);
  request.set_move_tenants(move_tenants);
  return Unary<v1::DrainNodeResponse>([&](const Connection& c, auto* context, auto* response) {
           return c.admin->DrainNode(context, request, response);
         })
      .status();
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo() {
  v1::GetServerInfoRequest request;
  return Unary<v1::ServerInfo>([&](const Connection& c, auto* context, auto* response) {
    return c.admin->GetServerInfo(context, request, response);
  });
}

absl::StatusOr<v1::MpsStatus> Client::GetMpsStatus() {
  v1::GetMpsStatusRequest request;
  return Unary<v1::MpsStatus>([&](const Connection& c, auto* context, auto* response) {
    return c.admin->GetMpsStatus(context, request, response);
  });
}

absl::StatusOr<v1::TerminateTenantWorkResponse> Client::TerminateTenantWork(
    absl::string_view tenant_id) {
  v1::TerminateTenantWorkRequest request;
  request.set_tenant_id(std::string(tenant_id));
  return Unary<v1::TerminateTenantWorkResponse>(
      [&](const Connection& c, auto* context, auto* response) {
        return c.admin->TerminateTenantWork(context, request, response);
      });
}

absl::StatusOr<v1::TensorInfo> Client::CreateTensor(const v1::TensorSpec& spec,
                                                    absl::string_view data) {
  if (data.size() > kMaxCreateTensorDataBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data is ", data.size(), " bytes; CreateTensor takes at most ", kMaxCreateTensorDataBytes,
        " bytes (16 MiB) inline: use Client::Upload, which streams it with WriteTensor"));
  }
  v1::CreateTensorRequest request;
  *request.mutable_spec() = spec;
  request.set_data(std::string(data));
  return Unary<v1::TensorInfo>([&](const Connection& c, auto* context, auto* response) {
    return c.compute->CreateTensor(context, request, response);
  });
}

absl::StatusOr<v1::TensorInfo> Client::Write(const v1::WriteHeader& header, absl::string_view data,
                                             size_t chunk_bytes, const Progress& progress,
                                             Canceller* cancel) {
  if (chunk_bytes == 0) return absl::InvalidArgumentError("chunk_bytes must be > 0");
  if (std::optional<absl::StatusOr<v1::TensorInfo>> written = WriteThroughRegion(header, data)) {
    if (written->ok() && progress) progress(data.size(), data.size());
    return *std::move(written);
  }
  // Each chunk goes from the caller's bytes where they lie (StreamWrite); `lent` goes last: this
  // returns only once gRPC has let go of every slice that refers to them. After the redirect
  // the stream is sent again, whole, to the tenant's home.
  LentBytes lent;
  v1::TensorInfo response;
  absl::Status status = Run(
      [&](const Connection& connection, grpc::ClientContext* context) {
        return StreamWrite(connection.channel, context, header, data, chunk_bytes, progress, cancel,
                           &lent, &response);
      },
      cancel);
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::TensorInfo> Client::Upload(const v1::TensorSpec& spec, absl::string_view data,
                                              size_t chunk_bytes, const Progress& progress,
                                              Canceller* cancel) {
  v1::WriteHeader header;
  *header.mutable_create() = spec;
  return Write(header, data, chunk_bytes, progress, cancel);
}

absl::StatusOr<v1::TensorInfo> Client::Overwrite(absl::string_view handle, absl::string_view data,
                                                 size_t chunk_bytes, const Progress& progress,
                                                 Canceller* cancel) {
  v1::WriteHeader header;
  header.set_handle(std::string(handle));
  return Write(header, data, chunk_bytes, progress, cancel);
}

absl::Status Client::Read(absl::string_view handle, uint64_t offset, uint64_t length,
                          uint32_t chunk_bytes, const Progress& progress, Canceller* cancel,
                          client_internal::ReadSink* sink) {
  // Through a region: `sink` filled at once, progress called once.
  if (std::optional<absl::StatusOr<uint64_t>> read =
          ReadThroughRegion(handle, offset, length, sink)) {
    if (read->ok() && progress) progress(**read, **read);
    return read->status();
  }
  v1::ReadTensorRequest request;
  request.set_handle(std::string(handle));
  request.set_offset(offset);
  request.set_length(length);
  request.set_chunk_bytes(chunk_bytes);
  return Run(
      [&](const Connection& connection, grpc::ClientContext* context) {
        return StreamRead(connection.channel, context, request, progress, cancel, sink);
      },
      cancel);
}

absl::StatusOr<std::string> Client::Download(absl::string_view handle, uint64_t offset,
                                             uint64_t length, uint32_t chunk_bytes,
                                             const Progress& progress, Canceller* cancel) {
  StringSink sink;
  absl::Status status = Read(handle, offset, length, chunk_bytes, progress, cancel, &sink);
  if (!status.ok()) return status;
  return sink.Take();
}

absl::StatusOr<v1::TensorInfo> Client::DownloadTo(absl::string_view handle, Destination destination,
                                                  uint64_t offset, uint64_t length,
                                                  uint32_t chunk_bytes, const Progress& progress,
                                                  Canceller* cancel) {
  DestinationSink sink(destination);
  absl::Status status = Read(handle, offset, length, chunk_bytes, progress, cancel, &sink);
  if (!status.ok()) return status;
  return std::move(sink.info());
}

absl::StatusOr<v1::TensorInfo> Client::GetTensor(absl::string_view handle) {
  v1::GetTensorRequest request;
  request.set_handle(std::string(handle));
  return Unary<v1::TensorInfo>([&](const Connection& c, auto* context, auto* response) {
    return c.compute->GetTensor(context, request, response);
  });
}

absl::StatusOr<std::vector<v1::TensorInfo>> Client::ListAllTensors() {
  std::vector<v1::TensorInfo> tensors;
  v1::ListTensorsRequest request;
  do {
    auto page =
        Unary<v1::ListTensorsResponse>([&](const Connection& c, auto* context, auto* response) {
          return c.compute->ListTensors(context, request, response);
        });
    if (!page.ok()) return page.status();
    for (v1::TensorInfo& t : *page->mutable_tensors()) tensors.push_back(std::move(t));
    request.set_page_token(page->next_page_token());
  } while (!request.page_token().empty());
  return tensors;
}

absl::StatusOr<uint64_t> Client::DeleteTensor(absl::string_view handle) {
  v1::DeleteTensorRequest request;
  request.set_handle(std::string(handle));
  auto response = Unary<v1::DeleteTensorResponse>([&](const Connection& c, auto* context, auto* r) {
    return c.compute->DeleteTensor(context, request, r);
  });
  if (!response.ok()) return response.status();
  return response->released_bytes();
}

absl::StatusOr<v1::Job> Client::Launch(const v1::LaunchRequest& request) {
  return Unary<v1::Job>([&](const Connection& c, auto* context, auto* response) {
    return c.compute->Launch(context, request, response);
  });
}

absl::StatusOr<v1::Job> Client::Submit(const v1::SubmitRequest& request) {
  return Unary<v1::Job>([&](const Connection& c, auto* context, auto* response) {
    return c.compute->Submit(context, request, response);
  });
}

absl::StatusOr<v1::Job> Client::WaitJob(absl::string_view job_id, absl::Duration timeout) {
  v1::WaitJobRequest request;
  request.set_job_id(std::string(job_id));
  if (timeout != absl::InfiniteDuration()) {
    int64_t ns = absl::ToInt64Nanoseconds(timeout);
    request.mutable_timeout()->set_seconds(ns / 1000000000);
    request.mutable_timeout()->set_nanos(static_cast<int32_t>(ns % 1000000000));
  }
  return Unary<v1::Job>([&](const Connection& c, auto* context, auto* response) {
    return c.compute->WaitJob(context, request, response);
  });
}

absl::StatusOr<v1::Job> Client::CancelJob(absl::string_view job_id) {
  v1::CancelJobRequest request;
  request.set_job_id(std::string(job_id));
  return Unary<v1::Job>([&](const Connection& c, auto* context, auto* response) {
    return c.compute->CancelJob(context, request, response);
  });
}

absl::StatusOr<uint64_t> Client::Synchronize(int64_t stream) {
  v1::SynchronizeRequest request;
  if (stream >= 0) request.set_stream(static_cast<uint32_t>(stream));
  auto response = Unary<v1::SynchronizeResponse>([&](const Connection& c, auto* context, auto* r) {
    return c.compute->Synchronize(context, request, r);
  });
  if (!response.ok()) return response.status();
  return response->jobs_completed();
}

absl::StatusOr<v1::ListKernelsResponse> Client::ListKernels() {
  v1::ListKernelsRequest request;
  return Unary<v1::ListKernelsResponse>([&](const Connection& c, auto* context, auto* response) {
    return c.compute->ListKernels(context, request, response);
  });
}

absl::StatusOr<v1::KernelInfo> Client::DefineKernel(absl::string_view source) {
  v1::DefineKernelRequest request;
  request.set_source(std::string(source));
  return Unary<v1::KernelInfo>([&](const Connection& c, auto* context, auto* response) {
    return c.compute->DefineKernel(context, request, response);
  });
}

absl::StatusOr<v1::KernelInfo> Client::DefineKernel(const v1::KernelDefinition& definition) {
  v1::DefineKernelRequest request;
  *request.mutable_definition() = definition;
  return Unary<v1::KernelInfo>([&](const Connection& c, auto* context, auto* response) {
    return c.compute->DefineKernel(context, request, response);
  });
}

absl::Status Client::DeleteKernel(absl::string_view name) {
  v1::DeleteKernelRequest request;
  request.set_name(std::string(name));
  return Unary<v1::DeleteKernelResponse>([&](const Connection& c, auto* context, auto* response) {
           return c.compute->DeleteKernel(context, request, response);
         })
      .status();
}

absl::StatusOr<v1::Usage> Client::GetUsage() {
  v1::GetUsageRequest request;
  return Unary<v1::Usage>([&](const Connection& c, auto* context, auto* response) {
    return c.compute->GetUsage(context, request, response);
  });
}

// ---- Shared-memory regions (SharedRegion and the transfers through them: region.cc) ----------

absl::StatusOr<v1::RegionTicket> Client::BeginRegion(uint64_t size_bytes) {
  v1::BeginRegionRequest request;
  request.set_size_bytes(size_bytes);
  return Unary<v1::RegionTicket>([&](const Connection& c, auto* context, auto* response) {
    return c.compute->BeginRegion(context, request, response);
  });
}

absl::StatusOr<v1::Region> Client::FinishRegion(absl::string_view ticket) {
  v1::FinishRegionRequest request;
  request.set_ticket(std::string(ticket));
  return Unary<v1::Region>([&](const Connection& c, auto* context, auto* response) {
    return c.compute->FinishRegion(context, request, response);
  });
}

absl::StatusOr<v1::ListRegionsResponse> Client::ListRegions() {
  v1::ListRegionsRequest request;
  return Unary<v1::ListRegionsResponse>([&](const Connection& c, auto* context, auto* response) {
    return c.compute->ListRegions(context, request, response);
  });
}

absl::StatusOr<uint64_t> Client::UnregisterRegion(absl::string_view handle) {
  v1::UnregisterRegionRequest request;
  request.set_handle(std::string(handle));
  auto response =
      Unary<v1::UnregisterRegionResponse>([&](const Connection& c, auto* context, auto* r) {
        return c.compute->UnregisterRegion(context, request, r);
      });
  if (!response.ok()) return response.status();
  return response->released_bytes();
}

absl::StatusOr<v1::TensorInfo> Client::WriteTensorFromRegion(
    const v1::WriteTensorFromRegionRequest& request) {
  return Unary<v1::TensorInfo>([&](const Connection& c, auto* context, auto* response) {
    return c.compute->WriteTensorFromRegion(context, request, response);
  });
}

absl::StatusOr<v1::ReadTensorIntoRegionResponse> Client::ReadTensorIntoRegion(
    const v1::ReadTensorIntoRegionRequest& request) {
  return Unary<v1::ReadTensorIntoRegionResponse>(
      [&](const Connection& c, auto* context, auto* response) {
        return c.compute->ReadTensorIntoRegion(context, request, response);
      });
}

}  // namespace tessera
