// How the fake driver runs a kernel compiled for the host (device.h, host_kernels.h).
//
// A launch runs its blocks one after another; each block's threads are fibers on the host
// thread that runs the launch (switched by tessera_fiber_switch below: a few instructions, no
// system call), so __syncthreads and the warp intrinsics are real
// barriers: a thread that reaches one is suspended until every thread it waits for arrives.
// The fibers run in thread order, each until it finishes or waits, so a block's threads
// interleave only at those barriers, which is all CUDA promises.
//
// Memory: the kernel sources are compiled with -fsanitize=kernel-address and the instrumentation
// threshold at 0, so every load and store calls __asan_{load,store}N_noabort below with its
// address and size. The access is allowed on the running thread's own stack (locals and
// parameters), in the block's shared memory, in read-only data of the fake driver, and in
// device memory of the launching context up to the size it asked for; anything else (another
// context's memory, past an allocation's end, a host or stale pointer, a misaligned vector
// access, a shared-memory read of a byte no thread of the block wrote) stops the launch with
// the error a GPU would give and a message naming the kernel, block, thread and address.
// Launches run one at a time in the process (a GPU makes no promise that two kernels overlap).
#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>

#include "tests/fake_cuda/driver/device.h"
#include "tests/fake_cuda/driver/host_kernels.h"
#include "tests/fake_cuda/driver/host_module.h"

// Saves the callee-saved registers, the SSE and x87 control words and the stack pointer
// (to *save), then continues on the stack `next` saved, where the same were saved.
extern "C" void tessera_fiber_switch(void** save, void* next);
asm(R"(
  .text
  .globl tessera_fiber_switch
  .hidden tessera_fiber_switch
  .type tessera_fiber_switch, @function
tessera_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size tessera_fiber_switch, .-tessera_fiber_switch
)");

