#ifndef TESSERA_TESTS_TESTING_CATALOG_CASES_H_
#define TESSERA_TESTS_TESTING_CATALOG_CASES_H_

// The whole kernel catalog as test cases: every kernel with every dtype it accepts, each with
// the shapes that exercise its launch geometry and indexing (broadcasting, middle axes,
// transposed operands, empty tensors, sizes that are no multiple of a block or of a vector
// pack, sizes larger than one grid). Used to compare backends: tests/gpu/gpu_test.cc (the
// backends directly) and tests/integration/catalog_test.cc (through servers).
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/registry.h"

namespace tessera::testing {

struct CatalogCase {
  std::string kernel;
  kernels::DType dtype;  // the one the case is for (its first operand's, or fill's output)
  std::vector<kernels::TensorMeta> inputs;
  kernels::Attrs attrs;
  std::string label;  // "kernel/dtype/shape"
};

/// Every case; `large` adds the cases larger than one grid (slower on the fake driver).
std::vector<CatalogCase> CatalogCases(bool large = true);

/// The (kernel, dtype) pairs of the registry: each kernel with every dtype its first operand
/// (fill: its output) admits. The cases above must cover exactly these.
std::set<std::pair<std::string, kernels::DType>> CatalogPairs();

/// How many terms each output element of `plan` combines (the reduced elements of a sum, k of
/// a matmul, the row of a softmax or norm; 1 for element-wise kernels), and the size of what
/// it combines given the largest input magnitude: for kernels/accuracy.h's bounds.
double TermsOf(const kernels::Plan& plan);
double MagnitudeOf(const kernels::Plan& plan, double max_abs_input, double want);

/// Whether `got` from one backend matches `want` from another for an output of `plan`: both
/// within the documented bound of the kernel (kernels/accuracy.h) of the exact result.
bool Matches(const kernels::Plan& plan, kernels::DType dtype, double want, double got,
             double max_abs_input);

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_CATALOG_CASES_H_
