#include "server/mps/manager.h"

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "server/backend/mps_probe.h"
#include "tests/testing/fake_mps.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

class MpsManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::PutFakeMpsOnPath();
    char pattern[] = "/tmp/tessera-mps-base-XXXXXX";
    base_ = mkdtemp(pattern);
  }
  void TearDown() override { std::filesystem::remove_all(base_); }

  std::string base_;
};

TEST_F(MpsManagerTest, OneDaemonPerGpuCountedByTenantsQuitWithTheLastAndOnShutdown) {
  MpsManager manager({.base_directory = base_});
  // Tenants on GPU 0 and GPU 1: a daemon each, with its own directories and GPU.
  ASSERT_TRUE(manager.Reconcile({1, 1}).ok());
  std::vector<MpsManager::Daemon> d = manager.daemons();
  ASSERT_EQ(d.size(), 2u);
  for (int gpu : {0, 1}) {
    SCOPED_TRACE(gpu);
    EXPECT_GT(d[gpu].pid, 0);
    EXPECT_EQ(d[gpu].pipe_directory, absl::StrCat(base_, "/gpu", gpu, "/pipe"));
    std::string env =
        testing::ReadText(absl::StrCat(d[gpu].pipe_directory, "/fake_env_", d[gpu].pid));
    EXPECT_THAT(env, HasSubstr(absl::StrCat("CUDA_VISIBLE_DEVICES=", gpu, "\n")));
    EXPECT_THAT(env, HasSubstr(absl::StrCat(base_, "/gpu", gpu, "/log")));
  }
  const pid_t gpu0 = d[0].pid, gpu1 = d[1].pid;
  // More tenants: the same daemons.
  ASSERT_TRUE(manager.Reconcile({3, 1}).ok());
  EXPECT_EQ(manager.daemons()[0].pid, gpu0);
  // The last tenant leaves GPU 0: its daemon gets `quit`; GPU 1's stays.
  ASSERT_TRUE(manager.Reconcile({0, 1}).ok());
  EXPECT_EQ(manager.daemons()[0].pid, 0);
  for (int i = 0; i < 200 && ProcessAlive(gpu0); ++i) usleep(10000);
  EXPECT_FALSE(ProcessAlive(gpu0));
  EXPECT_THAT(testing::ReadText(absl::StrCat(base_, "/gpu0/pipe/fake_commands")),
              HasSubstr("quit"));
  EXPECT_EQ(manager.daemons()[1].pid, gpu1);
  // Shutdown quits the rest.
  manager.Shutdown();
  EXPECT_EQ(manager.daemons()[1].pid, 0);
  EXPECT_THAT(testing::ReadText(absl::StrCat(base_, "/gpu1/pipe/fake_commands")),
              HasSubstr("quit"));
}

TEST_F(MpsManagerTest, ADaemonThatDiedIsStartedAgainWhileTenantsNeedIt) {
  MpsManager manager({.base_directory = base_});
  ASSERT_TRUE(manager.Reconcile({2}).ok());
  pid_t first = manager.daemons()[0].pid;
  ASSERT_EQ(kill(first, SIGKILL), 0);
  for (int i = 0; i < 200 && ProcessAlive(first); ++i) usleep(10000);
  EXPECT_EQ(manager.daemons()[0].pid, 0);  // noticed as gone
  ASSERT_TRUE(manager.Reconcile({2}).ok());
  pid_t second = manager.daemons()[0].pid;
  EXPECT_GT(second, 0);
  EXPECT_NE(second, first);
}

TEST_F(MpsManagerTest, ADaemonThatCannotStartIsAnErrorKeptOnTheGpu) {
  MpsManager manager({.base_directory = base_, .binary = "/nonexistent/mps-control"});
  absl::Status s = manager.Reconcile({1});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(manager.daemons()[0].error, HasSubstr("cannot run"));
}

TEST_F(MpsManagerTest, AnotherUsersDaemonInThePipeDirectoryIsRefusedSayingSo) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another user";
  // A process of user nobody stands in for another user's daemon.
  FILE* p = popen("setpriv --reuid=65534 --regid=65534 --clear-groups sleep 30 & echo $!", "r");
  ASSERT_NE(p, nullptr);
  int pid = 0;
  ASSERT_EQ(fscanf(p, "%d", &pid), 1);
  pclose(p);
  std::filesystem::create_directories(base_ + "/gpu0/pipe");
  std::ofstream(base_ + "/gpu0/pipe/nvidia-cuda-mps-control.pid") << pid << "\n";
  usleep(100000);
  MpsManager manager({.base_directory = base_});
  absl::Status owned = manager.CheckOwnership({0});
  EXPECT_EQ(owned.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(owned.message(), HasSubstr("another user's MPS control daemon"));
  EXPECT_THAT(owned.message(), HasSubstr("MPS user"));
  EXPECT_EQ(manager.Reconcile({1}).code(), absl::StatusCode::kFailedPrecondition);
  kill(pid, SIGKILL);
}

}  // namespace
}  // namespace tessera