namespace tessera::fake_cuda {
namespace {

constexpr int kSuccess = 0;
constexpr int kIllegalAddress = 700;     // CUDA_ERROR_ILLEGAL_ADDRESS
constexpr int kMisalignedAddress = 716;  // CUDA_ERROR_MISALIGNED_ADDRESS
constexpr int kLaunchFailed = 719;       // CUDA_ERROR_LAUNCH_FAILED
constexpr int kMaxThreads = 1024;
constexpr int kWarp = 32;
constexpr size_t kStackBytes = 128 << 10;
constexpr size_t kGuardBytes = 4096;

// ---- the kernel table --------------------------------------------------------------------

std::map<std::string, HostKernel, std::less<>>& Table() {
  static auto* table = new std::map<std::string, HostKernel, std::less<>>();
  return *table;
}

// ---- the running launch ------------------------------------------------------------------

enum class State { kReady, kAtBarrier, kAtWarp, kDone };

struct Fiber {
  void* sp = nullptr;     // saved stack pointer while switched out
  char* stack = nullptr;  // lowest usable byte
  State state = State::kDone;
  uint3 thread{};
  int linear = 0;
  unsigned long long warp_result = 0;
};

// A warp-wide operation some lanes have reached and others not yet.
struct WarpPending {
  int kind = -1;
  unsigned mask = 0;
  unsigned arrived = 0;
  int width = kWarp;
  unsigned long long values[kWarp] = {};
  int args[kWarp] = {};
};

struct Runtime {
  std::mutex mu;  // one launch at a time
  char* stacks = nullptr;
  Fiber fibers[kMaxThreads];
  void* scheduler = nullptr;  // the launching thread's stack pointer while a fiber runs
  // The launch.
  const HostKernel* kernel = nullptr;
  void** params = nullptr;
  dim3 grid, block;
  const std::vector<DeviceRange>* memory = nullptr;
  const void* context = nullptr;
  int error = kSuccess;
  std::string message;
  // The block.
  uint3 block_index{};
  int threads = 0;
  int live = 0;
  unsigned exited[kMaxThreads / kWarp] = {};  // per warp, lanes that have finished
  int at_barrier = 0;
  WarpPending warps[kMaxThreads / kWarp];
  std::vector<unsigned char> shared_written;
  size_t shared_dirty_lo = SIZE_MAX, shared_dirty_hi = 0;  // what this block marked
  // The device allocation the last access hit.
  const DeviceRange* last = nullptr;
  Fiber* current = nullptr;
  // libtessera_host_kernels.so: its writable data (the kernels' __shared__ variables: the
  // block's shared memory) and its read-only data (constants a kernel may read).
  std::once_flag loaded;
  std::string load_error;
  HostImage host_image;
  // The running kernel's library (host_image or a module's).
  const HostImage* image = nullptr;
  // Modules of generated kernels (LoadHostModule), by path; never unloaded.
  std::mutex modules_mu;
  std::map<std::string, std::vector<HostKernel>, std::less<>> modules;
};

Runtime* const g_runtime = new Runtime();
Runtime& R() { return *g_runtime; }

// A fiber of the running launch runs on this thread.
__attribute__((tls_model("initial-exec"))) thread_local bool t_in_kernel = false;

std::string Where() {
  const Runtime& r = R();
  std::string where = std::string("kernel ") + r.kernel->name;
  char text[96];
  std::snprintf(text, sizeof(text), ", block (%u,%u,%u)", r.block_index.x, r.block_index.y,
                r.block_index.z);
  where += text;
  if (r.current != nullptr) {
    std::snprintf(text, sizeof(text), ", thread (%u,%u,%u)", r.current->thread.x,
                  r.current->thread.y, r.current->thread.z);
    where += text;
  }
  return where;
}

// Records the launch's first error; not from a fiber.
void Fail(int error, const std::string& what) {
  Runtime& r = R();
  if (r.error != kSuccess) return;
  r.error = error;
  r.message = Where() + ": " + what;
}

// Stops the launch from inside a fiber: records the error and never comes back.
[[noreturn]] void Violation(int error, const char* format, ...) {
  Runtime& r = R();
  char text[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  Fail(error, text);
  Fiber* f = r.current;
  f->state = State::kDone;
  t_in_kernel = false;
  tessera_fiber_switch(&f->sp, r.scheduler);
  __builtin_unreachable();
}

// Back to the scheduler until this fiber is ready again.
void Yield() {
  Runtime& r = R();
  Fiber* f = r.current;
  t_in_kernel = false;
  tessera_fiber_switch(&f->sp, r.scheduler);
  // Resumed by the scheduler (which set current and t_in_kernel).
}

void ReleaseBarrier() {
  Runtime& r = R();
  r.at_barrier = 0;
  for (int i = 0; i < r.threads; ++i) {
    if (r.fibers[i].state == State::kAtBarrier) r.fibers[i].state = State::kReady;
  }
}

// Lanes of warp `w` that exist in this block.
unsigned LanesOf(int w) {
  const int first = w * kWarp;
  const int n = std::min(kWarp, R().threads - first);
  return n >= kWarp ? 0xffffffffu : (1u << n) - 1;
}

const char* WarpOpName(int kind) {
  switch (kind) {
    case kTesseraShfl:
      return "__shfl_sync";
    case kTesseraShflUp:
      return "__shfl_up_sync";
    case kTesseraShflDown:
      return "__shfl_down_sync";
    case kTesseraShflXor:
      return "__shfl_xor_sync";
    case kTesseraBallot:
      return "__ballot_sync";
    case kTesseraAny:
      return "__any_sync";
    case kTesseraAll:
      return "__all_sync";
    case kTesseraSyncWarp:
      return "__syncwarp";
  }
  return "a warp operation";
}

// Every lane of `mask` has arrived: what each receives.
void CompleteWarp(int w) {
  Runtime& r = R();
  WarpPending& p = r.warps[w];
  unsigned ballot = 0;
  for (int lane = 0; lane < kWarp; ++lane) {
    if ((p.mask >> lane & 1u) != 0 && p.values[lane] != 0) ballot |= 1u << lane;
  }
  for (int lane = 0; lane < kWarp; ++lane) {
    if ((p.mask >> lane & 1u) == 0) continue;
    Fiber& f = r.fibers[w * kWarp + lane];
    const int base = lane & ~(p.width - 1);
    int source = lane;
    switch (p.kind) {
      case kTesseraShfl:
        source = base + ((p.args[lane] % p.width) + p.width) % p.width;
        break;
      case kTesseraShflUp:
        source = lane - p.args[lane] >= base ? lane - p.args[lane] : lane;
        break;
      case kTesseraShflDown:
        source = lane + p.args[lane] < base + p.width ? lane + p.args[lane] : lane;
        break;
      case kTesseraShflXor:
        source = lane ^ p.args[lane];
        if (source < base || source >= base + p.width) source = lane;
        break;
      case kTesseraBallot:
        f.warp_result = ballot;
        continue;
      case kTesseraAny:
        f.warp_result = ballot != 0;
        continue;
      case kTesseraAll:
        f.warp_result = ballot == p.mask;
        continue;
      default:
        f.warp_result = 0;
        continue;
    }
    if ((p.mask >> source & 1u) == 0) {
      Violation(kLaunchFailed,
                "%s with mask 0x%08x: lane %d reads lane %d, which is not in the mask (its value "
                "is undefined on a GPU)",
                WarpOpName(p.kind), p.mask, lane, source);
    }
    f.warp_result = p.values[source];
  }
  for (int lane = 0; lane < kWarp; ++lane) {
    Fiber& f = r.fibers[w * kWarp + lane];
    if ((p.mask >> lane & 1u) != 0 && f.state == State::kAtWarp) f.state = State::kReady;
  }
  p.kind = -1;
  p.mask = 0;
  p.arrived = 0;
}

void FiberExit();

void FiberMain() {
  Runtime& r = R();
  r.kernel->invoke(r.kernel->fn, r.params);
  FiberExit();
}

void FiberExit() {
  Runtime& r = R();
  Fiber* f = r.current;
  const int w = f->linear / kWarp, lane = f->linear % kWarp;
  const WarpPending& p = r.warps[w];
  if (p.mask != 0 && (p.mask >> lane & 1u) != 0 && (p.arrived >> lane & 1u) == 0) {
    Violation(kLaunchFailed, "exits while lanes 0x%08x of its warp wait for it in %s (mask 0x%08x)",
              p.arrived, WarpOpName(p.kind), p.mask);
  }
  f->state = State::kDone;
  r.exited[w] |= 1u << lane;
  --r.live;
  if (r.at_barrier > 0 && r.at_barrier == r.live) ReleaseBarrier();  // exited threads count
  t_in_kernel = false;
  tessera_fiber_switch(&f->sp, r.scheduler);
  __builtin_unreachable();
}

// Stacks for the largest block, each above a guard page, made once.
void EnsureStacks() {
  Runtime& r = R();
  if (r.stacks != nullptr) return;
  const size_t each = kStackBytes + kGuardBytes;
  void* p = mmap(nullptr, each * kMaxThreads, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("fake libcuda: mmap of fiber stacks");
    std::abort();
  }
  r.stacks = static_cast<char*>(p);
  for (int i = 0; i < kMaxThreads; ++i) {
    char* lo = r.stacks + i * each;
    mprotect(lo, kGuardBytes, PROT_NONE);  // an overflow faults instead of corrupting
    r.fibers[i].stack = lo + kGuardBytes;
  }
}

// Finds the segments of the library holding `anchor`: the writable one, less what is
// read-only after relocation, is its kernels' shared memory; the rest is read-only to them.
// False when it has no writable segment.
bool FindSegments(const void* anchor, HostImage* image) {
  Dl_info info{};
  if (dladdr(anchor, &info) == 0) return false;
  struct Search {
    const void* base;
    HostImage* image;
  } search{info.dli_fbase, image};
  dl_iterate_phdr(
      [](dl_phdr_info* phdr, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        if (reinterpret_cast<const void*>(phdr->dlpi_addr) != s->base) return 0;
        uintptr_t relro_hi = 0;
        for (int i = 0; i < phdr->dlpi_phnum; ++i) {
          const ElfW(Phdr)& h = phdr->dlpi_phdr[i];
          if (h.p_type == PT_GNU_RELRO) relro_hi = phdr->dlpi_addr + h.p_vaddr + h.p_memsz;
        }
        for (int i = 0; i < phdr->dlpi_phnum; ++i) {
          const ElfW(Phdr)& h = phdr->dlpi_phdr[i];
          if (h.p_type != PT_LOAD) continue;
          uintptr_t lo = phdr->dlpi_addr + h.p_vaddr;
          const uintptr_t hi = lo + h.p_memsz;
          if ((h.p_flags & PF_W) != 0) {
            if (relro_hi > lo && relro_hi <= hi) {
              s->image->readonly.emplace_back(lo, relro_hi);
              lo = relro_hi;
            }
            s->image->shared_lo = lo;
            s->image->shared_hi = hi;
          } else {
            s->image->readonly.emplace_back(lo, hi);
          }
        }
        return 1;
      },
      &search);
  return image->shared_hi != 0;
}

// Loads libtessera_host_kernels.so from the fake driver's directory (its generated files
// register the kernels) and finds its segments.
void LoadHostKernels() {
  Runtime& r = R();
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&LoadHostKernels), &self) == 0 || self.dli_fname == nullptr) {
    r.load_error = "the fake driver cannot find its own file";
    return;
  }
  std::string path = self.dli_fname;
  path = path.substr(0, path.rfind('/') + 1) + "libtessera_host_kernels.so";
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* why = dlerror();
    r.load_error = why == nullptr ? "dlopen of " + path + " failed" : why;
    return;
  }
  void* any = dlsym(handle, "tessera_host_kernels_anchor");
  if (any == nullptr) {
    r.load_error = path + " has no tessera_host_kernels_anchor";
    return;
  }
  if (!FindSegments(any, &r.host_image)) r.load_error = path + " has no writable segment";
}

