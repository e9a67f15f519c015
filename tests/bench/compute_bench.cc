// Data-plane benchmarks, each against a baseline measured in the same run (this machine is
// shared and noisy; ratios are what to compare):
//   sgemm:   matmul through the server on resident tensors vs the faster of OpenBLAS and
//            Eigen called directly in this process (same threads: the machine's cores);
//   add:     c = a + b on 64 MiB through the server vs a plain loop split over the cores;
//   latency: a 4 KiB add (Launch, wait) end to end vs a bare gRPC echo of the same bytes.
// Usage: tessera_compute_bench [--quick] > results.md
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include <cblas.h>
#include <signal.h>

#include "absl/strings/str_format.h"
#include "grpcpp/grpcpp.h"

#include "Eigen/Core"
#include "tessera/client.h"
#include "tests/bench/echo.grpc.pb.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Median of `repeats` timings of `fn`, after one warm-up call.
template <typename Fn>
double MedianSeconds(int repeats, Fn fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    auto start = Clock::now();
    fn();
    t.push_back(Seconds(Clock::now() - start));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

class EchoService final : public bench::Echo::CallbackService {
  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context,
                                 const bench::EchoMessage* request,
                                 bench::EchoMessage* response) override {
    *response = *request;
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

// `--echo_server`: the transport baseline as a process of its own (default gRPC settings,
// like tessera-server), printing the same banner; stops on SIGTERM or SIGINT.
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
  builder.RegisterService(&echo);
  auto server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return 1;
  std::printf("echo server listening on 127.0.0.1:%d\n", port);
  std::fflush(stdout);
  int signal = 0;
  sigwait(&signals, &signal);
  server->Shutdown();
  return 0;
}

v1::TensorSpec Spec(std::vector<int64_t> shape) {
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_F32);
  spec.mutable_shape()->Add(shape.begin(), shape.end());
  return spec;
}

std::string RandomFloats(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f;
  return std::string(reinterpret_cast<const char*>(v.data()), n * sizeof(float));
}

