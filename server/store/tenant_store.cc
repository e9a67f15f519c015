#include "server/store/tenant_store.h"

#include <cstring>
#include <utility>

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

#include "server/common/status_macros.h"

namespace tessera {
namespace {

absl::Status SqliteError(sqlite3* db, absl::string_view what) {
  int code = sqlite3_extended_errcode(db);
  std::string message = absl::StrCat("state store: ", what, ": ", sqlite3_errmsg(db));
  // A full or read-only disk is an operational condition the operator can fix.
  if ((code & 0xff) == SQLITE_FULL || (code & 0xff) == SQLITE_READONLY ||
      (code & 0xff) == SQLITE_BUSY || (code & 0xff) == SQLITE_IOERR) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

absl::Status Exec(sqlite3* db, const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &error) != SQLITE_OK) {
    std::string message = error != nullptr ? error : "unknown error";
    sqlite3_free(error);
    return absl::InternalError(absl::StrCat("state store: ", message, " (in: ", sql, ")"));
  }
  return absl::OkStatus();
}

// RAII prepared statement.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    status_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) == SQLITE_OK
                  ? absl::OkStatus()
                  : SqliteError(db, absl::StrCat("prepare ", sql));
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  const absl::Status& status() const { return status_; }
  sqlite3_stmt* get() { return stmt_; }

  void Bind(int i, absl::string_view text) {
    sqlite3_bind_text(stmt_, i, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
  }
  void Bind(int i, int64_t value) { sqlite3_bind_int64(stmt_, i, value); }
  void BindBlob(int i, const void* data, size_t n) {
    sqlite3_bind_blob(stmt_, i, data, static_cast<int>(n), SQLITE_TRANSIENT);
  }

  /// SQLITE_ROW, SQLITE_DONE, or an error status.
  absl::StatusOr<int> Step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW || rc == SQLITE_DONE) return rc;
    if ((rc & 0xff) == SQLITE_CONSTRAINT) {
      return absl::AlreadyExistsError(absl::StrCat("state store: ", sqlite3_errmsg(db_)));
    }
    return SqliteError(db_, "step");
  }

  std::string Text(int col) {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    return p == nullptr ? std::string()
                        : std::string(reinterpret_cast<const char*>(p),
                                      static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  absl::Status status_;
};

// Best effort: some file systems refuse fsync on a directory.
void SyncParentDirectory(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)fsync(fd);
  close(fd);
}

int64_t ToMicros(absl::Time t) { return absl::ToUnixMicros(t); }
absl::Time FromMicros(int64_t us) { return absl::FromUnixMicros(us); }

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS tenants (
  id                    TEXT PRIMARY KEY,
  display_name          TEXT NOT NULL,
  device_memory_bytes   INTEGER NOT NULL,
  compute_share_percent INTEGER NOT NULL,
  max_streams           INTEGER NOT NULL,
  max_queued_jobs       INTEGER NOT NULL,
  priority              INTEGER NOT NULL,
  device_index          INTEGER NOT NULL,
  max_requests_in_flight INTEGER NOT NULL DEFAULT 0,
  requests_per_second   INTEGER NOT NULL DEFAULT 0,
  max_region_bytes      INTEGER NOT NULL DEFAULT 0,
  create_time_us        INTEGER NOT NULL,
  update_time_us        INTEGER NOT NULL,
  key_create_time_us    INTEGER NOT NULL,
  key_hash              BLOB NOT NULL CHECK (length(key_hash) = 32)
) STRICT;
CREATE TABLE IF NOT EXISTS tenant_labels (
  tenant_id TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
  key       TEXT NOT NULL,
  value     TEXT NOT NULL,
  PRIMARY KEY (tenant_id, key)
) STRICT;
CREATE TABLE IF NOT EXISTS tenant_kernels (
  tenant_id      TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
  name           TEXT NOT NULL,
  source         TEXT NOT NULL,
  create_time_us INTEGER NOT NULL,
  PRIMARY KEY (tenant_id, name)
) STRICT;
PRAGMA user_version = 4;
)sql";