void RunBlock(uint3 index) {
  Runtime& r = R();
  r.block_index = index;
  r.threads = static_cast<int>(r.block.x * r.block.y * r.block.z);
  r.live = r.threads;
  r.at_barrier = 0;
  std::fill(std::begin(r.exited), std::end(r.exited), 0u);
  for (WarpPending& p : r.warps) p = WarpPending{};
  if (r.shared_dirty_lo < r.shared_dirty_hi) {
    std::fill(r.shared_written.begin() + static_cast<ptrdiff_t>(r.shared_dirty_lo),
              r.shared_written.begin() + static_cast<ptrdiff_t>(r.shared_dirty_hi), 0);
  }
  r.shared_dirty_lo = SIZE_MAX;
  r.shared_dirty_hi = 0;
  for (int i = 0; i < r.threads; ++i) {
    Fiber& f = r.fibers[i];
    f.linear = i;
    f.thread = uint3{static_cast<unsigned>(i) % r.block.x,
                     static_cast<unsigned>(i) / r.block.x % r.block.y,
                     static_cast<unsigned>(i) / (r.block.x * r.block.y)};
    f.state = State::kReady;
    // A first switch to it "returns" into FiberMain as if called (see tessera_fiber_switch):
    // control words, six registers, the return address, and a null frame above it.
    auto* top = reinterpret_cast<uint64_t*>(f.stack + kStackBytes);
    top[-1] = 0;
    top[-2] = reinterpret_cast<uint64_t>(&FiberMain);
    for (int k = 3; k <= 8; ++k) top[-k] = 0;
    uint32_t control[2] = {};
    asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(control[0]), "=m"(control[1]));
    std::memcpy(&top[-9], control, sizeof(control));
    f.sp = &top[-9];
  }
  for (;;) {
    bool progress = false;
    for (int i = 0; i < r.threads && r.error == kSuccess; ++i) {
      Fiber& f = r.fibers[i];
      if (f.state != State::kReady) continue;
      progress = true;
      r.current = &f;
      t_in_kernel = true;
      tessera_fiber_switch(&r.scheduler, f.sp);
      t_in_kernel = false;
      r.current = nullptr;
    }
    if (r.error != kSuccess || r.live == 0) return;
    if (!progress) {
      std::string waiting;
      int barrier = 0, warp = 0;
      for (int i = 0; i < r.threads; ++i) {
        barrier += r.fibers[i].state == State::kAtBarrier;
        warp += r.fibers[i].state == State::kAtWarp;
      }
      Fail(kLaunchFailed, "deadlock: " + std::to_string(barrier) +
                              " threads wait at __syncthreads and " + std::to_string(warp) +
                              " at a warp operation that the others never reach");
      return;
    }
  }
}

