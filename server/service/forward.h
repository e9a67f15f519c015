#ifndef TESSERA_SERVER_SERVICE_FORWARD_H_
#define TESSERA_SERVER_SERVICE_FORWARD_H_

// Forwarding in a fleet (docs/fleet.md, "Reaching a tenant's home"; docs/api.md,
// "Forwarding and redirects"): a tenant's Compute call that reaches a node other than its
// home is relayed to the home, one hop, for clients that do not follow the redirect
// themselves (grpcurl, other languages). The home authenticates the key again, takes the
// call in the tenant's RequestGate and answers; its status, message and the trailers that
// matter come back unchanged.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/grpcpp.h"

#include "server/service/auth.h"

namespace tessera {

class TenantTable;

/// Sent by a client that follows redirects itself (value "1", as the C++ and Python clients
/// do on every call): the node answers FAILED_PRECONDITION with the home's trailers instead
/// of forwarding.
inline constexpr char kFollowHomeMetadata[] = "tessera-follow-home";
/// Carried by a forwarded call: the forwarding node's name. A call that carries it is never
/// forwarded again (one hop at most): a node that is not the tenant's home answers it with
/// the redirect (or UNAVAILABLE) as it would without forwarding.
inline constexpr char kForwardedByMetadata[] = "tessera-forwarded-by";
/// How long before a forwarded waiting call's deadline a cancellation is taken for that
/// deadline passing at the forwarding node (whose timer runs ahead of ours by the hop's
/// latency): the queued job then expires at its deadline rather than being cancelled.
inline constexpr absl::Duration kForwardedDeadlineSlack = absl::Milliseconds(250);

struct ForwardOptions {
  /// This node's name in the fleet (kForwardedByMetadata); empty: a single server, no
  /// Forwarder.
  std::string node_name;
  /// --fleet_forward; false on a node serving TLS too (its channels to other nodes would need
  /// credentials it does not have): every call for a tenant homed elsewhere gets the redirect.
  bool forward = true;
};

/// Decides, per call, whether a tenant's call is the home's to answer, and relays it there.
/// Thread-safe. `auth` and `tenants` are borrowed and must outlive it. A relay holds its
/// channel and needs nothing of the Forwarder once started: it may outlive it (it ends when
/// the server's call does, which server shutdown cancels).
class Forwarder {
 public:
  Forwarder(const Authenticator* auth, const TenantTable* tenants, ForwardOptions options);

  /// A reactor relaying unary method `rpc` ("GetUsage") to the tenant's home, which answers
  /// `response`; nullptr when the call is this node's to answer (a tenant of this node, a
  /// bad key, a client that follows redirects, a call forwarded already, a home that is not
  /// live, forwarding off). `request` is serialized before this returns; `response` must
  /// live until the call is done (gRPC's unary contract).
  grpc::ServerUnaryReactor* ForwardUnary(grpc::CallbackServerContext* context, const char* rpc,
                                         const google::protobuf::MessageLite& request,
                                         google::protobuf::MessageLite* response);
  /// The same for WriteTensor: the upload's messages relayed one at a time; `response` gets
  /// the home's serialized TensorInfo.
  grpc::ServerReadReactor<grpc::ByteBuffer>* ForwardWriteTensor(
      grpc::CallbackServerContext* context, grpc::ByteBuffer* response);
  /// The same for ReadTensor: the home's replies relayed one at a time.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ForwardReadTensor(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer& request);

  /// Region RPCs need the home's Unix socket and are never forwarded: for a tenant homed
  /// elsewhere, a reactor finished FAILED_PRECONDITION with the home's trailers and a message
  /// saying so (whatever the client sends, and with forwarding off too); nullptr otherwise.
  grpc::ServerUnaryReactor* RedirectRegion(grpc::CallbackServerContext* context, const char* rpc);

 private:
  struct Home {
    std::string tenant;
    std::string node;
    std::string address;
  };
  /// Where the caller's tenant lives when that is another, live node and the key is its
  /// valid key; nullopt otherwise. A tenant of this node costs a map lookup, no hash.
  std::optional<Home> HomeElsewhere(const grpc::CallbackServerContext& context) const;
  /// HomeElsewhere for a call that may be forwarded (forwarding on, no kFollowHomeMetadata
  /// "1", no kForwardedByMetadata).
  std::optional<Home> HomeToForwardTo(const grpc::CallbackServerContext& context) const;
  /// The cached channel to `address` (plaintext), made on first use.
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  /// Channels kept; past this, one is dropped (its calls in flight keep it until they end).
  static constexpr size_t kMaxChannels = 64;

  const Authenticator* const auth_;
  const TenantTable* const tenants_;
  const ForwardOptions options_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVICE_FORWARD_H_
