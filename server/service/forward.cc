#include "server/service/forward.h"

#include <atomic>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/generic/generic_stub.h"

#include "server/core/tenant_table.h"
#include "server/core/token.h"
#include "server/service/call.h"
#include "server/service/transfer_wire.h"

namespace tessera {
namespace {

// The home's trailers a caller may act on: a refusal's retry hint, and a redirect's home
// (when the tenant moved and the node we forwarded to is no longer its home).
constexpr const char* kHomeTrailers[] = {"grpc-retry-pushback-ms", "tessera-home-address",
                                         "tessera-home-node"};

// What every relay holds: the caller's call (its access line, request id and tenant) and the
// call to the home, which carries the caller's credentials and request id, this node's name
// and the caller's deadline. Two references, the caller's call and the home's, each dropped
// when its call is done: the relay is deleted after both.
class Relay {
 public:
  Relay(grpc::CallbackServerContext* context, const char* rpc, std::string tenant)
      : context_(context), log_(context, rpc), method_(absl::StrCat("/tessera.v1.Compute/", rpc)) {
    log_.set_tenant(std::move(tenant));
  }
  virtual ~Relay() = default;

 protected:
  void PrepareHomeCall(std::shared_ptr<grpc::Channel> channel, absl::string_view node) {
    channel_ = std::move(channel);
    const auto& metadata = context_->client_metadata();
    auto [begin, end] = metadata.equal_range("authorization");
    for (auto it = begin; it != end; ++it) {
      home_context_.AddMetadata("authorization", std::string(it->second.data(), it->second.size()));
    }
    home_context_.AddMetadata("x-request-id", log_.request_id());
    home_context_.AddMetadata(kForwardedByMetadata, std::string(node));
    if (context_->deadline() != std::chrono::system_clock::time_point::max()) {
      home_context_.set_deadline(context_->deadline());
    }
  }
  // Before the caller's call is finished with the home's status.
  void CopyHomeTrailers() {
    const auto& trailers = home_context_.GetServerTrailingMetadata();
    for (const char* key : kHomeTrailers) {
      auto [begin, end] = trailers.equal_range(key);
      for (auto it = begin; it != end; ++it) {
        context_->AddTrailingMetadata(key, std::string(it->second.data(), it->second.size()));
      }
    }
  }
  void Release() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  grpc::CallbackServerContext* const context_;
  CallLog log_;
  const std::string method_;  // gRPC keeps a pointer to it while the call lives
  std::shared_ptr<grpc::Channel> channel_;
  grpc::ClientContext home_context_;

 private:
  std::atomic<int> refs_{2};
};

// A unary call: the request serialized once, the home's reply parsed into the caller's
// response. A caller that goes away cancels the home's call.
class UnaryRelay final : public grpc::ServerUnaryReactor, public Relay {
 public:
  UnaryRelay(grpc::CallbackServerContext* context, const char* rpc, std::string tenant,
             google::protobuf::MessageLite* response)
      : Relay(context, rpc, std::move(tenant)), response_(response) {}

  void Start(std::shared_ptr<grpc::Channel> channel, absl::string_view node,
             const google::protobuf::MessageLite& request) {
    PrepareHomeCall(std::move(channel), node);
    SerializeMessage(request, &request_);
    grpc::GenericStub(channel_).UnaryCall(&home_context_, method_, grpc::StubOptions(), &request_,
                                          &reply_,
                                          [this](grpc::Status status) { HomeDone(status); });
  }

  void OnCancel() override { home_context_.TryCancel(); }
  void OnDone() override { Release(); }

 private:
  void HomeDone(grpc::Status status) {
    if (status.ok() && !ParseMessage(reply_, response_)) {
      status = grpc::Status(grpc::StatusCode::INTERNAL,
                            "the tenant's home node answered a reply that does not parse");
    }
    CopyHomeTrailers();
    Finish(status);
    Release();
  }

