#ifndef TESSERA_SERVER_COMMON_STATUS_MACROS_H_
#define TESSERA_SERVER_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

/// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                                           \
  do {                                                                  \
    if (absl::Status _tessera_status = (expr); !_tessera_status.ok()) { \
      return _tessera_status;                                           \
    }                                                                   \
  } while (false)

#define TESSERA_CONCAT_INNER_(a, b) a##b
#define TESSERA_CONCAT_(a, b) TESSERA_CONCAT_INNER_(a, b)

/// `ASSIGN_OR_RETURN(auto x, MakeX());` declares/assigns from an absl::StatusOr or returns
/// its status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  TESSERA_ASSIGN_OR_RETURN_IMPL_(TESSERA_CONCAT_(_tessera_statusor_, __LINE__), lhs, expr)

#define TESSERA_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) {                                     \
    return std::move(statusor).status();                    \
  }                                                         \
  lhs = std::move(statusor).value()

#endif  // TESSERA_SERVER_COMMON_STATUS_MACROS_H_
