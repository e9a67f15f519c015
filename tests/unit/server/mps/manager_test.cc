#include "server/mps/manager.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "server/backend/mps_probe.h"
#include "tests/testing/fake_mps.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Start() changes this process's environment, as it must in the server; each test gets the
// variables back as they were.
class SavedEnvironment {
 public:
  SavedEnvironment() {
    for (const char* name : kNames) {
      const char* value = std::getenv(name);
      saved_.push_back(value == nullptr ? std::nullopt : std::optional<std::string>(value));
    }
  }
  ~SavedEnvironment() {
    for (size_t i = 0; i < std::size(kNames); ++i) {
      if (saved_[i].has_value()) {
        setenv(kNames[i], saved_[i]->c_str(), 1);
      } else {
        unsetenv(kNames[i]);
      }
    }
  }

 private:
  static constexpr const char* kNames[] = {"CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY",
                                           "CUDA_VISIBLE_DEVICES"};
  std::vector<std::optional<std::string>> saved_;
};

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "<unset>" : value;
}

void AwaitExit(pid_t pid) {
  for (int i = 0; i < 300 && ProcessAlive(pid); ++i) usleep(10000);
}

class MpsManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::PutFakeMpsOnPath();
    char pattern[] = "/tmp/tessera-mps-base-XXXXXX";
    base_ = mkdtemp(pattern);
  }
  void TearDown() override {
    // Whatever a test left running is stopped.
    MpsControlClient({.pipe_directory = base_ + "/pipe"}).Quit().IgnoreError();
    std::filesystem::remove_all(base_);
  }

  std::string Commands() const { return testing::ReadText(base_ + "/pipe/fake_commands"); }

  SavedEnvironment env_;
  std::string base_;
};

