// matmul through OpenBLAS (single-threaded calls; the scheduler spreads row blocks and
// batches over workers). f16/bf16 are widened to f32, multiplied, and rounded once.
#include <algorithm>
#include <cstdlib>
#include <vector>

#include <cblas.h>

#include "kernels/cpu/element.h"
#include "kernels/cpu/kernels_internal.h"

namespace tessera::kernels::cpu {
namespace {

// The largest dimension up to which a product alone on the machine is one multi-threaded
// OpenBLAS call rather than row blocks (512: the crossover measured in scenario 3);
// $TESSERA_THREADED_BLAS_MAX_DIM overrides it (0: never), for measuring both ways.
int64_t ThreadedBlasMaxDim() {
  static const int64_t max_dim = [] {
    const char* text = std::getenv("TESSERA_THREADED_BLAS_MAX_DIM");
    return text != nullptr ? std::strtoll(text, nullptr, 10) : int64_t{512};
  }();
  return max_dim;
}

template <typename T>
void Gemm(const MatmulGeometry& g, const T* a, const T* b, T* c, int64_t rows, T alpha, T beta) {
  const auto ta = g.ta ? CblasTrans : CblasNoTrans;
  const auto tb = g.tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(rows), static_cast<int>(g.n),
                static_cast<int>(g.k), alpha, a, static_cast<int>(g.lda), b,
                static_cast<int>(g.ldb), beta, c, static_cast<int>(g.n));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(rows), static_cast<int>(g.n),
                static_cast<int>(g.k), alpha, a, static_cast<int>(g.lda), b,
                static_cast<int>(g.ldb), beta, c, static_cast<int>(g.n));
  }
}

// Runs every (batch, row block) of y = alpha * op(a) @ op(b) + beta * y.
template <typename T>
void MatmulTyped(const MatmulGeometry& g, const T* a, const T* b, T* y, double alpha_d,
                 double beta_d, Parallel& parallel) {
  const T alpha = static_cast<T>(alpha_d);
  const T beta = static_cast<T>(beta_d);
  const int64_t batches = static_cast<int64_t>(g.a_offset.size());
  if (g.k == 0) {  // the product is empty: y = beta * y
    const int64_t total = batches * g.m * g.n;
    for (int64_t i = 0; i < total; ++i) y[i] = beta == T(0) ? T(0) : beta * y[i];
    return;
  }
  // A small single product with the machine to itself: one multi-threaded OpenBLAS call,
  // whose threads share packed panels, beats row blocks on separate workers (measured:
  // docs/benchmarks.md, scenario 3). OpenBLAS's thread count is process-wide, so it is raised
  // only for this call, which no other work overlaps (AloneConcurrency).
  if (batches == 1 && std::max({g.m, g.n, g.k}) <= ThreadedBlasMaxDim()) {
    if (const int alone = parallel.AloneConcurrency(); alone > 1) {
      openblas_set_num_threads(alone);
      Gemm<T>(g, a + g.a_offset[0], b + g.b_offset[0], y, g.m, alpha, beta);
      openblas_set_num_threads(1);
      return;
    }
  }
  // One row block per worker (fewer when batches already fill them), each at least 64 rows:
  // BLAS is most efficient on large blocks.
  const int64_t workers = std::max<int64_t>(1, parallel.Concurrency());
  const int64_t blocks_per_matrix =
      std::clamp<int64_t>((workers + batches - 1) / batches, 1, std::max<int64_t>(1, g.m / 64));
  const int64_t block_rows = (g.m + blocks_per_matrix - 1) / blocks_per_matrix;
  parallel.For(batches * blocks_per_matrix, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / blocks_per_matrix;
      const int64_t r0 = (item % blocks_per_matrix) * block_rows;
      const int64_t rows = std::min(block_rows, g.m - r0);
      if (rows <= 0) continue;
      // Row r0 of op(a): row r0 of a, or column r0 of a stored [K, M].
      const T* a_block = a + g.a_offset[t] + (g.ta ? r0 : r0 * g.lda);
      Gemm<T>(g, a_block, b + g.b_offset[t], y + (t * g.m + r0) * g.n, rows, alpha, beta);
    }
  });
}

}  // namespace

void RunMatmul(const Plan& plan, const void* a, const void* b, void* out, Parallel& parallel) {
  MatmulGeometry g = MakeMatmulGeometry(plan);
  if (g.m == 0 || g.n == 0 || g.a_offset.empty()) return;
  const double alpha = AttrFloat(plan.attrs, "alpha");
  const double beta = AttrFloat(plan.attrs, "beta");
  const DType dtype = plan.inputs[0].dtype;
  if (dtype == DType::kF32) {
    return MatmulTyped(g, static_cast<const float*>(a), static_cast<const float*>(b),
                       static_cast<float*>(out), alpha, beta, parallel);
  }
  if (dtype == DType::kF64) {
    return MatmulTyped(g, static_cast<const double*>(a), static_cast<const double*>(b),
                       static_cast<double*>(out), alpha, beta, parallel);
  }
  // f16/bf16: widen, multiply in f32, round once.
  Dispatch(dtype, [&]<DType D>() {
    if constexpr (D == DType::kF16 || D == DType::kBF16) {
      auto widen = [&](const void* p, int64_t n) {
        std::vector<float> w(static_cast<size_t>(n));
        const auto* s = static_cast<const uint16_t*>(p);
        parallel.For(n, kElementGrain, [&](int64_t b0, int64_t e0) {
          for (int64_t i = b0; i < e0; ++i) w[i] = Elem<D>::Load(s[i]);
        });
        return w;
      };
      std::vector<float> wa = widen(a, CheckedNumElements(plan.inputs[0].shape));
      std::vector<float> wb = widen(b, CheckedNumElements(plan.inputs[1].shape));
      const int64_t ny = CheckedNumElements(plan.outputs[0].shape);
      std::vector<float> wy = beta != 0 ? widen(out, ny) : std::vector<float>(ny, 0.0f);
      MatmulTyped(g, wa.data(), wb.data(), wy.data(), alpha, beta, parallel);
      auto* y = static_cast<uint16_t*>(out);
      parallel.For(ny, kElementGrain, [&](int64_t b0, int64_t e0) {
        for (int64_t i = b0; i < e0; ++i) y[i] = Elem<D>::Store(wy[i]);
      });
    }
  });
}

}  // namespace tessera::kernels::cpu
