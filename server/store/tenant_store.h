#ifndef TESSERA_SERVER_STORE_TENANT_STORE_H_
#define TESSERA_SERVER_STORE_TENANT_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "server/common/tenant.h"

struct sqlite3;

namespace tessera {

/// A tenant-defined kernel as stored: its canonical source (kernels/expr/compile.h).
struct StoredKernel {
  std::string tenant_id;
  std::string name;
  std::string source;
  absl::Time create_time;
};

/// The durable tenant table: one SQLite database (WAL, synchronous=FULL). Every mutation is
/// one transaction; when a method returns OK the change has been committed to disk.
///
/// Thread-safe (calls are serialized on one connection).
class TenantStore {
 public:
  /// Opens or creates the database at `path` (its directory must exist) and migrates the
  /// schema. FAILED_PRECONDITION when the file was written by a newer schema.
  static absl::StatusOr<std::unique_ptr<TenantStore>> Open(const std::string& path);
  ~TenantStore();

  TenantStore(const TenantStore&) = delete;
  TenantStore& operator=(const TenantStore&) = delete;

  /// ALREADY_EXISTS when the id is present.
  absl::Status Insert(const TenantRecord& record) ABSL_LOCKS_EXCLUDED(mu_);
  /// Replaces every field of an existing record. NOT_FOUND when absent.
  absl::Status Update(const TenantRecord& record) ABSL_LOCKS_EXCLUDED(mu_);
  /// NOT_FOUND when absent.
  absl::Status Delete(absl::string_view id) ABSL_LOCKS_EXCLUDED(mu_);
  /// Every record, ordered by id.
  absl::StatusOr<std::vector<TenantRecord>> LoadAll() ABSL_LOCKS_EXCLUDED(mu_);

  /// A tenant's kernel definition (deleted with the tenant). ALREADY_EXISTS for a name the
  /// tenant has; NOT_FOUND when the tenant is not stored.
  absl::Status InsertKernel(const StoredKernel& kernel) ABSL_LOCKS_EXCLUDED(mu_);
  /// NOT_FOUND when the tenant has no kernel of that name.
  absl::Status DeleteKernel(absl::string_view tenant_id, absl::string_view name)
      ABSL_LOCKS_EXCLUDED(mu_);
  /// Every stored kernel, ordered by tenant and name.
  absl::StatusOr<std::vector<StoredKernel>> LoadKernels() ABSL_LOCKS_EXCLUDED(mu_);

  /// 2 added tenant_kernels (a version-1 file is migrated when opened).
  static constexpr int kSchemaVersion = 4;

 private:
  explicit TenantStore(sqlite3* db) : db_(db) {}

  absl::Status WriteRecord(const TenantRecord& record, bool insert)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* const db_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_STORE_TENANT_STORE_H_