// Device memory holding [address, address + size), or null.
const DeviceRange* FindDevice(uintptr_t address) {
  const std::vector<DeviceRange>& memory = *R().memory;
  auto it = std::upper_bound(memory.begin(), memory.end(), address,
                             [](uintptr_t a, const DeviceRange& d) { return a < d.base; });
  if (it == memory.begin()) return nullptr;
  --it;
  return address < it->base + it->extent ? &*it : nullptr;
}

bool InImage(uintptr_t address) {
  for (const auto& [lo, hi] : R().image->readonly) {
    if (address >= lo && address < hi) return true;
  }
  return false;
}

void Check(uintptr_t address, size_t size, bool store) {
  if (!t_in_kernel) return;  // instrumented code used outside a launch
  Runtime& r = R();
  // Fast path: within what the last access's allocation allows.
  if (const DeviceRange* d = r.last; d != nullptr && address >= d->base &&
                                     address + size <= d->base + d->requested &&
                                     (size & (size - 1)) == 0 && (address & (size - 1)) == 0) {
    return;
  }
  const Fiber* f = r.current;
  const char* access = store ? "store" : "load";
  const auto lo = reinterpret_cast<uintptr_t>(f->stack);
  if (address >= lo && address + size <= lo + kStackBytes) return;
  const bool vector = size == 2 || size == 4 || size == 8 || size == 16;
  const uintptr_t shared_lo = r.image->shared_lo, shared_hi = r.image->shared_hi;
  if (address >= shared_lo && address < shared_hi) {
    if (address + size > shared_hi) {
      Violation(kIllegalAddress,
                "%zu-byte shared-memory %s at offset %" PRIuPTR
                " runs past the "
                "%" PRIuPTR " bytes of shared memory",
                size, access, address - shared_lo, shared_hi - shared_lo);
    }
    if (vector && address % size != 0) {
      Violation(kMisalignedAddress, "misaligned %zu-byte shared-memory %s at offset %" PRIuPTR,
                size, access, address - shared_lo);
    }
    const size_t offset = address - shared_lo;
    unsigned char* written = r.shared_written.data() + offset;
    if (store) {
      std::memset(written, 1, size);
      r.shared_dirty_lo = std::min(r.shared_dirty_lo, offset);
      r.shared_dirty_hi = std::max(r.shared_dirty_hi, offset + size);
    } else if (std::find(written, written + size, 0) != written + size) {
      Violation(kLaunchFailed,
                "%zu-byte shared-memory load at offset %" PRIuPTR
                " reads bytes "
                "that no thread of this block has written",
                size, address - shared_lo);
    }
    return;
  }
  if (const DeviceRange* d = FindDevice(address); d != nullptr) {
    if (d->context != r.context) {
      Violation(kIllegalAddress,
                "%zu-byte %s at 0x%" PRIxPTR
                ": memory of another context (the "
                "%" PRIu64 "-byte allocation at 0x%" PRIxPTR ")",
                size, access, address, d->requested, d->base);
    }
    if (address + size > d->base + d->requested) {
      Violation(kIllegalAddress,
                "%zu-byte %s at 0x%" PRIxPTR ": %" PRIu64
                " bytes past the end "
                "of the %" PRIu64 "-byte allocation at 0x%" PRIxPTR,
                size, access, address,
                static_cast<uint64_t>(address + size - d->base - d->requested), d->requested,
                d->base);
    }
    if (vector && address % size != 0) {
      Violation(kMisalignedAddress, "misaligned %zu-byte %s at 0x%" PRIxPTR, size, access, address);
    }
    r.last = d;
    return;
  }
  if (!store && InImage(address)) return;  // constants the compiler put in read-only data
  Violation(kIllegalAddress, "%zu-byte %s at 0x%" PRIxPTR ": not device memory of any context",
            size, access, address);
}

}  // namespace

