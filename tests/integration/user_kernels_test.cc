// Tenant-defined kernels through a real server process, on every backend: DefineKernel (text
// and structured), ListKernels, Launch and Submit, DeleteKernel, isolation between tenants,
// errors and limits, durability across a restart, and the CLI.
#include <cmath>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/testing/server_fixture.h"

namespace tessera {
namespace {

using testing::Spec;

using ::testing::HasSubstr;
using testing::kGiB;

constexpr char kSwish[] = R"(# swish, as in the issue
kernel swish(x: f32) -> (y: f32) {
  y = x * sigmoid(1.702 * x)
}
)";

constexpr char kMaskedScale[] = R"(kernel masked_scale(x: f32, mask: bool) -> (y: f32)
  params(scale: float = 2.0)
{
  y = where(mask, x * scale, x)
}
)";

constexpr char kRms[] = R"(kernel rms(x: f32) -> (y: f32)
  params(eps: float = 0.0)
{
  y = sqrt(sum(x * x) / count + eps)
}
)";

constexpr char kDot[] = R"(kernel dot(a: f32, b: f32) -> (y: f32) {
  y = sum(a * b)
}
)";

using testing::AsFloats;
using testing::Floats;

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

class UserKernelsTest : public testing::ServerTest {
 protected:
  void SetUp() override {
    ServerTest::SetUp();
    alpha_ = ClientWith(MustRegister("alpha", kGiB));
  }

  std::string Put(Client& client, const std::vector<float>& values, std::vector<int64_t> shape) {
    auto info = client.CreateTensor(Spec(v1::DTYPE_F32, std::move(shape)), Floats(values));
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->handle() : "";
  }

  /// Launches and waits; the job must succeed; returns its first output as floats.
  std::vector<float> Run(Client& client, const std::string& kernel, std::vector<std::string> inputs,
                         std::map<std::string, v1::AttrValue> attrs = {}) {
    v1::LaunchRequest request;
    request.set_kernel(kernel);
    for (auto& h : inputs) request.add_inputs(h);
    for (auto& [k, v] : attrs) (*request.mutable_attrs())[k] = v;
    request.set_wait(true);
    auto job = client.Launch(request);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return {};
    EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->error_message();
    if (job->outputs_size() == 0) return {};
    auto bytes = client.Download(job->outputs(0).handle());
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return bytes.ok() ? AsFloats(*bytes) : std::vector<float>{};
  }

  absl::StatusCode LaunchCode(Client& client, const std::string& kernel,
                              std::vector<std::string> inputs) {
    v1::LaunchRequest request;
    request.set_kernel(kernel);
    for (auto& h : inputs) request.add_inputs(h);
    request.set_wait(true);
    return client.Launch(request).status().code();
  }

  std::unique_ptr<Client> alpha_;
};

v1::AttrValue Float(double f) {
  v1::AttrValue v;
  v.set_f(f);
  return v;
}

v1::AttrValue Ints(std::vector<int64_t> values) {
  v1::AttrValue v;
  v.mutable_ints()->mutable_values()->Add(values.begin(), values.end());
  return v;
}

TEST_F(UserKernelsTest, DefineListLaunchAndDelete) {
  auto defined = alpha_->DefineKernel(kSwish);
  ASSERT_TRUE(defined.ok()) << defined.status();
  EXPECT_EQ(defined->name(), "swish");
  EXPECT_TRUE(defined->tenant_defined());
  EXPECT_EQ(defined->hash().size(), 64u);
  EXPECT_THAT(defined->source(), HasSubstr("kernel swish(x: f32) -> (y: f32)"));
  ASSERT_EQ(defined->inputs_size(), 1);
  EXPECT_EQ(defined->inputs(0).dtypes(0), v1::DTYPE_F32);

  // Listed after the catalog, marked as the tenant's.
  auto listed = alpha_->ListKernels();
  ASSERT_TRUE(listed.ok()) << listed.status();
  int own = 0;
  for (const auto& k : listed->kernels()) {
    if (k.tenant_defined()) {
      ++own;
      EXPECT_EQ(k.name(), "swish");
      EXPECT_EQ(k.hash(), defined->hash());
    }
  }
  EXPECT_EQ(own, 1);
  EXPECT_FALSE(listed->kernels(0).tenant_defined());  // the catalog comes first

  // One job, one pass: the values match the formula, with broadcasting over any shape.
  std::vector<float> x = {-4.0f, -1.5f, -0.25f, 0.0f, 0.5f, 1.0f, 3.0f, 8.0f};
  std::vector<float> y = Run(*alpha_, "swish", {Put(*alpha_, x, {2, 4})});
  ASSERT_EQ(y.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(y[i], x[i] * Sigmoid(1.702f * x[i]), 1e-5f * (1 + std::abs(x[i]))) << i;
  }

  // Deleted: gone from the list, and launching it is NOT_FOUND.
  ASSERT_TRUE(alpha_->DeleteKernel("swish").ok());
  EXPECT_EQ(LaunchCode(*alpha_, "swish", {Put(*alpha_, x, {8})}), absl::StatusCode::kNotFound);
  EXPECT_EQ(alpha_->DeleteKernel("swish").code(), absl::StatusCode::kNotFound);
  // And can be defined again.
  EXPECT_TRUE(alpha_->DefineKernel(kSwish).ok());
}

