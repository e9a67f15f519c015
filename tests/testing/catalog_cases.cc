#include "tests/testing/catalog_cases.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"

#include "kernels/accuracy.h"

namespace tessera::testing {

using kernels::DType;
using kernels::TensorMeta;

namespace {

// Larger than one grid of the CUDA backend (a grid-stride loop over at most a few blocks per
// SM of 256 threads), not a multiple of a block or of a 16-byte pack.
constexpr int64_t kLarge = (int64_t{1} << 20) + 5;

const std::vector<DType>& DTypesOf(const kernels::KernelDef& def) {
  return def.inputs.empty() ? def.outputs[0].dtypes : def.inputs[0].dtypes;
}

}  // namespace

std::vector<CatalogCase> CatalogCases(bool large) {
  std::vector<CatalogCase> cases;
  const kernels::Registry& registry = kernels::Registry::Global();
  for (const kernels::KernelDef& def : registry.kernels()) {
    for (DType d : DTypesOf(def)) {
      const std::string& k = def.name;
      auto add = [&](std::vector<TensorMeta> in, kernels::Attrs attrs, std::string label) {
        // Only shapes the catalog accepts (an empty reduction of max, say, is refused there).
        if (!registry.Prepare(k, in, attrs).ok()) return;
        cases.push_back(CatalogCase{k, d, std::move(in), std::move(attrs),
                                    absl::StrCat(k, "/", kernels::DTypeName(d), "/", label)});
      };
      if (k == "fill") {
        const std::string name(kernels::DTypeName(d));
        add({}, {{"value", 1.75}, {"dtype", name}, {"shape", std::vector<int64_t>{3, 1000}}},
            "3x1000");
        add({}, {{"value", -3.0}, {"dtype", name}, {"shape", std::vector<int64_t>{0, 4}}}, "empty");
        if (large) {
          add({}, {{"value", 2.5}, {"dtype", name}, {"shape", std::vector<int64_t>{kLarge}}},
              "large");
        }
      } else if (k == "cast") {
        for (DType to : kernels::kAllDTypes) {
          add({{d, {4, 257}}}, {{"dtype", std::string(kernels::DTypeName(to))}},
              absl::StrCat("to_", kernels::DTypeName(to)));
        }
        add({{d, {0}}}, {{"dtype", std::string("f32")}}, "empty");
      } else if (def.inputs.size() == 2 && def.outputs[0].dtypes == def.inputs[0].dtypes &&
                 k != "matmul") {
        add({{d, {4099}}, {d, {4099}}}, {}, "contiguous");
        add({{d, {4, 1, 33}}, {d, {5, 33}}}, {}, "broadcast");
        add({{d, {7, 9}}, {d, {}}}, {}, "scalar");
        add({{d, {3, 1}}, {d, {1, 129}}}, {}, "outer");
        add({{d, {0, 5}}, {d, {5}}}, {}, "empty");
        if (large) add({{d, {kLarge}}, {d, {kLarge}}}, {}, "large");
      } else if (k == "sum" || k == "mean" || k == "max" || k == "min") {
        add({{d, {6, 7, 130}}}, {{"axes", std::vector<int64_t>{2}}}, "last");
        add({{d, {6, 7, 130}}}, {{"axes", std::vector<int64_t>{1}}}, "middle");
        add({{d, {6, 7, 130}}}, {{"axes", std::vector<int64_t>{0, 2}}, {"keepdims", true}},
            "outer_inner");
        add({{d, {6, 7, 130}}}, {}, "all");
        add({{d, {3, 0}}}, {{"axes", std::vector<int64_t>{1}}}, "empty_axis");
        if (large) add({{d, {kLarge}}}, {}, "large");
      } else if (k == "argmax") {
        add({{d, {6, 300, 5}}}, {{"axis", int64_t{1}}}, "middle");
        add({{d, {6, 300}}}, {}, "last");
        add({{d, {2, 3000}}}, {}, "long_rows");
      } else if (k == "softmax" || k == "log_softmax") {
        add({{d, {6, 1030}}}, {}, "last");
        add({{d, {50, 6}}}, {{"axis", int64_t{0}}}, "first");
        add({{d, {3, 4, 5}}}, {{"axis", int64_t{1}}}, "middle");
        add({{d, {2, 5000}}}, {}, "long_rows");
      } else if (k == "layer_norm") {
        add({{d, {8, 1000}}, {d, {1000}}, {d, {1000}}}, {}, "weight_bias");
        add({{d, {8, 64}}}, {}, "plain");
        add({{d, {3, 3000}}}, {}, "long_rows");
      } else if (k == "rms_norm") {
        add({{d, {8, 1000}}, {d, {1000}}}, {}, "weight");
        add({{d, {8, 33}}}, {}, "plain");
      } else if (k == "transpose") {
        add({{d, {3, 40, 5}}}, {{"perm", std::vector<int64_t>{2, 0, 1}}}, "perm");
        add({{d, {33, 65}}}, {}, "reversed");
        add({{d, {0, 7}}}, {}, "empty");
      } else if (k == "matmul") {
        add({{d, {2, 65, 33}}, {d, {33, 17}}}, {{"alpha", 0.5}}, "batched");
        add({{d, {33, 65}}, {d, {17, 33}}}, {{"transpose_a", true}, {"transpose_b", true}},
            "transposed");
        add({{d, {2, 1, 5, 4}}, {d, {3, 4, 6}}}, {}, "broadcast_batches");
        add({{d, {1, 300}}, {d, {300, 1}}}, {}, "dot");
      } else {  // unary
        const kernels::Attrs attrs =
            k == "scale" ? kernels::Attrs{{"alpha", 1.5}, {"beta", -0.25}} : kernels::Attrs{};
        add({{d, {4099}}}, attrs, "4099");
        add({{d, {3, 5}}}, attrs, "tiny");
        add({{d, {0}}}, attrs, "empty");
        if (large) add({{d, {kLarge}}}, attrs, "large");
      }
    }
  }
  return cases;
}

std::set<std::pair<std::string, DType>> CatalogPairs() {
  std::set<std::pair<std::string, DType>> pairs;
  for (const kernels::KernelDef& def : kernels::Registry::Global().kernels()) {
    for (DType d : DTypesOf(def)) pairs.emplace(def.name, d);
  }
  return pairs;
}

double TermsOf(const kernels::Plan& plan) {
  const std::string& k = plan.kernel->name;
  const kernels::Shape& in = plan.inputs.empty() ? kernels::Shape{} : plan.inputs[0].shape;
  if (k == "sum" || k == "mean" || k == "max" || k == "min") {
    const int64_t outputs = kernels::CheckedNumElements(plan.outputs[0].shape);
    return static_cast<double>(kernels::CheckedNumElements(in)) /
           static_cast<double>(std::max<int64_t>(outputs, 1));
  }
  if (k == "matmul" && !in.empty()) {
    const bool ta = kernels::AttrBool(plan.attrs, "transpose_a");
    return static_cast<double>(in.size() < 2 || !ta ? in.back() : in[in.size() - 2]);
  }
  if ((k == "softmax" || k == "log_softmax") && !in.empty()) {
    int64_t axis = kernels::AttrInt(plan.attrs, "axis");
    if (axis < 0) axis += static_cast<int64_t>(in.size());
    return static_cast<double>(in[static_cast<size_t>(axis)]);
  }
  if ((k == "layer_norm" || k == "rms_norm") && !in.empty()) return static_cast<double>(in.back());
  return 1;
}

double MagnitudeOf(const kernels::Plan& plan, double max_abs_input, double want) {
  const std::string& k = plan.kernel->name;
  const double terms = TermsOf(plan);
  if (k == "matmul") return terms * max_abs_input * max_abs_input;
  if (k == "sum" || k == "mean") return (k == "sum" ? terms : 1) * max_abs_input;
  if (k == "scale") {
    return std::abs(kernels::AttrFloat(plan.attrs, "alpha")) * max_abs_input +
           std::abs(kernels::AttrFloat(plan.attrs, "beta"));
  }
  if (k == "gelu") return max_abs_input;
  return std::max(1.0, std::abs(want));
}

bool Matches(const kernels::Plan& plan, DType dtype, double want, double got,
             double max_abs_input) {
  return kernels::BackendsAgree(kernels::BoundFor(plan.kernel->name, dtype), dtype, want, got,
                                MagnitudeOf(plan, max_abs_input, want), TermsOf(plan));
}

}  // namespace tessera::testing