void RegisterHostKernels(const HostKernel* kernels, size_t count) {
  for (size_t i = 0; i < count; ++i) Table()[kernels[i].name] = kernels[i];
}

const std::vector<HostKernel>* LoadHostModule(const std::string& path, std::string* error) {
  Runtime& r = R();
  std::lock_guard<std::mutex> lock(r.modules_mu);
  if (auto it = r.modules.find(path); it != r.modules.end()) return &it->second;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* why = dlerror();
    *error = why == nullptr ? "dlopen of " + path + " failed" : why;
    return nullptr;
  }
  const auto* entries =
      static_cast<const TesseraFakeHostEntry*>(dlsym(handle, "tessera_fake_host_entries"));
  if (entries == nullptr) {
    *error = path + " has no tessera_fake_host_entries";
    return nullptr;
  }
  auto* image = new HostImage();  // never freed: kernels of the module point at it
  if (!FindSegments(entries, image)) {
    delete image;
    *error = path + " has no writable segment";
    return nullptr;
  }
  std::vector<HostKernel> kernels;
  for (const TesseraFakeHostEntry* e = entries; e->name != nullptr; ++e) {
    HostKernel k;
    k.name = e->name;
    k.fn = e->fn;
    k.invoke = e->invoke;
    k.params = 1;
    k.sizes[0] = e->size;
    k.alignments[0] = e->alignment;
    k.image = image;
    kernels.push_back(k);
  }
  return &r.modules.emplace(path, std::move(kernels)).first->second;
}

