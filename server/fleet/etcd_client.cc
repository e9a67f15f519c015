#include "server/fleet/etcd_client.h"

#include <algorithm>
#include <utility>

#include <arpa/inet.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "grpcpp/grpcpp.h"

#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace tessera::fleet {
namespace {

namespace pb = ::etcdserverpb;

KeyValue FromProto(const ::mvccpb::KeyValue& kv) {
  return KeyValue{.key = kv.key(),
                  .value = kv.value(),
                  .create_revision = kv.create_revision(),
                  .mod_revision = kv.mod_revision(),
                  .lease = kv.lease()};
}

// Adds "`key` still has `mod_revision`" to a transaction's conditions.
void Unchanged(pb::TxnRequest& request, absl::string_view key, int64_t mod_revision) {
  pb::Compare* unchanged = request.add_compare();
  unchanged->set_key(std::string(key));
  unchanged->set_target(pb::Compare::MOD);
  unchanged->set_result(pb::Compare::EQUAL);
  unchanged->set_mod_revision(mod_revision);
}

}  // namespace

std::string PrefixEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key (etcd: range_end "\0")
}

struct EtcdClient::Impl {
  std::string endpoints;
  absl::Duration timeout;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;

  // Each call waits up to the timeout for a connection rather than failing at once while the
  // channel backs off after a refused connection: a call soon after etcd returns succeeds.
  void Prepare(grpc::ClientContext& context) const {
    context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
    context.set_wait_for_ready(true);
  }

  absl::Status Failed(const grpc::Status& status, absl::string_view what) const {
    // etcd's own refusals (a bad request) keep their code; everything else is etcd not
    // answering, which callers report as UNAVAILABLE naming etcd.
    const auto code = status.error_code();
    const absl::StatusCode mapped = code == grpc::StatusCode::INVALID_ARGUMENT ||
                                            code == grpc::StatusCode::FAILED_PRECONDITION ||
                                            code == grpc::StatusCode::NOT_FOUND ||
                                            code == grpc::StatusCode::OUT_OF_RANGE
                                        ? static_cast<absl::StatusCode>(code)
                                        : absl::StatusCode::kUnavailable;
    return absl::Status(
        mapped, absl::StrCat("etcd (", endpoints, "): ", what, ": ",
                             code == grpc::StatusCode::DEADLINE_EXCEEDED
                                 ? absl::StrCat("no answer within ", absl::FormatDuration(timeout))
                                 : status.error_message()));
  }

  absl::StatusOr<pb::TxnResponse> Txn(const pb::TxnRequest& request, absl::string_view what) {
    grpc::ClientContext context;
    Prepare(context);
    pb::TxnResponse response;
    grpc::Status status = kv->Txn(&context, request, &response);
    if (!status.ok()) return Failed(status, what);
    return response;
  }
};

EtcdClient::EtcdClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EtcdClient::~EtcdClient() = default;

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(const Options& options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("--fleet_etcd: no endpoint (http://HOST:PORT[,...])");
  }
  std::vector<std::string> addresses;
  for (std::string endpoint : options.endpoints) {
    absl::string_view e = endpoint;
    if (absl::StartsWith(e, "https://")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--fleet_etcd: ", endpoint, ": TLS to etcd is not supported yet; use http://"));
    }
    absl::ConsumePrefix(&e, "http://");
    absl::ConsumeSuffix(&e, "/");
    const size_t colon = e.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(e.substr(colon + 1), &port) || port <= 0 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("--fleet_etcd: ", endpoint, " is not http://HOST:PORT"));
    }
    addresses.emplace_back(e);
  }
  auto impl = std::make_unique<Impl>();
  impl->endpoints = absl::StrJoin(options.endpoints, ",");
  impl->timeout = options.timeout;
  // One member: that address (a name is resolved by DNS: a Service in front of the members
  // works). Several IPv4 literals: gRPC tries them in order. Several names: gRPC's address
  // lists need literals, so the first is used; put a Service or DNS name in front instead.
  const bool literals = std::all_of(addresses.begin(), addresses.end(), [](const std::string& a) {
    in_addr parsed{};
    return inet_pton(AF_INET, a.substr(0, a.rfind(':')).c_str(), &parsed) == 1;
  });
  const std::string target = addresses.size() > 1 && literals
                                 ? absl::StrCat("ipv4:", absl::StrJoin(addresses, ","))
                                 : addresses[0];
  grpc::ChannelArguments args;
  // Reconnect soon after etcd comes back (gRPC's defaults wait up to minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  impl->channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  impl->kv = pb::KV::NewStub(impl->channel);
  impl->lease = pb::Lease::NewStub(impl->channel);
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(impl)));
}

const std::string& EtcdClient::endpoints() const { return impl_->endpoints; }

