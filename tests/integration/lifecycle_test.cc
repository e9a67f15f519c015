// Process lifecycle and the ops surface: restart and restore, signals, health, reflection,
// start-up errors.
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "gtest/gtest.h"

#include "tests/testing/server_fixture.h"

namespace tessera {
namespace {

using testing::FreePort;

using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;
using testing::kGiB;

class LifecycleTest : public testing::ServerTest {
 protected:
  absl::StatusOr<HealthCheckResponse::ServingStatus> Health(
      const std::string& service, std::shared_ptr<grpc::Channel> channel = nullptr) {
    auto stub = Health::NewStub(channel != nullptr ? channel : admin_->channel());
    grpc::ClientContext context;  // no credentials: health is open to probes
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    grpc::Status s = stub->Check(&context, request, &response);
    if (!s.ok()) return FromGrpcStatus(s);
    return response.status();
  }
};

TEST_F(LifecycleTest, RestartRestoresEveryTenant) {
  std::map<std::string, std::string> keys;
  for (const char* id : {"alpha", "beta", "gamma"}) keys[id] = MustRegister(id, 2 * kGiB);
  v1::Tenant change;
  change.set_tenant_id("beta");
  (*change.mutable_labels())["tier"] = "gold";
  ASSERT_TRUE(admin_->UpdateTenant(change, {"labels"}).ok());
  ASSERT_TRUE(admin_->DeregisterTenant("gamma").ok());
  auto rotated = admin_->RotateTenantKey("alpha");
  ASSERT_TRUE(rotated.ok());
  auto before = admin_->ListAllTenants();
  ASSERT_TRUE(before.ok());

  ASSERT_EQ(*server_->Stop(SIGTERM), 0);
  StartServer();

  auto after = admin_->ListAllTenants();
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(after->size(), 2u);
  for (size_t i = 0; i < after->size(); ++i) {
    EXPECT_EQ((*after)[i].SerializeAsString(), (*before)[i].SerializeAsString());
  }
  EXPECT_EQ((*after)[1].labels().at("tier"), "gold");
  EXPECT_EQ((*after)[0].context().kind(), ExpectedContextKind());  // context rebuilt
  EXPECT_EQ(admin_->GetServerInfo()->devices(0).reserved_bytes(), 4 * kGiB);

  auto compute = [&](const std::string& key) {
    auto client = ClientWith(key);
    auto context = client->NewContext();
    v1::Usage usage;
    return v1::Compute::NewStub(client->channel())
        ->GetUsage(context.get(), v1::GetUsageRequest(), &usage)
        .error_code();
  };
  EXPECT_EQ(compute(rotated->api_key()), grpc::StatusCode::OK);
  EXPECT_EQ(compute(keys["alpha"]), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(compute(keys["beta"]), grpc::StatusCode::OK);
  EXPECT_EQ(compute(keys["gamma"]), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(LifecycleTest, SigtermAndSigintExitZero) {
  ASSERT_EQ(*server_->Stop(SIGTERM), 0);
  StartServer({"--log_level=info"});
  absl::StatusOr<int> code = server_->Stop(SIGTERM);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_THAT(server_->output(), HasSubstr("shutdown complete"));
  StartServer();
  EXPECT_EQ(*server_->Stop(SIGINT), 0);
}

TEST_F(LifecycleTest, HealthServesOverallAndPerService) {
  EXPECT_EQ(*Health(""), HealthCheckResponse::SERVING);
  EXPECT_EQ(*Health("tessera.v1.TenantAdmin"), HealthCheckResponse::SERVING);
  EXPECT_EQ(*Health("tessera.v1.Compute"), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health("no.such.Service").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(LifecycleTest, HealthIsNotServingWhileShuttingDown) {
  ASSERT_EQ(*server_->Stop(SIGTERM), 0);
  StartServer({"--shutdown_grace=3s", "--log_level=info"});
  ASSERT_EQ(*Health(""), HealthCheckResponse::SERVING);
  kill(server_->pid(), SIGTERM);
  ASSERT_TRUE(server_->WaitForOutput("health NOT_SERVING", absl::Seconds(10)));
  EXPECT_EQ(*Health(""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(*Health("tessera.v1.TenantAdmin"), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(*Health("tessera.v1.Compute"), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(*server_->Stop(SIGTERM), 0);  // already exiting; a second signal is harmless
}

// --health_listen: a plaintext port for probes that cannot do TLS (the kubelet's gRPC probe),
// serving grpc.health.v1 and nothing else, with the main port's status.
TEST_F(LifecycleTest, TheHealthPortServesHealthAloneAndFollowsTheMainPort) {
  ASSERT_EQ(*server_->Stop(SIGTERM), 0);
  const std::string health_address = absl::StrCat("127.0.0.1:", FreePort());
  StartServer({"--health_listen=" + health_address, "--shutdown_grace=3s", "--log_level=info"});
  auto channel = grpc::CreateChannel(health_address, grpc::InsecureChannelCredentials());
  EXPECT_EQ(*Health("", channel), HealthCheckResponse::SERVING);
  EXPECT_EQ(*Health("tessera.v1.TenantAdmin", channel), HealthCheckResponse::SERVING);
  EXPECT_EQ(*Health("tessera.v1.Compute", channel), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health("no.such.Service", channel).status().code(), absl::StatusCode::kNotFound);

  // Nothing else answers there: not the API, not reflection.
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer " + server_->AdminToken());
    v1::ServerInfo info;
    EXPECT_EQ(v1::TenantAdmin::NewStub(channel)
                  ->GetServerInfo(&context, v1::GetServerInfoRequest(), &info)
                  .error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }
  {
    grpc::ClientContext context;
    auto stream =
        grpc::reflection::v1alpha::ServerReflection::NewStub(channel)->ServerReflectionInfo(
            &context);
    grpc::reflection::v1alpha::ServerReflectionRequest list;
    list.set_list_services("");
    stream->Write(list);
    stream->WritesDone();
    grpc::reflection::v1alpha::ServerReflectionResponse response;
    while (stream->Read(&response)) {
    }
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }

  // Shutting down: NOT_SERVING there too, from the first moment.
  kill(server_->pid(), SIGTERM);
  ASSERT_TRUE(server_->WaitForOutput("health NOT_SERVING", absl::Seconds(10)));
  EXPECT_EQ(*Health("", channel), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(*Health("tessera.v1.Compute", channel), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(*server_->Stop(SIGTERM), 0);
}

TEST_F(LifecycleTest, ATakenHealthPortIsAStartUpErrorNamingIt) {
  const std::string taken = absl::StrCat("127.0.0.1:", server_->port());
  auto result = testing::RunCommand(
      {testing::ServerBinary(), "--listen=127.0.0.1:0", "--state_dir=" + dir_.File("other"),
       "--health_listen=" + taken, "--backend=cpu"},
      {});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NE(result->exit_code, 0);
  EXPECT_THAT(result->output, HasSubstr("--health_listen: cannot listen on " + taken));
}

// The CPU backend's pool is sized from what the process may use, not the host's CPU count:
// a server started with one CPU in its affinity mask gets one worker (the cgroup quota is
// read the same way; tests/unit/server/common/host_limits_test.cc covers its files).
TEST_F(LifecycleTest, TheCpuPoolFollowsTheCpusTheProcessMayUse) {
  if (testing::BackendUnderTest().name != "cpu") GTEST_SKIP() << "the CPU backend's pool";
  ASSERT_EQ(*server_->Stop(SIGTERM), 0);
  cpu_set_t all, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &all)) {
      CPU_SET(cpu, &one);
      break;
    }
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  StartServer();  // inherits the mask
  ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
  auto info = admin_->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->devices_size(), 1);
  EXPECT_EQ(info->devices(0).name(), "cpu (1 threads)");
}

TEST_F(LifecycleTest, ReflectionListsAndDescribesTheServices) {
  using ::grpc::reflection::v1alpha::ServerReflection;
  using ::grpc::reflection::v1alpha::ServerReflectionRequest;
  using ::grpc::reflection::v1alpha::ServerReflectionResponse;
  auto stub = ServerReflection::NewStub(admin_->channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stream = stub->ServerReflectionInfo(&context);

  ServerReflectionRequest list;
  list.set_list_services("");
  ASSERT_TRUE(stream->Write(list));
  ServerReflectionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  std::set<std::string> services;
  for (const auto& s : response.list_services_response().service()) services.insert(s.name());
  EXPECT_TRUE(services.contains("tessera.v1.TenantAdmin"));
  EXPECT_TRUE(services.contains("tessera.v1.Compute"));
  EXPECT_TRUE(services.contains("grpc.health.v1.Health"));

  // What `grpcurl describe` needs: the file defining a symbol, with its methods.
  ServerReflectionRequest describe;
  describe.set_file_containing_symbol("tessera.v1.TenantAdmin");
  ASSERT_TRUE(stream->Write(describe));
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_GT(response.file_descriptor_response().file_descriptor_proto_size(), 0);
  google::protobuf::FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(response.file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(file.name(), "tessera/v1/tenant_admin.proto");
  std::set<std::string> methods;
  for (const auto& service : file.service()) {
    for (const auto& m : service.method()) methods.insert(m.name());
  }
  EXPECT_TRUE(methods.contains("RegisterTenant"));
  EXPECT_TRUE(methods.contains("GetServerInfo"));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(LifecycleTest, SecondServerOnTheSameStateDirIsRefused) {
  auto second =
      testing::ServerProcess::Start(testing::OnTestBackend({.state_dir = dir_.File("var")}));
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("in use by another tessera-server"));
  EXPECT_TRUE(admin_->GetServerInfo().ok());  // the first is unaffected
}

// gRPC binds with SO_REUSEPORT unless told otherwise: a second server on the same address
// would start and silently take part of the first one's traffic.
TEST_F(LifecycleTest, ASecondServerOnTheSameAddressIsRefusedNamingIt) {
  const std::string address = absl::StrCat("127.0.0.1:", server_->port());
  testing::TempDir other;
  auto second = testing::ServerProcess::Start(testing::OnTestBackend(
      {.state_dir = other.File("var"), .args = {absl::StrCat("--listen=", address)}}));
  ASSERT_FALSE(second.ok()) << "a second server started on " << address;
  EXPECT_THAT(second.status().message(), HasSubstr("cannot listen on " + address));
  EXPECT_THAT(second.status().message(), HasSubstr("in use"));
  EXPECT_TRUE(admin_->GetServerInfo().ok());  // the first is unaffected
}

// Under systemd's Type=notify: READY=1 once the port serves, STOPPING=1 when shutdown starts,
// as datagrams to $NOTIFY_SOCKET.
TEST(ServiceManagerTest, ReadyOnceServingAndStoppingOnShutdown) {
  testing::TempDir dir;
  const std::string path = dir.File("notify");
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof(address.sun_path));
  std::memcpy(address.sun_path, path.data(), path.size());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  auto receive = [&](absl::Duration timeout) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) != 1)
      return std::string();
    char buffer[1024];
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : std::string();
  };
  auto server = testing::ServerProcess::Start(
      testing::OnTestBackend({.state_dir = dir.File("var"), .env = {{"NOTIFY_SOCKET", path}}}));
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string ready = receive(absl::Seconds(10));
  EXPECT_THAT(ready, HasSubstr("READY=1"));
  EXPECT_THAT(ready, HasSubstr(absl::StrCat("STATUS=serving on 127.0.0.1:", (*server)->port())));
  auto stopped = (*server)->Stop(SIGTERM);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(*stopped, 0);
  EXPECT_THAT(receive(absl::Seconds(5)), HasSubstr("STOPPING=1"));
  close(fd);
}

TEST_F(LifecycleTest, JsonLogsCarryTheRequestIdOfAFailedCall) {
  ASSERT_EQ(*server_->Stop(SIGTERM), 0);
  StartServer({"--log_format=json", "--log_level=info"});
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer wrong-token");
  context.AddMetadata("x-request-id", "req-json-7");
  v1::ServerInfo info;
  grpc::Status status = v1::TenantAdmin::NewStub(admin_->channel())
                            ->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
  ASSERT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  ASSERT_TRUE(server_->WaitForOutput("req-json-7", absl::Seconds(10)));
  std::string line;
  std::istringstream lines(server_->output());
  while (std::getline(lines, line) && line.find("req-json-7") == std::string::npos) {
  }
  // One JSON object per line: the call's access line, with the fields at the top level.
  EXPECT_EQ(line.front(), '{');
  EXPECT_EQ(line.back(), '}');
  EXPECT_THAT(line, HasSubstr("\"level\":\"info\""));
  EXPECT_THAT(line, HasSubstr("\"time\":\""));
  EXPECT_THAT(line, HasSubstr("\"msg\":\"access\""));
  EXPECT_THAT(line, HasSubstr("\"request_id\":\"req-json-7\""));
  EXPECT_THAT(line, HasSubstr("\"method\":\"tessera.v1.TenantAdmin/GetServerInfo\""));
  EXPECT_THAT(line, HasSubstr("\"code\":\"UNAUTHENTICATED\""));
  EXPECT_THAT(line, HasSubstr("\"tenant\":\"-\""));
  EXPECT_THAT(line, HasSubstr("invalid admin token"));
}

TEST_F(LifecycleTest, OversizedMessagesAreRefused) {
  ASSERT_EQ(*server_->Stop(SIGTERM), 0);
  StartServer({"--max_message_bytes=64KiB"});
  v1::RegisterTenantRequest request = Registration("alpha");
  (*request.mutable_labels())["blob"] = std::string(100 << 10, 'x');
  absl::Status s = admin_->RegisterTenant(request).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(admin_->ListTenants()->tenants_size(), 0);
  EXPECT_TRUE(admin_->RegisterTenant(Registration("alpha")).ok());  // the server is fine
}

TEST(StartupTest, ClearErrorsForBadConfiguration) {
  testing::TempDir dir;
  struct Case {
    std::vector<std::string> args;
    const char* expect;
  };
  std::vector<Case> cases = {
      {{"--backend=cpu", "--mps=require"}, "--mps=require"},
      {{"--backend=gpu"}, "allowed values are auto, cpu, cuda"},
      {{"--log_format=xml"}, "--log_format=xml"},
      {{"--max_message_bytes=1KiB"}, "--max_message_bytes"},
      {{"--memory_overcommit=0"}, "--memory_overcommit"},
      {{"--tls_cert=/nonexistent.pem"}, "--tls_cert and --tls_key must be given together"},
      {{"--tls_cert=/nonexistent.pem", "--tls_key=/nonexistent.key"}, "cannot read"},
  };
  // The CPU runs have no CUDA driver, so asking for CUDA there is an error.
  if (testing::BackendUnderTest().name == "cpu") {
    cases.push_back({{"--backend=cuda"}, "--backend=cuda: no CUDA driver"});
  }
  for (const Case& c : cases) {
    auto server = testing::ServerProcess::Start(
        testing::OnTestBackend({.state_dir = dir.File("var"), .args = c.args}));
    ASSERT_FALSE(server.ok()) << c.expect;
    EXPECT_THAT(server.status().message(), HasSubstr(c.expect));
  }
}

TEST(StartupTest, PrintsTokenPathAndAGrpcurlLine) {
  testing::TempDir dir;
  // No --backend: auto picks the backend under test, as the CPU runs have no CUDA driver and
  // the CUDA ones have one.
  auto server = testing::ServerProcess::Start(
      {.state_dir = dir.File("var"), .env = testing::BackendUnderTest().env});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(server->get()->WaitForOutput("try: grpcurl", absl::Seconds(10)));
  std::string out = (*server)->output();
  EXPECT_THAT(out, HasSubstr(dir.File("var") + "/admin.token (generated now)"));
  EXPECT_THAT(out, HasSubstr("grpcurl -plaintext -H \"authorization: Bearer $(cat "));
  EXPECT_THAT(out, HasSubstr("tessera.v1.TenantAdmin/GetServerInfo"));
  EXPECT_THAT(out, HasSubstr("backend " + testing::BackendUnderTest().name));
}

TEST(StartupTest, AdminTokenFromTheEnvironment) {
  testing::TempDir dir;
  const std::string token = "operator-supplied-token-123";
  auto server = testing::ServerProcess::Start(testing::OnTestBackend(
      {.state_dir = dir.File("var"), .env = {{"TESSERA_ADMIN_TOKEN", token}}}));
  ASSERT_TRUE(server.ok()) << server.status();
  auto with_env = Client::Connect({.address = (*server)->address(), .token = token});
  EXPECT_TRUE((*with_env)->GetServerInfo().ok());
  EXPECT_FALSE(std::ifstream(dir.File("var/admin.token")).good());
}

}  // namespace
}  // namespace tessera
