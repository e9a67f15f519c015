# Included by the tsan preset after project() (CMAKE_PROJECT_INCLUDE): what ThreadSanitizer
# needs beyond -fsanitize=thread with Debian's toolchain and libraries.

# 1. The Abseil and gRPC that tests/tsan/build_deps.sh built with -fsanitize=thread, never
#    Debian's uninstrumented ones, whose locks and hand-overs TSan cannot see (see the script).
set(TESSERA_TSAN_DEPS "${CMAKE_BINARY_DIR}/tsan-deps" CACHE PATH
  "Abseil and gRPC built with -fsanitize=thread by tests/tsan/build_deps.sh")
if(NOT EXISTS "${TESSERA_TSAN_DEPS}/abseil.version" OR NOT EXISTS "${TESSERA_TSAN_DEPS}/grpc.version")
  message(FATAL_ERROR "No ThreadSanitizer Abseil and gRPC in ${TESSERA_TSAN_DEPS}: run\n"
    "  tests/tsan/build_deps.sh ${CMAKE_BINARY_DIR}\nfirst (once).")
endif()
# Abseil from there (forced, so that a build tree that once found Debian's switches too).
# gRPC's headers, plugin and CMake package stay Debian's (the same version): only its
# libraries are replaced, at run time, under the same sonames.
set(absl_DIR "${TESSERA_TSAN_DEPS}/lib/cmake/absl" CACHE PATH "" FORCE)
list(APPEND CMAKE_BUILD_RPATH "${TESSERA_TSAN_DEPS}/lib")
# Debian's libraries that need Abseil or gRPC (libgrpc++ itself, libgrpc++_reflection) carry no
# run path: the executables' DT_RPATH, unlike the DT_RUNPATH that the linker writes by default,
# also applies to the libraries that they load, so those bind to the instrumented copies too.
# Executables only: a DT_RPATH also comes before $LD_LIBRARY_PATH, and the CUDA module's
# (the toolkit's lib directory) would then load the real cuBLAS in place of the fake one
# that the fake_cuda tests put on $LD_LIBRARY_PATH.
add_link_options("$<$<STREQUAL:$<TARGET_PROPERTY:TYPE>,EXECUTABLE>:-Wl,--disable-new-dtags>")

# 2. GCC warns that ThreadSanitizer does not model std::atomic_thread_fence, which Abseil's
#    flag headers use inline (absl/flags/internal/sequence_lock.h). Flags are written only in
#    main() before any thread starts: the warning is silenced.
add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wno-tsan>)