const HostKernel* FindHostKernel(std::string_view name, std::string* error) {
  Runtime& r = R();
  std::call_once(r.loaded, LoadHostKernels);
  if (!r.load_error.empty()) {
    if (error != nullptr) *error = r.load_error;
    return nullptr;
  }
  auto it = Table().find(name);
  return it == Table().end() ? nullptr : &it->second;
}

int RunHostKernel(const HostKernel& kernel, dim3 grid, dim3 block, void** params,
                  const std::vector<DeviceRange>& memory, const void* context,
                  std::string* message) {
  Runtime& r = R();
  std::lock_guard<std::mutex> lock(r.mu);
  EnsureStacks();
  r.kernel = &kernel;
  r.params = params;
  r.grid = grid;
  r.block = block;
  r.memory = &memory;
  r.last = nullptr;
  r.context = context;
  r.error = kSuccess;
  r.message.clear();
  r.image = kernel.image != nullptr ? kernel.image : &r.host_image;
  r.shared_written.assign(r.image->shared_hi - r.image->shared_lo, 0);
  r.shared_dirty_lo = SIZE_MAX;
  r.shared_dirty_hi = 0;
  for (unsigned z = 0; z < grid.z && r.error == kSuccess; ++z) {
    for (unsigned y = 0; y < grid.y && r.error == kSuccess; ++y) {
      for (unsigned x = 0; x < grid.x && r.error == kSuccess; ++x) RunBlock(uint3{x, y, z});
    }
  }
  r.memory = nullptr;
  r.last = nullptr;
  if (message != nullptr) *message = r.message;
  return r.error;
}

}  // namespace tessera::fake_cuda

