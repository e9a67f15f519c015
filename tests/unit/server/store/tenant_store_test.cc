#include "server/store/tenant_store.h"

#include <sqlite3.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "server/core/token.h"
#include "server/store/state_dir.h"
#include "tests/testing/temp_dir.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TenantRecord Record(const std::string& id) {
  TenantRecord r;
  r.id = id;
  r.display_name = "Team " + id;
  r.labels = {{"team", id}, {"env", "prod"}};
  r.quota = Quota{.device_memory_bytes = uint64_t{3} << 40,
                  .compute_share_percent = 25,
                  .max_streams = 8,
                  .max_queued_jobs = 512,
                  .priority = Priority::kLow};
  r.device_index = 1;
  r.create_time = absl::FromUnixMicros(1700000000123456);
  r.update_time = absl::FromUnixMicros(1700000001000000);
  r.key_create_time = absl::FromUnixMicros(1700000002000000);
  r.key_hash = HashCredential("key-" + id);
  return r;
}

// Turns the store file at `path` back into what an older server left, by running `sql` on it.
void RewriteAsOlderServer(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  sqlite3_close(db);
  ASSERT_EQ(rc, SQLITE_OK);
}

TEST(TenantStoreTest, RoundTripSurvivesReopen) {
  testing::TempDir dir;
  std::string path = dir.File("tenants.db");
  {
    auto store = TenantStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Insert(Record("beta")).ok());
    ASSERT_TRUE((*store)->Insert(Record("alpha")).ok());
    TenantRecord no_labels = Record("gamma");
    no_labels.labels.clear();
    ASSERT_TRUE((*store)->Insert(no_labels).ok());
  }
  auto store = TenantStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto records = (*store)->LoadAll();
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 3u);
  EXPECT_EQ((*records)[0], Record("alpha"));  // every field, ordered by id
  EXPECT_EQ((*records)[1], Record("beta"));
  EXPECT_EQ((*records)[2].id, "gamma");
  EXPECT_TRUE((*records)[2].labels.empty());
}

TEST(TenantStoreTest, InsertDuplicateIsAlreadyExists) {
  testing::TempDir dir;
  auto store = *TenantStore::Open(dir.File("t.db"));
  ASSERT_TRUE(store->Insert(Record("alpha")).ok());
  absl::Status dup = store->Insert(Record("alpha"));
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(dup.message(), HasSubstr("alpha"));
  EXPECT_EQ(store->LoadAll()->size(), 1u);
}

TEST(TenantStoreTest, UpdateReplacesFieldsAndLabels) {
  testing::TempDir dir;
  auto store = *TenantStore::Open(dir.File("t.db"));
  ASSERT_TRUE(store->Insert(Record("alpha")).ok());
  TenantRecord changed = Record("alpha");
  changed.display_name = "renamed";
  changed.labels = {{"only", "one"}};
  changed.key_hash = HashCredential("rotated");
  ASSERT_TRUE(store->Update(changed).ok());
  EXPECT_THAT(*store->LoadAll(), ElementsAre(changed));
  EXPECT_EQ(store->Update(Record("nobody")).code(), absl::StatusCode::kNotFound);
}

TEST(TenantStoreTest, DeleteRemovesTenantAndLabels) {
  testing::TempDir dir;
  std::string path = dir.File("t.db");
  {
    auto store = *TenantStore::Open(path);
    ASSERT_TRUE(store->Insert(Record("alpha")).ok());
    ASSERT_TRUE(store->Insert(Record("beta")).ok());
    ASSERT_TRUE(store->Delete("alpha").ok());
    EXPECT_EQ(store->Delete("alpha").code(), absl::StatusCode::kNotFound);
  }
  auto store = *TenantStore::Open(path);
  EXPECT_THAT(*store->LoadAll(), ElementsAre(Record("beta")));
  // No orphaned labels: re-registering the id starts clean.
  TenantRecord again = Record("alpha");
  again.labels = {{"fresh", "yes"}};
  ASSERT_TRUE(store->Insert(again).ok());
  EXPECT_EQ(store->LoadAll()->front().labels, (Labels{{"fresh", "yes"}}));
}