TEST_F(UserKernelsTest, ParametersAttributesAndBroadcasting) {
  ASSERT_TRUE(alpha_->DefineKernel(kMaskedScale).ok());
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  const std::string xh = Put(*alpha_, x, {2, 3});
  // A [3] bool mask broadcast over the [2, 3] x.
  auto mask = alpha_->CreateTensor(Spec(v1::DTYPE_BOOL, {3}), std::string("\1\0\1", 3));
  ASSERT_TRUE(mask.ok()) << mask.status();
  std::vector<float> by_default = Run(*alpha_, "masked_scale", {xh, mask->handle()});
  EXPECT_EQ(by_default, (std::vector<float>{2, 2, 6, 8, 5, 12}));
  std::vector<float> scaled =
      Run(*alpha_, "masked_scale", {xh, mask->handle()}, {{"scale", Float(-1)}});
  EXPECT_EQ(scaled, (std::vector<float>{-1, 2, -3, -4, 5, -6}));

  // A wrong dtype and an unknown attribute are INVALID_ARGUMENT naming them.
  v1::LaunchRequest bad;
  bad.set_kernel("masked_scale");
  bad.add_inputs(xh);
  bad.add_inputs(xh);
  bad.set_wait(true);
  auto refused = alpha_->Launch(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("mask"));
  (*bad.mutable_attrs())["scael"] = Float(1);
  EXPECT_EQ(alpha_->Launch(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(UserKernelsTest, ReductionsOverAxesWithPostExpressions) {
  ASSERT_TRUE(alpha_->DefineKernel(kRms).ok());
  ASSERT_TRUE(alpha_->DefineKernel(kDot).ok());
  std::vector<float> x = {3, 4, 0, 0, 1, 1, 1, 1};
  const std::string xh = Put(*alpha_, x, {2, 4});
  // Over all axes: sqrt(mean(x^2)).
  std::vector<float> all = Run(*alpha_, "rms", {xh});
  ASSERT_EQ(all.size(), 1u);
  EXPECT_NEAR(all[0], std::sqrt(29.0f / 8), 1e-5);
  // Over the last axis, per row.
  std::vector<float> rows = Run(*alpha_, "rms", {xh}, {{"axes", Ints({-1})}});
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_NEAR(rows[0], std::sqrt(25.0f / 4), 1e-5);
  EXPECT_NEAR(rows[1], 1.0f, 1e-5);
  // A dot product of two inputs, one broadcast.
  const std::string w = Put(*alpha_, {1, 2, 3, 4}, {4});
  std::vector<float> dots = Run(*alpha_, "dot", {xh, w}, {{"axes", Ints({1})}});
  EXPECT_EQ(dots, (std::vector<float>{11, 10}));
}

TEST_F(UserKernelsTest, ProgramsMixCatalogAndOwnKernels) {
  ASSERT_TRUE(alpha_->DefineKernel(kSwish).ok());
  const std::string xh = Put(*alpha_, {-1, 0, 1, 2}, {4});
  v1::SubmitRequest request;
  request.set_wait(true);
  v1::ProgramStep* first = request.add_steps();
  first->set_kernel("swish");
  first->add_inputs()->set_handle(xh);
  v1::ProgramStep* second = request.add_steps();
  second->set_kernel("neg");
  second->add_inputs()->mutable_step_output()->set_step(0);
  auto job = alpha_->Submit(request);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->error_message();
  auto bytes = alpha_->Download(job->outputs(1).handle());
  ASSERT_TRUE(bytes.ok());
  std::vector<float> y = AsFloats(*bytes);
  const float xs[] = {-1, 0, 1, 2};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i], -xs[i] * Sigmoid(1.702f * xs[i]), 1e-5) << i;
}

TEST_F(UserKernelsTest, AnotherTenantsKernelsAreInvisibleAndUnusable) {
  ASSERT_TRUE(alpha_->DefineKernel(kSwish).ok());
  auto beta = ClientWith(MustRegister("beta", kGiB));
  auto listed = beta->ListKernels();
  ASSERT_TRUE(listed.ok());
  for (const auto& k : listed->kernels()) EXPECT_FALSE(k.tenant_defined()) << k.name();

  // The same answer as for a name nobody defined: no existence oracle.
  const std::string x = Put(*beta, {1, 2}, {2});
  v1::LaunchRequest theirs, nobodys;
  theirs.set_kernel("swish");
  nobodys.set_kernel("nobody_defined_this");
  for (v1::LaunchRequest* r : {&theirs, &nobodys}) {
    r->add_inputs(x);
    r->set_wait(true);
  }
  absl::Status a = beta->Launch(theirs).status();
  absl::Status b = beta->Launch(nobodys).status();
  EXPECT_EQ(a.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(a.message()).replace(a.message().find("swish"), 5, "X"),
            std::string(b.message()).replace(b.message().find("nobody_defined_this"), 19, "X"));
  EXPECT_EQ(beta->DeleteKernel("swish").code(), absl::StatusCode::kNotFound);

  // Beta may define its own kernel of that name; each tenant runs its own.
  ASSERT_TRUE(beta->DefineKernel("kernel swish(x: f32) -> (y: f32) { y = x + 100 }").ok());
  EXPECT_EQ(Run(*beta, "swish", {x}), (std::vector<float>{101, 102}));
  std::vector<float> mine = Run(*alpha_, "swish", {Put(*alpha_, {0}, {1})});
  EXPECT_EQ(mine, (std::vector<float>{0}));
}

TEST_F(UserKernelsTest, BadDefinitionsAreRefusedWithTheReasonAndTheServerStaysHealthy) {
  struct Case {
    std::string source;
    absl::StatusCode code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"kernel k(x: f32) -> (y: f32) { y = x * }", absl::StatusCode::kInvalidArgument, "line"},
      {"kernel k(x: f32) -> (y: f32) { y = nosuch(x) }", absl::StatusCode::kInvalidArgument,
       "nosuch"},
      {"kernel k(x: f32) -> (y: f32) { y = z }", absl::StatusCode::kInvalidArgument, "z"},
      {"kernel add(x: f32) -> (y: f32) { y = x }", absl::StatusCode::kInvalidArgument, "catalog"},
      {"kernel k(x: f32) -> (y: f32) { y = " + std::string(100000, '(') + "x" +
           std::string(100000, ')') + " }",
       absl::StatusCode::kInvalidArgument, "limit"},
      {"kernel k(x: f32) -> (y: f32) { let t = t + 1; y = t }", absl::StatusCode::kInvalidArgument,
       "t"},
      {"kernel k(x: f32) -> (y: f32) { y = x + 99999999999999999999999 }",
       absl::StatusCode::kInvalidArgument, "line"},
      {std::string(1 << 20, 'x'), absl::StatusCode::kInvalidArgument, "limit"},
  };
  for (const Case& c : cases) {
    auto defined = alpha_->DefineKernel(c.source);
    EXPECT_EQ(defined.status().code(), c.code) << c.source.substr(0, 80);
    EXPECT_THAT(defined.status().message(), HasSubstr(c.says)) << c.source.substr(0, 80);
  }
  // Both forms at once, or neither, are refused.
  v1::KernelDefinition empty;
  EXPECT_EQ(alpha_->DefineKernel(empty).status().code(), absl::StatusCode::kInvalidArgument);
  // A duplicate is ALREADY_EXISTS.
  ASSERT_TRUE(alpha_->DefineKernel(kSwish).ok());
  EXPECT_EQ(alpha_->DefineKernel(kSwish).status().code(), absl::StatusCode::kAlreadyExists);
  // The server is fine: the kernel that was accepted still runs.
  EXPECT_EQ(Run(*alpha_, "swish", {Put(*alpha_, {0}, {1})}), (std::vector<float>{0}));
}

