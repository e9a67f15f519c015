// Shared-memory regions on the client side (docs/api.md, "Clients on the same node"):
// SharedRegion's registration, the regions a Client keeps for its own transfers, and the
// region paths of Upload, Overwrite and Download.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

#include "client/read_sink.h"
#include "client/region_pool.h"
#include "tessera/client.h"

namespace tessera {
namespace {

// Regions are registered in whole MiB (the server's smallest region quota is 1 MiB).
constexpr uint64_t kRegionGranule = uint64_t{1} << 20;

uint64_t RegionSizeFor(uint64_t bytes) {
  return std::max<uint64_t>(1, (bytes + kRegionGranule - 1) / kRegionGranule) * kRegionGranule;
}

absl::Status SystemError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// The descriptor socket's answer ("OK", or "ERR CODE message") as a status.
absl::Status ParseReply(absl::string_view line) {
  if (line == "OK") return absl::OkStatus();
  if (absl::ConsumePrefix(&line, "ERR ")) {
    const size_t space = line.find(' ');
    const absl::string_view name = line.substr(0, space);
    const absl::string_view message =
        space == absl::string_view::npos ? absl::string_view() : line.substr(space + 1);
    for (int code = 1; code <= static_cast<int>(absl::StatusCode::kUnauthenticated); ++code) {
      if (absl::StatusCodeToString(static_cast<absl::StatusCode>(code)) == name) {
        return absl::Status(static_cast<absl::StatusCode>(code), message);
      }
    }
  }
  return absl::InternalError(
      absl::StrCat("the descriptor socket answered \"", line.substr(0, 200), "\""));
}

// Step 3 of docs/api.md's registration: `ticket` and a newline with `fd` (SCM_RIGHTS) on the
// descriptor socket at `path`, and its one-line answer. FAILED_PRECONDITION, with `*connected`
// false, when nothing listens there.
absl::Status SendDescriptor(const std::string& path, absl::string_view ticket, int fd,
                            absl::Duration timeout, bool* connected) {
  *connected = false;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the descriptor socket's path ", path, " is too long for a Unix socket"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return SystemError("socket");
  absl::Cleanup close_socket = [s] { close(s); };
  const int64_t us =
      std::clamp<int64_t>(absl::ToInt64Microseconds(timeout), 1, int64_t{3600} * 1000000);
  const timeval wait{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
  setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof(wait));
  if (connect(s, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot connect to the descriptor socket ", path, ": ", std::strerror(errno)));
  }
  *connected = true;
  std::string line = absl::StrCat(ticket, "\n");
  iovec iov{line.data(), line.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  cmsghdr* rights = CMSG_FIRSTHDR(&message);
  rights->cmsg_level = SOL_SOCKET;
  rights->cmsg_type = SCM_RIGHTS;
  rights->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(rights), &fd, sizeof(int));
  ssize_t sent;
  do {
    sent = sendmsg(s, &message, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  // The descriptor went with the first byte; the rest of the line, if the kernel took a part.
  for (size_t done = sent < 0 ? 0 : static_cast<size_t>(sent); sent >= 0 && done < line.size();) {
    sent = send(s, line.data() + done, line.size() - done, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) sent = 0;
    if (sent > 0) done += static_cast<size_t>(sent);
  }
  if (sent < 0) return SystemError(absl::StrCat("sending the descriptor to ", path));
  std::string reply;
  while (reply.find('\n') == std::string::npos && reply.size() < 4096) {
    char buffer[512];
    const ssize_t n = read(s, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    reply.append(buffer, static_cast<size_t>(n));
  }
  const size_t newline = reply.find('\n');
  if (newline == std::string::npos) {
    return absl::UnavailableError(
        absl::StrCat("the descriptor socket ", path, " closed without answering"));
  }
  return ParseReply(absl::string_view(reply).substr(0, newline));
}

// A refusal after which a transfer streams instead: regions are not to be had here at all
// (an older server, no descriptor socket), or not for this size (quota, limits), or this
// process could not make the memory.
bool StreamInstead(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) || absl::IsUnimplemented(status) ||
         absl::IsResourceExhausted(status) || absl::IsInvalidArgument(status) ||
         absl::IsInternal(status);
}

// The server no longer knows `region` (it restarted): NOT_FOUND naming it.
bool Forgotten(const absl::Status& status, const SharedRegion& region) {
  return absl::IsNotFound(status) && absl::StrContains(status.message(), region.handle());
}

// `region` is too small for the bytes asked for: INVALID_ARGUMENT naming it.
bool TooSmall(const absl::Status& status, const SharedRegion& region) {
  return absl::IsInvalidArgument(status) && absl::StrContains(status.message(), region.handle());
}

}  // namespace

// ---- SharedRegion ------------------------------------------------------------------------------

SharedRegion::SharedRegion(Client* client, char* data, uint64_t size)
    : client_(client), data_(data), size_(size) {}

SharedRegion::~SharedRegion() {
  if (!handle_.empty()) (void)client_->UnregisterRegion(handle_);
  munmap(data_, size_);
}

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Register(Client& client,
                                                                     uint64_t size_bytes) {
  const std::string& socket_path = client.unix_socket_path();
  if (socket_path.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("regions need the server's Unix socket (address unix:PATH); this client's "
                     "address is ",
                     client.options_.address));
  }
  // The ticket first: the server checks the size and the quota before any memory is made.
  absl::StatusOr<v1::RegionTicket> ticket = client.BeginRegion(size_bytes);
  if (!ticket.ok()) return ticket.status();
  const int fd = memfd_create("tessera-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return SystemError("memfd_create");
  absl::Cleanup close_fd = [fd] { close(fd); };  // the mapping outlives it
  if (ftruncate(fd, static_cast<off_t>(size_bytes)) != 0) return SystemError("ftruncate");
  // Never F_SEAL_WRITE: the server writes downloads into it.
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) return SystemError("F_ADD_SEALS");
  void* data =
      mmap(nullptr, static_cast<size_t>(size_bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return SystemError("mmap");
  std::unique_ptr<SharedRegion> region(
      new SharedRegion(&client, static_cast<char*>(data), size_bytes));
  // The socket beside the one this client connected to (the server's own path for it, in the
  // ticket, differs inside a container that mounts the directory elsewhere).
  const std::string beside = absl::StrCat(socket_path, ".regions");
  bool connected = false;
  absl::Status sent =
      SendDescriptor(beside, ticket->ticket(), fd, client.options_.timeout, &connected);
  if (!connected && !ticket->socket_path().empty() && ticket->socket_path() != beside) {
    sent = SendDescriptor(ticket->socket_path(), ticket->ticket(), fd, client.options_.timeout,
                          &connected);
  }
  if (!sent.ok()) return sent;
  absl::StatusOr<v1::Region> claimed = client.FinishRegion(ticket->ticket());
  if (!claimed.ok()) return claimed.status();
  region->handle_ = claimed->handle();
  return region;
}

// ---- The regions a Client keeps ----------------------------------------------------------------

std::unique_ptr<SharedRegion> Client::RegionPool::Take(uint64_t size_bytes,
                                                       std::unique_ptr<SharedRegion>* retired) {
  absl::MutexLock lock(&mu_);
  auto fits = idle_.end();
  for (auto it = idle_.begin(); it != idle_.end(); ++it) {
    if ((*it)->size() >= size_bytes && (fits == idle_.end() || (*it)->size() < (*fits)->size())) {
      fits = it;
    }
  }
  if (fits != idle_.end()) {
    std::unique_ptr<SharedRegion> region = std::move(*fits);
    idle_.erase(fits);
    return region;
  }
  if (!idle_.empty()) *retired = TakeLargestLocked();
  return nullptr;
}

std::unique_ptr<SharedRegion> Client::RegionPool::TakeLargest() {
  absl::MutexLock lock(&mu_);
  return idle_.empty() ? nullptr : TakeLargestLocked();
}

std::unique_ptr<SharedRegion> Client::RegionPool::TakeLargestLocked() {
  auto largest = std::max_element(idle_.begin(), idle_.end(), [](const auto& a, const auto& b) {
    return a->size() < b->size();
  });
  std::unique_ptr<SharedRegion> region = std::move(*largest);
  idle_.erase(largest);
  return region;
}

std::unique_ptr<SharedRegion> Client::RegionPool::Give(std::unique_ptr<SharedRegion> region) {
  absl::MutexLock lock(&mu_);
  idle_.push_back(std::move(region));
  if (idle_.size() <= kMaxIdle) return nullptr;
  auto smallest = std::min_element(idle_.begin(), idle_.end(), [](const auto& a, const auto& b) {
    return a->size() < b->size();
  });
  std::unique_ptr<SharedRegion> extra = std::move(*smallest);
  idle_.erase(smallest);
  return extra;
}

std::vector<std::unique_ptr<SharedRegion>> Client::RegionPool::TakeAll() {
  absl::MutexLock lock(&mu_);
  return std::exchange(idle_, {});
}

bool Client::RegionPool::available() const {
  absl::MutexLock lock(&mu_);
  return available_;
}

void Client::RegionPool::MarkUnavailable() {
  absl::MutexLock lock(&mu_);
  available_ = false;
}

Client::RegionLease::RegionLease(Client* client, std::unique_ptr<SharedRegion> region)
    : client_(client), region_(std::move(region)) {}

Client::RegionLease::RegionLease(RegionLease&& other) noexcept
    : client_(other.client_), region_(std::move(other.region_)) {}

Client::RegionLease::~RegionLease() {
  if (region_ != nullptr) client_->ReturnRegion(std::move(region_));
}

void Client::ReturnRegion(std::unique_ptr<SharedRegion> region) {
  // Destroyed (unregistered) here, outside the pool's lock.
  std::unique_ptr<SharedRegion> extra = regions_->Give(std::move(region));
}

absl::StatusOr<std::optional<Client::RegionLease>> Client::LeaseTransferRegion(
    uint64_t size_bytes) {
  if (!options_.use_regions || unix_socket_path_.empty() || !regions_->available()) {
    return std::nullopt;
  }
  std::unique_ptr<SharedRegion> retired;
  std::unique_ptr<SharedRegion> region = regions_->Take(size_bytes, &retired);
  if (region == nullptr) {
    retired.reset();  // unregistered first: its bytes go back to the quota
    absl::StatusOr<std::unique_ptr<SharedRegion>> registered =
        SharedRegion::Register(*this, RegionSizeFor(size_bytes));
    if (!registered.ok()) {
      const absl::Status& status = registered.status();
      if (absl::IsFailedPrecondition(status) || absl::IsUnimplemented(status)) {
        regions_->MarkUnavailable();  // for good: no descriptor socket, or an older server
      }
      if (StreamInstead(status)) return std::nullopt;
      return status;
    }
    region = *std::move(registered);
  }
  return std::optional<RegionLease>(RegionLease(this, std::move(region)));
}

// ---- Transfers through regions -----------------------------------------------------------------

std::optional<absl::StatusOr<v1::TensorInfo>> Client::WriteThroughRegion(
    const v1::WriteHeader& header, absl::string_view data) {
  if (data.empty()) return std::nullopt;
  absl::StatusOr<v1::TensorInfo> written;
  // A second try only when the server forgot the region (it restarted since).
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<std::optional<RegionLease>> lease = LeaseTransferRegion(data.size());
    if (!lease.ok()) return lease.status();
    if (!lease->has_value()) return std::nullopt;
    RegionLease& region = **lease;
    std::memcpy(region.data(), data.data(), data.size());  // the one copy on this side
    v1::WriteTensorFromRegionRequest request;
    if (header.has_create()) {
      *request.mutable_create() = header.create();
    } else {
      request.set_handle(header.handle());
    }
    request.set_region(region.region().handle());
    request.set_length(data.size());
    written = WriteTensorFromRegion(request);
    if (!Forgotten(written.status(), region.region())) return written;
    region.region_.reset();  // not given back: unknown to the server
  }
  return written;
}

std::optional<absl::StatusOr<uint64_t>> Client::ReadThroughRegion(absl::string_view handle,
                                                                  uint64_t offset, uint64_t length,
                                                                  client_internal::ReadSink* sink) {
  if (!options_.use_regions || unix_socket_path_.empty() || !regions_->available()) {
    return std::nullopt;
  }
  // With the length unknown, a kept region may hold the bytes already (the same tensors read
  // again); else, or when it is too small, the tensor's size decides (GetTensor).
  std::optional<RegionLease> lease;
  if (length == 0) {
    std::unique_ptr<SharedRegion> idle = regions_->TakeLargest();
    if (idle != nullptr) lease.emplace(RegionLease(this, std::move(idle)));
  }
  absl::StatusOr<v1::ReadTensorIntoRegionResponse> read;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!lease.has_value()) {
      uint64_t need = length;
      if (need == 0) {
        absl::StatusOr<v1::TensorInfo> info = GetTensor(handle);
        if (!info.ok()) return info.status();
        need = info->size_bytes() > offset ? info->size_bytes() - offset : 0;
      }
      absl::StatusOr<std::optional<RegionLease>> leased = LeaseTransferRegion(need);
      if (!leased.ok()) return leased.status();
      if (!leased->has_value()) return std::nullopt;
      lease.emplace(**std::move(leased));
    }
    v1::ReadTensorIntoRegionRequest request;
    request.set_handle(std::string(handle));
    request.set_offset(offset);
    request.set_length(length);
    request.set_region(lease->region().handle());
    read = ReadTensorIntoRegion(request);
    if (read.ok()) {
      absl::Status started = sink->Start(read->info(), read->bytes());
      if (!started.ok()) return started;
      sink->Append(absl::string_view(lease->data(), read->bytes()));  // the one copy here
      return read->bytes();
    }
    const bool forgotten = Forgotten(read.status(), lease->region());
    if (!forgotten && !TooSmall(read.status(), lease->region())) return read.status();
    if (forgotten) lease->region_.reset();  // not given back: unknown to the server
    lease.reset();
  }
  return read.status();
}

absl::StatusOr<v1::TensorInfo> Client::UploadFromRegion(const v1::TensorSpec& spec,
                                                        const SharedRegion& region,
                                                        uint64_t offset) {
  v1::WriteTensorFromRegionRequest request;
  *request.mutable_create() = spec;
  request.set_region(region.handle());
  request.set_offset(offset);
  return WriteTensorFromRegion(request);
}

absl::StatusOr<v1::TensorInfo> Client::OverwriteFromRegion(absl::string_view handle,
                                                           const SharedRegion& region,
                                                           uint64_t offset) {
  v1::WriteTensorFromRegionRequest request;
  request.set_handle(std::string(handle));
  request.set_region(region.handle());
  request.set_offset(offset);
  return WriteTensorFromRegion(request);
}

absl::StatusOr<v1::ReadTensorIntoRegionResponse> Client::DownloadIntoRegion(
    absl::string_view handle, const SharedRegion& region, uint64_t region_offset, uint64_t offset,
    uint64_t length) {
  v1::ReadTensorIntoRegionRequest request;
  request.set_handle(std::string(handle));
  request.set_offset(offset);
  request.set_length(length);
  request.set_region(region.handle());
  request.set_region_offset(region_offset);
  return ReadTensorIntoRegion(request);
}

}  // namespace tessera