TEST(TenantStoreTest, KernelsAreStoredPerTenantAndLeaveWithIt) {
  testing::TempDir dir;
  std::string path = dir.File("t.db");
  const absl::Time t = absl::FromUnixSeconds(1700000000);
  {
    auto store = *TenantStore::Open(path);
    ASSERT_TRUE(store->Insert(Record("alpha")).ok());
    ASSERT_TRUE(store->Insert(Record("beta")).ok());
    ASSERT_TRUE(
        store->InsertKernel({"alpha", "k", "kernel k(x: f32) -> (y: f32) { y = x }", t}).ok());
    ASSERT_TRUE(
        store->InsertKernel({"beta", "k", "kernel k(x: f32) -> (y: f32) { y = -x }", t}).ok());
    EXPECT_EQ(store->InsertKernel({"alpha", "k", "other", t}).code(),
              absl::StatusCode::kAlreadyExists);
    EXPECT_EQ(store->InsertKernel({"nobody", "k", "x", t}).code(), absl::StatusCode::kNotFound);
  }
  auto store = *TenantStore::Open(path);
  auto kernels = store->LoadKernels();
  ASSERT_TRUE(kernels.ok()) << kernels.status();
  ASSERT_EQ(kernels->size(), 2u);
  EXPECT_EQ((*kernels)[0].tenant_id, "alpha");
  EXPECT_EQ((*kernels)[0].source, "kernel k(x: f32) -> (y: f32) { y = x }");
  EXPECT_EQ((*kernels)[0].create_time, t);
  EXPECT_EQ((*kernels)[1].tenant_id, "beta");
  // Deleting one kernel, then a tenant, takes its kernels with it.
  EXPECT_EQ(store->DeleteKernel("alpha", "nope").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store->DeleteKernel("alpha", "k").ok());
  ASSERT_TRUE(store->Delete("beta").ok());
  EXPECT_TRUE(store->LoadKernels()->empty());
}

TEST(TenantStoreTest, AVersionOneFileIsMigrated) {
  testing::TempDir dir;
  std::string path = dir.File("t.db");
  {
    auto store = *TenantStore::Open(path);
    ASSERT_TRUE(store->Insert(Record("alpha")).ok());
  }
  // As a version-1 server left it: no kernel table, no request quota columns.
  RewriteAsOlderServer(path,
                       "DROP TABLE tenant_kernels; "
                       "ALTER TABLE tenants DROP COLUMN max_requests_in_flight; "
                       "ALTER TABLE tenants DROP COLUMN requests_per_second; "
                       "ALTER TABLE tenants DROP COLUMN max_region_bytes; "
                       "PRAGMA user_version = 1");
  auto store = TenantStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_THAT(*(*store)->LoadAll(), ElementsAre(Record("alpha")));
  EXPECT_TRUE((*store)->InsertKernel({"alpha", "k", "src", absl::Now()}).ok());
}

TEST(TenantStoreTest, AVersionTwoFileGainsTheRequestQuotaColumns) {
  testing::TempDir dir;
  std::string path = dir.File("t.db");
  TenantRecord alpha = Record("alpha");
  alpha.quota.max_requests_in_flight = 8;
  alpha.quota.requests_per_second = 500;
  {
    auto store = *TenantStore::Open(path);
    ASSERT_TRUE(store->Insert(alpha).ok());
  }
  RewriteAsOlderServer(path,
                       "ALTER TABLE tenants DROP COLUMN max_requests_in_flight; "
                       "ALTER TABLE tenants DROP COLUMN requests_per_second; "
                       "ALTER TABLE tenants DROP COLUMN max_region_bytes; "
                       "PRAGMA user_version = 2");
  auto store = TenantStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<TenantRecord> loaded = *(*store)->LoadAll();
  ASSERT_EQ(loaded.size(), 1u);
  // Not set: the tenant table fills in the defaults when it restores the tenant.
  EXPECT_EQ(loaded[0].quota.max_requests_in_flight, 0u);
  EXPECT_EQ(loaded[0].quota.requests_per_second, 0u);
  ASSERT_TRUE((*store)->Update(alpha).ok());
  EXPECT_THAT(*(*store)->LoadAll(), ElementsAre(alpha));
}

TEST(TenantStoreTest, AVersionThreeFileGainsTheRegionQuotaColumn) {
  testing::TempDir dir;
  std::string path = dir.File("t.db");
  TenantRecord alpha = Record("alpha");
  alpha.quota.max_region_bytes = uint64_t{3} << 30;
  {
    auto store = *TenantStore::Open(path);
    ASSERT_TRUE(store->Insert(alpha).ok());
  }
  RewriteAsOlderServer(path,
                       "ALTER TABLE tenants DROP COLUMN max_region_bytes; "
                       "PRAGMA user_version = 3");
  auto store = TenantStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<TenantRecord> loaded = *(*store)->LoadAll();
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0].quota.max_region_bytes, 0u);  // not set: defaulted on restore
  ASSERT_TRUE((*store)->Update(alpha).ok());
  EXPECT_THAT(*(*store)->LoadAll(), ElementsAre(alpha));
}

TEST(TenantStoreTest, UsesWalAndFullSync) {
  testing::TempDir dir;
  std::string path = dir.File("t.db");
  auto store = *TenantStore::Open(path);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &stmt, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)), "wal");
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

TEST(TenantStoreTest, RefusesNewerSchema) {
  testing::TempDir dir;
  std::string path = dir.File("t.db");
  { ASSERT_TRUE(TenantStore::Open(path).ok()); }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 99", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  absl::Status s = TenantStore::Open(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("schema version 99"));
}

TEST(StateDirTest, SecondHolderIsRefused) {
  testing::TempDir dir;
  std::string path = dir.File("state");
  auto first = StateDir::Open(path);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::Status second = StateDir::Open(path).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.message(), HasSubstr("in use by another tessera-server"));
  first->reset();
  EXPECT_TRUE(StateDir::Open(path).ok());
}

}  // namespace
}  // namespace tessera
