#include "server/backend/cuda/kernel_images.h"

#include <atomic>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

#include "common/fd_io.h"

namespace tessera::cuda {
namespace {

// In memory: at most this many images and bytes (a generated kernel's cubin is ~20-60 KiB).
constexpr size_t kMaxImages = 1024;
constexpr uint64_t kMaxCachedImageBytes = 256ull << 20;
// Generated sources remembered by program hash, and rejections remembered.
constexpr size_t kMaxGenerated = 4096;
constexpr size_t kMaxRejected = 1024;
// A cache file larger than this is not read.
constexpr off_t kMaxFileBytes = 256ll << 20;
constexpr char kFileMagic[] = "tessera kernel image 1\n";

std::string Sha256(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(data.data(), data.size(), digest, &size, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < size; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 15];
  }
  return hex;
}

// Makes `dir` an owner-only directory of ours; false (with the reason) when it cannot be.
bool OwnerOnlyDirectory(const std::string& dir, std::string* why) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    *why = absl::StrCat("mkdir: ", std::strerror(errno));
    return false;
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *why = "not a directory";
    return false;
  }
  if (st.st_uid != geteuid()) {
    *why = absl::StrCat("owned by uid ", st.st_uid, ", not this server's ", geteuid());
    return false;
  }
  if ((st.st_mode & 0777) != 0700 && chmod(dir.c_str(), 0700) != 0) {
    *why = absl::StrCat("chmod 0700: ", std::strerror(errno));
    return false;
  }
  return true;
}

}  // namespace

KernelImages::KernelImages(KernelImagesOptions options)
    : options_(std::move(options)), compiler_(options_.compiler, options_.limits) {
  if (!options_.cache_dir.empty()) {
    std::string why;
    disk_ = OwnerOnlyDirectory(options_.cache_dir, &why);
    if (!disk_) {
      spdlog::warn(
          "kernel image cache {} is not usable ({}); compiled kernels are kept in memory "
          "only",
          options_.cache_dir, why);
    }
  }
  const int workers = std::max(1, options_.workers);
  per_tenant_ = std::max(1, workers - 1);
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { Work(); });
}

KernelImages::~KernelImages() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  compiler_.Stop();
  for (std::thread& t : workers_) t.join();
  std::map<std::string, std::vector<Callback>> waiting;
  {
    absl::MutexLock lock(&mu_);
    waiting.swap(flights_);
  }
  for (auto& [key, callbacks] : waiting) {
    for (Callback& done : callbacks) {
      std::move(done)(absl::UnavailableError("the CUDA backend is shutting down"));
    }
  }
}

absl::StatusOr<std::shared_ptr<const GeneratedKernel>> KernelImages::Generate(
    const kernels::expr::Program& program) {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = generated_.find(program.hash); it != generated_.end()) return it->second;
  }
  absl::StatusOr<kernels::expr::CudaKernelSource> kernel =
      kernels::expr::GenerateCudaKernel(program);
  if (!kernel.ok()) return kernel.status();
  auto generated = std::make_shared<GeneratedKernel>();
  generated->digest = Sha256(kernel->source);
  generated->kernel = *std::move(kernel);
  generated->name = program.definition.name;
  absl::MutexLock lock(&mu_);
  if (generated_.size() >= kMaxGenerated) generated_.clear();
  return generated_.emplace(program.hash, std::move(generated)).first->second;
}

std::string KernelImages::KeyOf(const GeneratedKernel& kernel, int arch) {
  return absl::StrCat(kernel.digest, "/sm_", arch);
}

KernelImage KernelImages::Find(const GeneratedKernel& kernel, int arch) {
  absl::MutexLock lock(&mu_);
  auto it = images_.find(KeyOf(kernel, arch));
  if (it == images_.end()) return nullptr;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  return it->second.image;
}

