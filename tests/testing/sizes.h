// Byte sizes the tests write quotas, tensors and limits in.
#ifndef TESSERA_TESTS_TESTING_SIZES_H_
#define TESSERA_TESTS_TESTING_SIZES_H_

#include <cstdint>

namespace tessera::testing {

inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_SIZES_H_
