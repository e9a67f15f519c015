// MPS operations through a real server with the fake nvidia-cuda-mps-control first on PATH:
// managed daemons per GPU following the tenants, GetMpsStatus and `tessera mps status`,
// TerminateTenantWork, quit on shutdown, and an unmanaged daemon found through
// CUDA_MPS_PIPE_DIRECTORY.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "server/backend/mps_probe.h"
#include "tessera/client.h"
#include "tests/testing/fake_mps.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kGiB = uint64_t{1} << 30;

std::string PathWithFake() {
  const char* path = std::getenv("PATH");
  return absl::StrCat(testing::FakeMpsBinDir(), ":", path == nullptr ? "/usr/bin:/bin" : path);
}

class MpsTest : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> extra, std::map<std::string, std::string> env = {}) {
    std::vector<std::string> args = {"--log_level=warn"};
    args.insert(args.end(), extra.begin(), extra.end());
    env["PATH"] = PathWithFake();
    auto server = testing::ServerProcess::Start(
        testing::OnTestBackend({.state_dir = dir_.File("var"), .args = args, .env = env}));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto client = Client::Connect({.address = server_->address(),
                                   .token = server_->AdminToken(),
                                   .timeout = absl::Seconds(20)});
    ASSERT_TRUE(client.ok()) << client.status();
    admin_ = *std::move(client);
  }

  void Register(const std::string& id) {
    v1::RegisterTenantRequest request;
    request.set_tenant_id(id);
    request.mutable_quota()->set_device_memory_bytes(kGiB);
    auto registered = admin_->RegisterTenant(request);
    ASSERT_TRUE(registered.ok()) << registered.status();
  }

  testing::CommandResult Cli(std::vector<std::string> args) {
    args.insert(args.begin(), testing::CliBinary());
    auto result = testing::RunCommand(
        args, {{"TESSERA_ADDR", server_->address()}, {"TESSERA_TOKEN", server_->AdminToken()}});
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : testing::CommandResult{};
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::ServerProcess> server_;
  std::unique_ptr<Client> admin_;
};

TEST_F(MpsTest, ManagedDaemonFollowsTheTenantsAndReportsThroughTheApiAndCli) {
  const std::string base = dir_.File("mps");
  Start({"--mps_manage", "--mps_base_dir=" + base});
  const std::string pipe = base + "/gpu0/pipe";

  // No tenants yet: no daemon. The decision is the backend's: none on the CPU; on CUDA,
  // per-tenant contexts, as the driver joins only a daemon running when the server starts.
  const v1::MpsDecision decision = testing::BackendUnderTest().name == "cpu"
                                       ? v1::MPS_DECISION_NOT_APPLICABLE
                                       : v1::MPS_DECISION_FALLBACK;
  auto status = admin_->GetMpsStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(status->managed());
  EXPECT_EQ(status->decision(), decision);

  // The first tenant on device 0 starts its daemon, with its own directories.
  Register("alpha");
  MpsProbe probe = ProbeMps(pipe.c_str());
  ASSERT_TRUE(probe.daemon_running) << probe.summary;
  const pid_t daemon = *probe.daemon_pid;
  EXPECT_THAT(testing::ReadText(absl::StrCat(pipe, "/fake_env_", daemon)),
              HasSubstr("CUDA_VISIBLE_DEVICES=0\n"));
  // What the daemon says shows up in GetMpsStatus.
  std::ofstream(pipe + "/fake_servers") << "4242\n";
  std::ofstream(pipe + "/fake_status_4242") << "FAULT\n";
  std::ofstream(pipe + "/fake_clients_4242") << "77\n78\n";
  status = admin_->GetMpsStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->daemons_size(), 1);
  const v1::MpsDaemon& d = status->daemons(0);
  EXPECT_EQ(d.gpu(), 0);
  EXPECT_EQ(d.pid(), daemon);
  EXPECT_TRUE(d.managed());
  EXPECT_EQ(d.tenants(), 1u);
  EXPECT_EQ(d.pipe_directory(), pipe);
  ASSERT_EQ(d.servers_size(), 1);
  EXPECT_EQ(d.servers(0).pid(), 4242);
  EXPECT_EQ(d.servers(0).state(), v1::MPS_SERVER_STATE_FAULT);
  EXPECT_EQ(d.servers(0).client_pids_size(), 2);
  EXPECT_EQ(d.default_active_thread_percentage(), 100.0);
  EXPECT_TRUE(d.error().empty()) << d.error();

  auto cli = Cli({"mps", "status"});
  EXPECT_EQ(cli.exit_code, 0) << cli.output;
  EXPECT_THAT(cli.output, HasSubstr("decision: " + v1::MpsDecision_Name(decision)));
  EXPECT_THAT(cli.output, HasSubstr(absl::StrCat("daemon gpu 0: pid ", daemon)));
  EXPECT_THAT(cli.output, HasSubstr("server 4242: MPS_SERVER_STATE_FAULT, clients [77, 78]"));

  // A second tenant shares the daemon; the last one leaving quits it.
  Register("beta");
  EXPECT_EQ(*ProbeMps(pipe.c_str()).daemon_pid, daemon);
  ASSERT_TRUE(admin_->DeregisterTenant("alpha").ok());
  EXPECT_TRUE(ProbeMps(pipe.c_str()).daemon_running);
  ASSERT_TRUE(admin_->DeregisterTenant("beta").ok());
  EXPECT_FALSE(ProbeMps(pipe.c_str()).daemon_running);
  EXPECT_THAT(testing::ReadText(pipe + "/fake_commands"), HasSubstr("quit"));

  // Shutdown quits a daemon that still has tenants.
  Register("gamma");
  ASSERT_TRUE(ProbeMps(pipe.c_str()).daemon_running);
  auto stopped = server_->Stop(SIGTERM);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(*stopped, 0);
  EXPECT_FALSE(ProbeMps(pipe.c_str()).daemon_running);
}

