// Smoke test of the `tessera` CLI against a real server.
#include <cstring>

#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/npy.h"
#include "tests/testing/server_fixture.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class CliTest : public testing::ServerTest {
 protected:
  testing::CommandResult Cli(std::vector<std::string> args, std::string token = "") {
    args.insert(args.begin(), testing::CliBinary());
    std::map<std::string, std::string> env = {
        {"TESSERA_ADDR", server_->address()},
        {"TESSERA_TOKEN", token.empty() ? server_->AdminToken() : token}};
    auto result = testing::RunCommand(args, env);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : testing::CommandResult{};
  }
};

TEST_F(CliTest, TenantLifecycle) {
  auto registered = Cli({"tenant", "register", "alpha", "--memory=2GiB", "--compute_share=30",
                         "--display_name=Alpha team", "--labels=team=ml,env=dev"});
  ASSERT_EQ(registered.exit_code, 0) << registered.output;
  EXPECT_THAT(registered.output, HasSubstr("api key:         tsk_alpha."));
  EXPECT_THAT(registered.output, HasSubstr("compute share:   30%"));
  const std::string kind = v1::ContextKind_Name(ExpectedContextKind(30));
  EXPECT_THAT(registered.output, HasSubstr(absl::StrCat("context:         ",
                                                        absl::StripPrefix(kind, "CONTEXT_KIND_"))));

  auto listed = Cli({"tenant", "list"});
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr("alpha"));
  EXPECT_THAT(listed.output, HasSubstr("2.0 GiB"));

  auto json = Cli({"tenant", "get", "alpha", "--output=json"});
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_THAT(json.output, HasSubstr("\"tenant_id\": \"alpha\""));
  EXPECT_THAT(json.output, HasSubstr("\"device_memory_bytes\": \"2147483648\""));

  auto updated = Cli({"tenant", "update", "alpha", "--labels=env=prod"});
  ASSERT_EQ(updated.exit_code, 0) << updated.output;
  EXPECT_THAT(updated.output, HasSubstr("labels:          env=prod"));
  EXPECT_THAT(updated.output, HasSubstr("display_name:    Alpha team"));  // untouched

  auto quota = Cli({"tenant", "update", "alpha", "--memory=4GiB"});
  EXPECT_EQ(quota.exit_code, 1);
  EXPECT_THAT(quota.output, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(quota.output, HasSubstr("deregister the tenant and register it again"));

  auto rotated = Cli({"tenant", "rotate-key", "alpha"});
  ASSERT_EQ(rotated.exit_code, 0) << rotated.output;
  EXPECT_THAT(rotated.output, HasSubstr("api key: tsk_alpha."));

  auto info = Cli({"server", "info"});
  ASSERT_EQ(info.exit_code, 0) << info.output;
  EXPECT_THAT(info.output, HasSubstr("backend:   " + backend().name));
  EXPECT_THAT(info.output, HasSubstr("reserved 2.0 GiB of 8.0 GiB"));

  auto gone = Cli({"tenant", "deregister", "alpha"});
  ASSERT_EQ(gone.exit_code, 0) << gone.output;
  EXPECT_THAT(gone.output, HasSubstr("released 2.0 GiB"));
  EXPECT_THAT(Cli({"tenant", "list"}).output, Not(HasSubstr("alpha")));
}

