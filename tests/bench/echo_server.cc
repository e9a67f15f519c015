#include "tests/bench/echo_server.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include <pthread.h>
#include <signal.h>

#include "grpcpp/grpcpp.h"

#include "tests/bench/echo.grpc.pb.h"

namespace tessera::bench {
namespace {

// Receives chunks and counts their bytes (the data is not kept).
class UploadReactor final : public grpc::ServerReadReactor<EchoMessage> {
 public:
  explicit UploadReactor(StreamSummary* summary) : summary_(summary) { StartRead(&message_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      summary_->set_size(bytes_);
      Finish(grpc::Status::OK);
      return;
    }
    bytes_ += message_.data().size();
    StartRead(&message_);
  }
  void OnDone() override { delete this; }

 private:
  StreamSummary* const summary_;
  EchoMessage message_;
  uint64_t bytes_ = 0;
};

// Sends `size` bytes, each chunk copied from a source buffer as a server reading a stored
// tensor would.
class DownloadReactor final : public grpc::ServerWriteReactor<EchoMessage> {
 public:
  explicit DownloadReactor(const StreamRequest& request)
      : left_(request.size()),
        chunk_(std::max<uint32_t>(1, request.chunk_bytes())),
        source_(static_cast<size_t>(chunk_), 'x') {
    Next();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    Next();
  }
  void OnDone() override { delete this; }

 private:
  void Next() {
    if (left_ == 0) {
      Finish(grpc::Status::OK);
      return;
    }
    size_t n = static_cast<size_t>(std::min<uint64_t>(left_, chunk_));
    message_.set_data(source_.data(), n);
    left_ -= n;
    StartWrite(&message_);
  }

  uint64_t left_;
  const uint32_t chunk_;
  const std::string source_;
  EchoMessage message_;
};

class EchoService final : public Echo::CallbackService {
  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context, const EchoMessage* request,
                                 EchoMessage* response) override {
    *response = *request;
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerReadReactor<EchoMessage>* Upload(grpc::CallbackServerContext*,
                                               StreamSummary* summary) override {
    return new UploadReactor(summary);
  }
  grpc::ServerWriteReactor<EchoMessage>* Download(grpc::CallbackServerContext*,
                                                  const StreamRequest* request) override {
    return new DownloadReactor(*request);
  }
};

}  // namespace

int EchoServerMain() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before gRPC starts its threads
  grpc::ServerBuilder builder;
  EchoService echo;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.RegisterService(&echo);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return 1;
  std::printf("echo server listening on 127.0.0.1:%d\n", port);
  std::fflush(stdout);
  int signal = 0;
  sigwait(&signals, &signal);
  server->Shutdown();
  return 0;
}

}  // namespace tessera::bench
