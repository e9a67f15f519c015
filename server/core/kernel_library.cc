#include "server/core/kernel_library.h"

#include "absl/strings/str_cat.h"

namespace tessera {

KernelLibrary::Kernel KernelLibrary::Find(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = kernels_.find(name);
  return it == kernels_.end() ? nullptr : it->second;
}

std::vector<KernelLibrary::Kernel> KernelLibrary::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<Kernel> out;
  out.reserve(kernels_.size());
  for (const auto& [name, kernel] : kernels_) out.push_back(kernel);
  return out;
}

size_t KernelLibrary::size() const {
  absl::MutexLock lock(&mu_);
  return kernels_.size();
}

absl::Status KernelLibrary::Add(Kernel kernel) {
  absl::MutexLock lock(&mu_);
  const std::string& name = kernel->program.definition.name;
  if (kernels_.contains(name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("kernel \"", name, "\" is already defined; DeleteKernel it first"));
  }
  kernels_.emplace(name, std::move(kernel));
  return absl::OkStatus();
}

bool KernelLibrary::Remove(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  auto it = kernels_.find(name);
  if (it == kernels_.end()) return false;
  kernels_.erase(it);
  return true;
}

}  // namespace tessera