int Main(bool quick) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  testing::TempDir dir;
  auto server = testing::ServerProcess::Start(
      {.state_dir = dir.File("var"), .args = {"--backend=cpu", "--log_level=warn"}});
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  auto admin =
      *Client::Connect({.address = (*server)->address(), .token = (*server)->AdminToken()});
  v1::RegisterTenantRequest reg;
  reg.set_tenant_id("bench");
  reg.mutable_quota()->set_device_memory_bytes(uint64_t{2} << 30);
  auto key = admin->RegisterTenant(reg);
  if (!key.ok()) return 1;
  auto tenant = *Client::Connect(
      {.address = (*server)->address(), .token = key->api_key(), .timeout = absl::Minutes(5)});

  std::printf("| benchmark | through Tessera | baseline (same run) | ratio | target |\n");
  std::printf("|---|---|---|---|---|\n");

  // ---- SGEMM on resident tensors ----
  for (int n : quick ? std::vector<int>{256, 1024} : std::vector<int>{256, 512, 1024, 2048}) {
    std::string a_bytes = RandomFloats(static_cast<size_t>(n) * n);
    auto a = tenant->Upload(Spec({n, n}), a_bytes, 4 << 20);
    auto c = tenant->CreateTensor(Spec({n, n}));
    v1::LaunchRequest launch;
    launch.set_kernel("matmul");
    launch.add_inputs(a->handle());
    launch.add_inputs(a->handle());
    launch.add_outputs()->set_handle(c->handle());
    launch.set_wait(true);
    int repeats = n >= 2048 ? 5 : n >= 1024 ? 9 : 21;
    std::vector<float> A(static_cast<size_t>(n) * n), C(static_cast<size_t>(n) * n);
    std::memcpy(A.data(), a_bytes.data(), a_bytes.size());
    openblas_set_num_threads(cores);
    using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::Map<const RowMajor> EA(A.data(), n, n);
    Eigen::Map<RowMajor> EC(C.data(), n, n);
    // Interleaved call by call, so drift of this shared machine hits both sides alike; a
    // pause after each direct call lets OpenBLAS's threads stop spinning first.
    std::vector<double> server_t, blas_t, eigen_t;
    auto time = [](auto fn) {
      auto start = Clock::now();
      fn();
      return Seconds(Clock::now() - start);
    };
    for (int r = -1; r < repeats; ++r) {  // r = -1 warms up
      double ts = time([&] { (void)tenant->Launch(launch); });
      double tb = time([&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A.data(), n, A.data(),
                    n, 0.0f, C.data(), n);
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      double te = time([&] { EC.noalias() = EA * EA; });
      if (r < 0) continue;
      server_t.push_back(ts);
      blas_t.push_back(tb);
      eigen_t.push_back(te);
    }
    double server_s = Percentile(server_t, 0.5);
    double blas_s = Percentile(blas_t, 0.5);
    double eigen_s = Percentile(eigen_t, 0.5);
    double best = std::min(blas_s, eigen_s);
    double gflop = 2.0 * n * n * n / 1e9;
    std::printf(
        "| sgemm n=%d | %.1f GFLOP/s | %s %.1f GFLOP/s (OpenBLAS %d threads %.1f, Eigen %.1f) | "
        "%.2fx | >= 0.9x for n >= 512 |\n",
        n, gflop / server_s, blas_s <= eigen_s ? "OpenBLAS" : "Eigen", gflop / best, cores,
        gflop / blas_s, gflop / eigen_s, best / server_s);
    (void)tenant->DeleteTensor(a->handle());
    (void)tenant->DeleteTensor(c->handle());
  }

  // ---- c = a + b on 64 MiB ----
  {
    const size_t n = (size_t{64} << 20) / sizeof(float);
    std::string bytes = RandomFloats(n);
    auto a = tenant->Upload(Spec({static_cast<int64_t>(n)}), bytes, 4 << 20);
    auto b = tenant->Upload(Spec({static_cast<int64_t>(n)}), bytes, 4 << 20);
    auto c = tenant->CreateTensor(Spec({static_cast<int64_t>(n)}));
    v1::LaunchRequest launch;
    launch.set_kernel("add");
    launch.add_inputs(a->handle());
    launch.add_inputs(b->handle());
    launch.add_outputs()->set_handle(c->handle());
    launch.set_wait(true);
    double server_s = MedianSeconds(quick ? 5 : 15, [&] { (void)tenant->Launch(launch); });
    std::vector<float> A(n), B(n), C(n);
    std::memcpy(A.data(), bytes.data(), bytes.size());
    std::memcpy(B.data(), bytes.data(), bytes.size());
    double loop_s = MedianSeconds(quick ? 5 : 15, [&] {
      std::vector<std::thread> threads;
      for (int t = 0; t < cores; ++t) {
        threads.emplace_back([&, t] {
          size_t begin = n * t / cores, end = n * (t + 1) / cores;
          for (size_t i = begin; i < end; ++i) C[i] = A[i] + B[i];
        });
      }
      for (auto& th : threads) th.join();
    });
    double gb = 3.0 * n * sizeof(float) / 1e9;
    std::printf("| add 64 MiB | %.2f GB/s | plain %d-thread loop %.2f GB/s | %.2fx | >= 0.8x |\n",
                gb / server_s, cores, gb / loop_s, loop_s / server_s);
  }

  // ---- 4 KiB add, Launch wait, vs echo of 4 KiB ----
  {
    // The baseline runs in a process of its own, like tessera-server: a server inside the
    // client's process shares the client's gRPC pollers, and a blocked client thread then
    // serves the echo itself, with no wake-up of another thread (reported as a diagnostic).
    testing::ServerProcess::Options echo_options;
    echo_options.binary = "/proc/self/exe";
    echo_options.args = {"--echo_server"};
    auto echo_process = testing::ServerProcess::Start(echo_options);
    if (!echo_process.ok()) {
      std::fprintf(stderr, "echo server: %s\n", echo_process.status().ToString().c_str());
      return 1;
    }
    auto stub = bench::Echo::NewStub(
        grpc::CreateChannel((*echo_process)->address(), grpc::InsecureChannelCredentials()));
    grpc::ServerBuilder builder;
    EchoService echo;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&echo);
    auto echo_server = builder.BuildAndStart();
    auto local_stub = bench::Echo::NewStub(grpc::CreateChannel(
        absl::StrFormat("127.0.0.1:%d", port), grpc::InsecureChannelCredentials()));
    bench::EchoMessage message;
    message.set_data(std::string(4096, 'x'));
    const int calls = quick ? 500 : 3000;
    std::vector<double> echo_t, local_echo_t, add_t, usage_t, nowait_t;
    auto a = tenant->CreateTensor(Spec({1024}), RandomFloats(1024));
    auto c = tenant->CreateTensor(Spec({1024}));
    v1::LaunchRequest launch;
    launch.set_kernel("add");
    launch.add_inputs(a->handle());
    launch.add_inputs(a->handle());
    launch.add_outputs()->set_handle(c->handle());
    launch.set_wait(true);
    v1::LaunchRequest nowait = launch;
    nowait.set_wait(false);
    for (int i = 0; i < 100; ++i) {  // warm both paths
      grpc::ClientContext ctx;
      bench::EchoMessage reply;
      (void)stub->Echo(&ctx, message, &reply);
      grpc::ClientContext local_ctx;
      (void)local_stub->Echo(&local_ctx, message, &reply);
      (void)tenant->Launch(launch);
    }
    for (int i = 0; i < calls; ++i) {  // interleaved, so drift affects both alike
      auto start = Clock::now();
      grpc::ClientContext ctx;
      bench::EchoMessage reply;
      (void)stub->Echo(&ctx, message, &reply);
      echo_t.push_back(Seconds(Clock::now() - start));
      start = Clock::now();
      grpc::ClientContext local_ctx;
      (void)local_stub->Echo(&local_ctx, message, &reply);
      local_echo_t.push_back(Seconds(Clock::now() - start));
      start = Clock::now();
      (void)tenant->Launch(launch);
      add_t.push_back(Seconds(Clock::now() - start));
      start = Clock::now();
      (void)tenant->GetUsage();
      usage_t.push_back(Seconds(Clock::now() - start));
      start = Clock::now();
      (void)tenant->Launch(nowait);
      nowait_t.push_back(Seconds(Clock::now() - start));
    }
    double add50 = Percentile(add_t, 0.5), echo50 = Percentile(echo_t, 0.5);
    double add99 = Percentile(add_t, 0.99), echo99 = Percentile(echo_t, 0.99);
    std::printf(
        "| 4 KiB add p50 (Launch, wait) | %.0f us | echo of 4 KiB %.0f us | %.2fx | <= 1.25x |\n",
        add50 * 1e6, echo50 * 1e6, add50 / echo50);
    std::printf(
        "| 4 KiB add p99 (Launch, wait) | %.0f us | echo of 4 KiB %.0f us | %.2fx | <= 1.5x |\n",
        add99 * 1e6, echo99 * 1e6, add99 / echo99);
    std::printf(
        "| GetUsage p50 (authenticated, no job) | %.0f us | echo of 4 KiB %.0f us | %.2fx | "
        "(diagnostic) |\n",
        Percentile(usage_t, 0.5) * 1e6, echo50 * 1e6, Percentile(usage_t, 0.5) / echo50);
    std::printf(
        "| 4 KiB add p50 without wait (diagnostic) | %.0f us | echo of 4 KiB %.0f us | %.2fx | "
        "(diagnostic) |\n",
        Percentile(nowait_t, 0.5) * 1e6, echo50 * 1e6, Percentile(nowait_t, 0.5) / echo50);
    std::printf(
        "| echo p50, server in the client's process (diagnostic) | %.0f us | echo of 4 KiB %.0f "
        "us | %.2fx | (diagnostic) |\n",
        Percentile(local_echo_t, 0.5) * 1e6, echo50 * 1e6, Percentile(local_echo_t, 0.5) / echo50);
    (void)tenant->Synchronize();
    echo_server->Shutdown();
    (void)(*echo_process)->Stop(SIGTERM);
  }
  (void)(*server)->Stop(SIGTERM);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--echo_server") return tessera::EchoServerMain();
  bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  return tessera::Main(quick);
}
