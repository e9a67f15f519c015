// Smoke test of the `tessera` CLI against a real server.
#include "gmock/gmock.h"
#include "gtest/gtest.h"

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
  EXPECT_THAT(registered.output, HasSubstr("context:         CPU"));

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
  EXPECT_THAT(info.output, HasSubstr("backend:   cpu"));
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

}  // namespace
}  // namespace tessera