  google::protobuf::MessageLite* const response_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer reply_;
};

// WriteTensor: the caller's messages relayed to the home one at a time (read one, write it,
// read the next once the home has taken it), then the home's answer. A hold on the home's
// call keeps it open while the caller may still send: released when the caller half-closes
// (after WritesDone), goes away (after TryCancel), or the home stops taking messages.
class WriteTensorRelay final : public grpc::ServerReadReactor<grpc::ByteBuffer>, public Relay {
 public:
  WriteTensorRelay(grpc::CallbackServerContext* context, std::string tenant,
                   grpc::ByteBuffer* response)
      : Relay(context, "WriteTensor", std::move(tenant)), response_(response), home_(this) {}

  void Start(std::shared_ptr<grpc::Channel> channel, absl::string_view node) {
    PrepareHomeCall(std::move(channel), node);
    grpc::GenericStub(channel_).PrepareBidiStreamingCall(&home_context_, method_,
                                                         grpc::StubOptions(), &home_);
    home_.AddHold();
    home_.StartRead(&reply_);
    home_.StartCall();
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    if (ok) return home_.StartWrite(&message_);
    // Half-closed (the upload is complete) or gone (the home must commit nothing).
    if (context_->IsCancelled()) {
      home_context_.TryCancel();
    } else {
      home_.StartWritesDone();
    }
    home_.RemoveHold();
  }
  void OnCancel() override { home_context_.TryCancel(); }
  void OnDone() override { Release(); }

 private:
  class Home final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Home(WriteTensorRelay* relay) : relay_(relay) {}
    void OnWriteDone(bool ok) override {
      if (ok) {
        relay_->message_.Clear();
        relay_->StartRead(&relay_->message_);
      } else {
        RemoveHold();  // the home ended the call: its status comes in OnDone
      }
    }
    void OnReadDone(bool ok) override { relay_->replied_ = ok; }
    void OnDone(const grpc::Status& status) override { relay_->HomeDone(status); }

   private:
    WriteTensorRelay* const relay_;
  };

  void HomeDone(grpc::Status status) {
    if (status.ok()) {
      if (replied_) {
        *response_ = reply_;
      } else {
        status = grpc::Status(grpc::StatusCode::INTERNAL,
                              "the tenant's home node ended the upload without an answer");
      }
    }
    CopyHomeTrailers();
    Finish(status);
    Release();
  }

  grpc::ByteBuffer* const response_;
  Home home_;
  grpc::ByteBuffer message_;  // the caller's message being read or written to the home
  grpc::ByteBuffer reply_;
  bool replied_ = false;  // set by the home's read, which completes before its OnDone
};

// ReadTensor: the request sent, then the home's replies relayed to the caller one at a time
// (read one, write it, read the next once the caller has taken it). A hold on the home's call
// while a reply is written to the caller keeps it from ending under the write.
class ReadTensorRelay final : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public Relay {
 public:
  ReadTensorRelay(grpc::CallbackServerContext* context, std::string tenant)
      : Relay(context, "ReadTensor", std::move(tenant)), home_(this) {}

  void Start(std::shared_ptr<grpc::Channel> channel, absl::string_view node,
             const grpc::ByteBuffer& request) {
    PrepareHomeCall(std::move(channel), node);
    request_ = request;
    grpc::GenericStub(channel_).PrepareBidiStreamingCall(&home_context_, method_,
                                                         grpc::StubOptions(), &home_);
    home_.StartWriteLast(&request_, grpc::WriteOptions());
    home_.StartRead(&message_);
    home_.StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (ok) {
      message_.Clear();
      home_.StartRead(&message_);
    } else {
      home_context_.TryCancel();  // the caller stopped reading
    }
    home_.RemoveHold();
  }
  void OnCancel() override { home_context_.TryCancel(); }
  void OnDone() override { Release(); }

 private:
  class Home final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Home(ReadTensorRelay* relay) : relay_(relay) {}
    void OnReadDone(bool ok) override {
      if (!ok) return;  // the home's status follows in OnDone
      AddHold();
      relay_->StartWrite(&relay_->message_);
    }
    void OnDone(const grpc::Status& status) override { relay_->HomeDone(status); }

   private:
    ReadTensorRelay* const relay_;
  };

  void HomeDone(const grpc::Status& status) {
    CopyHomeTrailers();
    Finish(status);
    Release();
  }

