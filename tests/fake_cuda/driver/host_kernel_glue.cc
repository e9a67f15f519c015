// Part of libtessera_host_kernels.so, not instrumented: the checks that -fsanitize=kernel-address
// makes the kernels call, forwarded to the fake driver (device_runtime.cc). Hidden, so that
// they never interpose on, nor are interposed by, a real AddressSanitizer in the process.
#include <cstddef>
#include <cstdint>

extern "C" {

void tessera_device_check(uintptr_t address, size_t size, int store);

// What the fake driver looks up to find this library's segments.
__attribute__((visibility("default"))) extern const int tessera_host_kernels_anchor = 1;

#define TESSERA_CHECKS(n)                                                       \
  void __asan_load##n##_noabort(uintptr_t a) { tessera_device_check(a, n, 0); } \
  void __asan_store##n##_noabort(uintptr_t a) { tessera_device_check(a, n, 1); }
TESSERA_CHECKS(1)
TESSERA_CHECKS(2)
TESSERA_CHECKS(4)
TESSERA_CHECKS(8)
TESSERA_CHECKS(16)
#undef TESSERA_CHECKS
void __asan_loadN_noabort(uintptr_t a, size_t n) { tessera_device_check(a, n, 0); }
void __asan_storeN_noabort(uintptr_t a, size_t n) { tessera_device_check(a, n, 1); }
void __asan_handle_no_return() {}
void __asan_before_dynamic_init(const char*) {}
void __asan_after_dynamic_init() {}

}  // extern "C"