using tessera::fake_cuda::R;
using tessera::fake_cuda::State;

// ---- what device.h declares, for libtessera_host_kernels.so ---------------------------------

#define DEVICE_EXPORT __attribute__((visibility("default")))

extern "C" {

DEVICE_EXPORT uint3 tessera_device_thread_idx() { return R().current->thread; }
DEVICE_EXPORT uint3 tessera_device_block_idx() { return R().block_index; }
DEVICE_EXPORT dim3 tessera_device_block_dim() { return R().block; }
DEVICE_EXPORT dim3 tessera_device_grid_dim() { return R().grid; }

DEVICE_EXPORT void tessera_device_syncthreads() {
  auto& r = R();
  if (++r.at_barrier == r.live) {
    tessera::fake_cuda::ReleaseBarrier();
    return;
  }
  r.current->state = State::kAtBarrier;
  tessera::fake_cuda::Yield();
}

DEVICE_EXPORT unsigned long long tessera_device_warp(int kind, unsigned mask,
                                                     unsigned long long value, int arg, int width) {
  using tessera::fake_cuda::Violation;
  auto& r = R();
  auto* f = r.current;
  const int w = f->linear / tessera::fake_cuda::kWarp;
  const int lane = f->linear % tessera::fake_cuda::kWarp;
  const unsigned exists = tessera::fake_cuda::LanesOf(w);
  const char* name = tessera::fake_cuda::WarpOpName(kind);
  if (kind == kTesseraBallot && mask == 0) return exists & ~r.exited[w];  // __activemask
  if ((mask >> lane & 1u) == 0) {
    Violation(tessera::fake_cuda::kLaunchFailed,
              "%s with mask 0x%08x, which leaves out the calling lane %d", name, mask, lane);
  }
  if ((mask & ~exists) != 0) {
    Violation(tessera::fake_cuda::kLaunchFailed,
              "%s with mask 0x%08x names lanes that this block of %d threads does not have", name,
              mask, r.threads);
  }
  if ((mask & r.exited[w]) != 0) {
    Violation(tessera::fake_cuda::kLaunchFailed,
              "%s with mask 0x%08x names lanes 0x%08x, which have exited", name, mask,
              mask & r.exited[w]);
  }
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
    Violation(tessera::fake_cuda::kLaunchFailed, "%s with width %d (a power of 2 up to 32)", name,
              width);
  }
  auto& p = r.warps[w];
  if (p.mask != 0 && (p.mask != mask || p.kind != kind || p.width != width)) {
    Violation(tessera::fake_cuda::kLaunchFailed,
              "%s with mask 0x%08x while lanes 0x%08x of its warp wait in %s with mask 0x%08x",
              name, mask, p.arrived, tessera::fake_cuda::WarpOpName(p.kind), p.mask);
  }
  p.kind = kind;
  p.mask = mask;
  p.width = width;
  p.arrived |= 1u << lane;
  p.values[lane] = value;
  p.args[lane] = arg;
  if (p.arrived == mask) {
    tessera::fake_cuda::CompleteWarp(w);
    return f->warp_result;
  }
  f->state = State::kAtWarp;
  tessera::fake_cuda::Yield();
  return f->warp_result;
}

DEVICE_EXPORT void tessera_device_atomic(const void* address, unsigned long size) {
  tessera::fake_cuda::Check(reinterpret_cast<uintptr_t>(address), size, true);
}

// Every load and store of the kernels (host_kernel_glue.cc forwards -fsanitize=kernel-address's
// checks here).
DEVICE_EXPORT void tessera_device_check(uintptr_t address, size_t size, int store) {
  tessera::fake_cuda::Check(address, size, store != 0);
}

DEVICE_EXPORT void tessera_fake_cuda_register_host_kernels(
    const tessera::fake_cuda::HostKernel* kernels, size_t count) {
  tessera::fake_cuda::RegisterHostKernels(kernels, count);
}

}  // extern "C"
