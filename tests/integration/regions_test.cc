// Clients on the same node: the Unix-socket listener and shared-memory regions (a memfd
// handed over by descriptor; docs/api.md). Every test runs on each backend under test.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "gtest/gtest.h"

#include "tessera/npy.h"
#include "tests/testing/region_handover.h"
#include "tests/testing/server_fixture.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using testing::kGiB;
using testing::MakeMemfd;
using testing::SendDescriptors;
using ::testing::StartsWith;

using testing::kMiB;

// Descriptors the server process holds now.
int CountFds(pid_t pid) {
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (dir == nullptr) return -1;
  int n = 0;
  while (readdir(dir) != nullptr) n++;
  closedir(dir);
  return n - 2;
}

// The server's descriptor count once it is `expected`, or after 10 s: the descriptor socket
// closes each connection on a thread of its own just after its reply, which the client may
// read first.
int FdsOnceSettled(pid_t pid, int expected) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  int n = CountFds(pid);
  while (n != expected && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
    n = CountFds(pid);
  }
  return n;
}

// What the server's descriptors are, for a failure message.
std::string ListFds(pid_t pid) {
  std::string out;
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    char link[256] = {};
    const std::string path = absl::StrCat("/proc/", pid, "/fd/", e->d_name);
    if (readlink(path.c_str(), link, sizeof(link) - 1) > 0) absl::StrAppend(&out, link, " ");
  }
  closedir(dir);
  return out;
}

// Mappings of memfds named `name` (the tests' own by default; "" for every memfd) in the
// server process now.
int CountMemfdMaps(pid_t pid, const std::string& name = "tessera-test") {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) n += absl::StrContains(line, "/memfd:" + name);
  return n;
}

// Starts the tessera CLI with `args` and `env` (added to this process's environment) as a
// client process of its own: stdin `stdin_fd` (/dev/null when -1), stdout and stderr into the
// file `log`. Returns its pid, or -1.
pid_t StartCli(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
               int stdin_fd, const std::string& log) {
  std::vector<std::string> argv = {testing::CliBinary()};
  argv.insert(argv.end(), args.begin(), args.end());
  const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) return -1;
  absl::StatusOr<pid_t> pid = testing::StartProcess(argv, env, stdin_fd, out);
  close(out);
  return pid.ok() ? *pid : -1;
}

// Reaps `pid` if it exits within `timeout`: its wait status, or nullopt while it runs.
std::optional<int> WaitFor(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;
    if (absl::Now() >= deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(2));
  }
}

