// The shared-memory regions a Client keeps for its own transfers (ClientOptions::use_regions).
// Private to the client library (client.cc, region.cc).
#ifndef TESSERA_CLIENT_REGION_POOL_H_
#define TESSERA_CLIENT_REGION_POOL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "tessera/client.h"

namespace tessera {

/// Idle regions, each leased to one transfer at a time. Thread-safe; its lock is held only to
/// move pointers: registering and unregistering (RPCs) happen in the callers, outside it.
class Client::RegionPool {
 public:
  /// Idle regions kept for later transfers; more are unregistered when given back.
  static constexpr size_t kMaxIdle = 4;

  /// The smallest idle region of at least `size_bytes`, or nullptr. Then `*retired` gets the
  /// largest idle region, for the caller to destroy (unregister, giving its bytes back to the
  /// quota) before it registers a bigger one.
  std::unique_ptr<SharedRegion> Take(uint64_t size_bytes, std::unique_ptr<SharedRegion>* retired)
      ABSL_LOCKS_EXCLUDED(mu_);
  /// The largest idle region, or nullptr.
  std::unique_ptr<SharedRegion> TakeLargest() ABSL_LOCKS_EXCLUDED(mu_);
  /// Keeps `region` idle; returns the smallest idle one when more than kMaxIdle are kept, for
  /// the caller to destroy.
  std::unique_ptr<SharedRegion> Give(std::unique_ptr<SharedRegion> region) ABSL_LOCKS_EXCLUDED(mu_);
  /// Every idle region, for the caller to destroy (~Client).
  std::vector<std::unique_ptr<SharedRegion>> TakeAll() ABSL_LOCKS_EXCLUDED(mu_);

  /// False once the server refused regions for good (no descriptor socket): transfers stream.
  bool available() const ABSL_LOCKS_EXCLUDED(mu_);
  void MarkUnavailable() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::unique_ptr<SharedRegion> TakeLargestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<SharedRegion>> idle_ ABSL_GUARDED_BY(mu_);
  bool available_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_REGION_POOL_H_