absl::StatusOr<std::optional<KeyValue>> EtcdClient::Get(absl::string_view key) {
  pb::RangeRequest request;
  request.set_key(std::string(key));
  grpc::ClientContext context;
  impl_->Prepare(context);
  pb::RangeResponse response;
  grpc::Status status = impl_->kv->Range(&context, request, &response);
  if (!status.ok()) return impl_->Failed(status, absl::StrCat("reading ", key));
  if (response.kvs_size() == 0) return std::optional<KeyValue>();
  return std::optional<KeyValue>(FromProto(response.kvs(0)));
}

absl::StatusOr<std::vector<KeyValue>> EtcdClient::GetPrefix(absl::string_view prefix) {
  pb::RangeRequest request;
  request.set_key(std::string(prefix));
  request.set_range_end(PrefixEnd(prefix));
  grpc::ClientContext context;
  impl_->Prepare(context);
  pb::RangeResponse response;
  grpc::Status status = impl_->kv->Range(&context, request, &response);
  if (!status.ok()) return impl_->Failed(status, absl::StrCat("listing ", prefix));
  std::vector<KeyValue> out;
  out.reserve(static_cast<size_t>(response.kvs_size()));
  for (const auto& kv : response.kvs()) out.push_back(FromProto(kv));
  return out;
}

absl::Status EtcdClient::Put(absl::string_view key, absl::string_view value, int64_t lease) {
  pb::PutRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  request.set_lease(lease);
  grpc::ClientContext context;
  impl_->Prepare(context);
  pb::PutResponse response;
  grpc::Status status = impl_->kv->Put(&context, request, &response);
  if (!status.ok()) return impl_->Failed(status, absl::StrCat("writing ", key));
  return absl::OkStatus();
}

absl::StatusOr<bool> EtcdClient::Commit(const etcdserverpb::TxnRequest& request,
                                        const std::string& what) {
  absl::StatusOr<pb::TxnResponse> response = impl_->Txn(request, what);
  if (!response.ok()) return response.status();
  return response->succeeded();
}

absl::StatusOr<bool> EtcdClient::PutIf(etcdserverpb::TxnRequest& request, absl::string_view key,
                                       absl::string_view value, int64_t lease,
                                       absl::string_view verb) {
  pb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  put->set_lease(lease);
  return Commit(request, absl::StrCat(verb, key));
}

absl::StatusOr<bool> EtcdClient::CreateIfAbsent(absl::string_view key, absl::string_view value,
                                                int64_t lease) {
  pb::TxnRequest request;
  pb::Compare* absent = request.add_compare();
  absent->set_key(std::string(key));
  absent->set_target(pb::Compare::CREATE);
  absent->set_result(pb::Compare::EQUAL);
  absent->set_create_revision(0);
  return PutIf(request, key, value, lease, "creating ");
}

absl::StatusOr<bool> EtcdClient::ReplaceIfUnchanged(absl::string_view key, absl::string_view value,
                                                    int64_t mod_revision, int64_t lease) {
  pb::TxnRequest request;
  Unchanged(request, key, mod_revision);
  return PutIf(request, key, value, lease, "replacing ");
}

absl::StatusOr<bool> EtcdClient::DeleteIfUnchanged(absl::string_view key, int64_t mod_revision) {
  pb::TxnRequest request;
  Unchanged(request, key, mod_revision);
  request.add_success()->mutable_request_delete_range()->set_key(std::string(key));
  return Commit(request, absl::StrCat("deleting ", key));
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(absl::Duration ttl) {
  pb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(ttl)));
  grpc::ClientContext context;
  impl_->Prepare(context);
  pb::LeaseGrantResponse response;
  grpc::Status status = impl_->lease->LeaseGrant(&context, request, &response);
  if (!status.ok()) return impl_->Failed(status, "granting a lease");
  if (!response.error().empty()) {
    return absl::UnavailableError(
        absl::StrCat("etcd (", impl_->endpoints, "): granting a lease: ", response.error()));
  }
  return response.id();
}

absl::StatusOr<absl::Duration> EtcdClient::KeepAlive(int64_t lease) {
  grpc::ClientContext context;
  impl_->Prepare(context);
  auto stream = impl_->lease->LeaseKeepAlive(&context);
  pb::LeaseKeepAliveRequest request;
  request.set_id(lease);
  pb::LeaseKeepAliveResponse response;
  const bool exchanged = stream->Write(request) && stream->Read(&response);
  stream->WritesDone();
  grpc::Status status = stream->Finish();
  if (!exchanged || !status.ok()) {
    return impl_->Failed(
        status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream closed") : status,
        absl::StrCat("renewing lease ", lease));
  }
  if (response.ttl() <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " has expired"));
  }
  return absl::Seconds(response.ttl());
}

absl::Status EtcdClient::RevokeLease(int64_t lease) {
  pb::LeaseRevokeRequest request;
  request.set_id(lease);
  grpc::ClientContext context;
  impl_->Prepare(context);
  pb::LeaseRevokeResponse response;
  grpc::Status status = impl_->lease->LeaseRevoke(&context, request, &response);
  if (!status.ok()) return impl_->Failed(status, absl::StrCat("revoking lease ", lease));
  return absl::OkStatus();
}

}  // namespace tessera::fleet