// A write transaction that rolls back unless committed.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) {}
  ~Transaction() {
    if (open_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  absl::Status Begin() {
    RETURN_IF_ERROR(Exec(db_, "BEGIN IMMEDIATE"));
    open_ = true;
    return absl::OkStatus();
  }
  absl::Status Commit() {
    if (sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
      return SqliteError(db_, "commit");
    }
    open_ = false;
    return absl::OkStatus();
  }

 private:
  sqlite3* db_;
  bool open_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TenantStore>> TenantStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string message = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open state store ", path, ": ", message));
  }
  std::unique_ptr<TenantStore> store(new TenantStore(db));
  sqlite3_busy_timeout(db, 5000);
  RETURN_IF_ERROR(Exec(db, "PRAGMA journal_mode = WAL"));
  RETURN_IF_ERROR(Exec(db, "PRAGMA synchronous = FULL"));
  RETURN_IF_ERROR(Exec(db, "PRAGMA foreign_keys = ON"));

  Statement version(db, "PRAGMA user_version");
  RETURN_IF_ERROR(version.status());
  ASSIGN_OR_RETURN(int row, version.Step());
  int64_t schema = row == SQLITE_ROW ? version.Int(0) : 0;
  if (schema > kSchemaVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("state store ", path, " has schema version ", schema,
                     " from a newer Tessera; this server understands up to ", kSchemaVersion));
  }
  if (schema < kSchemaVersion) {
    Transaction txn(db);
    RETURN_IF_ERROR(txn.Begin());
    if (schema >= 1 && schema < 3) {
      // Version 3 added the request quota fields; 0 means "not set", and the tenant table
      // fills in their defaults when it restores the tenants (and stores them).
      RETURN_IF_ERROR(Exec(db, R"sql(
          ALTER TABLE tenants ADD COLUMN max_requests_in_flight INTEGER NOT NULL DEFAULT 0;
          ALTER TABLE tenants ADD COLUMN requests_per_second INTEGER NOT NULL DEFAULT 0;)sql"));
    }
    if (schema >= 1 && schema < 4) {
      // Version 4 added quota.max_region_bytes (0: not set; defaulted on restore, as above).
      RETURN_IF_ERROR(
          Exec(db, "ALTER TABLE tenants ADD COLUMN max_region_bytes INTEGER NOT NULL DEFAULT 0;"));
    }
    RETURN_IF_ERROR(Exec(db, kSchema));
    RETURN_IF_ERROR(txn.Commit());
    // A new database file: SQLite syncs the directory for the -wal file it creates but not
    // for the main file, so without this a power loss could take the file's directory entry
    // (and every commit checkpointed into it) with it.
    SyncParentDirectory(path);
  }
  return store;
}

TenantStore::~TenantStore() { sqlite3_close(db_); }

absl::Status TenantStore::WriteRecord(const TenantRecord& r, bool insert) {
  Transaction txn(db_);
  RETURN_IF_ERROR(txn.Begin());
  {
    Statement stmt(db_, insert ? R"sql(
        INSERT INTO tenants (display_name, device_memory_bytes, compute_share_percent,
          max_streams, max_queued_jobs, priority, device_index, create_time_us,
          update_time_us, key_create_time_us, key_hash, id, max_requests_in_flight,
          requests_per_second, max_region_bytes)
        VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15))sql"
                               : R"sql(
        UPDATE tenants SET display_name = ?1, device_memory_bytes = ?2,
          compute_share_percent = ?3, max_streams = ?4, max_queued_jobs = ?5, priority = ?6,
          device_index = ?7, create_time_us = ?8, update_time_us = ?9,
          key_create_time_us = ?10, key_hash = ?11, max_requests_in_flight = ?13,
          requests_per_second = ?14, max_region_bytes = ?15
        WHERE id = ?12)sql");
    RETURN_IF_ERROR(stmt.status());
    stmt.Bind(1, r.display_name);
    stmt.Bind(2, static_cast<int64_t>(r.quota.device_memory_bytes));
    stmt.Bind(3, static_cast<int64_t>(r.quota.compute_share_percent));
    stmt.Bind(4, static_cast<int64_t>(r.quota.max_streams));
    stmt.Bind(5, static_cast<int64_t>(r.quota.max_queued_jobs));
    stmt.Bind(6, static_cast<int64_t>(r.quota.priority));
    stmt.Bind(7, static_cast<int64_t>(r.device_index));
    stmt.Bind(8, ToMicros(r.create_time));
    stmt.Bind(9, ToMicros(r.update_time));
    stmt.Bind(10, ToMicros(r.key_create_time));
    stmt.BindBlob(11, r.key_hash.data(), r.key_hash.size());
    stmt.Bind(12, r.id);
    stmt.Bind(13, static_cast<int64_t>(r.quota.max_requests_in_flight));
    stmt.Bind(14, static_cast<int64_t>(r.quota.requests_per_second));
    stmt.Bind(15, static_cast<int64_t>(r.quota.max_region_bytes));
    absl::StatusOr<int> step = stmt.Step();
    if (!step.ok()) {
      if (absl::IsAlreadyExists(step.status())) {
        return absl::AlreadyExistsError(absl::StrCat("tenant_id \"", r.id, "\" is taken"));
      }
      return step.status();
    }
    if (!insert && sqlite3_changes(db_) == 0) {
      return absl::NotFoundError(absl::StrCat("tenant \"", r.id, "\" not found"));
    }
  }
  if (!insert) {
    Statement clear(db_, "DELETE FROM tenant_labels WHERE tenant_id = ?1");
    RETURN_IF_ERROR(clear.status());
    clear.Bind(1, r.id);
    RETURN_IF_ERROR(clear.Step().status());
  }
  for (const auto& [key, value] : r.labels) {
    Statement label(db_, "INSERT INTO tenant_labels (tenant_id, key, value) VALUES (?1, ?2, ?3)");
    RETURN_IF_ERROR(label.status());
    label.Bind(1, r.id);
    label.Bind(2, key);
    label.Bind(3, value);
    RETURN_IF_ERROR(label.Step().status());
  }
  return txn.Commit();
}

