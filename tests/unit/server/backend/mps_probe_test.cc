#include "server/backend/mps_probe.h"

#include <fstream>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/testing/fake_mps.h"
#include "tests/testing/temp_dir.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

void WritePidFile(const std::string& dir, const std::string& text) {
  std::ofstream(dir + "/" + kMpsControlPidFile) << text;
}

// A pid that certainly is not running: a child that has exited and been reaped.
pid_t DeadPid() {
  pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return child;
}

TEST(MpsProbeTest, HonoursThePipeDirectoryVariableBeforeTheDefault) {
  testing::TempDir dir;
  EXPECT_EQ(ProbeMps(dir.path().c_str()).pipe_directory, dir.path());
  EXPECT_EQ(ProbeMps(nullptr).pipe_directory, kDefaultMpsPipeDirectory);
  EXPECT_EQ(ProbeMps("").pipe_directory, kDefaultMpsPipeDirectory);
}

TEST(MpsProbeTest, MissingDirectoryOrPidFileMeansNoDaemon) {
  testing::TempDir dir;
  MpsProbe missing = ProbeMps(dir.File("absent").c_str());
  EXPECT_FALSE(missing.directory_found);
  EXPECT_FALSE(missing.daemon_running);
  EXPECT_THAT(missing.summary, HasSubstr("does not exist"));

  MpsProbe no_pid = ProbeMps(dir.path().c_str());
  EXPECT_TRUE(no_pid.directory_found);
  EXPECT_FALSE(no_pid.daemon_running);
  EXPECT_THAT(no_pid.summary, HasSubstr(kMpsControlPidFile));
}

TEST(MpsProbeTest, ReadsTheDaemonPidAndChecksItIsAlive) {
  testing::TempDir dir;
  testing::StandInDaemon daemon;
  WritePidFile(dir.path(), std::to_string(daemon.pid()) + "\n");
  MpsProbe alive;
  for (int i = 0; i < 200; ++i) {  // until the child has exec'ed
    alive = ProbeMps(dir.path().c_str());
    if (alive.daemon_running) break;
    usleep(5000);
  }
  ASSERT_TRUE(alive.daemon_pid.has_value());
  EXPECT_EQ(*alive.daemon_pid, daemon.pid());
  EXPECT_TRUE(alive.daemon_running) << alive.summary;
  EXPECT_FALSE(alive.daemon_other_user);
  EXPECT_THAT(alive.summary, HasSubstr("running"));

  // A live pid of another program (here this test) is a pid file that outlived its daemon.
  WritePidFile(dir.path(), std::to_string(getpid()) + "\n");
  MpsProbe reused = ProbeMps(dir.path().c_str());
  EXPECT_FALSE(reused.daemon_running);
  EXPECT_THAT(reused.summary, HasSubstr("not nvidia-cuda-mps-control (a stale pid file)"));

  pid_t dead = DeadPid();
  WritePidFile(dir.path(), std::to_string(dead));
  MpsProbe stale = ProbeMps(dir.path().c_str());
  EXPECT_EQ(stale.daemon_pid, dead);
  EXPECT_FALSE(stale.daemon_running);
  EXPECT_TRUE(stale.daemon_not_visible);
  EXPECT_THAT(stale.summary, HasSubstr("stale pid file"));
  EXPECT_FALSE(reused.daemon_not_visible);

  for (const char* junk : {"", "abc", "-5", "0", "12x"}) {
    WritePidFile(dir.path(), junk);
    MpsProbe bad = ProbeMps(dir.path().c_str());
    EXPECT_FALSE(bad.daemon_pid.has_value()) << junk;
    EXPECT_FALSE(bad.daemon_running) << junk;
    EXPECT_THAT(bad.summary, HasSubstr("does not hold a pid")) << junk;
  }
}

// The decision table: mode × what the probe found.
TEST(MpsProbeTest, DecisionTable) {
  MpsProbe none{.pipe_directory = "/d", .summary = "no MPS control daemon: x"};
  MpsProbe running{.pipe_directory = "/d",
                   .directory_found = true,
                   .daemon_pid = 42,
                   .daemon_running = true,
                   .summary = "MPS control daemon running (pid 42)"};
  MpsProbe foreign = running;
  foreign.daemon_other_user = true;
  foreign.summary = "belongs to another user";

  EXPECT_EQ(DecideMps("auto", running)->decision, MpsDecision::kMps);
  EXPECT_EQ(DecideMps("require", running)->decision, MpsDecision::kMps);
  EXPECT_THAT(DecideMps("auto", running)->reason, HasSubstr("pid 42"));

  EXPECT_EQ(DecideMps("auto", none)->decision, MpsDecision::kFallback);
  EXPECT_THAT(DecideMps("auto", none)->reason, HasSubstr("--mps=auto: no MPS control daemon"));
  EXPECT_EQ(DecideMps("auto", foreign)->decision, MpsDecision::kFallback);
  EXPECT_THAT(DecideMps("auto", foreign)->reason, HasSubstr("another user"));

  for (const MpsProbe& p : {none, running, foreign}) {
    EXPECT_EQ(DecideMps("off", p)->decision, MpsDecision::kFallback);
    EXPECT_EQ(DecideMps("off", p)->reason, "--mps=off");
  }

  absl::Status refused = DecideMps("require", none).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("--mps=require: no MPS control daemon"));
  EXPECT_TRUE(absl::IsFailedPrecondition(DecideMps("require", foreign).status()));

  // A pid file naming no process here: gone, or a daemon in another container. --mps=auto
  // does not count on it; --mps=require trusts the pipe directory and lets the driver decide.
  MpsProbe elsewhere{.pipe_directory = "/mps",
                     .directory_found = true,
                     .daemon_pid = 42,
                     .daemon_not_visible = true,
                     .summary = "no MPS control daemon: pid 42 ... is not running here"};
  EXPECT_EQ(DecideMps("auto", elsewhere)->decision, MpsDecision::kFallback);
  ASSERT_TRUE(DecideMps("require", elsewhere).ok());
  EXPECT_EQ(DecideMps("require", elsewhere)->decision, MpsDecision::kMps);
  EXPECT_THAT(DecideMps("require", elsewhere)->reason, HasSubstr("the driver must connect"));

  absl::Status bad = DecideMps("sometimes", running).status();
  EXPECT_TRUE(absl::IsInvalidArgument(bad)) << bad;
  EXPECT_THAT(bad.message(), HasSubstr("--mps=sometimes"));
}

}  // namespace
}  // namespace tessera
