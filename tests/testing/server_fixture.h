#ifndef TESSERA_TESTS_TESTING_SERVER_FIXTURE_H_
#define TESSERA_TESTS_TESTING_SERVER_FIXTURE_H_

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

#include "tessera/client.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"

namespace tessera::testing {

/// A tensor's spec: `dtype` and `shape`.
inline v1::TensorSpec Spec(v1::DType dtype, std::vector<int64_t> shape) {
  v1::TensorSpec spec;
  spec.set_dtype(dtype);
  spec.mutable_shape()->Add(shape.begin(), shape.end());
  return spec;
}

/// Starts a real tessera-server on the backend under test (BackendUnderTest: the CPU or the
/// CUDA module, 8 GiB of device memory either way) on a loopback port with a temporary state
/// directory for each test.
class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(); }

  /// (Re)starts the server on the same state directory with `extra_args`.
  void StartServer(std::vector<std::string> extra_args = {}) {
    std::vector<std::string> args = {"--log_level=warn"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    auto server =
        ServerProcess::Start(OnTestBackend({.state_dir = dir_.File("var"), .args = args}));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    admin_ = ClientWith(server_->AdminToken());
  }

  /// The backend every server of this test runs on.
  static const TestBackend& backend() { return BackendUnderTest(); }
  static bool OnCpu() { return backend().name == "cpu"; }
  /// The context a tenant with `share_percent` gets: a CPU one on the CPU backend; on the
  /// CUDA one (with no MPS daemon and a driver with green contexts, as the fake driver is), a
  /// plain context for the whole device and a green one for a part of it.
  static v1::ContextKind ExpectedContextKind(uint32_t share_percent = 100) {
    if (OnCpu()) return v1::CONTEXT_KIND_CPU;
    return share_percent >= 100 ? v1::CONTEXT_KIND_FALLBACK : v1::CONTEXT_KIND_GREEN;
  }

  std::unique_ptr<Client> ClientWith(const std::string& token) const {
    auto client = Client::Connect(
        {.address = server_->address(), .token = token, .timeout = absl::Seconds(20)});
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

  static v1::RegisterTenantRequest Registration(const std::string& id, uint64_t memory = kGiB) {
    v1::RegisterTenantRequest request;
    request.set_tenant_id(id);
    request.mutable_quota()->set_device_memory_bytes(memory);
    return request;
  }

  /// Registers `id` and returns its API key (fails the test otherwise).
  std::string MustRegister(const std::string& id, uint64_t memory = kGiB) {
    auto registered = admin_->RegisterTenant(Registration(id, memory));
    EXPECT_TRUE(registered.ok()) << registered.status();
    return registered.ok() ? registered->api_key() : "";
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<Client> admin_;
};

/// A ReadTensor of `handle` in `chunk_bytes` chunks that has received its first reply
/// (`started`, in `first`) and reads no further until the test does: a stalled or abandoned
/// download.
struct OpenDownload {
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReader<v1::ReadTensorResponse>> reader;
  v1::ReadTensorResponse first;
  bool started = false;
};
inline OpenDownload StartDownload(const Client& client, const std::string& handle,
                                  uint32_t chunk_bytes) {
  OpenDownload download;
  download.context = client.NewContext();
  v1::ReadTensorRequest read;
  read.set_handle(handle);
  read.set_chunk_bytes(chunk_bytes);
  download.reader =
      v1::Compute::NewStub(client.channel())->ReadTensor(download.context.get(), read);
  download.started = download.reader->Read(&download.first);
  return download;
}

/// The bytes of f32 `values`, as a tensor holds them.
inline std::string Floats(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

/// f32 values from a tensor's bytes.
inline std::vector<float> AsFloats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_SERVER_FIXTURE_H_
