#include "server/mps/control_client.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/testing/fake_mps.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(MpsParseTest, RepliesInTheDocumentedForms) {
  EXPECT_THAT(*ParsePidList("get_server_list", "6472\n7001\n"), ElementsAre(6472, 7001));
  EXPECT_TRUE(ParsePidList("get_server_list", "")->empty());
  EXPECT_EQ(ParsePidList("get_client_list 1", "oops").status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(*ParseServerState("ACTIVE\n"), MpsServerState::kActive);
  EXPECT_EQ(*ParseServerState("FAULT"), MpsServerState::kFault);
  EXPECT_EQ(*ParseServerState("INITIALIZING"), MpsServerState::kInitializing);
  EXPECT_FALSE(ParseServerState("SLEEPING").ok());
  // The guide's example.
  auto ps = ParsePs(
      "PID ID SERVER DEVICE NAMESPACE COMMAND\n"
      "9741 0 6472 GPU-cb1213a3-d6a4-be7f 4026531836 ./nbody -benchmark\n"
      "9743 0 6472 GPU-cb1213a3-d6a4-be7f 4026531836 ./matrixMul\n");
  ASSERT_TRUE(ps.ok()) << ps.status();
  ASSERT_EQ(ps->size(), 2u);
  EXPECT_EQ((*ps)[0].pid, 9741);
  EXPECT_EQ((*ps)[0].server, 6472);
  EXPECT_EQ((*ps)[0].device, "GPU-cb1213a3-d6a4-be7f");
  EXPECT_EQ((*ps)[0].pid_namespace, "4026531836");
  EXPECT_EQ((*ps)[0].command, "./nbody -benchmark");
  EXPECT_FALSE(ParsePs("PID ID SERVER DEVICE NAMESPACE COMMAND\nbroken line\n").ok());
  EXPECT_EQ(*ParsePercentage("37.5\n"), 37.5);
  EXPECT_FALSE(ParsePercentage("lots").ok());
}

class MpsControlClientTest : public ::testing::Test {
 protected:
  void SetUp() override { fake_.Start(); }
  testing::FakeMps fake_;
};

TEST_F(MpsControlClientTest, QueriesAndSettingsAgainstTheDaemon) {
  MpsControlClient client = fake_.Client();
  EXPECT_TRUE(client.GetServerList()->empty());
  fake_.Write("fake_servers", "6472\n");
  fake_.Write("fake_status_6472", "FAULT\n");
  fake_.Write("fake_clients_6472", "9741\n9743\n");
  fake_.Write("fake_ps", "9741 0 6472 GPU-cb12 4026531836 ./nbody\n");
  EXPECT_THAT(*client.GetServerList(), ElementsAre(6472));
  EXPECT_EQ(*client.GetServerStatus(6472), MpsServerState::kFault);
  EXPECT_THAT(*client.GetClientList(6472), ElementsAre(9741, 9743));
  EXPECT_EQ(client.Ps()->at(0).command, "./nbody");

  EXPECT_EQ(*client.GetDefaultActiveThreadPercentage(), 100.0);
  ASSERT_TRUE(client.SetDefaultActiveThreadPercentage(40).ok());
  EXPECT_EQ(*client.GetDefaultActiveThreadPercentage(), 40.0);
  EXPECT_EQ(client.SetDefaultActiveThreadPercentage(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client.SetDefaultActiveThreadPercentage(150).code(),
            absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(client.SetDefaultDevicePinnedMemLimit(0, "10G").ok());
  EXPECT_EQ(*client.GetDefaultDevicePinnedMemLimit(0), "10G");
  absl::Status bad = client.SetDefaultDevicePinnedMemLimit(0, "10T");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("G or M"));

  ASSERT_TRUE(client.TerminateClient(6472, 9741).ok());
  EXPECT_THAT(*client.GetClientList(6472), ElementsAre(9743));
  EXPECT_EQ(client.TerminateClient(6472, 1).code(), absl::StatusCode::kUnavailable);

  ASSERT_TRUE(client.Quit().ok());
  absl::Status gone = client.GetServerList().status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(gone.message(), HasSubstr("Cannot find MPS control daemon"));
}

TEST_F(MpsControlClientTest, AnUnknownCommandIsAClearRefusal) {
  absl::StatusOr<std::string> out = fake_.Client().Run("make_coffee");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out.status().message(), HasSubstr("rejected \"make_coffee\""));
}

TEST_F(MpsControlClientTest, ANonZeroExitIsUnavailableWithWhatItSaid) {
  fake_.Write("fake_mode", "error\n");
  absl::Status s = fake_.Client().GetServerList().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("exited with status 3"));
  EXPECT_THAT(s.message(), HasSubstr("internal error"));
}

TEST_F(MpsControlClientTest, ACrashIsUnavailableNamingTheSignal) {
  fake_.Write("fake_mode", "crash\n");
  absl::Status s = fake_.Client().GetServerList().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("signal 11"));
}

TEST_F(MpsControlClientTest, AHangIsCutOffAtTheTimeout) {
  fake_.Write("fake_mode", "hang\n");
  MpsControlClient::Options options = fake_.Client().options();
  options.timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::Status s = MpsControlClient(options).GetServerList().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("killed"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// The server blocks SIGTERM in its threads (main.cc); what it starts must not inherit that.
TEST(MpsControlClientSpawnTest, ChildrenStartWithNoSignalBlocked) {
  sigset_t term, previous;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &term, &previous), 0);
  // /bin/sh runs the "command" it reads on stdin.
  absl::StatusOr<std::string> out =
      MpsControlClient({.binary = "/bin/sh"}).Run("grep SigBlk /proc/self/status");
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, HasSubstr("SigBlk:\t0000000000000000"));
}

TEST(MpsControlClientMissingTest, AMissingBinaryIsFailedPrecondition) {
  MpsControlClient client({.binary = "/nonexistent/nvidia-cuda-mps-control"});
  absl::Status s = client.GetServerList().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("cannot run"));
}

}  // namespace
}  // namespace tessera
