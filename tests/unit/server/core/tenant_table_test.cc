#include "server/core/tenant_table.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "server/backend/cpu/cpu_backend.h"
#include "tests/testing/fake_backend.h"
#include "tests/testing/sizes.h"
#include "tests/testing/temp_dir.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

using testing::kGiB;

TenantSpec Spec(const std::string& id, uint64_t memory = kGiB) {
  TenantSpec spec;
  spec.id = id;
  spec.display_name = "Tenant " + id;
  spec.labels = {{"team", id}};
  spec.quota.device_memory_bytes = memory;
  return spec;
}

class TenantTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = std::make_unique<testing::FakeBackend>(std::vector<DeviceInfo>{
        {.index = 0, .name = "gpu0", .memory_bytes = 8 * kGiB, .context_limit = 3},
        {.index = 1, .name = "gpu1", .memory_bytes = 4 * kGiB, .context_limit = 3}});
    Open();
  }

  void Open(double overcommit = 1.0) {
    table_.reset();
    store_.reset();
    store_ = *TenantStore::Open(dir_.File("tenants.db"));
    auto table =
        TenantTable::Create({.memory_overcommit = overcommit}, store_.get(), backend_.get());
    ASSERT_TRUE(table.ok()) << table.status();
    table_ = *std::move(table);
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::FakeBackend> backend_;
  std::unique_ptr<TenantStore> store_;
  std::unique_ptr<TenantTable> table_;
};

TEST_F(TenantTableTest, RegisterCreatesContextAndReturnsAWorkingKey) {
  auto registered = table_->Register(Spec("alpha"));
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_EQ(registered->tenant.record.id, "alpha");
  EXPECT_EQ(registered->tenant.record.quota.max_streams, 4u);  // default filled
  EXPECT_EQ(registered->tenant.context.kind, ContextKind::kFallback);
  EXPECT_EQ(backend_->live_contexts(), 1);
  EXPECT_EQ((*table_->AuthenticateKey(registered->api_key))->tenant_id(), "alpha");
  // Only the hash is stored.
  EXPECT_EQ(registered->tenant.record.key_hash, HashCredential(registered->api_key));
}

TEST_F(TenantTableTest, AStoredQuotaOutOfBoundsStopsTheRestoreNamingTheTenant) {
  ASSERT_TRUE(table_->Register(Spec("alpha")).ok());
  TenantRecord record = table_->Get("alpha")->record;
  record.quota.max_streams = uint32_t{1} << 31;  // what a damaged or hand-edited file can hold
  ASSERT_TRUE(store_->Update(record).ok());
  table_.reset();
  auto table = TenantTable::Create({}, store_.get(), backend_.get());
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(table.status().message(), HasSubstr("\"alpha\""));
  EXPECT_THAT(table.status().message(), HasSubstr("max_streams"));
}

TEST_F(TenantTableTest, TenantsStoredBeforeTheRequestQuotasGetTheirDefaults) {
  ASSERT_TRUE(table_->Register(Spec("alpha")).ok());
  TenantRecord record = table_->Get("alpha")->record;
  EXPECT_EQ(record.quota.max_requests_in_flight, 64u);
  EXPECT_EQ(record.quota.requests_per_second, 1000000u);
  // As a schema-2 file migrates: the new columns read 0.
  record.quota.max_requests_in_flight = 0;
  record.quota.requests_per_second = 0;
  ASSERT_TRUE(store_->Update(record).ok());
  Open();
  EXPECT_EQ(table_->Get("alpha")->record.quota.max_requests_in_flight, 64u);
  EXPECT_EQ(table_->Get("alpha")->record.quota.requests_per_second, 1000000u);
  // ... and the defaults are stored, so the next start reads them back as they are.
  EXPECT_EQ((*store_->LoadAll())[0].quota.requests_per_second, 1000000u);
}