// Sends all of `data` into the socket `fd` by `deadline`; false when the reader is gone or
// does not take it in time (never SIGPIPE, never blocked past the deadline).
bool SendAll(int fd, absl::string_view data, absl::Time deadline) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return false;
    pollfd p{fd, POLLOUT, 0};
    poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 100)));
  }
  return true;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class RegionsTest : public testing::ServerTest {
 protected:
  void SetUp() override {
    socket_ = dir_.File("t.sock");
    StartServer({"--unix_socket=" + socket_});
  }

  // One channel per server, so that the server's descriptors counted by the tests are those
  // of one connection throughout.
  std::unique_ptr<v1::Compute::Stub> Stub() {
    if (channel_ == nullptr || channel_server_ != server_.get()) {
      channel_ = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
      channel_server_ = server_.get();
    }
    return v1::Compute::NewStub(channel_);
  }
  void Authorize(grpc::ClientContext& context, const std::string& key) {
    context.AddMetadata("authorization", "Bearer " + key);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  }

  grpc::Status Begin(const std::string& key, uint64_t size, v1::RegionTicket* ticket) {
    grpc::ClientContext context;
    Authorize(context, key);
    v1::BeginRegionRequest request;
    request.set_size_bytes(size);
    return Stub()->BeginRegion(&context, request, ticket);
  }
  grpc::Status Finish(const std::string& key, const std::string& ticket, v1::Region* region) {
    grpc::ClientContext context;
    Authorize(context, key);
    v1::FinishRegionRequest request;
    request.set_ticket(ticket);
    return Stub()->FinishRegion(&context, request, region);
  }

  struct Mapped {
    int fd = -1;
    char* data = nullptr;
    uint64_t size = 0;
    std::string handle;
  };
  // A region of `size` bytes registered by `key` through the documented hand-over; the test
  // keeps its own mapping of the memfd.
  Mapped Register(const std::string& key, uint64_t size) {
    Mapped m;
    m.size = size;
    m.fd = MakeMemfd(size);
    EXPECT_GE(m.fd, 0);
    void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
    EXPECT_NE(data, MAP_FAILED);
    m.data = static_cast<char*>(data);
    v1::RegionTicket ticket;
    grpc::Status begun = Begin(key, size, &ticket);
    EXPECT_TRUE(begun.ok()) << begun.error_message();
    EXPECT_EQ(ticket.socket_path(), socket_ + ".regions");
    EXPECT_THAT(ticket.ticket(), StartsWith("rt_"));
    EXPECT_EQ(SendDescriptors(socket_ + ".regions", ticket.ticket() + "\n", {m.fd}), "OK");
    v1::Region region;
    grpc::Status finished = Finish(key, ticket.ticket(), &region);
    EXPECT_TRUE(finished.ok()) << finished.error_message();
    EXPECT_THAT(region.handle(), StartsWith("rg_"));
    EXPECT_EQ(region.size_bytes(), size);
    m.handle = region.handle();
    return m;
  }
  static void Unmap(Mapped& m) {
    if (m.data != nullptr) munmap(m.data, m.size);
    if (m.fd >= 0) close(m.fd);
    m = Mapped{};
  }

  // Sends `fds` with a fresh ticket for `size` bytes; returns the socket's answer and the
  // status FinishRegion gives afterwards.
  std::pair<std::string, grpc::Status> Handover(const std::string& key, uint64_t size,
                                                const std::vector<int>& fds) {
    v1::RegionTicket ticket;
    grpc::Status begun = Begin(key, size, &ticket);
    EXPECT_TRUE(begun.ok()) << begun.error_message();
    std::string reply = SendDescriptors(socket_ + ".regions", ticket.ticket() + "\n", fds);
    v1::Region region;
    return {reply, Finish(key, ticket.ticket(), &region)};
  }

  v1::Usage Usage(const std::string& key) {
    grpc::ClientContext context;
    Authorize(context, key);
    v1::Usage usage;
    EXPECT_TRUE(Stub()->GetUsage(&context, v1::GetUsageRequest(), &usage).ok());
    return usage;
  }

  grpc::Status WriteFrom(const std::string& key, const v1::WriteTensorFromRegionRequest& request,
                         v1::TensorInfo* info) {
    grpc::ClientContext context;
    Authorize(context, key);
    return Stub()->WriteTensorFromRegion(&context, request, info);
  }
  grpc::Status ReadInto(const std::string& key, const v1::ReadTensorIntoRegionRequest& request,
                        v1::ReadTensorIntoRegionResponse* response) {
    grpc::ClientContext context;
    Authorize(context, key);
    return Stub()->ReadTensorIntoRegion(&context, request, response);
  }
  grpc::Status Unregister(const std::string& key, const std::string& handle) {
    grpc::ClientContext context;
    Authorize(context, key);
    v1::UnregisterRegionRequest request;
    request.set_handle(handle);
    v1::UnregisterRegionResponse response;
    return Stub()->UnregisterRegion(&context, request, &response);
  }

  static v1::WriteTensorFromRegionRequest CreateF32(const std::string& region, int64_t n,
                                                    uint64_t offset = 0) {
    v1::WriteTensorFromRegionRequest request;
    request.mutable_create()->set_dtype(v1::DTYPE_F32);
    request.mutable_create()->add_shape(n);
    request.set_region(region);
    request.set_offset(offset);
    return request;
  }

  std::string socket_;
  std::shared_ptr<grpc::Channel> channel_;
  const void* channel_server_ = nullptr;
};