void KernelImages::Fetch(std::shared_ptr<const GeneratedKernel> kernel, int arch,
                         const std::string& tenant, Callback done) {
  Request request{KeyOf(*kernel, arch), std::move(kernel), arch};
  absl::MutexLock lock(&mu_);
  auto [flight, fresh] = flights_.try_emplace(request.key);
  flight->second.push_back(std::move(done));
  if (!fresh) return;  // already queued or compiling
  std::deque<Request>& queue = queues_[tenant];
  if (queue.empty()) turns_.push_back(tenant);
  queue.push_back(std::move(request));
}

bool KernelImages::NextLocked(Request& request, std::string& tenant) {
  for (auto it = turns_.begin(); it != turns_.end(); ++it) {
    if (running_[*it] >= per_tenant_) continue;
    tenant = *it;
    turns_.erase(it);
    std::deque<Request>& queue = queues_[tenant];
    request = std::move(queue.front());
    queue.pop_front();
    if (queue.empty()) {
      queues_.erase(tenant);
    } else {
      turns_.push_back(tenant);  // its next request waits for the other tenants' turns
    }
    ++running_[tenant];
    return true;
  }
  return false;
}

void KernelImages::Work() {
  for (;;) {
    Request request;
    std::string tenant;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](KernelImages* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            if (self->stopping_) return true;
            for (const std::string& t : self->turns_) {
              auto it = self->running_.find(t);
              if (it == self->running_.end() || it->second < self->per_tenant_) return true;
            }
            return false;
          },
          this));
      if (stopping_) return;
      NextLocked(request, tenant);
    }
    absl::StatusOr<KernelImage> image = Produce(request);
    std::vector<Callback> callbacks;
    {
      absl::MutexLock lock(&mu_);
      if (--running_[tenant] == 0) running_.erase(tenant);
      if (image.ok()) RememberLocked(request.key, *image);
      auto it = flights_.find(request.key);
      if (it != flights_.end()) {
        callbacks = std::move(it->second);
        flights_.erase(it);
      }
    }
    for (Callback& done : callbacks) std::move(done)(image);
  }
}

absl::StatusOr<KernelImage> KernelImages::Produce(const Request& request) {
  const GeneratedKernel& kernel = *request.kernel;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = images_.find(request.key); it != images_.end()) return it->second.image;
    if (auto it = rejected_.find(request.key); it != rejected_.end()) return it->second;
  }
  absl::StatusOr<std::string> version = compiler_.Version();
  if (!version.ok()) {
    spdlog::warn("kernel {} for sm_{}: {}", kernel.name, request.arch, version.status().ToString());
    return version.status();
  }
  const std::string key = DiskKey(request, *version);
  const std::string path = DiskFile(request, *version);
  if (!path.empty()) {
    if (KernelImage image = ReadFile(path, key)) return image;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> compiled =
      compiler_.Compile(kernel.kernel.source, request.arch, kernel.name);
  if (!compiled.ok()) {
    spdlog::warn("kernel {} (source {}) for sm_{}: {}", kernel.name, kernel.digest.substr(0, 12),
                 request.arch, compiled.status().ToString());
    if (absl::IsInternal(compiled.status())) {
      absl::MutexLock lock(&mu_);
      if (rejected_.size() >= kMaxRejected) rejected_.clear();
      rejected_.emplace(request.key, compiled.status());
    }
    return compiled.status();
  }
  spdlog::info("compiled kernel {} (source {}) for sm_{} in {} ({} bytes)", kernel.name,
               kernel.digest.substr(0, 12), request.arch, absl::FormatDuration(absl::Now() - start),
               compiled->size());
  if (!path.empty()) WriteFile(path, key, *compiled);
  return std::make_shared<const std::string>(*std::move(compiled));
}

std::string KernelImages::DiskKey(const Request& request, const std::string& version) const {
  return absl::StrCat("source sha256 ", request.kernel->digest, "; sm_", request.arch, "; ",
                      version, "; ", options_.driver);
}

std::string KernelImages::DiskFile(const Request& request, const std::string& version) const {
  if (!disk_) return "";
  return absl::StrCat(options_.cache_dir, "/sm_", request.arch, "-",
                      Sha256(DiskKey(request, version)).substr(0, 40), ".kimg");
}