TEST_F(MpsManagerTest, StartsOneDaemonForEveryGpuAndPointsThisProcessAtIt) {
  setenv("CUDA_VISIBLE_DEVICES", "0,2", 1);
  MpsManager manager({.base_directory = base_});
  ASSERT_TRUE(manager.Start().ok());
  const MpsManager::Daemon d = manager.daemon();
  ASSERT_GT(d.pid, 0);
  EXPECT_TRUE(d.started);
  EXPECT_EQ(d.pipe_directory, base_ + "/pipe");
  EXPECT_EQ(d.log_directory, base_ + "/log");
  EXPECT_TRUE(d.error.empty()) << d.error;
  // The daemon serves the GPUs this process was given, in its own directories.
  const std::string daemon_env =
      testing::ReadText(absl::StrCat(d.pipe_directory, "/fake_env_", d.pid));
  EXPECT_THAT(daemon_env, HasSubstr("CUDA_VISIBLE_DEVICES=0,2\n"));
  EXPECT_THAT(daemon_env, HasSubstr("CUDA_MPS_LOG_DIRECTORY=" + base_ + "/log\n"));
  EXPECT_EQ(d.visible_devices, "0,2");
  // This process now names the daemon for the driver, and leaves the device selection to the
  // MPS server, which renumbers the daemon's devices from 0.
  EXPECT_EQ(Env("CUDA_MPS_PIPE_DIRECTORY"), base_ + "/pipe");
  EXPECT_EQ(Env("CUDA_MPS_LOG_DIRECTORY"), base_ + "/log");
  EXPECT_EQ(Env("CUDA_VISIBLE_DEVICES"), "<unset>");
  // Owner-only directories.
  struct stat st {};
  ASSERT_EQ(stat(d.pipe_directory.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  // No client but this process: shutdown quits the daemon it started.
  manager.Shutdown();
  AwaitExit(d.pid);
  EXPECT_FALSE(ProcessAlive(d.pid));
  EXPECT_THAT(Commands(), HasSubstr("quit"));
  EXPECT_EQ(manager.daemon().pid, 0);
  manager.Shutdown();  // idempotent
}

TEST_F(MpsManagerTest, ADaemonFoundRunningIsJoinedAndLeftRunning) {
  const std::string pipe = base_ + "/pipe";
  std::filesystem::create_directories(pipe);
  ASSERT_EQ(
      std::system(("CUDA_MPS_PIPE_DIRECTORY=" + pipe + " nvidia-cuda-mps-control -d").c_str()), 0);
  const MpsProbe before = ProbeMps(pipe.c_str());
  ASSERT_TRUE(before.daemon_running);

  MpsManager manager({.base_directory = base_});
  ASSERT_TRUE(manager.Start().ok());
  EXPECT_EQ(manager.daemon().pid, *before.daemon_pid);
  EXPECT_FALSE(manager.daemon().started);
  EXPECT_EQ(Env("CUDA_MPS_PIPE_DIRECTORY"), pipe);
  manager.Shutdown();
  EXPECT_TRUE(ProcessAlive(*before.daemon_pid));
  EXPECT_THAT(Commands(), Not(HasSubstr("quit")));
}

TEST_F(MpsManagerTest, AStalePidFileNamingAnotherProgramIsReplacedByANewDaemon) {
  // After a container restart the old pid can belong to anything, this server included.
  std::filesystem::create_directories(base_ + "/pipe");
  std::ofstream(base_ + "/pipe/nvidia-cuda-mps-control.pid") << getpid() << "\n";
  MpsManager manager({.base_directory = base_});
  ASSERT_TRUE(manager.Start().ok());
  const MpsManager::Daemon d = manager.daemon();
  EXPECT_GT(d.pid, 0);
  EXPECT_NE(d.pid, getpid());
  EXPECT_TRUE(d.started);
  EXPECT_EQ(ProgramName(d.pid), "nvidia-cuda-mps-control");
}

TEST_F(MpsManagerTest, ADaemonWithAnotherClientIsLeftRunningAtShutdown) {
  MpsManager manager({.base_directory = base_});
  ASSERT_TRUE(manager.Start().ok());
  const pid_t daemon = manager.daemon().pid;
  // This process and another one are clients (as the fake driver announces them).
  FILE* p = popen("sleep 30 & echo $!", "r");
  ASSERT_NE(p, nullptr);
  int other = 0;
  ASSERT_EQ(fscanf(p, "%d", &other), 1);
  pclose(p);
  const std::string pipe = base_ + "/pipe";
  std::ofstream(absl::StrCat(pipe, "/fake_client_", getpid())) << "CUDA_VISIBLE_DEVICES=\n";
  std::ofstream(absl::StrCat(pipe, "/fake_client_", other)) << "CUDA_VISIBLE_DEVICES=\n";

  manager.Shutdown();
  EXPECT_TRUE(ProcessAlive(daemon));
  EXPECT_THAT(Commands(), Not(HasSubstr("quit")));

  // Clients are processes: once the other one exits, only this process is listed.
  kill(other, SIGKILL);
  AwaitExit(other);
  auto clients = manager.Client().GetClientList(daemon);
  ASSERT_TRUE(clients.ok()) << clients.status();
  EXPECT_THAT(*clients, ::testing::ElementsAre(getpid()));
}

TEST_F(MpsManagerTest, ADaemonThatDiedIsReportedAndNotStartedAgain) {
  MpsManager manager({.base_directory = base_});
  ASSERT_TRUE(manager.Start().ok());
  const pid_t first = manager.daemon().pid;
  ASSERT_EQ(kill(first, SIGKILL), 0);
  AwaitExit(first);
  manager.Check();
  const MpsManager::Daemon d = manager.daemon();
  EXPECT_EQ(d.pid, 0);
  EXPECT_THAT(d.error, HasSubstr("restart tessera-server"));
  EXPECT_FALSE(ProbeMps((base_ + "/pipe").c_str()).daemon_running);
}

TEST_F(MpsManagerTest, ADaemonThatCannotStartLeavesTheEnvironmentAlone) {
  setenv("CUDA_MPS_PIPE_DIRECTORY", "/somewhere/else", 1);
  MpsManager manager({.base_directory = base_, .binary = "/nonexistent/mps-control"});
  absl::Status s = manager.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("cannot run /nonexistent/mps-control"));
  EXPECT_THAT(manager.daemon().error, HasSubstr("cannot run"));
  EXPECT_EQ(Env("CUDA_MPS_PIPE_DIRECTORY"), "/somewhere/else");
}

TEST_F(MpsManagerTest, AnotherUsersDaemonInThePipeDirectoryIsRefusedSayingSo) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another user";
  // A process of user nobody stands in for another user's daemon.
  testing::StandInDaemon other(65534, 65534);
  std::filesystem::create_directories(base_ + "/pipe");
  std::ofstream(base_ + "/pipe/nvidia-cuda-mps-control.pid") << other.pid() << "\n";
  usleep(100000);
  MpsManager manager({.base_directory = base_});
  absl::Status owned = manager.Start();
  EXPECT_EQ(owned.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(owned.message(), HasSubstr("another user's MPS control daemon"));
  EXPECT_THAT(owned.message(), HasSubstr("MPS user"));
  std::filesystem::remove(base_ + "/pipe/nvidia-cuda-mps-control.pid");
}

}  // namespace
}  // namespace tessera
