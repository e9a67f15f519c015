#include "server/core/admin_token.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

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

TEST(AdminTokenTest, ConcurrentStartsAgreeOnOneTokenAndLeaveNoTemporaryFile) {
  testing::TempDir dir;
  const std::string path = dir.File("admin.token");
  constexpr int kThreads = 8;
  std::vector<absl::StatusOr<AdminCredential>> results(kThreads, absl::UnknownError("not run"));
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      results[i] = LoadOrCreateAdminToken(path, "");
    });
  }
  go = true;
  for (std::thread& t : threads) t.join();
  const std::string token = ReadLine(path);
  int created = 0;
  for (const auto& result : results) {
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->hash, HashCredential(token));
    created += result->created ? 1 : 0;
  }
  EXPECT_EQ(created, 1);
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(names, ::testing::ElementsAre("admin.token"));
}

TEST(AdminTokenTest, ATemporaryFileLeftByACrashIsNotTheToken) {
  testing::TempDir dir;
  const std::string path = dir.File("admin.token");
  // What a crash between creating and linking the temporary file leaves behind.
  std::ofstream(path + ".tmp.1") << "partial";
  auto credential = LoadOrCreateAdminToken(path, "");
  ASSERT_TRUE(credential.ok()) << credential.status();
  EXPECT_TRUE(credential->created);
  EXPECT_EQ(credential->hash, HashCredential(ReadLine(path)));
}

TEST(AdminTokenTest, UncreatableFileIsAClearError) {
  absl::Status s = LoadOrCreateAdminToken("/nonexistent-dir/admin.token", "").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("/nonexistent-dir/admin.token"));
}

}  // namespace
}  // namespace tessera