std::string KernelImages::CacheFile(const GeneratedKernel& kernel, int arch) {
  absl::StatusOr<std::string> version = compiler_.Version();
  if (!version.ok()) return "";
  return DiskFile(Request{KeyOf(kernel, arch), nullptr, arch}, *version);
}

KernelImage KernelImages::ReadFile(const std::string& path, const std::string& key) const {
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return nullptr;  // not cached yet
  std::string text;
  struct stat st {};
  std::string problem;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > kMaxFileBytes) {
    problem = "not a regular file of a sensible size";
  } else if (!ReadAll(fd, &text)) {
    problem = absl::StrCat("read: ", std::strerror(errno));
  }
  close(fd);
  // kFileMagic, "key <key>\n", "size <n>\n", "sha256 <hex>\n", "\n", then the image.
  KernelImage image;
  if (problem.empty()) {
    const std::string head = absl::StrCat(kFileMagic, "key ", key, "\nsize ");
    const size_t size_end = text.find('\n', head.size());
    const size_t sha_end =
        size_end == std::string::npos ? std::string::npos : text.find('\n', size_end + 1);
    uint64_t size = 0;
    if (text.compare(0, head.size(), head) != 0) {
      problem = "its header is not this key's";
    } else if (sha_end == std::string::npos || sha_end + 1 >= text.size() ||
               text[sha_end + 1] != '\n' ||
               !absl::SimpleAtoi(text.substr(head.size(), size_end - head.size()), &size) ||
               text.compare(size_end + 1, 7, "sha256 ") != 0) {
      problem = "its header is malformed";
    } else if (text.size() - sha_end - 2 != size) {
      problem = absl::StrCat("it holds ", text.size() - sha_end - 2, " image bytes, not ", size);
    } else {
      const std::string body = text.substr(sha_end + 2);
      if (Sha256(body) != text.substr(size_end + 8, sha_end - size_end - 8)) {
        problem = "its SHA-256 does not match";
      } else {
        image = std::make_shared<const std::string>(body);
      }
    }
  }
  if (image == nullptr) {
    spdlog::warn(
        "kernel image cache file {} is corrupt ({}); it is removed and the kernel "
        "recompiled",
        path, problem);
    unlink(path.c_str());
  }
  return image;
}

void KernelImages::WriteFile(const std::string& path, const std::string& key,
                             const std::string& image) const {
  static std::atomic<uint64_t> counter{0};
  const std::string temporary = absl::StrCat(path, ".tmp-", getpid(), "-", counter.fetch_add(1));
  const int fd =
      open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    spdlog::warn("cannot write the kernel image cache file {}: {}", temporary,
                 std::strerror(errno));
    return;
  }
  const std::string header = absl::StrCat(kFileMagic, "key ", key, "\nsize ", image.size(),
                                          "\nsha256 ", Sha256(image), "\n\n");
  // 0600 whatever the umask; the rename publishes only a complete file.
  const bool ok = fchmod(fd, 0600) == 0 && WriteAll(fd, header) && WriteAll(fd, image);
  const int error = errno;
  close(fd);
  if (!ok || rename(temporary.c_str(), path.c_str()) != 0) {
    spdlog::warn("cannot write the kernel image cache file {}: {}", path,
                 std::strerror(ok ? errno : error));
    unlink(temporary.c_str());
  }
}

void KernelImages::RememberLocked(const std::string& key, KernelImage image) {
  if (images_.count(key) != 0) return;
  image_bytes_ += image->size();
  lru_.push_back(key);
  images_.emplace(key, Cached{std::move(image), std::prev(lru_.end())});
  while (!lru_.empty() && (images_.size() > kMaxImages || image_bytes_ > kMaxCachedImageBytes)) {
    auto it = images_.find(lru_.front());
    image_bytes_ -= it->second.image->size();
    images_.erase(it);
    lru_.pop_front();
  }
}

}  // namespace tessera::cuda