TEST_F(RegionsTest, UnixSocketServesEveryServiceWithTheSameCredentials) {
  ASSERT_TRUE(server_->Stop(SIGTERM).ok());
  StartServer({"--unix_socket=" + socket_, "--log_level=info"});  // with the access log
  struct stat st {};
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  ASSERT_EQ(stat((socket_ + ".regions").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_THAT(server_->output(), HasSubstr("unix socket: " + socket_));

  auto admin = Client::Connect(
      {.address = "unix:" + socket_, .token = server_->AdminToken(), .timeout = absl::Seconds(20)});
  ASSERT_TRUE(admin.ok());
  ASSERT_TRUE((*admin)->GetServerInfo().ok());
  auto registered = (*admin)->RegisterTenant(Registration("local"));
  ASSERT_TRUE(registered.ok()) << registered.status();
  auto tenant = Client::Connect(
      {.address = "unix:" + socket_, .token = registered->api_key(), .timeout = absl::Seconds(20)});
  ASSERT_TRUE(tenant.ok());
  EXPECT_TRUE((*tenant)->GetUsage().ok());
  // The admin token is refused on Compute, a wrong key everywhere: as over TCP.
  EXPECT_EQ((*admin)->GetUsage().status().code(), absl::StatusCode::kPermissionDenied);
  auto wrong = Client::Connect({.address = "unix:" + socket_, .token = "tsk_local.wrong"});
  EXPECT_EQ((*wrong)->GetUsage().status().code(), absl::StatusCode::kUnauthenticated);

  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("tessera.v1.Compute");
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(health->Check(&context, request, &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  // Reflection too, as `grpcurl -plaintext -unix PATH list` asks it.
  auto reflection = grpc::reflection::v1alpha::ServerReflection::NewStub(
      grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext reflection_context;
  reflection_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stream = reflection->ServerReflectionInfo(&reflection_context);
  grpc::reflection::v1alpha::ServerReflectionRequest list;
  list.set_list_services("");
  ASSERT_TRUE(stream->Write(list));
  grpc::reflection::v1alpha::ServerReflectionResponse listed;
  ASSERT_TRUE(stream->Read(&listed));
  std::vector<std::string> services;
  for (const auto& service : listed.list_services_response().service()) {
    services.push_back(service.name());
  }
  EXPECT_THAT(services, ::testing::IsSupersetOf({"tessera.v1.Compute", "tessera.v1.TenantAdmin",
                                                 "grpc.health.v1.Health"}));
  stream->WritesDone();

  // The access log names the socket as the peer.
  EXPECT_TRUE(server_->WaitForOutput("method=tessera.v1.Compute/GetUsage", absl::Seconds(10)));
  EXPECT_THAT(server_->output(), HasSubstr("peer=unix:" + socket_));
}

TEST_F(RegionsTest, TensorsMoveThroughARegionBothWays) {
  const std::string key = MustRegister("alpha");
  Mapped region = Register(key, 4 * kMiB);
  const int64_t n = 1000;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(i) * 0.5f - 3.0f;
    std::memcpy(region.data + 64 + i * 4, &v, 4);
  }
  v1::TensorInfo created;
  ASSERT_TRUE(WriteFrom(key, CreateF32(region.handle, n, 64), &created).ok());
  EXPECT_EQ(created.size_bytes(), 4000u);

  // The whole tensor back into the region at another offset, then a byte range of it.
  v1::ReadTensorIntoRegionRequest read;
  read.set_handle(created.handle());
  read.set_region(region.handle);
  read.set_region_offset(kMiB);
  v1::ReadTensorIntoRegionResponse answer;
  ASSERT_TRUE(ReadInto(key, read, &answer).ok());
  EXPECT_EQ(answer.bytes(), 4000u);
  EXPECT_EQ(answer.info().handle(), created.handle());
  EXPECT_EQ(std::memcmp(region.data + kMiB, region.data + 64, 4000), 0);
  read.set_offset(400);
  read.set_length(40);
  read.set_region_offset(2 * kMiB);
  ASSERT_TRUE(ReadInto(key, read, &answer).ok());
  EXPECT_EQ(answer.bytes(), 40u);
  EXPECT_EQ(std::memcmp(region.data + 2 * kMiB, region.data + 64 + 400, 40), 0);

  // The same bytes over the stream path (the tensor is an ordinary tensor).
  auto client = ClientWith(key);
  auto streamed = client->Download(created.handle());
  ASSERT_TRUE(streamed.ok());
  EXPECT_EQ(*streamed, std::string(region.data + 64, 4000));

  // Overwrite the existing tensor whole from another offset; a wrong length is refused.
  std::memset(region.data + 3 * kMiB, 0x3f, 4000);
  v1::WriteTensorFromRegionRequest overwrite;
  overwrite.set_handle(created.handle());
  overwrite.set_region(region.handle);
  overwrite.set_offset(3 * kMiB);
  overwrite.set_length(3999);
  v1::TensorInfo info;
  grpc::Status wrong_length = WriteFrom(key, overwrite, &info);
  EXPECT_EQ(wrong_length.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(wrong_length.error_message(), HasSubstr("length is 3999"));
  overwrite.set_length(4000);
  ASSERT_TRUE(WriteFrom(key, overwrite, &info).ok());
  streamed = client->Download(created.handle());
  ASSERT_TRUE(streamed.ok());
  EXPECT_EQ(*streamed, std::string(4000, '\x3f'));

  // Uploaded over the stream, read through the region.
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_U8);
  spec.add_shape(5);
  auto small = client->CreateTensor(spec, "hello");
  ASSERT_TRUE(small.ok());
  read = v1::ReadTensorIntoRegionRequest();
  read.set_handle(small->handle());
  read.set_region(region.handle);
  ASSERT_TRUE(ReadInto(key, read, &answer).ok());
  EXPECT_EQ(std::string(region.data, 5), "hello");

  v1::Usage usage = Usage(key);
  EXPECT_EQ(usage.regions(), 1u);
  EXPECT_EQ(usage.region_bytes(), 4 * kMiB);
  EXPECT_EQ(usage.region_quota_bytes(), kGiB);  // default: the memory quota
  grpc::ClientContext context;
  Authorize(context, key);
  v1::ListRegionsResponse list;
  ASSERT_TRUE(Stub()->ListRegions(&context, v1::ListRegionsRequest(), &list).ok());
  ASSERT_EQ(list.regions_size(), 1);
  EXPECT_EQ(list.regions(0).handle(), region.handle);
  EXPECT_EQ(list.regions(0).transfers(), 0u);

  ASSERT_TRUE(Unregister(key, region.handle).ok());
  EXPECT_EQ(Usage(key).regions(), 0u);
  EXPECT_EQ(Usage(key).region_bytes(), 0u);
  EXPECT_EQ(Unregister(key, region.handle).error_code(), grpc::StatusCode::NOT_FOUND);
  Unmap(region);
}

TEST_F(RegionsTest, EveryBadDescriptorIsRefusedWithAClearStatus) {
  const std::string key = MustRegister("alpha");
  struct Case {
    std::string name;
    int fd;
    std::string why;
  };
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  int sockets[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sockets), 0);
  const std::string file = dir_.File("plain");
  { std::ofstream(file) << std::string(kMiB, 'x'); }
  const int regular = open(file.c_str(), O_RDWR | O_CLOEXEC);
  const int zero = open("/dev/zero", O_RDWR | O_CLOEXEC);
  const int unsealed = MakeMemfd(kMiB, 0);
  const int no_sealing = MakeMemfd(kMiB, 0, /*allow_sealing=*/false);
  const int grow_sealed = MakeMemfd(kMiB, F_SEAL_GROW);
  const int write_sealed = MakeMemfd(kMiB, F_SEAL_SHRINK | F_SEAL_WRITE);
  const int small = MakeMemfd(kMiB / 2);
  const int good = MakeMemfd(kMiB);
  const int read_only = open(absl::StrCat("/proc/self/fd/", good).c_str(), O_RDONLY | O_CLOEXEC);
  const std::vector<Case> cases = {
      {"pipe", pipe_fds[0], "a pipe"},
      {"socket", sockets[0], "a socket"},
      {"regular file", regular, "not a memfd"},
      {"/dev/zero", zero, "a character device"},
      {"unsealed memfd", unsealed, "not sealed against shrinking"},
      {"memfd without sealing", no_sealing, "not sealed against shrinking"},
      {"grow-sealed memfd", grow_sealed, "not sealed against shrinking"},
      {"write-sealed memfd", write_sealed, "sealed against writes"},
      {"memfd too small", small, "holds 524288 bytes"},
      {"read-only memfd", read_only, "O_RDWR"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_GE(c.fd, 0);
    auto [reply, finished] = Handover(key, kMiB, {c.fd});
    EXPECT_THAT(reply, StartsWith("ERR INVALID_ARGUMENT the descriptor"));
    EXPECT_THAT(reply, HasSubstr(c.why));
    EXPECT_EQ(finished.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(finished.error_message(), HasSubstr(c.why));
  }
  // No descriptor, two descriptors.
  auto [none, none_finished] = Handover(key, kMiB, {});
  EXPECT_THAT(none, StartsWith("ERR INVALID_ARGUMENT send exactly one descriptor"));
  EXPECT_EQ(none_finished.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  auto [two, two_finished] = Handover(key, kMiB, {good, good});
  EXPECT_THAT(two, StartsWith("ERR INVALID_ARGUMENT send exactly one descriptor"));

  // Tickets: a made-up one, one used twice, one finished before its descriptor came.
  EXPECT_THAT(SendDescriptors(socket_ + ".regions", "rt_" + std::string(64, '0') + "\n", {good}),
              StartsWith("ERR UNAUTHENTICATED"));
  v1::RegionTicket ticket;
  ASSERT_TRUE(Begin(key, kMiB, &ticket).ok());
  v1::Region region;
  grpc::Status early = Finish(key, ticket.ticket(), &region);
  EXPECT_EQ(early.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(early.error_message(), HasSubstr("no descriptor has arrived"));
  EXPECT_EQ(SendDescriptors(socket_ + ".regions", ticket.ticket() + "\n", {good}), "OK");
  EXPECT_THAT(SendDescriptors(socket_ + ".regions", ticket.ticket() + "\n", {good}),
              StartsWith("ERR FAILED_PRECONDITION the region ticket was already used"));
  ASSERT_TRUE(Finish(key, ticket.ticket(), &region).ok());
  EXPECT_EQ(Finish(key, ticket.ticket(), &region).error_code(), grpc::StatusCode::NOT_FOUND);

  // Sizes: 0, above 1 TiB, above the quota.
  grpc::Status zero_size = Begin(key, 0, &ticket);
  EXPECT_EQ(zero_size.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(zero_size.error_message(), HasSubstr("size_bytes is 0; the range is 1.."));
  grpc::Status huge = Begin(key, uint64_t{4} << 40, &ticket);
  EXPECT_EQ(huge.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  grpc::Status over = Begin(key, 2 * kGiB, &ticket);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(over.error_message(), HasSubstr("quota.max_region_bytes"));

  for (int fd : {pipe_fds[0], pipe_fds[1], sockets[0], sockets[1], regular, zero, unsealed,
                 no_sealing, grow_sealed, write_sealed, small, good, read_only}) {
    close(fd);
  }
  // Nothing leaked: only the one region registered above is mapped.
  EXPECT_EQ(Usage(key).regions(), 1u);
  EXPECT_EQ(CountMemfdMaps(server_->pid()), 1);
}

TEST_F(RegionsTest, RangesAreCheckedWithoutOverflow) {
  const std::string key = MustRegister("alpha");
  Mapped region = Register(key, kMiB);
  v1::TensorInfo info;
  grpc::Status past = WriteFrom(key, CreateF32(region.handle, 1000, kMiB - 100), &info);
  EXPECT_EQ(past.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(past.error_message(), HasSubstr("is outside region"));
  grpc::Status overflow = WriteFrom(
      key, CreateF32(region.handle, 1000, std::numeric_limits<uint64_t>::max() - 10), &info);
  EXPECT_EQ(overflow.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // A 4 TiB tensor: refused by the memory quota before any byte is touched.
  grpc::Status four_tib = WriteFrom(key, CreateF32(region.handle, int64_t{1} << 40), &info);
  EXPECT_EQ(four_tib.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  ASSERT_TRUE(WriteFrom(key, CreateF32(region.handle, 1000), &info).ok());
  v1::ReadTensorIntoRegionRequest read;
  read.set_handle(info.handle());
  read.set_region(region.handle);
  read.set_length(uint64_t{4} << 40);
  v1::ReadTensorIntoRegionResponse answer;
  EXPECT_EQ(ReadInto(key, read, &answer).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  read.set_length(0);
  read.set_offset(std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(ReadInto(key, read, &answer).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  read.set_offset(0);
  read.set_region_offset(std::numeric_limits<uint64_t>::max() - 100);
  grpc::Status region_past = ReadInto(key, read, &answer);
  EXPECT_EQ(region_past.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(region_past.error_message(), HasSubstr("region_offset"));
  read.set_region_offset(kMiB - 3999);
  EXPECT_EQ(ReadInto(key, read, &answer).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  read.set_region_offset(kMiB - 4000);
  EXPECT_TRUE(ReadInto(key, read, &answer).ok());
  Unmap(region);
}

TEST_F(RegionsTest, ARegionIsItsTenantsAlone) {
  const std::string alpha = MustRegister("alpha");
  const std::string beta = MustRegister("beta");
  Mapped region = Register(alpha, kMiB);
  v1::TensorInfo info;
  grpc::Status other = WriteFrom(beta, CreateF32(region.handle, 10), &info);
  grpc::Status unknown = WriteFrom(beta, CreateF32("rg_" + std::string(32, 'a'), 10), &info);
  EXPECT_EQ(other.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(other.error_message(), absl::StrCat("region \"", region.handle, "\" not found"));
  EXPECT_EQ(Unregister(beta, region.handle).error_code(), grpc::StatusCode::NOT_FOUND);
  // Another tenant's ticket is unknown to it.
  v1::RegionTicket ticket;
  ASSERT_TRUE(Begin(alpha, kMiB, &ticket).ok());
  const int fd = MakeMemfd(kMiB);
  EXPECT_EQ(SendDescriptors(socket_ + ".regions", ticket.ticket() + "\n", {fd}), "OK");
  close(fd);
  v1::Region stolen;
  EXPECT_EQ(Finish(beta, ticket.ticket(), &stolen).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Finish(alpha, ticket.ticket(), &stolen).ok());
  EXPECT_EQ(Usage(beta).regions(), 0u);
  EXPECT_EQ(Usage(alpha).regions(), 2u);
  Unmap(region);
}

TEST_F(RegionsTest, QuotaAndCountLimitsAndNothingLeaks) {
  v1::RegisterTenantRequest registration = Registration("alpha");
  registration.mutable_quota()->set_max_region_bytes(8 * kMiB);
  auto registered = admin_->RegisterTenant(registration);
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_EQ(registered->tenant().quota().max_region_bytes(), 8 * kMiB);
  const std::string key = registered->api_key();
  Usage(key);  // the test's connection is open before the count
  const int fds_before = CountFds(server_->pid());

  // 8 regions of 1 MiB fit; the ninth does not (at BeginRegion already).
  std::vector<Mapped> regions;
  for (int i = 0; i < 8; ++i) regions.push_back(Register(key, kMiB));
  v1::RegionTicket ticket;
  grpc::Status full = Begin(key, kMiB, &ticket);
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(full.error_message(), HasSubstr("8388608 in use by 8 regions"));
  EXPECT_EQ(CountMemfdMaps(server_->pid()), 8);
  EXPECT_EQ(FdsOnceSettled(server_->pid(), fds_before), fds_before)  // a region holds none
      << ListFds(server_->pid());

  // The quota is immutable like the others.
  v1::UpdateTenantRequest update;
  update.mutable_tenant()->set_tenant_id("alpha");
  update.mutable_update_mask()->add_paths("quota.max_region_bytes");
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + server_->AdminToken());
  v1::Tenant tenant;
  auto admin_stub = v1::TenantAdmin::NewStub(admin_->channel());
  EXPECT_EQ(admin_stub->UpdateTenant(&context, update, &tenant).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  for (Mapped& m : regions) {
    EXPECT_TRUE(Unregister(key, m.handle).ok());
    Unmap(m);
  }
  EXPECT_EQ(CountMemfdMaps(server_->pid()), 0);

  // Many small regions: the per-tenant count limit refuses cleanly past 1024.
  auto big = admin_->RegisterTenant(Registration("many"));
  ASSERT_TRUE(big.ok());
  const int fd = MakeMemfd(4096);
  int registered_count = 0;
  grpc::Status refused;
  for (int i = 0; i < 1100 && refused.ok(); ++i) {
    v1::RegionTicket t;
    refused = Begin(big->api_key(), 4096, &t);
    if (!refused.ok()) break;
    ASSERT_EQ(SendDescriptors(socket_ + ".regions", t.ticket() + "\n", {fd}), "OK");
    v1::Region r;
    ASSERT_TRUE(Finish(big->api_key(), t.ticket(), &r).ok());
    registered_count++;
  }
  close(fd);
  EXPECT_EQ(registered_count, 1024);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("1024"));
  EXPECT_EQ(CountMemfdMaps(server_->pid()), 1024);
  // Deregistering the tenant unmaps all of them.
  ASSERT_TRUE(admin_->DeregisterTenant("many").ok());
  EXPECT_EQ(CountMemfdMaps(server_->pid()), 0);
  EXPECT_EQ(FdsOnceSettled(server_->pid(), fds_before), fds_before) << ListFds(server_->pid());
}

TEST_F(RegionsTest, UnregisteringDuringTransfersNeverUnmapsUnderThem) {
  const std::string key = MustRegister("alpha", 2 * kGiB);
  const uint64_t size = 64 * kMiB;
  Mapped region = Register(key, size);
  std::memset(region.data, 7, size);
  std::atomic<bool> stop{false};
  std::atomic<int> writes{0}, write_errors{0};
  std::thread writer([&] {
    for (int i = 0; i < 200 && !stop.load(); ++i) {
      v1::TensorInfo info;
      grpc::Status s = WriteFrom(key, CreateF32(region.handle, size / 4), &info);
      if (s.ok()) {
        writes++;
        grpc::ClientContext context;
        Authorize(context, key);
        v1::DeleteTensorRequest del;
        del.set_handle(info.handle());
        v1::DeleteTensorResponse deleted;
        (void)Stub()->DeleteTensor(&context, del, &deleted);
      } else {
        EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
        write_errors++;
        break;  // unregistered
      }
    }
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (writes.load() < 2 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  // Unregister while the writer runs: refused while a transfer holds the region (the writer
  // copies 64 MiB a time, so most attempts land inside one), then done, never under a copy.
  int refusals = 0;
  grpc::Status unregistered;
  while (absl::Now() < give_up) {
    unregistered = Unregister(key, region.handle);
    if (unregistered.ok()) break;
    EXPECT_EQ(unregistered.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(unregistered.error_message(), HasSubstr("in use by"));
    refusals++;
  }
  stop = true;
  writer.join();
  EXPECT_TRUE(unregistered.ok()) << unregistered.error_message();
  EXPECT_GT(writes.load(), 0);
  // The server is still up and serving.
  EXPECT_EQ(Usage(key).regions(), 0u);
  EXPECT_EQ(CountMemfdMaps(server_->pid()), 0);
  Unmap(region);
}

// A client process (the CLI, `tessera tensor put`, over the Unix socket) killed with SIGKILL
// in the middle of a transfer through its region: first while it fills the region from a pipe
// (half the bytes in: deterministic), then as soon as the server copies out of it
// (WriteTensorFromRegion; when the poll misses that, the put ends on its own first). Either
// way the server goes on serving; the dead client's region stays registered, as documented (a
// region lives until its tenant unregisters it), until the tenant unregisters it; then the
// server holds no more descriptors or memfd mappings than before, the region quota is whole
// again, and no tensor was left half written.
TEST_F(RegionsTest, AClientKilledDuringARegionTransferLeavesNothingBehind) {
  const std::string key = MustRegister("alpha");  // 1 GiB, also the region quota
  // The tenant seen from outside the socket (TCP), and the test's connections open before
  // the counts.
  std::unique_ptr<Client> tenant = ClientWith(key);
  ASSERT_TRUE(tenant->GetUsage().ok());
  Usage(key);
  const pid_t server = server_->pid();
  const int fds_before = CountFds(server);
  const int maps_before = CountMemfdMaps(server, "");
  ASSERT_GE(fds_before, 0);

  // 128 MiB of f32 whose 32-bit words count up: a tensor made of a part of them is told apart.
  const int64_t n = int64_t{32} << 20;
  std::string data(static_cast<size_t>(n) * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t word = static_cast<uint32_t>(i);
    std::memcpy(data.data() + i * 4, &word, 4);
  }
  absl::StatusOr<std::string> header = FormatNpyHeader(v1::DTYPE_F32, {n});
  ASSERT_TRUE(header.ok()) << header.status();
  const std::string file = dir_.File("big.npy");
  {
    std::ofstream out(file, std::ios::binary);
    out << *header << data;
    ASSERT_TRUE(out.good());
  }
  const std::map<std::string, std::string> env = {{"TESSERA_ADDR", "unix:" + socket_},
                                                  {"TESSERA_TOKEN", key}};

  for (const bool from_pipe : {true, false}) {
    SCOPED_TRACE(from_pipe ? "killed while it fills its region from a pipe"
                           : "killed while the server copies out of its region");
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    const std::string log = dir_.File(from_pipe ? "pipe.log" : "file.log");
    int sockets[2] = {-1, -1};
    pid_t pid = -1;
    if (from_pipe) {
      ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets), 0);
      pid = StartCli({"tensor", "put", "-"}, env, sockets[0], log);
      close(sockets[0]);
    } else {
      pid = StartCli({"tensor", "put", file}, env, -1, log);
    }
    ASSERT_GT(pid, 0);
    std::optional<int> status;  // once reaped
    absl::Cleanup reap = [&] {
      if (sockets[1] >= 0) close(sockets[1]);
      if (!status.has_value()) {
        kill(pid, SIGKILL);
        WaitFor(pid, absl::Seconds(10));
      }
    };

    bool killed = false;
    if (from_pipe) {
      // The header, then half the data: the CLI has registered its region by then and copies
      // what comes into it; it waits for the rest when it is killed.
      ASSERT_TRUE(SendAll(sockets[1], *header, deadline)) << ReadText(log);
      ASSERT_TRUE(SendAll(sockets[1], absl::string_view(data).substr(0, data.size() / 2), deadline))
          << ReadText(log);
      absl::StatusOr<v1::ListRegionsResponse> regions;
      while (absl::Now() < deadline) {
        regions = tenant->ListRegions();
        if (!regions.ok() || regions->regions_size() > 0) break;
        absl::SleepFor(absl::Milliseconds(2));
      }
      ASSERT_TRUE(regions.ok()) << regions.status();
      ASSERT_EQ(regions->regions_size(), 1) << ReadText(log);
      EXPECT_GE(regions->regions(0).size_bytes(), data.size());
      EXPECT_EQ(regions->regions(0).transfers(), 0u);  // the client is still filling it
      EXPECT_GE(CountMemfdMaps(server, "tessera-region"), 1);
      ASSERT_EQ(kill(pid, SIGKILL), 0);
      killed = true;
    } else {
      while (absl::Now() < deadline && !status.has_value()) {
        status = WaitFor(pid, absl::ZeroDuration());
        if (status.has_value()) break;
        absl::StatusOr<v1::ListRegionsResponse> regions = tenant->ListRegions();
        ASSERT_TRUE(regions.ok()) << regions.status();
        bool copying = false;
        for (const v1::Region& r : regions->regions()) copying |= r.transfers() > 0;
        if (copying) {
          ASSERT_EQ(kill(pid, SIGKILL), 0);
          killed = true;
          break;
        }
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
    if (!status.has_value()) status = WaitFor(pid, absl::Seconds(10));
    ASSERT_TRUE(status.has_value()) << "the CLI is still running\n" << ReadText(log);
    if (from_pipe) {
      EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) << *status;
    } else {
      // Killed, or done just before the signal (or before the poll saw the copy).
      EXPECT_TRUE((WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) ||
                  (WIFEXITED(*status) && WEXITSTATUS(*status) == 0))
          << *status << " " << ReadText(log);
    }
    RecordProperty(from_pipe ? "pipe_round" : "file_round",
                   killed ? "killed" : "finished before the kill");

    // The server is up and serves, over the socket and over TCP.
    EXPECT_TRUE(admin_->GetServerInfo().ok());
    EXPECT_EQ(Usage(key).memory_quota_bytes(), kGiB);

    // The dead client's region is still the tenant's (it lives until unregistered); a copy
    // out of it, if one runs, keeps it until the copy ends (FAILED_PRECONDITION till then).
    absl::StatusOr<v1::ListRegionsResponse> left = tenant->ListRegions();
    ASSERT_TRUE(left.ok()) << left.status();
    if (from_pipe) {
      EXPECT_EQ(left->regions_size(), 1);
    }
    EXPECT_LE(left->regions_size(), 1);
    for (const v1::Region& r : left->regions()) {
      absl::StatusOr<uint64_t> released = tenant->UnregisterRegion(r.handle());
      while (absl::IsFailedPrecondition(released.status()) && absl::Now() < deadline) {
        EXPECT_THAT(released.status().message(), HasSubstr("in use by"));
        absl::SleepFor(absl::Milliseconds(5));
        released = tenant->UnregisterRegion(r.handle());
      }
      ASSERT_TRUE(released.ok()) << released.status();
      EXPECT_EQ(*released, r.size_bytes());
    }
    v1::Usage usage = Usage(key);
    EXPECT_EQ(usage.regions(), 0u);
    EXPECT_EQ(usage.region_bytes(), 0u);

    // No tensor half written: none from the pipe (its bytes never all came); from the file
    // none, or the whole one when the server's copy had begun.
    absl::StatusOr<std::vector<v1::TensorInfo>> tensors = tenant->ListAllTensors();
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    RecordProperty(from_pipe ? "pipe_round_tensors" : "file_round_tensors",
                   static_cast<int>(tensors->size()));
    if (from_pipe) {
      EXPECT_EQ(tensors->size(), 0u);
    }
    EXPECT_LE(tensors->size(), 1u);
    for (const v1::TensorInfo& t : *tensors) {
      EXPECT_EQ(t.size_bytes(), data.size());
      ASSERT_EQ(t.shape_size(), 1);
      EXPECT_EQ(t.shape(0), n);
      absl::StatusOr<std::string> head = tenant->Download(t.handle(), 0, 4096);
      absl::StatusOr<std::string> tail = tenant->Download(t.handle(), data.size() - 4096, 4096);
      ASSERT_TRUE(head.ok() && tail.ok()) << head.status() << " " << tail.status();
      EXPECT_EQ(*head, data.substr(0, 4096));
      EXPECT_EQ(*tail, data.substr(data.size() - 4096));
      EXPECT_TRUE(tenant->DeleteTensor(t.handle()).ok());
    }
    usage = Usage(key);
    EXPECT_EQ(usage.tensors(), 0u);
    EXPECT_EQ(usage.memory_used_bytes(), 0u);

    // Nothing the dead client had is held any more: its connection is closed and its memfd
    // unmapped (the server notices the closed connection on its own, so this is polled).
    const absl::Time settle = absl::Now() + absl::Seconds(10);
    while ((CountFds(server) != fds_before || CountMemfdMaps(server, "") != maps_before) &&
           absl::Now() < settle) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(CountFds(server), fds_before) << ListFds(server);
    EXPECT_EQ(CountMemfdMaps(server, ""), maps_before);
    EXPECT_EQ(CountMemfdMaps(server, "tessera-region"), 0);
  }
}

TEST_F(RegionsTest, DeregisteringATenantAndStoppingTheServerReleaseRegions) {
  const std::string key = MustRegister("alpha");
  Mapped a = Register(key, kMiB);
  Mapped b = Register(key, 2 * kMiB);
  // A delivered but unclaimed region counts too and goes with the tenant.
  v1::RegionTicket ticket;
  ASSERT_TRUE(Begin(key, kMiB, &ticket).ok());
  const int fd = MakeMemfd(kMiB);
  ASSERT_EQ(SendDescriptors(socket_ + ".regions", ticket.ticket() + "\n", {fd}), "OK");
  close(fd);
  EXPECT_EQ(CountMemfdMaps(server_->pid()), 3);
  ASSERT_TRUE(admin_->DeregisterTenant("alpha").ok());
  EXPECT_EQ(CountMemfdMaps(server_->pid()), 0);
  v1::Region region;
  EXPECT_FALSE(Finish(key, ticket.ticket(), &region).ok());  // the key is revoked

  const std::string key2 = MustRegister("beta");
  Mapped c = Register(key2, kMiB);
  auto code = server_->Stop(SIGTERM);
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
  struct stat st {};
  EXPECT_NE(stat(socket_.c_str(), &st), 0);  // both socket files removed
  EXPECT_NE(stat((socket_ + ".regions").c_str(), &st), 0);
  // A restart serves the socket again (and no region survives a restart).
  StartServer({"--unix_socket=" + socket_});
  auto client =
      Client::Connect({.address = "unix:" + socket_, .token = key2, .timeout = absl::Seconds(20)});
  auto usage = (*client)->GetUsage();
  ASSERT_TRUE(usage.ok()) << usage.status();
  EXPECT_EQ(usage->regions(), 0u);
  for (Mapped* m : {&a, &b, &c}) Unmap(*m);
}

TEST_F(RegionsTest, ASecondServerCannotTakeALiveSocket) {
  testing::TempDir other;
  auto second = testing::ServerProcess::Start(testing::OnTestBackend(
      {.state_dir = other.File("var"), .args = {"--unix_socket=" + socket_}}));
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("another server is listening"));
  // The first still serves.
  auto client = Client::Connect({.address = "unix:" + socket_, .token = server_->AdminToken()});
  EXPECT_TRUE((*client)->GetServerInfo().ok());
}

TEST_F(RegionsTest, WithoutUnixSocketRegionsAreRefusedClearly) {
  ASSERT_TRUE(server_->Stop(SIGTERM).ok());
  StartServer();
  const std::string key = MustRegister("alpha");
  auto stub = v1::Compute::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  Authorize(context, key);
  v1::BeginRegionRequest request;
  request.set_size_bytes(kMiB);
  v1::RegionTicket ticket;
  grpc::Status status = stub->BeginRegion(&context, request, &ticket);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("--unix_socket"));
}

}  // namespace
}  // namespace tessera
