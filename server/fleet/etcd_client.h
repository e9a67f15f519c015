#ifndef TESSERA_SERVER_FLEET_ETCD_CLIENT_H_
#define TESSERA_SERVER_FLEET_ETCD_CLIENT_H_

// A small client of etcd's v3 gRPC API (KV and Lease, compiled from etcd's own .proto files):
// what the fleet needs of its store, nothing more. docs/fleet.md.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace etcdserverpb {
class TxnRequest;
}

namespace tessera::fleet {

/// One key as etcd holds it.
struct KeyValue {
  std::string key;
  std::string value;
  /// The revision that created the key, and the one that last changed it (etcd's
  /// create_revision and mod_revision): a write conditioned on mod_revision changes exactly
  /// what was read.
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  /// The lease the key is attached to (0: none); it goes when the lease expires.
  int64_t lease = 0;
};

/// Thread-safe. Every call has a deadline (Options::timeout); a failure to reach etcd is
/// UNAVAILABLE with a message naming etcd and its endpoints.
class EtcdClient {
 public:
  struct Options {
    /// "http://HOST:PORT" (or HOST:PORT), one per member; plaintext.
    std::vector<std::string> endpoints;
    absl::Duration timeout = absl::Seconds(3);
  };

  /// INVALID_ARGUMENT for an endpoint that is not http://HOST:PORT. Does not connect yet.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(const Options& options);
  ~EtcdClient();

  /// The key, if present.
  absl::StatusOr<std::optional<KeyValue>> Get(absl::string_view key);
  /// Every key that starts with `prefix`, in key order.
  absl::StatusOr<std::vector<KeyValue>> GetPrefix(absl::string_view prefix);
  /// Writes the key unconditionally, attached to `lease` (0: none).
  absl::Status Put(absl::string_view key, absl::string_view value, int64_t lease = 0);
  /// Creates the key only if it does not exist, in one transaction: true when this call
  /// created it, false when it existed (and is left as it was).
  absl::StatusOr<bool> CreateIfAbsent(absl::string_view key, absl::string_view value,
                                      int64_t lease = 0);
  /// Replaces the key only if it still has `mod_revision`: false when it changed or went.
  absl::StatusOr<bool> ReplaceIfUnchanged(absl::string_view key, absl::string_view value,
                                          int64_t mod_revision, int64_t lease = 0);
  /// Deletes the key only if it still has `mod_revision`: false when it changed or went.
  absl::StatusOr<bool> DeleteIfUnchanged(absl::string_view key, int64_t mod_revision);

  /// A lease of `ttl` (whole seconds, at least 1), with its id.
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl);
  /// Renews the lease once; its remaining TTL. NOT_FOUND when it has expired (its keys are gone).
  absl::StatusOr<absl::Duration> KeepAlive(int64_t lease);
  /// Ends the lease now, deleting its keys.
  absl::Status RevokeLease(int64_t lease);

  /// "http://127.0.0.1:2379,..." as given.
  const std::string& endpoints() const;

 private:
  /// Runs the transaction: whether its conditions held (and its success operations ran).
  absl::StatusOr<bool> Commit(const etcdserverpb::TxnRequest& request, const std::string& what);
  /// Adds a put of `key` to the transaction's success operations and commits it; `verb`
  /// ("creating ") names the write in errors.
  absl::StatusOr<bool> PutIf(etcdserverpb::TxnRequest& request, absl::string_view key,
                             absl::string_view value, int64_t lease, absl::string_view verb);

  struct Impl;
  explicit EtcdClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The end of the key range of every key that starts with `prefix` (etcd's range_end).
std::string PrefixEnd(absl::string_view prefix);

}  // namespace tessera::fleet

#endif  // TESSERA_SERVER_FLEET_ETCD_CLIENT_H_
