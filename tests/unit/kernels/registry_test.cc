#include "kernels/registry.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::kernels {
namespace {

using ::testing::HasSubstr;

const Registry& R() { return Registry::Global(); }

TensorMeta F32(Shape shape) { return {DType::kF32, std::move(shape)}; }

TEST(RegistryTest, CatalogIsCompleteAndSorted) {
  std::vector<std::string> names;
  for (const KernelDef& k : R().kernels()) names.push_back(k.name);
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  for (const char* expected :
       {"fill",       "copy",     "cast",      "neg",   "abs",     "exp",     "log",
        "sqrt",       "rsqrt",    "relu",      "gelu",  "sigmoid", "tanh",    "scale",
        "add",        "sub",      "mul",       "div",   "maximum", "minimum", "pow",
        "sum",        "mean",     "max",       "min",   "argmax",  "softmax", "log_softmax",
        "layer_norm", "rms_norm", "transpose", "matmul"}) {
    const KernelDef* k = R().Find(expected);
    ASSERT_NE(k, nullptr) << expected;
    EXPECT_FALSE(k->description.empty()) << expected;
    for (const ParamDef& p : k->inputs) EXPECT_FALSE(p.dtypes.empty()) << expected;
  }
  EXPECT_EQ(R().Find("conv2d"), nullptr);
}

TEST(RegistryTest, ErrorsNameTheKernelOperandAndRule) {
  auto error = [](absl::string_view name, std::vector<TensorMeta> in, Attrs attrs = {},
                  OutputHints hints = {}) {
    absl::Status s = R().Prepare(name, std::move(in), std::move(attrs), hints).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.message());
  };
  EXPECT_THAT(error("conv2d", {}), HasSubstr("kernel \"conv2d\" is unknown"));
  EXPECT_THAT(error("add", {F32({2})}), HasSubstr("add takes 2 inputs (a, b); got 1"));
  EXPECT_THAT(error("layer_norm", {}), HasSubstr("takes 1 to 3 inputs"));
  EXPECT_THAT(error("exp", {{DType::kI32, {2}}}),
              HasSubstr("exp input 0 (x) has dtype i32; accepted: f32, f16, bf16, f64"));
  EXPECT_THAT(error("add", {F32({2}), {DType::kF64, {2}}}), HasSubstr("same dtype"));
  EXPECT_THAT(error("add", {F32({2}), F32({3})}), HasSubstr("do not broadcast"));
  EXPECT_THAT(error("scale", {F32({2})}, {{"gamma", 1.0}}),
              HasSubstr("scale has no attribute \"gamma\"; its attributes: alpha, beta"));
  EXPECT_THAT(error("scale", {F32({2})}, {{"alpha", std::string("x")}}),
              HasSubstr("attribute alpha must be float; got string"));
  EXPECT_THAT(error("cast", {F32({2})}), HasSubstr("cast attribute dtype (string) is required"));
  EXPECT_THAT(error("cast", {F32({2})}, {{"dtype", std::string("f128")}}),
              HasSubstr("\"f128\" is unknown"));
  EXPECT_THAT(error("sum", {F32({2, 3})}, {{"axes", std::vector<int64_t>{2}}}),
              HasSubstr("axes[0] is 2; the range is -2..1"));
  EXPECT_THAT(error("sum", {F32({2, 3})}, {{"axes", std::vector<int64_t>{1, -1}}}),
              HasSubstr("twice"));
  EXPECT_THAT(error("transpose", {F32({2, 3})}, {{"perm", std::vector<int64_t>{0, 0}}}),
              HasSubstr("not a permutation"));
  EXPECT_THAT(error("matmul", {F32({2, 3}), F32({4, 5})}), HasSubstr("inner dimensions differ"));
  EXPECT_THAT(error("matmul", {F32({3}), F32({3, 5})}), HasSubstr("rank >= 2"));
  EXPECT_THAT(error("matmul", {F32({2, 2, 3}), F32({3, 3, 5})}), HasSubstr("batch dimensions"));
  EXPECT_THAT(error("layer_norm", {F32({4, 8}), F32({4})}),
              HasSubstr("weight has shape [4]; it must be [8]"));
  EXPECT_THAT(error("layer_norm", {F32({8})}, {{"eps", 0.0}}), HasSubstr("eps must be > 0"));
  EXPECT_THAT(error("fill", {}), HasSubstr("give attribute shape"));
  EXPECT_THAT(error("add", {F32({2}), F32({2})}, {}, {F32({3})}),
              HasSubstr("add output 0 (y) is f32[2] but the given output tensor is f32[3]"));
  EXPECT_THAT(error("copy", {F32({9, 1, 1, 1, 1, 1, 1, 1, 1})}), HasSubstr("9 dimensions"));
  EXPECT_THAT(error("fill", {}, {{"shape", std::vector<int64_t>{int64_t{1} << 40, 1 << 30}}}),
              HasSubstr("more than 2^62"));
}

TEST(RegistryTest, DefaultsAndCoercion) {
  auto plan = R().Prepare("scale", {F32({2})}, {{"alpha", int64_t{3}}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(AttrFloat(plan->attrs, "alpha"), 3.0);  // int accepted for a float attribute
  EXPECT_EQ(AttrFloat(plan->attrs, "beta"), 0.0);   // default filled
  auto sum = R().Prepare("sum", {{DType::kI32, {2, 3}}},
                         {{"axes", std::vector<int64_t>{-1}}, {"keepdims", true}});
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(sum->outputs[0], (TensorMeta{DType::kI64, {2, 1}}));
  auto mm = R().Prepare("matmul", {F32({7, 1, 4, 3}), F32({5, 3, 2})}, {{"transpose_a", false}});
  ASSERT_TRUE(mm.ok()) << mm.status();
  EXPECT_EQ(mm->outputs[0].shape, (Shape{7, 5, 4, 2}));
  auto am = R().Prepare("argmax", {F32({2, 3, 4})}, {{"axis", int64_t{1}}});
  EXPECT_EQ(am->outputs[0], (TensorMeta{DType::kI64, {2, 4}}));
}

TEST(ShapeTest, SizesAreOverflowChecked) {
  EXPECT_EQ(*NumElements({}), 1);
  EXPECT_EQ(*NumElements({0, 5}), 0);
  EXPECT_EQ(*ByteSize({DType::kF64, {3, 4}}), 96);
  EXPECT_FALSE(NumElements({-1}).ok());
  EXPECT_FALSE(NumElements({int64_t{1} << 31, int64_t{1} << 31, 4}).ok());
  EXPECT_FALSE(ByteSize({DType::kF64, {int64_t{1} << 61}}).ok());
  EXPECT_TRUE(ByteSize({DType::kU8, {int64_t{1} << 61}}).ok());
  EXPECT_EQ(*BroadcastShapes({3, 1, 5}, {4, 1}), (Shape{3, 4, 5}));
  EXPECT_EQ(*BroadcastShapes({}, {2}), (Shape{2}));
  EXPECT_EQ(*BroadcastShapes({0}, {1}), (Shape{0}));
  EXPECT_FALSE(BroadcastShapes({0}, {2}).ok());
}

}  // namespace
}  // namespace tessera::kernels