  Home home_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer message_;  // the home's reply being read or written to the caller
};

}  // namespace

Forwarder::Forwarder(const Authenticator* auth, const TenantTable* tenants, ForwardOptions options)
    : auth_(auth), tenants_(tenants), options_(std::move(options)) {}

std::optional<Forwarder::Home> Forwarder::HomeElsewhere(
    const grpc::CallbackServerContext& context) const {
  absl::StatusOr<std::string> token = BearerToken(context);
  if (!token.ok()) return std::nullopt;
  const absl::string_view id = TenantIdOfKey(*token);
  // A tenant of this node, or a key that names none: answered here as on a single server.
  if (id.empty() || tenants_->RuntimeOf(id).ok()) return std::nullopt;
  // Checks the key against the directory's hash: only the tenant's own key is forwarded.
  absl::StatusOr<Authenticator::Location> where = auth_->LocateTenant(context);
  if (!where.ok() || where->here || where->address.empty()) return std::nullopt;
  return Home{.tenant = std::string(id), .node = where->node, .address = where->address};
}

std::optional<Forwarder::Home> Forwarder::HomeToForwardTo(
    const grpc::CallbackServerContext& context) const {
  if (!options_.forward) return std::nullopt;
  const auto& metadata = context.client_metadata();
  if (metadata.find(kForwardedByMetadata) != metadata.end()) return std::nullopt;
  auto [begin, end] = metadata.equal_range(kFollowHomeMetadata);
  for (auto it = begin; it != end; ++it) {
    if (it->second == "1") return std::nullopt;
  }
  return HomeElsewhere(context);
}

std::shared_ptr<grpc::Channel> Forwarder::ChannelTo(const std::string& address) {
  {
    absl::MutexLock lock(&mu_);
    auto it = channels_.find(address);
    if (it != channels_.end()) return it->second;
  }
  grpc::ChannelArguments args;
  // Both ends enforce their own limits: the caller's node on what it receives, the home on
  // its requests and replies.
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  std::shared_ptr<grpc::Channel> made =
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  absl::MutexLock lock(&mu_);
  if (channels_.size() >= kMaxChannels && !channels_.contains(address)) {
    channels_.erase(channels_.begin());
  }
  return channels_.try_emplace(address, std::move(made)).first->second;
}

grpc::ServerUnaryReactor* Forwarder::ForwardUnary(grpc::CallbackServerContext* context,
                                                  const char* rpc,
                                                  const google::protobuf::MessageLite& request,
                                                  google::protobuf::MessageLite* response) {
  std::optional<Home> home = HomeToForwardTo(*context);
  if (!home.has_value()) return nullptr;
  auto* relay = new UnaryRelay(context, rpc, home->tenant, response);
  relay->Start(ChannelTo(home->address), options_.node_name, request);
  return relay;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* Forwarder::ForwardWriteTensor(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  std::optional<Home> home = HomeToForwardTo(*context);
  if (!home.has_value()) return nullptr;
  auto* relay = new WriteTensorRelay(context, home->tenant, response);
  relay->Start(ChannelTo(home->address), options_.node_name);
  return relay;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* Forwarder::ForwardReadTensor(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer& request) {
  std::optional<Home> home = HomeToForwardTo(*context);
  if (!home.has_value()) return nullptr;
  auto* relay = new ReadTensorRelay(context, home->tenant);
  relay->Start(ChannelTo(home->address), options_.node_name, request);
  return relay;
}

grpc::ServerUnaryReactor* Forwarder::RedirectRegion(grpc::CallbackServerContext* context,
                                                    const char* rpc) {
  std::optional<Home> home = HomeElsewhere(*context);
  if (!home.has_value()) return nullptr;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  CallLog log(context, rpc);
  log.set_tenant(home->tenant);
  reactor->Finish(log.Finish(WithHome(
      absl::FailedPreconditionError(absl::StrCat(
          "tenant \"", home->tenant, "\" lives on node ", home->node, " at ", home->address,
          "; regions are never forwarded: they need a connection to the tenant's home node "
          "(its --unix_socket, on that machine)")),
      home->address, home->node)));
  return reactor;
}

}  // namespace tessera