TEST_F(UserKernelsTest, IntegerDivisionByZeroAndOverflowAreDefinedNotFatal) {
  ASSERT_TRUE(
      alpha_
          ->DefineKernel("kernel idiv(a: i32, b: i32) -> (q: i32, r: i32) { q = a / b; r = a % b }")
          .ok());
  std::vector<int32_t> a = {7, -7, 7, INT32_MIN, 5};
  std::vector<int32_t> b = {2, 2, 0, -1, 0};
  auto ah = alpha_->CreateTensor(Spec(v1::DTYPE_I32, {5}),
                                 std::string(reinterpret_cast<const char*>(a.data()), 20));
  auto bh = alpha_->CreateTensor(Spec(v1::DTYPE_I32, {5}),
                                 std::string(reinterpret_cast<const char*>(b.data()), 20));
  ASSERT_TRUE(ah.ok() && bh.ok());
  v1::LaunchRequest request;
  request.set_kernel("idiv");
  request.add_inputs(ah->handle());
  request.add_inputs(bh->handle());
  request.set_wait(true);
  auto job = alpha_->Launch(request);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->error_message();
  auto q = alpha_->Download(job->outputs(0).handle());
  auto r = alpha_->Download(job->outputs(1).handle());
  ASSERT_TRUE(q.ok() && r.ok());
  std::vector<int32_t> qs(5), rs(5);
  std::memcpy(qs.data(), q->data(), 20);
  std::memcpy(rs.data(), r->data(), 20);
  // Computed in i64 and stored saturated to i32: INT32_MIN / -1 is 2^31, stored as INT32_MAX.
  EXPECT_EQ(qs, (std::vector<int32_t>{3, -3, 0, INT32_MAX, 0}));
  EXPECT_EQ(rs, (std::vector<int32_t>{1, -1, 0, 0, 0}));
}

