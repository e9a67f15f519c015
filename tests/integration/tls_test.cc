// TLS and mutual TLS with certificates minted per test run by the openssl CLI.
#include <fstream>
#include <iterator>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/client.h"
#include "tests/testing/certs.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new testing::TempDir();
    absl::Status minted = testing::MintTestCertificates(certs_->path());
    ASSERT_TRUE(minted.ok()) << minted;
  }
  static void TearDownTestSuite() { delete certs_; }

  std::unique_ptr<testing::ServerProcess> Start(bool mutual) {
    std::vector<std::string> args = {"--tls_cert=" + certs_->File("server.pem"),
                                     "--tls_key=" + certs_->File("server.key")};
    if (mutual) args.push_back("--tls_client_ca=" + certs_->File("ca.pem"));
    auto server = testing::ServerProcess::Start(
        testing::OnTestBackend({.state_dir = state_.File("var"), .args = args}));
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  absl::StatusOr<v1::ServerInfo> Info(const testing::ServerProcess& server, ClientOptions options) {
    options.address = server.address();
    options.token = server.AdminToken();
    options.timeout = absl::Seconds(5);
    auto client = Client::Connect(options);
    if (!client.ok()) return client.status();
    return (*client)->GetServerInfo();
  }

  static testing::TempDir* certs_;
  testing::TempDir state_;
};

testing::TempDir* TlsTest::certs_ = nullptr;

TEST_F(TlsTest, TlsServesVerifiedClientsOnly) {
  auto server = Start(/*mutual=*/false);
  ASSERT_NE(server, nullptr);
  auto info = Info(*server, {.tls = true, .tls_ca_file = certs_->File("ca.pem")});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->transport_security(), "tls");
  // A plaintext client cannot talk to a TLS server.
  EXPECT_EQ(Info(*server, {}).status().code(), absl::StatusCode::kUnavailable);
  // Nor can one that does not trust the server's CA (system roots only).
  EXPECT_EQ(Info(*server, {.tls = true}).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(server->output(), HasSubstr("(tls)"));
}

TEST_F(TlsTest, MutualTlsRequiresAClientCertificate) {
  auto server = Start(/*mutual=*/true);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Info(*server, {.tls = true, .tls_ca_file = certs_->File("ca.pem")}).status().code(),
            absl::StatusCode::kUnavailable);
  auto info = Info(*server, {.tls = true,
                             .tls_ca_file = certs_->File("ca.pem"),
                             .tls_cert_file = certs_->File("client.pem"),
                             .tls_key_file = certs_->File("client.key")});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->transport_security(), "mtls");
}

TEST_F(TlsTest, CertificatesMayBeGivenAsPemText) {
  // ClientOptions' *_pem fields, for callers that hold the certificates in memory (the Python
  // package's transfers through this library).
  auto server = Start(/*mutual=*/true);
  ASSERT_NE(server, nullptr);
  auto text = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  auto info = Info(*server, {.tls_ca_pem = text(certs_->File("ca.pem")),
                             .tls_cert_pem = text(certs_->File("client.pem")),
                             .tls_key_pem = text(certs_->File("client.key"))});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->transport_security(), "mtls");
  // The CA alone implies TLS, and the server still wants a client certificate.
  EXPECT_EQ(Info(*server, {.tls_ca_pem = text(certs_->File("ca.pem"))}).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(TlsTest, ClientRefusesInconsistentOptions) {
  EXPECT_EQ(Client::Connect({.tls_cert_file = "a.pem"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Client::Connect({.tls_cert_pem = "-----BEGIN CERTIFICATE-----"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Client::Connect({.tls = true, .tls_ca_file = "/nonexistent.pem"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