TEST_F(CliTest, ErrorsAndExitCodes) {
  auto missing = Cli({"tenant", "get", "nobody"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.output, HasSubstr("NOT_FOUND"));
  auto denied = Cli({"server", "info"}, "wrong-token");
  EXPECT_EQ(denied.exit_code, 1);
  EXPECT_THAT(denied.output, HasSubstr("UNAUTHENTICATED"));
  auto no_memory = Cli({"tenant", "register", "beta"});
  EXPECT_EQ(no_memory.exit_code, 1);
  EXPECT_THAT(no_memory.output, HasSubstr("quota.device_memory_bytes is required"));
  EXPECT_EQ(Cli({"frobnicate"}).exit_code, 2);
  EXPECT_EQ(Cli({"tenant", "register", "x", "--memory=lots"}).exit_code, 1);  // flag parse error
  EXPECT_EQ(Cli({"tenant", "update", "x"}).exit_code, 2);
}

TEST_F(CliTest, TensorsKernelsAndUsage) {
  auto registered = admin_->RegisterTenant(Registration("alpha", testing::kGiB));
  ASSERT_TRUE(registered.ok());
  const std::string key = registered->api_key();
  auto run = Cli({"run", "fill", "--attr=shape=[2,3];value=2.5", "--output=json"}, key);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("JOB_STATE_SUCCEEDED"));
  size_t at = run.output.find("\"handle\": \"");
  ASSERT_NE(at, std::string::npos);
  std::string handle = run.output.substr(at + 11, run.output.find('"', at + 11) - at - 11);

  testing::TempDir files;
  auto got = Cli({"tensor", "get", handle, "-o", files.File("x.npy")}, key);
  ASSERT_EQ(got.exit_code, 0) << got.output;
  auto array = ReadNpyFile(files.File("x.npy"));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dtype, v1::DTYPE_F32);
  EXPECT_EQ(array->shape, (std::vector<int64_t>{2, 3}));
  float first;
  std::memcpy(&first, array->data.data(), 4);
  EXPECT_EQ(first, 2.5f);

  auto put = Cli({"tensor", "put", files.File("x.npy")}, key);
  ASSERT_EQ(put.exit_code, 0) << put.output;
  std::string uploaded(absl::StripAsciiWhitespace(put.output));
  auto summed = Cli({"run", "add", "--in=" + handle + "," + uploaded}, key);
  ASSERT_EQ(summed.exit_code, 0) << summed.output;
  EXPECT_THAT(summed.output, HasSubstr("SUCCEEDED"));

  auto ls = Cli({"tensor", "ls"}, key);
  EXPECT_THAT(ls.output, HasSubstr(handle));
  EXPECT_THAT(ls.output, HasSubstr("[2, 3]"));
  EXPECT_THAT(Cli({"kernels"}, key).output, HasSubstr("matmul"));
  auto usage = Cli({"usage"}, key);
  EXPECT_THAT(usage.output, HasSubstr("tensors: 3"));
  EXPECT_THAT(usage.output, HasSubstr("2 succeeded"));
  auto rm = Cli({"tensor", "rm", uploaded}, key);
  EXPECT_EQ(rm.exit_code, 0) << rm.output;
  auto bad = Cli({"run", "matmul", "--in=" + handle + "," + handle}, key);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.output, HasSubstr("inner dimensions differ"));
}

TEST_F(CliTest, ProgressBarOnTerminalsOnly) {
  if (access("/usr/bin/script", X_OK) != 0) GTEST_SKIP() << "util-linux script(1) is missing";
  auto registered = admin_->RegisterTenant(Registration("alpha", testing::kGiB));
  ASSERT_TRUE(registered.ok());
  testing::TempDir files;
  NpyArray array{v1::DTYPE_F32, {2 << 20}, std::string(size_t{8} << 20, '\0')};  // 8 MiB
  ASSERT_TRUE(WriteNpyFile(files.File("big.npy"), array).ok());
  std::map<std::string, std::string> env = {{"TESSERA_ADDR", server_->address()},
                                            {"TESSERA_TOKEN", registered->api_key()}};
  // script(1) gives the CLI a pseudo-terminal.
  std::string command = absl::StrCat(testing::CliBinary(), " tensor put ", files.File("big.npy"));
  auto on_terminal = testing::RunCommand({"/usr/bin/script", "-qec", command, "/dev/null"}, env);
  ASSERT_TRUE(on_terminal.ok()) << on_terminal.status();
  EXPECT_EQ(on_terminal->exit_code, 0) << on_terminal->output;
  EXPECT_THAT(on_terminal->output, HasSubstr("put ["));
  EXPECT_THAT(on_terminal->output, HasSubstr("100% 8.0 MiB / 8.0 MiB"));
  auto piped =
      testing::RunCommand({testing::CliBinary(), "tensor", "put", files.File("big.npy")}, env);
  ASSERT_TRUE(piped.ok());
  EXPECT_EQ(piped->exit_code, 0);
  EXPECT_THAT(piped->output, Not(HasSubstr("put [")));
}

}  // namespace
}  // namespace tessera
