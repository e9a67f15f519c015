#ifndef TESSERA_KERNELS_ACCURACY_H_
#define TESSERA_KERNELS_ACCURACY_H_

// The documented accuracy of every floating-point kernel of the catalog, per dtype: what
// each backend promises against the exact result, and what tests of one backend against a
// higher-precision evaluation (tests/unit/kernels/accuracy_test.cc) or against another backend
// (tests/testing/catalog_cases.cc) allow. docs/api.md lists the same table.
//
// An output element may differ from the exact result by at most
//   ulps * ulp(exact)  +  terms_ulps * eps * magnitude  +  tiny
// where ulp and eps are the output type's (f16 and bf16 are computed in f32 and rounded once,
// so their bounds are in their own ulps), `magnitude` is the size of what was combined (the
// sum of |terms| of a sum or dot product, |x| for a cancelling expression; see
// AccuracyBound::terms_ulps), and `tiny` is half the smallest normal number (results in the
// subnormal range may flush or round there, on both backends).
#include <string_view>

#include "kernels/dtype.h"

namespace tessera::kernels {

struct AccuracyBound {
  /// Units in the last place of the exact result: 0.5 for a correctly rounded operation.
  double ulps = 0;
  /// Multiples of eps * magnitude, for results computed from many terms or with
  /// cancellation: sums and means (magnitude: sum of |x|), dot products (sum of |a b|),
  /// normalizations and softmax (the row's magnitude), scale (|alpha x| + |beta|), gelu (|x|).
  /// Per term where the error grows with the count: multiplied by log2(terms) + 1.
  double terms_ulps = 0;
  /// Whether terms_ulps grows with log2 of the number of terms (sums, dot products).
  bool grows_with_terms = false;
};

/// The bound of `kernel` (a catalog name, or a function of tenant-defined kernels such as
/// "sin", docs/kernels.md) for outputs of `dtype`. Integer and boolean outputs, kernels that
/// only move or select values (copy, transpose, max, min, maximum, minimum, relu, neg, abs)
/// and functions with representable results (ceil, floor, trunc, round, copysign, isnan,
/// isinf, isfinite) are exact: all zero. Unknown names: NaN ulps (a test fails on it).
AccuracyBound BoundFor(std::string_view kernel, DType dtype);

/// Whether `got` is within `bound` of `exact` (in long double, so that a reference is not
/// rounded twice) for an output of `dtype`: NaN where exact is
/// NaN, the same infinity where exact is infinite. `magnitude` and `terms` as above (1 and 1
/// for element-wise kernels).
bool WithinBound(const AccuracyBound& bound, DType dtype, long double exact, double got,
                 double magnitude = 0, double terms = 1);

/// The allowed difference between two backends' results for the same inputs, each within
/// `bound` of the exact result `reference` (either's result will do): twice the bound.
bool BackendsAgree(const AccuracyBound& bound, DType dtype, double reference, double other,
                   double magnitude = 0, double terms = 1);

/// The unit in the last place of `x` in `dtype` (for f16 and bf16, of their own mantissa).
double UlpOf(DType dtype, double x);

}  // namespace tessera::kernels

#endif  // TESSERA_KERNELS_ACCURACY_H_
