// The state loader: a server starting on an existing --state_dir opens its tenants.db
// (server/store/tenant_store.cc: TenantStore::Open, LoadAll, LoadKernels) and restores every
// tenant, its context and its kernels (server/core/tenant_table.cc: TenantTable::Create,
// Restore, RestoreKernels). The file is the input: a damaged disk, an old version or a
// hand-edited file must give an error or a working server, never a crash.
//
// Input: a serialized tessera.fuzz.StateCase (tests/fuzz/fuzz_inputs.proto). Fuzzing the raw
// file bytes alone mostly fuzzes SQLite's own page checks; rows reach the loader's code: they
// are written with plain SQL into a file that has the store's schema (values of the columns'
// types, and rows that the foreign keys would have refused), or, with `loose_schema`, into
// tables without type constraints (any value of any type). `raw_file` is also accepted.
//
// Properties: no crash and no unbounded allocation; a refusal is an error status; a table
// restored from the file answers List, Get (TenantToProto), AuthenticateKey and CreateTensor
// for each tenant.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <sqlite3.h>
#include <unistd.h>

#include "spdlog/spdlog.h"

#include "server/backend/cpu/cpu_backend.h"
#include "server/core/tenant_table.h"
#include "server/core/validation.h"
#include "server/service/convert.h"
#include "server/store/tenant_store.h"
#include "tests/fuzz/fuzz_inputs.pb.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tessera::fuzz::SqlValue;

// The store's tables without STRICT, NOT NULL, CHECK or foreign keys.
constexpr char kLooseSchema[] = R"sql(
CREATE TABLE tenants (id PRIMARY KEY, display_name, device_memory_bytes,
  compute_share_percent, max_streams, max_queued_jobs, priority, device_index, create_time_us,
  update_time_us, key_create_time_us, key_hash);
CREATE TABLE tenant_labels (tenant_id, key, value, PRIMARY KEY (tenant_id, key));
CREATE TABLE tenant_kernels (tenant_id, name, source, create_time_us,
  PRIMARY KEY (tenant_id, name));
PRAGMA user_version = 2;
)sql";

enum class Column { kInteger, kText, kBlob };

// Binds `value` as itself (loose schema) or converted to the column's type.
void Bind(sqlite3_stmt* stmt, int i, const SqlValue& value, Column column, bool loose) {
  auto bind_text = [&](const std::string& s) {
    sqlite3_bind_text(stmt, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  };
  auto bind_blob = [&](const std::string& s) {
    sqlite3_bind_blob(stmt, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  };
  if (loose) {
    switch (value.value_case()) {
      case SqlValue::kI:
        sqlite3_bind_int64(stmt, i, value.i());
        return;
      case SqlValue::kF:
        sqlite3_bind_double(stmt, i, value.f());
        return;
      case SqlValue::kText:
        bind_text(value.text());
        return;
      case SqlValue::kBlob:
        bind_blob(value.blob());
        return;
      case SqlValue::kIsNull:
      case SqlValue::VALUE_NOT_SET:
        sqlite3_bind_null(stmt, i);
        return;
    }
  }
  switch (column) {
    case Column::kInteger: {
      int64_t v = value.i();
      if (value.has_f() && std::isfinite(value.f()) && std::fabs(value.f()) < 9e18) {
        v = static_cast<int64_t>(value.f());
      }
      sqlite3_bind_int64(stmt, i, v);
      return;
    }
    case Column::kText:
      bind_text(value.has_blob() ? value.blob() : value.text());
      return;
    case Column::kBlob:
      bind_blob(value.has_text() ? value.text() : value.blob());
      return;
  }
}

void Insert(sqlite3* db, const char* sql,
            std::initializer_list<std::pair<const SqlValue*, Column>> values, bool loose) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) != SQLITE_OK) std::abort();
  int i = 1;
  for (const auto& [value, column] : values) Bind(stmt, i++, *value, column, loose);
  sqlite3_step(stmt);  // rows the constraints refuse are simply absent
  sqlite3_finalize(stmt);
}