absl::Status TenantStore::Insert(const TenantRecord& record) {
  absl::MutexLock lock(&mu_);
  return WriteRecord(record, /*insert=*/true);
}

absl::Status TenantStore::Update(const TenantRecord& record) {
  absl::MutexLock lock(&mu_);
  return WriteRecord(record, /*insert=*/false);
}

absl::Status TenantStore::Delete(absl::string_view id) {
  absl::MutexLock lock(&mu_);
  Transaction txn(db_);
  RETURN_IF_ERROR(txn.Begin());
  Statement stmt(db_, "DELETE FROM tenants WHERE id = ?1");
  RETURN_IF_ERROR(stmt.status());
  stmt.Bind(1, id);
  RETURN_IF_ERROR(stmt.Step().status());
  if (sqlite3_changes(db_) == 0) {
    return absl::NotFoundError(absl::StrCat("tenant \"", id, "\" not found"));
  }
  return txn.Commit();
}

absl::StatusOr<std::vector<TenantRecord>> TenantStore::LoadAll() {
  absl::MutexLock lock(&mu_);
  std::vector<TenantRecord> records;
  Statement stmt(db_, R"sql(
      SELECT id, display_name, device_memory_bytes, compute_share_percent, max_streams,
        max_queued_jobs, priority, device_index, create_time_us, update_time_us,
        key_create_time_us, key_hash, max_requests_in_flight, requests_per_second,
        max_region_bytes
      FROM tenants ORDER BY id)sql");
  RETURN_IF_ERROR(stmt.status());
  for (;;) {
    ASSIGN_OR_RETURN(int rc, stmt.Step());
    if (rc == SQLITE_DONE) break;
    TenantRecord r;
    r.id = stmt.Text(0);
    r.display_name = stmt.Text(1);
    r.quota.device_memory_bytes = static_cast<uint64_t>(stmt.Int(2));
    r.quota.compute_share_percent = static_cast<uint32_t>(stmt.Int(3));
    r.quota.max_streams = static_cast<uint32_t>(stmt.Int(4));
    r.quota.max_queued_jobs = static_cast<uint32_t>(stmt.Int(5));
    r.quota.priority = static_cast<Priority>(stmt.Int(6));
    r.device_index = static_cast<int>(stmt.Int(7));
    r.create_time = FromMicros(stmt.Int(8));
    r.update_time = FromMicros(stmt.Int(9));
    r.key_create_time = FromMicros(stmt.Int(10));
    const void* blob = sqlite3_column_blob(stmt.get(), 11);
    if (blob == nullptr || sqlite3_column_bytes(stmt.get(), 11) != 32) {
      return absl::DataLossError(
          absl::StrCat("state store: tenant \"", r.id, "\" has a malformed key hash"));
    }
    std::memcpy(r.key_hash.data(), blob, r.key_hash.size());
    r.quota.max_requests_in_flight = static_cast<uint32_t>(stmt.Int(12));
    r.quota.requests_per_second = static_cast<uint32_t>(stmt.Int(13));
    r.quota.max_region_bytes = static_cast<uint64_t>(stmt.Int(14));
    records.push_back(std::move(r));
  }
  Statement labels(db_, "SELECT tenant_id, key, value FROM tenant_labels ORDER BY tenant_id");
  RETURN_IF_ERROR(labels.status());
  size_t i = 0;
  for (;;) {
    ASSIGN_OR_RETURN(int rc, labels.Step());
    if (rc == SQLITE_DONE) break;
    std::string tenant_id = labels.Text(0);
    while (i < records.size() && records[i].id < tenant_id) ++i;
    if (i == records.size() || records[i].id != tenant_id) {
      return absl::DataLossError(
          absl::StrCat("state store: labels for unknown tenant \"", tenant_id, "\""));
    }
    records[i].labels.emplace(labels.Text(1), labels.Text(2));
  }
  return records;
}

}  // namespace tessera

