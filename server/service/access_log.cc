#include "server/service/access_log.h"

#include <array>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "spdlog/spdlog.h"

#include "server/common/logging.h"
#include "server/service/metrics.h"

namespace tessera {
namespace {

using grpc::experimental::InterceptionHookPoints;

constexpr size_t kMaxRequestIdLength = 64;

// context -> record, sharded so that concurrent calls rarely share a lock.
class CallRegistry {
 public:
  static CallRegistry& Get() {
    static CallRegistry* registry = new CallRegistry();
    return *registry;
  }
  void Add(const void* key, std::shared_ptr<CallRecord> record) {
    Shard& s = ShardOf(key);
    absl::MutexLock lock(&s.mu);
    s.records[key] = std::move(record);
  }
  std::shared_ptr<CallRecord> Find(const void* key) {
    Shard& s = ShardOf(key);
    absl::MutexLock lock(&s.mu);
    auto it = s.records.find(key);
    return it == s.records.end() ? nullptr : it->second;
  }
  void Remove(const void* key) {
    Shard& s = ShardOf(key);
    absl::MutexLock lock(&s.mu);
    s.records.erase(key);
  }

 private:
  struct Shard {
    absl::Mutex mu;
    absl::flat_hash_map<const void*, std::shared_ptr<CallRecord>> records ABSL_GUARDED_BY(mu);
  };
  Shard& ShardOf(const void* key) {
    return shards_[(reinterpret_cast<uintptr_t>(key) >> 6) % shards_.size()];
  }
  std::array<Shard, 16> shards_;
};

// Per-method sampling counters for successful calls.
class Sampler {
 public:
  explicit Sampler(uint32_t every) : every_(every) {}
  bool Take(absl::string_view method) {
    if (every_ <= 1) return true;
    absl::MutexLock lock(&mu_);
    return counts_[method]++ % every_ == 0;
  }

 private:
  const uint32_t every_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, uint64_t> counts_ ABSL_GUARDED_BY(mu_);
};

struct Shared {
  Shared(AccessLogOptions o, Metrics* m)
      : options(std::move(o)), metrics(m), sampler(options.sample) {}
  const AccessLogOptions options;
  Metrics* const metrics;
  Sampler sampler;
};

std::string CodeString(grpc::StatusCode code) {
  std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  return name.empty() ? absl::StrCat("CODE_", static_cast<int>(code)) : name;
}

class AccessLogInterceptor final : public grpc::experimental::Interceptor {
 public:
  AccessLogInterceptor(grpc::experimental::ServerRpcInfo* info, std::shared_ptr<Shared> shared)
      : info_(info),
        shared_(std::move(shared)),
        method_(absl::StripPrefix(info->method(), "/")),
        received_(ReceivedKind(method_)),
        record_(std::make_shared<CallRecord>()),
        start_(absl::Now()) {}

