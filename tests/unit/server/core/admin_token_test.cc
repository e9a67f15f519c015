#include "server/core/admin_token.h"

#include <fstream>

#include <sys/stat.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/testing/temp_dir.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

std::string ReadLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

TEST(AdminTokenTest, CreatesA0600FileOnceAndReusesIt) {
  testing::TempDir dir;
  std::string path = dir.File("admin.token");
  auto first = LoadOrCreateAdminToken(path, "");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->created);
  EXPECT_EQ(first->source, path);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string token = ReadLine(path);
  EXPECT_EQ(token.size(), 43u);
  EXPECT_EQ(first->hash, HashCredential(token));

  auto second = LoadOrCreateAdminToken(path, "");
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->created);
  EXPECT_EQ(second->hash, first->hash);
  EXPECT_TRUE(second->warning.empty());
}

TEST(AdminTokenTest, EnvironmentOverridesTheFile) {
  testing::TempDir dir;
  auto credential = LoadOrCreateAdminToken(dir.File("admin.token"), "  env-token-0123456789\n");
  ASSERT_TRUE(credential.ok());
  EXPECT_EQ(credential->hash, HashCredential("env-token-0123456789"));
  EXPECT_EQ(credential->source, "$TESSERA_ADMIN_TOKEN");
  EXPECT_FALSE(std::ifstream(dir.File("admin.token")).good());  // no file written
}

TEST(AdminTokenTest, ShortTokensAreRefused) {
  testing::TempDir dir;
  absl::Status s = LoadOrCreateAdminToken(dir.File("x"), "short").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("at least 16"));
  std::ofstream(dir.File("weak")) << "tiny\n";
  EXPECT_EQ(LoadOrCreateAdminToken(dir.File("weak"), "").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(AdminTokenTest, WarnsAboutAReadableFile) {
  testing::TempDir dir;
  std::string path = dir.File("open.token");
  std::ofstream(path) << "an-operator-chosen-token\n";
  chmod(path.c_str(), 0644);
  auto credential = LoadOrCreateAdminToken(path, "");
  ASSERT_TRUE(credential.ok());
  EXPECT_EQ(credential->hash, HashCredential("an-operator-chosen-token"));
  EXPECT_THAT(credential->warning, HasSubstr("chmod 600"));
}

TEST(AdminTokenTest, UncreatableFileIsAClearError) {
  absl::Status s = LoadOrCreateAdminToken("/nonexistent-dir/admin.token", "").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("/nonexistent-dir/admin.token"));
}

}  // namespace
}  // namespace tessera
