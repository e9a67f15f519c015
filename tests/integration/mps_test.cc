// MPS operations through a real server with the fake nvidia-cuda-mps-control first on PATH:
// the managed daemon started before the driver and joined by it (the fake driver connects as
// the real one does), GetMpsStatus and `tessera mps status`, TerminateTenantWork, quit on
// shutdown unless another client remains, a found daemon left running, and an unmanaged
// daemon joined through CUDA_MPS_PIPE_DIRECTORY.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
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

using testing::FreePort;
using testing::kGiB;

using ::testing::HasSubstr;

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

bool OnCuda() { return testing::BackendUnderTest().name != "cpu"; }

// A process that stands in for another MPS client; killed and reaped by the destructor.
class OtherProcess {
 public:
  OtherProcess() {
    pid_ = fork();
    if (pid_ == 0) {
      execlp("sleep", "sleep", "60", static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~OtherProcess() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

void QuitDaemon(const std::string& pipe) {
  const std::string quit =
      absl::StrCat("echo quit | PATH=", PathWithFake(), " CUDA_MPS_PIPE_DIRECTORY=", pipe,
                   " nvidia-cuda-mps-control >/dev/null");
  EXPECT_EQ(std::system(quit.c_str()), 0);
}

// --mps_manage starts one daemon before the driver initializes, the tenants' contexts are
// its clients (the fake daemon sees the server process connect), and shutdown quits it.
TEST_F(MpsTest, ManagedDaemonStartsBeforeTheDriverAndTheTenantsJoinIt) {
  const std::string base = dir_.File("mps");
  const std::string pipe = base + "/pipe";
  // The GPUs the server is given go to the daemon; the MPS server renumbers them.
  Start({"--mps_manage", "--mps_base_dir=" + base}, {{"CUDA_VISIBLE_DEVICES", "0"}});
  auto status = admin_->GetMpsStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(status->managed());
  ASSERT_EQ(status->daemons_size(), 1);
  if (!OnCuda()) {
    // Nothing for a daemon to serve: none is started, and the report says why.
    EXPECT_EQ(status->decision(), v1::MPS_DECISION_NOT_APPLICABLE);
    EXPECT_EQ(status->daemons(0).pid(), 0);
    EXPECT_THAT(status->daemons(0).error(), HasSubstr("not started: --backend=cpu"));
    EXPECT_FALSE(std::filesystem::exists(pipe + "/nvidia-cuda-mps-control.pid"));
    return;
  }
  // Running before any tenant: the driver joined it at start-up, so the decision is MPS.
  MpsProbe probe = ProbeMps(pipe.c_str());
  ASSERT_TRUE(probe.daemon_running) << probe.summary;
  const pid_t daemon = *probe.daemon_pid;
  EXPECT_EQ(status->decision(), v1::MPS_DECISION_MPS) << status->reason();
  EXPECT_THAT(status->reason(), HasSubstr(pipe));
  EXPECT_THAT(testing::ReadText(absl::StrCat(pipe, "/fake_env_", daemon)),
              HasSubstr("CUDA_VISIBLE_DEVICES=0\n"));
  // The server process is the daemon's client, with no device filter of its own.
  EXPECT_EQ(testing::ReadText(absl::StrCat(pipe, "/fake_client_", server_->pid())),
            "CUDA_VISIBLE_DEVICES=\n");

  Register("alpha");
  Register("beta");
  for (const char* id : {"alpha", "beta"}) {
    auto tenant = admin_->GetTenant(id);
    ASSERT_TRUE(tenant.ok()) << tenant.status();
    EXPECT_EQ(tenant->context().kind(), v1::CONTEXT_KIND_MPS) << tenant->context().reason();
  }
  status = admin_->GetMpsStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->daemons_size(), 1);
  const v1::MpsDaemon& d = status->daemons(0);
  EXPECT_EQ(d.gpu(), -1);
  EXPECT_EQ(d.pid(), daemon);
  EXPECT_TRUE(d.managed());
  EXPECT_TRUE(d.started());
  EXPECT_EQ(d.tenants(), 2u);
  EXPECT_EQ(d.pipe_directory(), pipe);
  EXPECT_EQ(d.log_directory(), base + "/log");
  ASSERT_EQ(d.servers_size(), 1);
  EXPECT_EQ(d.servers(0).state(), v1::MPS_SERVER_STATE_ACTIVE);
  EXPECT_THAT(d.servers(0).client_pids(), ::testing::ElementsAre(server_->pid()));
  EXPECT_EQ(d.default_active_thread_percentage(), 100.0);
  EXPECT_TRUE(d.error().empty()) << d.error();

  auto cli = Cli({"mps", "status"});
  EXPECT_EQ(cli.exit_code, 0) << cli.output;
  EXPECT_THAT(cli.output, HasSubstr("decision: MPS_DECISION_MPS"));
  EXPECT_THAT(cli.output, HasSubstr(absl::StrCat("daemon (all GPUs): pid ", daemon)));
  EXPECT_THAT(cli.output, HasSubstr("2 tenant(s), started by this server"));
  EXPECT_THAT(cli.output, HasSubstr(absl::StrCat("clients [", server_->pid(), "]")));

  // Tenants come and go; the daemon stays (the process stays its client).
  ASSERT_TRUE(admin_->DeregisterTenant("alpha").ok());
  ASSERT_TRUE(admin_->DeregisterTenant("beta").ok());
  EXPECT_TRUE(ProbeMps(pipe.c_str()).daemon_running);

  // No other client: shutdown quits the daemon it started.
  auto stopped = server_->Stop(SIGTERM);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(*stopped, 0);
  EXPECT_FALSE(ProbeMps(pipe.c_str()).daemon_running);
  EXPECT_THAT(testing::ReadText(pipe + "/fake_commands"), HasSubstr("quit"));
}

TEST_F(MpsTest, AManagedDaemonWithAnotherClientOutlivesTheServer) {
  if (!OnCuda()) GTEST_SKIP() << "no daemon is started for the CPU backend (tested above)";
  const std::string base = dir_.File("mps");
  const std::string pipe = base + "/pipe";
  Start({"--mps_manage", "--mps_base_dir=" + base});
  const MpsProbe probe = ProbeMps(pipe.c_str());
  ASSERT_TRUE(probe.daemon_running) << probe.summary;
  OtherProcess other;  // a second process pointed at the same pipe directory
  std::ofstream(absl::StrCat(pipe, "/fake_client_", other.pid())) << "CUDA_VISIBLE_DEVICES=\n";
  auto stopped = server_->Stop(SIGTERM);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(*stopped, 0);
  EXPECT_TRUE(ProbeMps(pipe.c_str()).daemon_running);
  EXPECT_THAT(server_->output(), HasSubstr("running for its other client(s)"));
  QuitDaemon(pipe);
}

TEST_F(MpsTest, AManagedDaemonFoundRunningIsJoinedAndLeftRunning) {
  if (!OnCuda()) GTEST_SKIP() << "no daemon is started for the CPU backend (tested above)";
  const std::string base = dir_.File("mps");
  const std::string pipe = base + "/pipe";
  std::filesystem::create_directories(pipe);
  ASSERT_EQ(std::system(absl::StrCat("PATH=", PathWithFake(), " CUDA_MPS_PIPE_DIRECTORY=", pipe,
                                     " nvidia-cuda-mps-control -d")
                            .c_str()),
            0);
  const pid_t daemon = *ProbeMps(pipe.c_str()).daemon_pid;
  Start({"--mps_manage", "--mps_base_dir=" + base});
  auto status = admin_->GetMpsStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->decision(), v1::MPS_DECISION_MPS) << status->reason();
  ASSERT_EQ(status->daemons_size(), 1);
  EXPECT_EQ(status->daemons(0).pid(), daemon);
  EXPECT_FALSE(status->daemons(0).started());
  EXPECT_TRUE(std::filesystem::exists(absl::StrCat(pipe, "/fake_client_", server_->pid())));
  auto stopped = server_->Stop(SIGTERM);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_TRUE(ProbeMps(pipe.c_str()).daemon_running);
  EXPECT_EQ(*ProbeMps(pipe.c_str()).daemon_pid, daemon);
  QuitDaemon(pipe);
}

// --mps=require with a pid file whose process this server cannot see (a daemon in another
// container) is left to the driver: here nothing answers in the pipe directory, the driver
// does not connect, and the start fails saying so.
TEST_F(MpsTest, RequireWithAnInvisibleDaemonIsDecidedByTheDriver) {
  if (!OnCuda()) GTEST_SKIP() << "--mps=require needs the CUDA backend (tested in select_test)";
  const std::string pipe = dir_.File("pipe");
  std::filesystem::create_directories(pipe);
  pid_t gone = fork();
  if (gone == 0) _exit(0);
  waitpid(gone, nullptr, 0);
  std::ofstream(pipe + "/nvidia-cuda-mps-control.pid") << gone << "\n";
  auto result =
      testing::RunCommand({testing::ServerBinary(), "--listen=127.0.0.1:0",
                           "--state_dir=" + dir_.File("var"), "--backend=cuda", "--mps=require"},
                          {{"PATH", PathWithFake()}, {"CUDA_MPS_PIPE_DIRECTORY", pipe}});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NE(result->exit_code, 0) << result->output;
  EXPECT_THAT(result->output, HasSubstr("not running here"));
  EXPECT_THAT(result->output, HasSubstr("the driver did not connect"));
}

TEST_F(MpsTest, ManagingADaemonWithMpsOffIsABadFlagCombination) {
  auto result = testing::RunCommand(
      {testing::ServerBinary(), "--listen=127.0.0.1:0", "--state_dir=" + dir_.File("var"),
       "--mps_manage", "--mps=off", "--backend=cpu"},
      {{"PATH", PathWithFake()}});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 2) << result->output;
  EXPECT_THAT(result->output, HasSubstr("--mps_manage"));
  EXPECT_THAT(result->output, HasSubstr("--mps=off"));
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
  EXPECT_FALSE(status->daemons(0).started());
  EXPECT_TRUE(status->daemons(0).error().empty()) << status->daemons(0).error();
  // On CUDA the driver joined it when it initialized: the server process is its client and
  // the tenants get MPS client contexts. The CPU backend has no driver to join anything.
  if (OnCuda()) {
    EXPECT_EQ(status->decision(), v1::MPS_DECISION_MPS) << status->reason();
    ASSERT_EQ(status->daemons(0).servers_size(), 1);
    EXPECT_THAT(status->daemons(0).servers(0).client_pids(),
                ::testing::ElementsAre(server_->pid()));
    Register("alpha");
    auto tenant = admin_->GetTenant("alpha");
    ASSERT_TRUE(tenant.ok()) << tenant.status();
    EXPECT_EQ(tenant->context().kind(), v1::CONTEXT_KIND_MPS) << tenant->context().reason();
  } else {
    EXPECT_EQ(status->decision(), v1::MPS_DECISION_NOT_APPLICABLE);
    EXPECT_EQ(status->daemons(0).servers_size(), 0);
  }
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
  EXPECT_THAT(response, HasSubstr("HTTP/1.1 200 OK"));
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
