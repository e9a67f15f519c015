// The whole kernel catalog through the server under test, against a CPU-backend server: every
// (kernel, dtype) pair the catalog has, each with the shapes of tests/testing/catalog_cases.h,
// uploaded to both, launched over gRPC, downloaded and compared. On the fake_cuda run this is
// where our CUDA kernels (compiled for the host and run by the fake driver) and the cuBLAS call
// sequence meet the CPU backend's results; on the cpu run it checks the cases themselves.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

#include "kernels/dtype.h"
#include "kernels/registry.h"
#include "tests/testing/catalog_cases.h"
#include "tests/testing/context_runner.h"
#include "tests/testing/host_tensor.h"
#include "tests/testing/server_fixture.h"

namespace tessera {
namespace {

using kernels::DType;
using testing::CatalogCase;
using testing::HostTensor;

v1::DType ToProto(DType d) { return static_cast<v1::DType>(static_cast<int>(d)); }

v1::AttrValue ToProto(const kernels::AttrValue& value) {
  v1::AttrValue out;
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          out.set_i(v);
        } else if constexpr (std::is_same_v<T, double>) {
          out.set_f(v);
        } else if constexpr (std::is_same_v<T, bool>) {
          out.set_b(v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          out.set_s(v);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          for (int64_t x : v) out.mutable_ints()->add_values(x);
        } else {
          for (double x : v) out.mutable_floats()->add_values(x);
        }
      },
      value);
  return out;
}

class CatalogTest : public testing::ServerTest {
 protected:
  void SetUp() override {
    ServerTest::SetUp();
    // The reference: a server of the same build on the CPU backend.
    auto reference = testing::ServerProcess::Start(
        {.state_dir = reference_dir_.File("var"),
         .args = {"--log_level=warn", "--backend=cpu", "--cpu_memory_bytes=8GiB"}});
    ASSERT_TRUE(reference.ok()) << reference.status();
    reference_ = *std::move(reference);
    auto reference_admin = Client::Connect({.address = reference_->address(),
                                            .token = reference_->AdminToken(),
                                            .timeout = absl::Seconds(60)});
    ASSERT_TRUE(reference_admin.ok());
    auto registered =
        (*reference_admin)->RegisterTenant(Registration("catalog", 4 * testing::kGiB));
    ASSERT_TRUE(registered.ok()) << registered.status();
    auto want = Client::Connect({.address = reference_->address(),
                                 .token = registered->api_key(),
                                 .timeout = absl::Seconds(60)});
    ASSERT_TRUE(want.ok());
    want_ = *std::move(want);
    auto tested = Client::Connect({.address = server_->address(),
                                   .token = MustRegister("catalog", 4 * testing::kGiB),
                                   .timeout = absl::Seconds(60)});
    ASSERT_TRUE(tested.ok());
    got_ = *std::move(tested);
  }

  // Runs `c` on `client` with `inputs`; the outputs' bytes, or the failure.
  absl::StatusOr<std::vector<std::string>> Run(Client& client, const CatalogCase& c,
                                               const std::vector<HostTensor>& inputs) {
    v1::LaunchRequest request;
    request.set_kernel(c.kernel);
    request.set_wait(true);
    std::vector<std::string> handles;
    for (const HostTensor& t : inputs) {
      v1::TensorSpec spec;
      spec.set_dtype(ToProto(t.meta.dtype));
      for (int64_t d : t.meta.shape) spec.add_shape(d);
      auto info = client.Upload(
          spec, absl::string_view(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size()),
          4 << 20);
      if (!info.ok()) return info.status();
      handles.push_back(info->handle());
      request.add_inputs(info->handle());
    }
    for (const auto& [name, value] : c.attrs) (*request.mutable_attrs())[name] = ToProto(value);
    auto job = client.Launch(request);
    std::vector<std::string> outputs;
    absl::Status status = job.status();
    if (job.ok() && job->state() != v1::JOB_STATE_SUCCEEDED) {
      status = absl::InternalError(
          absl::StrCat("job ", v1::JobState_Name(job->state()), ": ", job->error_message()));
    }
    if (status.ok()) {
      for (const auto& out : job->outputs()) {
        auto bytes = client.Download(out.handle(), 0, 0, 4 << 20);
        if (!bytes.ok()) status = bytes.status();
        outputs.push_back(bytes.ok() ? *std::move(bytes) : "");
        handles.push_back(out.handle());
      }
    }
    for (const std::string& h : handles) (void)client.DeleteTensor(h);
    if (!status.ok()) return status;
    return outputs;
  }