TEST_F(MpsTest, TerminateTenantWorkCancelsQueuedJobsAndSaysWhyNotTerminateClient) {
  Start({});
  Register("alpha");
  auto done = admin_->TerminateTenantWork("alpha");
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->cancelled_jobs(), 0u);
  EXPECT_THAT(done->detail(), HasSubstr("terminate_client"));
  EXPECT_EQ(admin_->TerminateTenantWork("nobody").status().code(), absl::StatusCode::kNotFound);
  auto cli = Cli({"mps", "terminate", "alpha"});
  EXPECT_EQ(cli.exit_code, 0) << cli.output;
  EXPECT_THAT(cli.output, HasSubstr("cancelled 0 queued job(s)"));
}

TEST_F(MpsTest, AnUnmanagedDaemonIsFoundThroughThePipeDirectory) {
  const std::string pipe = dir_.File("pipe");
  std::filesystem::create_directories(pipe);
  const std::string start = absl::StrCat("PATH=", PathWithFake(), " CUDA_MPS_PIPE_DIRECTORY=", pipe,
                                         " nvidia-cuda-mps-control -d");
  ASSERT_EQ(std::system(start.c_str()), 0);
  Start({}, {{"CUDA_MPS_PIPE_DIRECTORY", pipe}});
  auto status = admin_->GetMpsStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_FALSE(status->managed());
  ASSERT_EQ(status->daemons_size(), 1);
  EXPECT_EQ(status->daemons(0).gpu(), -1);
  EXPECT_EQ(status->daemons(0).pipe_directory(), pipe);
  EXPECT_GT(status->daemons(0).pid(), 0);
  EXPECT_TRUE(status->daemons(0).error().empty()) << status->daemons(0).error();
  // A daemon that hangs is reported, not waited for.
  std::ofstream(pipe + "/fake_mode") << "hang\n";
  server_.reset();
  Start({"--mps_timeout=300ms"}, {{"CUDA_MPS_PIPE_DIRECTORY", pipe}});
  status = admin_->GetMpsStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_THAT(status->daemons(0).error(), HasSubstr("did not answer"));
  std::filesystem::remove(pipe + "/fake_mode");
  const std::string quit =
      absl::StrCat("echo quit | PATH=", PathWithFake(), " CUDA_MPS_PIPE_DIRECTORY=", pipe,
                   " nvidia-cuda-mps-control");
  EXPECT_EQ(std::system(quit.c_str()), 0);
}

// A free loopback port (bound, read, released; the server binds it right after).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  std::string request = "GET " + path + " HTTP/1.0\r\n\r\n";
  (void)!write(fd, request.data(), request.size());
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, n);
  close(fd);
  return response;
}

// The scrape target the Kubernetes manifests annotate: Prometheus text with device and
// per-tenant series.
TEST_F(MpsTest, MetricsEndpointServesPrometheusText) {
  const int port = FreePort();
  Start({absl::StrCat("--metrics_listen=127.0.0.1:", port)});
  Register("alpha");
  std::string response = HttpGet(port, "/metrics");
  EXPECT_THAT(response, HasSubstr("HTTP/1.0 200 OK"));
  EXPECT_THAT(response, HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(response, HasSubstr("# TYPE tessera_device_reserved_bytes gauge"));
  EXPECT_THAT(response, HasSubstr("tessera_device_reserved_bytes{device=\"0\"} 1073741824"));
  EXPECT_THAT(response, HasSubstr("tessera_device_tenants{device=\"0\"} 1"));
  EXPECT_THAT(response,
              HasSubstr("tessera_tenant_memory_quota_bytes{tenant=\"alpha\"} 1073741824"));
  EXPECT_THAT(response, HasSubstr("# TYPE tessera_tenant_jobs_succeeded_total counter"));
  EXPECT_THAT(HttpGet(port, "/other"), HasSubstr("404"));
}

}  // namespace
}  // namespace tessera