TEST_F(UserKernelsTest, TheKernelCountIsLimitedPerTenant) {
  server_.reset();
  StartServer({"--max_kernels_per_tenant=2"});
  alpha_ = ClientWith(MustRegister("gamma", kGiB));
  ASSERT_TRUE(alpha_->DefineKernel("kernel k1(x: f32) -> (y: f32) { y = x }").ok());
  ASSERT_TRUE(alpha_->DefineKernel("kernel k2(x: f32) -> (y: f32) { y = x }").ok());
  auto third = alpha_->DefineKernel("kernel k3(x: f32) -> (y: f32) { y = x }");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("the limit is 2"));
  ASSERT_TRUE(alpha_->DeleteKernel("k1").ok());
  EXPECT_TRUE(alpha_->DefineKernel("kernel k3(x: f32) -> (y: f32) { y = x }").ok());
}

TEST_F(UserKernelsTest, DefinitionsSurviveARestartAndLeaveWithTheirTenant) {
  ASSERT_TRUE(alpha_->DefineKernel(kSwish).ok());
  auto before = alpha_->ListKernels();
  ASSERT_TRUE(before.ok());
  const std::string key = admin_->RotateTenantKey("alpha")->api_key();
  ASSERT_EQ(*server_->Stop(SIGTERM), 0);
  StartServer();
  alpha_ = ClientWith(key);
  auto after = alpha_->ListKernels();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->SerializeAsString(), before->SerializeAsString());
  EXPECT_EQ(Run(*alpha_, "swish", {Put(*alpha_, {0}, {1})}), (std::vector<float>{0}));

  // Deregistered: the definitions go too; the same id registered again starts empty.
  ASSERT_TRUE(admin_->DeregisterTenant("alpha").ok());
  alpha_ = ClientWith(MustRegister("alpha", kGiB));
  auto fresh = alpha_->ListKernels();
  ASSERT_TRUE(fresh.ok());
  for (const auto& k : fresh->kernels()) EXPECT_FALSE(k.tenant_defined());
}

TEST_F(UserKernelsTest, TheCliDefinesListsRunsAndRemoves) {
  const std::string key = admin_->RotateTenantKey("alpha")->api_key();
  alpha_ = ClientWith(key);
  const std::string file = dir_.File("swish.tk");
  std::ofstream(file) << kSwish;
  std::map<std::string, std::string> env = {{"TESSERA_ADDR", server_->address()},
                                            {"TESSERA_TOKEN", key}};
  auto cli = [&](std::vector<std::string> args) {
    args.insert(args.begin(), testing::CliBinary());
    auto result = testing::RunCommand(args, env);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : testing::CommandResult{};
  };
  auto defined = cli({"kernel", "define", "swish", "--file=" + file});
  EXPECT_EQ(defined.exit_code, 0) << defined.output;
  EXPECT_THAT(defined.output, HasSubstr("defined swish"));
  auto wrong = cli({"kernel", "define", "other", "--file=" + file});
  EXPECT_EQ(wrong.exit_code, 2) << wrong.output;
  auto listed = cli({"kernel", "ls"});
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr("kernel swish(x: f32) -> (y: f32)"));
  auto catalog = cli({"kernels"});
  EXPECT_THAT(catalog.output, HasSubstr("yours:"));
  const std::string x = Put(*alpha_, {0, 1}, {2});
  auto ran = cli({"run", "swish", "--in=" + x});
  EXPECT_EQ(ran.exit_code, 0) << ran.output;
  auto removed = cli({"kernel", "rm", "swish"});
  EXPECT_EQ(removed.exit_code, 0) << removed.output;
  auto again = cli({"kernel", "rm", "swish"});
  EXPECT_EQ(again.exit_code, 1) << again.output;
  EXPECT_THAT(again.output, HasSubstr("NOT_FOUND"));
}

}  // namespace
}  // namespace tessera
