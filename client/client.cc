#include "tessera/client.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": cannot read"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Calls a unary stub method with a fresh context and maps the status.
template <typename Response, typename Call>
absl::StatusOr<Response> Unary(const Client& client, Call call) {
  std::unique_ptr<grpc::ClientContext> context = client.NewContext();
  Response response;
  grpc::Status status = call(context.get(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  if (options.address.empty()) return absl::InvalidArgumentError("address is empty");
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("tls_cert_file and tls_key_file must be given together");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options.tls || !options.tls_ca_file.empty() || !options.tls_cert_file.empty()) {
    options.tls = true;
    grpc::SslCredentialsOptions ssl;
    if (!options.tls_ca_file.empty()) {
      absl::StatusOr<std::string> ca = ReadFile(options.tls_ca_file, "tls_ca_file");
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *std::move(ca);
    }
    if (!options.tls_cert_file.empty()) {
      absl::StatusOr<std::string> cert = ReadFile(options.tls_cert_file, "tls_cert_file");
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadFile(options.tls_key_file, "tls_key_file");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // the server enforces its own limit
  auto channel = grpc::CreateCustomChannel(options.address, credentials, args);
  return std::unique_ptr<Client>(new Client(std::move(options), std::move(channel)));
}

Client::Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      admin_(v1::TenantAdmin::NewStub(channel_)) {}

std::unique_ptr<grpc::ClientContext> Client::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(options_.timeout));
  if (!options_.token.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", options_.token));
  }
  return context;
}

absl::StatusOr<v1::RegisterTenantResponse> Client::RegisterTenant(
    const v1::RegisterTenantRequest& request) {
  return Unary<v1::RegisterTenantResponse>(*this, [&](auto* context, auto* response) {
    return admin_->RegisterTenant(context, request, response);
  });
}

absl::StatusOr<v1::Tenant> Client::GetTenant(absl::string_view tenant_id) {
  v1::GetTenantRequest request;
  request.set_tenant_id(std::string(tenant_id));
  return Unary<v1::Tenant>(*this, [&](auto* context, auto* response) {
    return admin_->GetTenant(context, request, response);
  });
}

absl::StatusOr<v1::ListTenantsResponse> Client::ListTenants(int32_t page_size,
                                                            absl::string_view page_token) {
  v1::ListTenantsRequest request;
  request.set_page_size(page_size);
  request.set_page_token(std::string(page_token));
  return Unary<v1::ListTenantsResponse>(*this, [&](auto* context, auto* response) {
    return admin_->ListTenants(context, request, response);
  });
}

absl::StatusOr<std::vector<v1::Tenant>> Client::ListAllTenants() {
  std::vector<v1::Tenant> tenants;
  std::string token;
  do {
    absl::StatusOr<v1::ListTenantsResponse> page = ListTenants(0, token);
    if (!page.ok()) return page.status();
    for (v1::Tenant& tenant : *page->mutable_tenants()) tenants.push_back(std::move(tenant));
    token = page->next_page_token();
  } while (!token.empty());
  return tenants;
}

absl::StatusOr<v1::Tenant> Client::UpdateTenant(const v1::Tenant& tenant,
                                                const std::vector<std::string>& paths) {
  v1::UpdateTenantRequest request;
  *request.mutable_tenant() = tenant;
  for (const std::string& path : paths) request.mutable_update_mask()->add_paths(path);
  return Unary<v1::Tenant>(*this, [&](auto* context, auto* response) {
    return admin_->UpdateTenant(context, request, response);
  });
}

absl::StatusOr<v1::DeregisterTenantResponse> Client::DeregisterTenant(absl::string_view tenant_id) {
  v1::DeregisterTenantRequest request;
  request.set_tenant_id(std::string(tenant_id));
  return Unary<v1::DeregisterTenantResponse>(*this, [&](auto* context, auto* response) {
    return admin_->DeregisterTenant(context, request, response);
  });
}

absl::StatusOr<v1::RotateTenantKeyResponse> Client::RotateTenantKey(absl::string_view tenant_id) {
  v1::RotateTenantKeyRequest request;
  request.set_tenant_id(std::string(tenant_id));
  return Unary<v1::RotateTenantKeyResponse>(*this, [&](auto* context, auto* response) {
    return admin_->RotateTenantKey(context, request, response);
  });
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo() {
  v1::GetServerInfoRequest request;
  return Unary<v1::ServerInfo>(*this, [&](auto* context, auto* response) {
    return admin_->GetServerInfo(context, request, response);
  });
}

}  // namespace tessera
