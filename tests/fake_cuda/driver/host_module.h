#ifndef TESSERA_TESTS_FAKE_CUDA_DRIVER_HOST_MODULE_H_
#define TESSERA_TESTS_FAKE_CUDA_DRIVER_HOST_MODULE_H_

// The entry-point table of a module that the fake driver's kernel compiler
// (fake_kernel_compiler.cc) builds from a generated kernel (kernels/expr/cuda_codegen.h) for
// the host: appended to the source, which is compiled with device.h like the catalog's
// kernels, into a shared object that the fake's cuModuleLoadData loads. No standard header,
// so that the per-kernel host compile stays fast.

/// One __global__ function of the module, taking one parameter (by value).
struct TesseraFakeHostEntry {
  const char* name;  // null ends the table
  void (*fn)();
  /// Calls `fn` with the parameter `params[0]` points at (the driver's copy).
  void (*invoke)(void (*fn)(), void** params);
  unsigned int size;
  unsigned int alignment;
};

/// The table's symbol in the shared object.
#define TESSERA_FAKE_HOST_ENTRIES tessera_fake_host_entries

template <typename F>
struct TesseraFakeEntryOf;

template <typename P>
struct TesseraFakeEntryOf<void (*)(P)> {
  // The driver's copy of the parameter is not device memory: no access check here.
  [[gnu::no_sanitize_address]] static void Invoke(void (*fn)(), void** params) {
    reinterpret_cast<void (*)(P)>(fn)(*static_cast<P*>(params[0]));
  }
  static TesseraFakeHostEntry Make(const char* name, void (*fn)(P)) {
    return {name, reinterpret_cast<void (*)()>(fn), &Invoke, sizeof(P), alignof(P)};
  }
};

#endif  // TESSERA_TESTS_FAKE_CUDA_DRIVER_HOST_MODULE_H_
