#ifndef TESSERA_SERVER_CORE_KERNEL_LIBRARY_H_
#define TESSERA_SERVER_CORE_KERNEL_LIBRARY_H_

// A tenant's own kernels (DefineKernel), by name. Owned by the tenant's runtime; a launch
// takes a reference to the kernel it uses, so deleting a kernel never disturbs a job that
// already holds it. Thread-safe; its lock is a leaf (nothing is called under it).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

#include "kernels/expr/user_kernel.h"

namespace tessera {

class KernelLibrary {
 public:
  using Kernel = std::shared_ptr<const kernels::expr::UserKernel>;

  /// nullptr when the tenant has no kernel of that name.
  Kernel Find(absl::string_view name) const ABSL_LOCKS_EXCLUDED(mu_);
  /// Ordered by name.
  std::vector<Kernel> List() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  /// ALREADY_EXISTS when the name is taken.
  absl::Status Add(Kernel kernel) ABSL_LOCKS_EXCLUDED(mu_);
  /// False when absent.
  bool Remove(absl::string_view name) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, Kernel, std::less<>> kernels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_CORE_KERNEL_LIBRARY_H_