  ~AccessLogInterceptor() override {
    CallRegistry::Get().Remove(info_->server_context());
    if (!status_sent_) {  // the client went away before the handler answered
      code_ = grpc::StatusCode::CANCELLED;
      end_ = absl::Now();
    }
    const double seconds = absl::ToDoubleSeconds(end_ - start_);
    const std::string code = CodeString(code_);
    const std::string tenant = record_->get_tenant();
    if (shared_->metrics != nullptr) {
      shared_->metrics->RpcHandled(method_, code, seconds);
      if (code_ == grpc::StatusCode::OK && !tenant.empty()) {
        if (absl::EndsWith(method_, "/WriteTensor") || absl::EndsWith(method_, "/CreateTensor")) {
          shared_->metrics->Transfer(tenant, "upload", bytes_in_, seconds);
        } else if (absl::EndsWith(method_, "/ReadTensor")) {
          shared_->metrics->Transfer(tenant, "download", bytes_out_, seconds);
        }
      }
    }
    const AccessLogOptions& o = shared_->options;
    if (o.mode == "off") return;
    const bool ok = code_ == grpc::StatusCode::OK;
    if (ok && (o.mode == "errors" || !shared_->sampler.Take(method_))) return;
    const LogField fields[] = {
        {"request_id", record_->request_id},
        {"tenant", tenant.empty() ? absl::string_view("-") : absl::string_view(tenant)},
        {"method", method_},
        {"code", code},
        {"duration_ms", seconds * 1e3},
        {"peer", peer_},
        {"bytes_in", static_cast<int64_t>(bytes_in_)},
        {"bytes_out", static_cast<int64_t>(bytes_out_)},
        {"error", absl::string_view(message_)}};
    // A success has no error field.
    LogEvent(spdlog::level::info, "access",
             absl::MakeConstSpan(fields, ok ? std::size(fields) - 1 : std::size(fields)));
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      const auto* metadata = methods->GetRecvInitialMetadata();
      record_->request_id = metadata != nullptr ? RequestIdFrom(*metadata) : RequestIdFrom({});
      peer_ = info_->server_context()->peer();
      // A client's end of a Unix socket is unnamed: name the server's socket it came in on.
      if (peer_ == "unix:" && !shared_->options.unix_socket.empty()) {
        peer_ = "unix:" + shared_->options.unix_socket;
      }
      CallRegistry::Get().Add(info_->server_context(), record_);
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
      // Generated messages derive from MessageLite alone, so the pointer is the base's.
      const void* message = methods->GetRecvMessage();
      if (message != nullptr && received_ == Received::kProtobuf) {
        bytes_in_ += static_cast<const google::protobuf::MessageLite*>(message)->ByteSizeLong();
      } else if (message != nullptr && received_ == Received::kByteBuffer) {
        bytes_in_ += static_cast<const grpc::ByteBuffer*>(message)->Length();
      }
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      if (grpc::ByteBuffer* buffer = methods->GetSerializedSendMessage(); buffer != nullptr) {
        bytes_out_ += buffer->Length();
      }
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      grpc::Status status = methods->GetSendStatus();
      code_ = status.error_code();
      message_ = status.error_message();
      status_sent_ = true;
      end_ = absl::Now();
      // The call is answered: its request ticket goes back now, not when gRPC frees the call
      // later, so that a client's next call never finds its previous one still counted.
      record_->set_lease(nullptr);
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* const info_;
  const std::shared_ptr<Shared> shared_;
  // What a received message is: our methods' protobuf or raw buffers; other services'
  // (health, reflection's) messages are not counted unless known to be protobuf.
  enum class Received { kProtobuf, kByteBuffer, kUncounted };
  static Received ReceivedKind(absl::string_view method) {
    for (absl::string_view raw : kRawMethods) {
      if (method == raw) return Received::kByteBuffer;
    }
    return absl::StartsWith(method, "tessera.v1.") || absl::StartsWith(method, "grpc.reflection.")
               ? Received::kProtobuf
               : Received::kUncounted;
  }

  const std::string method_;
  const Received received_;
  const std::shared_ptr<CallRecord> record_;
  const absl::Time start_;
  absl::Time end_;
  std::string peer_;
  uint64_t bytes_in_ = 0;
  uint64_t bytes_out_ = 0;
  grpc::StatusCode code_ = grpc::StatusCode::UNKNOWN;
  std::string message_;
  bool status_sent_ = false;
};

class AccessLogFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit AccessLogFactory(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new AccessLogInterceptor(info, shared_);
  }

 private:
  const std::shared_ptr<Shared> shared_;
};

}  // namespace

std::shared_ptr<CallRecord> FindCallRecord(const grpc::ServerContextBase* context) {
  return CallRegistry::Get().Find(context);
}

std::string RequestIdFrom(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) {
  auto it = metadata.find("x-request-id");
  if (it != metadata.end()) {
    absl::string_view id(it->second.data(), it->second.size());
    bool ok = !id.empty() && id.size() <= kMaxRequestIdLength;
    for (char c : id) ok = ok && (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.');
    if (ok) return std::string(id);
  }
  thread_local absl::BitGen gen;
  return absl::StrFormat("%016x", absl::Uniform<uint64_t>(gen));
}

absl::Status CheckAccessLogOptions(const AccessLogOptions& options) {
  if (options.mode != "all" && options.mode != "errors" && options.mode != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--access_log=", options.mode, ": allowed values are all, errors, off"));
  }
  if (options.sample < 1 || options.sample > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat("--access_log_sample=", options.sample,
                                                   ": the range is 1..1000000 (1: every call)"));
  }
  return absl::OkStatus();
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewAccessLogFactory(
    AccessLogOptions options, Metrics* metrics) {
  auto shared = std::make_shared<Shared>(std::move(options), metrics);
  return std::make_unique<AccessLogFactory>(std::move(shared));
}

}  // namespace tessera