  testing::TempDir reference_dir_;
  std::unique_ptr<testing::ServerProcess> reference_;
  std::unique_ptr<Client> want_, got_;
};

TEST_F(CatalogTest, EveryKernelAndDTypeMatchesTheCpuBackend) {
  // Every pair through the server and the wire, at the shapes that reach each kernel's edges
  // (broadcasting, scalars, empty tensors, several blocks). The cases of a million elements
  // run in process in fake_cuda.gpu_tests (the CUDA module on the fake against the CPU
  // backend), and large transfers in ComputeTest.LargeStreamedTransfer.
  const std::vector<CatalogCase> cases = testing::CatalogCases(/*large=*/false);
  // Every pair of the catalog has a case, and no case names a pair the catalog lacks: a new
  // kernel or dtype without cases fails here.
  std::set<std::pair<std::string, DType>> covered;
  for (const CatalogCase& c : cases) covered.emplace(c.kernel, c.dtype);
  const auto pairs = testing::CatalogPairs();
  std::vector<std::string> missing;
  for (const auto& [kernel, dtype] : pairs) {
    if (covered.count({kernel, dtype}) == 0) {
      missing.push_back(absl::StrCat(kernel, "/", kernels::DTypeName(dtype)));
    }
  }
  EXPECT_TRUE(missing.empty()) << "catalog pairs without a case: " << absl::StrJoin(missing, ", ");
  EXPECT_EQ(covered.size(), pairs.size());
  // And the server lists the same catalog.
  auto listed = got_->ListKernels();
  ASSERT_TRUE(listed.ok()) << listed.status();
  std::set<std::string> names;
  for (const auto& k : listed->kernels()) names.insert(k.name());
  std::set<std::string> registry_names;
  for (const auto& def : kernels::Registry::Global().kernels()) registry_names.insert(def.name);
  EXPECT_EQ(names, registry_names);

  std::mt19937 rng(7);
  int checked = 0;
  for (const CatalogCase& c : cases) {
    SCOPED_TRACE(c.label);
    auto plan = kernels::Registry::Global().Prepare(c.kernel, c.inputs, c.attrs);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::vector<HostTensor> inputs = testing::RandomInputs(*plan, c.kernel, rng);
    double max_abs = 0;
    for (const HostTensor& t : inputs) {
      for (int64_t i = 0; i < t.size(); ++i) max_abs = std::max(max_abs, std::abs(t.Get(i)));
    }
    auto want = Run(*want_, c, inputs);
    ASSERT_TRUE(want.ok()) << "reference: " << want.status();
    auto got = Run(*got_, c, inputs);
    if (!got.ok()) {  // every failing case is listed, not just the first
      ADD_FAILURE() << got.status();
      continue;
    }
    ASSERT_EQ(got->size(), plan->outputs.size());
    for (size_t o = 0; o < plan->outputs.size(); ++o) {
      HostTensor w(plan->outputs[o].dtype, plan->outputs[o].shape);
      HostTensor g(plan->outputs[o].dtype, plan->outputs[o].shape);
      ASSERT_EQ((*want)[o].size(), w.bytes.size());
      ASSERT_EQ((*got)[o].size(), g.bytes.size());
      if (!w.bytes.empty()) {  // memcpy from an empty string's null data() is undefined
        std::memcpy(w.bytes.data(), (*want)[o].data(), w.bytes.size());
        std::memcpy(g.bytes.data(), (*got)[o].data(), g.bytes.size());
      }
      int mismatches = 0;
      for (int64_t i = 0; i < w.size() && mismatches < 5; ++i) {
        if (!testing::Matches(*plan, w.meta.dtype, w.Get(i), g.Get(i), max_abs)) {
          ++mismatches;
          ADD_FAILURE() << "output " << o << " element " << i << ": cpu " << w.Get(i) << ", "
                        << backend().name << " " << g.Get(i);
        }
      }
    }
    ++checked;
  }
  std::printf("catalog: %d cases, %zu (kernel, dtype) pairs of %zu kernels, on %s\n", checked,
              covered.size(), registry_names.size(), backend().name.c_str());
  EXPECT_EQ(checked, static_cast<int>(cases.size()));
}

}  // namespace
}  // namespace tessera