namespace tessera {

absl::Status TenantStore::InsertKernel(const StoredKernel& kernel) {
  absl::MutexLock lock(&mu_);
  Transaction txn(db_);
  RETURN_IF_ERROR(txn.Begin());
  {
    Statement exists(db_, "SELECT 1 FROM tenants WHERE id = ?1");
    RETURN_IF_ERROR(exists.status());
    exists.Bind(1, kernel.tenant_id);
    ASSIGN_OR_RETURN(int row, exists.Step());
    if (row != SQLITE_ROW) {
      return absl::NotFoundError(absl::StrCat("tenant \"", kernel.tenant_id, "\" not found"));
    }
  }
  Statement stmt(db_, R"sql(
      INSERT INTO tenant_kernels (tenant_id, name, source, create_time_us)
      VALUES (?1, ?2, ?3, ?4))sql");
  RETURN_IF_ERROR(stmt.status());
  stmt.Bind(1, kernel.tenant_id);
  stmt.Bind(2, kernel.name);
  stmt.Bind(3, kernel.source);
  stmt.Bind(4, ToMicros(kernel.create_time));
  absl::StatusOr<int> step = stmt.Step();
  if (!step.ok()) {
    if (absl::IsAlreadyExists(step.status())) {
      return absl::AlreadyExistsError(absl::StrCat("kernel \"", kernel.name, "\" exists"));
    }
    return step.status();
  }
  return txn.Commit();
}

absl::Status TenantStore::DeleteKernel(absl::string_view tenant_id, absl::string_view name) {
  absl::MutexLock lock(&mu_);
  Transaction txn(db_);
  RETURN_IF_ERROR(txn.Begin());
  Statement stmt(db_, "DELETE FROM tenant_kernels WHERE tenant_id = ?1 AND name = ?2");
  RETURN_IF_ERROR(stmt.status());
  stmt.Bind(1, tenant_id);
  stmt.Bind(2, name);
  RETURN_IF_ERROR(stmt.Step().status());
  if (sqlite3_changes(db_) == 0) {
    return absl::NotFoundError(absl::StrCat("kernel \"", name, "\" not found"));
  }
  return txn.Commit();
}

absl::StatusOr<std::vector<StoredKernel>> TenantStore::LoadKernels() {
  absl::MutexLock lock(&mu_);
  std::vector<StoredKernel> kernels;
  Statement stmt(db_, R"sql(
      SELECT tenant_id, name, source, create_time_us FROM tenant_kernels
      ORDER BY tenant_id, name)sql");
  RETURN_IF_ERROR(stmt.status());
  for (;;) {
    ASSIGN_OR_RETURN(int rc, stmt.Step());
    if (rc == SQLITE_DONE) break;
    kernels.push_back(StoredKernel{.tenant_id = stmt.Text(0),
                                   .name = stmt.Text(1),
                                   .source = stmt.Text(2),
                                   .create_time = FromMicros(stmt.Int(3))});
  }
  return kernels;
}

}  // namespace tessera