// Writes the case's rows into `path`; false when the file cannot be built.
bool WriteRows(const tessera::fuzz::StateCase& input, const std::string& path) {
  if (!input.loose_schema()) {
    // The store's own schema, as a server of this version created it.
    absl::StatusOr<std::unique_ptr<tessera::TenantStore>> store = tessera::TenantStore::Open(path);
    if (!store.ok()) std::abort();
  }
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) std::abort();
  const bool loose = input.loose_schema();
  if (loose) sqlite3_exec(db, kLooseSchema, nullptr, nullptr, nullptr);
  sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
  int rows = 0;
  for (const tessera::fuzz::TenantRow& t : input.tenants()) {
    if (++rows > 64) break;
    Insert(db, R"sql(
        INSERT INTO tenants (id, display_name, device_memory_bytes, compute_share_percent,
          max_streams, max_queued_jobs, priority, device_index, create_time_us, update_time_us,
          key_create_time_us, key_hash)
        VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12))sql",
           {{&t.id(), Column::kText},
            {&t.display_name(), Column::kText},
            {&t.device_memory_bytes(), Column::kInteger},
            {&t.compute_share_percent(), Column::kInteger},
            {&t.max_streams(), Column::kInteger},
            {&t.max_queued_jobs(), Column::kInteger},
            {&t.priority(), Column::kInteger},
            {&t.device_index(), Column::kInteger},
            {&t.create_time_us(), Column::kInteger},
            {&t.update_time_us(), Column::kInteger},
            {&t.key_create_time_us(), Column::kInteger},
            {&t.key_hash(), Column::kBlob}},
           loose);
  }
  for (const tessera::fuzz::LabelRow& l : input.labels()) {
    if (++rows > 256) break;
    Insert(
        db, "INSERT INTO tenant_labels (tenant_id, key, value) VALUES (?1, ?2, ?3)",
        {{&l.tenant_id(), Column::kText}, {&l.key(), Column::kText}, {&l.value(), Column::kText}},
        loose);
  }
  for (const tessera::fuzz::KernelRow& k : input.kernels()) {
    if (++rows > 320) break;
    Insert(db,
           "INSERT INTO tenant_kernels (tenant_id, name, source, create_time_us) "
           "VALUES (?1, ?2, ?3, ?4)",
           {{&k.tenant_id(), Column::kText},
            {&k.name(), Column::kText},
            {&k.source(), Column::kText},
            {&k.create_time_us(), Column::kInteger}},
           loose);
  }
  sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
  if (input.has_user_version()) {
    const std::string pragma = absl::StrCat("PRAGMA user_version = ", input.user_version());
    sqlite3_exec(db, pragma.c_str(), nullptr, nullptr, nullptr);
  }
  sqlite3_close(db);
  return true;
}

// One directory per process, emptied for each input; in memory where /dev/shm is (the store
// syncs every commit).
const std::filesystem::path& StateDir() {
  static const std::filesystem::path* dir = [] {
    std::string name = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    name += "/tessera-state-fuzz-XXXXXX";
    if (mkdtemp(name.data()) == nullptr) std::abort();
    std::atexit([] { std::filesystem::remove_all(StateDir()); });
    return new std::filesystem::path(name);
  }();
  return *dir;
}

void CheckRestored(tessera::TenantTable& table) {
  tessera::TenantTable::Page page = table.List("", 1000);
  for (const tessera::TenantView& view : page.tenants) {
    tessera::v1::Tenant proto;
    tessera::TenantToProto(view, &proto);
    absl::StatusOr<tessera::TenantView> got = table.Get(view.record.id);
    FUZZ_CHECK(got.ok(), "a listed tenant is not found: ", got.status().ToString());
    (void)table.AuthenticateKey(absl::StrCat("tsk_", view.record.id, ".key"));
    absl::StatusOr<std::shared_ptr<tessera::TenantRuntime>> runtime =
        table.RuntimeOf(view.record.id);
    FUZZ_CHECK(runtime.ok(), runtime.status().ToString());
    absl::StatusOr<tessera::TensorInfo> tensor =
        (*runtime)->CreateTensor({tessera::kernels::DType::kF32, {4}}, "");
    if (tensor.ok()) (void)(*runtime)->DeleteTensor(tensor->handle);
    (void)(*runtime)->Usage();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);
    return true;
  }();
  (void)quiet;
  static tessera::CpuBackend* const backend = new tessera::CpuBackend(
      {.memory_bytes = uint64_t{1} << 30, .worker_threads = 1, .reason = "fuzz"});

  tessera::fuzz::StateCase input;
  if (!tessera::fuzz::ParseMessage(data, size, &input)) return 0;
  const std::filesystem::path& dir = StateDir();
  const std::string path = (dir / "tenants.db").string();
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    std::filesystem::remove(path + suffix);
  }
  if (!input.raw_file().empty()) {
    std::ofstream(path, std::ios::binary) << input.raw_file();
  } else if (!WriteRows(input, path)) {
    return 0;
  }

  absl::StatusOr<std::unique_ptr<tessera::TenantStore>> store = tessera::TenantStore::Open(path);
  if (!store.ok()) {
    FUZZ_CHECK(!store.status().ok(), "?");
    return 0;
  }
  absl::StatusOr<std::vector<tessera::TenantRecord>> records = (*store)->LoadAll();
  absl::StatusOr<std::vector<tessera::StoredKernel>> kernels = (*store)->LoadKernels();
  (void)kernels;
  absl::StatusOr<std::unique_ptr<tessera::TenantTable>> table =
      tessera::TenantTable::Create({}, store->get(), backend);
  if (table.ok()) {
    FUZZ_CHECK(records.ok(),
               "a table was restored from a file LoadAll refuses: ", records.status().ToString());
    CheckRestored(**table);
  }
  return 0;
}