TEST_F(TenantTableTest, TenantsStoredBeforeTheRegionQuotaGetItsDefault) {
  ASSERT_TRUE(table_->Register(Spec("alpha")).ok());
  TenantRecord record = table_->Get("alpha")->record;
  EXPECT_EQ(record.quota.max_region_bytes, record.quota.device_memory_bytes);
  record.quota.max_region_bytes = 0;  // as a schema-3 file migrates
  ASSERT_TRUE(store_->Update(record).ok());
  Open();
  EXPECT_EQ(table_->Get("alpha")->record.quota.max_region_bytes, record.quota.device_memory_bytes);
}

TEST_F(TenantTableTest, DuplicateIdIsAlreadyExists) {
  ASSERT_TRUE(table_->Register(Spec("alpha")).ok());
  absl::Status dup = table_->Register(Spec("alpha")).status();
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(backend_->live_contexts(), 1);
}

TEST_F(TenantTableTest, InvalidSpecIsRefusedBeforeAnyWork) {
  EXPECT_EQ(table_->Register(Spec("Bad_Id")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table_->Register(Spec("alpha", 0)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(backend_->created().empty());
}

TEST_F(TenantTableTest, AdmissionPlacesAndRefuses) {
  // gpu0 has 8 GiB, gpu1 4 GiB: the first goes to gpu0, then the emptier one.
  EXPECT_EQ(table_->Register(Spec("a", 5 * kGiB))->tenant.record.device_index, 0);
  EXPECT_EQ(table_->Register(Spec("b", 2 * kGiB))->tenant.record.device_index, 1);
  absl::Status full = table_->Register(Spec("c", 4 * kGiB)).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("does not fit"));
  TenantSpec pinned = Spec("d", 3 * kGiB);
  pinned.device_index = 0;
  EXPECT_EQ(table_->Register(pinned)->tenant.record.device_index, 0);
  auto loads = table_->DeviceLoads();
  EXPECT_EQ(loads[0].reserved_bytes, 8 * kGiB);
  EXPECT_EQ(loads[0].contexts, 2u);
  EXPECT_EQ(loads[1].reserved_bytes, 2 * kGiB);
  // Deregistering returns the reservation.
  ASSERT_TRUE(table_->Deregister("a").ok());
  EXPECT_TRUE(table_->Register(Spec("c", 4 * kGiB)).ok());
}

TEST_F(TenantTableTest, ContextLimitRefusesWithTheLimit) {
  for (const char* id : {"a", "b", "c", "d", "e", "f"}) {
    ASSERT_TRUE(table_->Register(Spec(id, kGiB / 2)).ok()) << id;
  }
  absl::Status s = table_->Register(Spec("g", kGiB / 2)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("its limit is 3"));
}

TEST_F(TenantTableTest, FailedContextCreationCommitsNothing) {
  backend_->FailContexts(absl::UnavailableError("device busy"));
  absl::Status s = table_->Register(Spec("alpha")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(table_->size(), 0u);
  EXPECT_TRUE(store_->LoadAll()->empty());
  backend_->FailContexts(absl::OkStatus());
  EXPECT_TRUE(table_->Register(Spec("alpha")).ok());
}

TEST_F(TenantTableTest, QuotaIsImmutable) {
  ASSERT_TRUE(table_->Register(Spec("alpha")).ok());
  Quota current = table_->Get("alpha")->record.quota;

  TenantTable::MetadataUpdate named;
  named.quota_named = true;
  absl::Status s = table_->Update("alpha", named).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("deregister the tenant and register it again"));

  TenantTable::MetadataUpdate changed;
  changed.quota = current;
  changed.quota->max_streams = 8;
  EXPECT_EQ(table_->Update("alpha", changed).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // Sending the registered quota back unchanged (get-modify-put) is not a change.
  TenantTable::MetadataUpdate same;
  same.quota = current;
  same.display_name = "renamed";
  auto updated = table_->Update("alpha", same);
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ(updated->record.display_name, "renamed");
  EXPECT_EQ(updated->record.quota, current);

  // Unknown tenants are NOT_FOUND even when the quota is named.
  EXPECT_EQ(table_->Update("nobody", named).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TenantTableTest, UpdateChangesLabelsAndIsDurable) {
  ASSERT_TRUE(table_->Register(Spec("alpha")).ok());
  TenantTable::MetadataUpdate update;
  update.labels = Labels{{"env", "prod"}};
  ASSERT_TRUE(table_->Update("alpha", update).ok());
  TenantTable::MetadataUpdate bad;
  bad.labels = Labels{{"Bad Key", "x"}};
  EXPECT_EQ(table_->Update("alpha", bad).status().code(), absl::StatusCode::kInvalidArgument);
  Open();
  EXPECT_EQ(table_->Get("alpha")->record.labels, (Labels{{"env", "prod"}}));
}

TEST_F(TenantTableTest, RotateKeyRevokesTheOldKeyAtOnce) {
  auto registered = *table_->Register(Spec("alpha"));
  auto rotated = table_->RotateKey("alpha");
  ASSERT_TRUE(rotated.ok());
  EXPECT_EQ(table_->AuthenticateKey(registered.api_key).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*table_->AuthenticateKey(rotated->api_key))->tenant_id(), "alpha");
  Open();  // and after a restart
  EXPECT_EQ(table_->AuthenticateKey(registered.api_key).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*table_->AuthenticateKey(rotated->api_key))->tenant_id(), "alpha");
}

TEST_F(TenantTableTest, AuthenticationRevealsNothing) {
  auto alpha = *table_->Register(Spec("alpha"));
  auto beta = *table_->Register(Spec("beta"));
  std::string forged = "tsk_alpha." + beta.api_key.substr(beta.api_key.find('.') + 1);
  absl::Status wrong_secret = table_->AuthenticateKey(forged).status();
  absl::Status unknown = table_->AuthenticateKey("tsk_nobody.abc").status();
  EXPECT_EQ(wrong_secret.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(wrong_secret.message(), unknown.message());
  EXPECT_EQ(table_->AuthenticateKey("").status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(TenantTableTest, RestoreRebuildsEveryContext) {
  auto alpha = *table_->Register(Spec("alpha", 2 * kGiB));
  ASSERT_TRUE(table_->Register(Spec("beta", kGiB)).ok());
  ASSERT_TRUE(table_->Register(Spec("gamma", kGiB)).ok());
  ASSERT_TRUE(table_->Deregister("gamma").ok());
  auto before = table_->List("", 100);
  EXPECT_EQ(backend_->live_contexts(), 2);

  Open();
  EXPECT_EQ(backend_->live_contexts(), 2);  // old ones released, new ones built
  auto after = table_->List("", 100);
  ASSERT_THAT(after.tenants, SizeIs(2));
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(after.tenants[i].record, before.tenants[i].record);
  }
  EXPECT_EQ((*table_->AuthenticateKey(alpha.api_key))->tenant_id(), "alpha");
  EXPECT_EQ(table_->Get("gamma").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TenantTableTest, RestoreMovesTenantsOffAMissingDevice) {
  TenantSpec spec = Spec("alpha");
  spec.device_index = 1;
  ASSERT_TRUE(table_->Register(spec).ok());
  table_.reset();
  backend_ = std::make_unique<testing::FakeBackend>(
      std::vector<DeviceInfo>{{.index = 0, .name = "gpu0", .memory_bytes = 8 * kGiB}});
  Open();
  EXPECT_EQ(table_->Get("alpha")->record.device_index, 0);
  Open();  // the new placement was persisted
  EXPECT_EQ(table_->Get("alpha")->record.device_index, 0);
}

TEST_F(TenantTableTest, ListPagesInIdOrder) {
  for (const char* id : {"d", "b", "a", "c", "e"})
    ASSERT_TRUE(table_->Register(Spec(id, kGiB / 4)).ok());
  auto first = table_->List("", 2);
  ASSERT_THAT(first.tenants, SizeIs(2));
  EXPECT_EQ(first.tenants[0].record.id, "a");
  EXPECT_EQ(first.last_id, "b");
  EXPECT_EQ(first.total, 5u);
  auto second = table_->List(first.last_id, 2);
  EXPECT_EQ(second.tenants[0].record.id, "c");
  auto last = table_->List(second.last_id, 2);
  ASSERT_THAT(last.tenants, SizeIs(1));
  EXPECT_EQ(last.tenants[0].record.id, "e");
  EXPECT_EQ(last.last_id, "");
}

TEST_F(TenantTableTest, DeregisterIsDurableAndReleasesTheContext) {
  ASSERT_TRUE(table_->Register(Spec("alpha", 3 * kGiB)).ok());
  auto gone = table_->Deregister("alpha");
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->released_memory_bytes, 3 * kGiB);
  EXPECT_EQ(backend_->live_contexts(), 0);
  EXPECT_EQ(table_->Deregister("alpha").status().code(), absl::StatusCode::kNotFound);
  Open();
  EXPECT_EQ(table_->size(), 0u);
}

TEST_F(TenantTableTest, ADeregisteredTenantsHeldMemoryStaysReservedUntilFreed) {
  auto registered = table_->Register(Spec("alpha", 3 * kGiB));
  ASSERT_TRUE(registered.ok());
  std::shared_ptr<TenantRuntime> runtime = *table_->AuthenticateKey(registered->api_key);
  // A transfer still holds a buffer when the tenant goes.
  absl::StatusOr<MemoryCharge> held = runtime->ReserveStaging(1 << 20);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(table_->Deregister("alpha").ok());
  // Readers share the table's lock: several at once, while the buffer is freed, each see the
  // reservation or not, never anything else (a reader once pruned the list it read; the
  // ThreadSanitizer preset saw two do it at once).
  std::atomic<bool> wrong{false};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        const uint64_t reserved = table_->DeviceLoads()[0].reserved_bytes;
        if (reserved != 0 && reserved != 3 * kGiB) wrong = true;
        (void)table_->TenantsPerDevice();
      }
    });
  }
  EXPECT_EQ(table_->DeviceLoads()[0].reserved_bytes + table_->DeviceLoads()[1].reserved_bytes,
            3 * kGiB);
  *held = MemoryCharge();
  for (std::thread& t : readers) t.join();
  EXPECT_FALSE(wrong.load());
  EXPECT_EQ(table_->DeviceLoads()[0].reserved_bytes, 0u);
  EXPECT_EQ(table_->DeviceLoads()[1].reserved_bytes, 0u);
  // The next deregistration drops the drained entry; the reservation stays returned.
  ASSERT_TRUE(table_->Register(Spec("beta")).ok());
  ASSERT_TRUE(table_->Deregister("beta").ok());
  EXPECT_TRUE(table_->Register(Spec("gamma", 8 * kGiB)).ok());
}

TEST_F(TenantTableTest, OvercommitLetsReservationsExceedCapacity) {
  Open(2.0);
  EXPECT_TRUE(table_->Register(Spec("a", 16 * kGiB)).ok());
  EXPECT_EQ(table_->Register(Spec("b", 9 * kGiB)).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(TenantTableCpuTest, CpuContextsReportTheirKindAndReason) {
  testing::TempDir dir;
  CpuBackend backend({.memory_bytes = 4 * kGiB, .worker_threads = 2, .reason = "--backend=cpu"});
  auto store = *TenantStore::Open(dir.File("t.db"));
  auto table = *TenantTable::Create({}, store.get(), &backend);
  auto registered = table->Register(Spec("alpha"));
  ASSERT_TRUE(registered.ok());
  EXPECT_EQ(registered->tenant.context.kind, ContextKind::kCpu);
  EXPECT_THAT(registered->tenant.context.reason, HasSubstr("--backend=cpu"));
  EXPECT_EQ(table->Register(Spec("big", 4 * kGiB)).status().code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace tessera
