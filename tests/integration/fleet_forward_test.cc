// Forwarding in a fleet (docs/fleet.md, "Reaching a tenant's home"; docs/api.md, "Forwarding
// and redirects"): a tenant's calls that reach another node are relayed to its home, one hop,
// unless the client follows redirects itself (`tessera-follow-home: 1`), the call was
// forwarded already (`tessera-forwarded-by`), it is a region RPC, or the node runs with
// --fleet_forward=false; the C++ client follows a tenant that moves while it is connected.
// A real etcd on loopback and real servers.
#include <csignal>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

#include "tessera/client.h"
#include "tessera/v1/compute.grpc.pb.h"
#include "tessera/v1/tenant_admin.pb.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/server_process.h"
#include "tests/testing/slow_work.h"
#include "tests/testing/temp_dir.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using testing::ServerProcess;

class FleetForwardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto etcd = testing::EtcdProcess::Start(dir_.File("etcd"));
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
  }

  /// A node of the fleet named `name` on a port of its own (fleet_test.cc's StartNode).
  absl::StatusOr<std::unique_ptr<ServerProcess>> StartNode(const std::string& name,
                                                           std::vector<std::string> extra = {}) {
    const int port = testing::FreePort();
    std::vector<std::string> args = {
        absl::StrCat("--listen=127.0.0.1:", port), absl::StrCat("--fleet_etcd=", etcd_->endpoint()),
        absl::StrCat("--node_name=", name), "--fleet_lease_ttl=2s", "--log_level=warn"};
    args.insert(args.end(), extra.begin(), extra.end());
    return ServerProcess::Start(
        testing::OnTestBackend({.state_dir = dir_.File(absl::StrCat("node-", name)),
                                .args = args,
                                .env = {{"TESSERA_ADMIN_TOKEN", kAdminToken}}}));
  }

  /// Registers tenant `id` at `node` (placed there: the fleet's only node at the time, or
  /// the one the test starts first) and returns its key.
  static std::string Register(const ServerProcess& node, const std::string& id,
                              uint32_t requests_per_second = 0) {
    auto admin = Client::Connect(
        {.address = node.address(), .token = kAdminToken, .timeout = absl::Seconds(20)});
    EXPECT_TRUE(admin.ok()) << admin.status();
    if (!admin.ok()) return "";
    v1::RegisterTenantRequest request;
    request.set_tenant_id(id);
    request.mutable_quota()->set_device_memory_bytes(64 << 20);
    if (requests_per_second > 0) {
      request.mutable_quota()->set_requests_per_second(requests_per_second);
      request.mutable_quota()->set_max_requests_in_flight(1);
    }
    auto registered = (*admin)->RegisterTenant(request);
    EXPECT_TRUE(registered.ok()) << registered.status();
    if (!registered.ok()) return "";
    EXPECT_EQ(registered->tenant().home_node(), "a");
    return registered->api_key();
  }

  /// A plain generated stub to `node`, as grpcurl or another language's client would call it.
  static std::unique_ptr<v1::Compute::Stub> RawStub(const ServerProcess& node) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    return v1::Compute::NewStub(
        grpc::CreateCustomChannel(node.address(), grpc::InsecureChannelCredentials(), args));
  }

  /// A context with `key` and a deadline, and `extra` metadata.
  static std::unique_ptr<grpc::ClientContext> Context(
      const std::string& key, std::vector<std::pair<std::string, std::string>> extra = {}) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata("authorization", "Bearer " + key);
    for (const auto& [name, value] : extra) context->AddMetadata(name, value);
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return context;
  }

  static std::string Trailer(const grpc::ClientContext& context, const std::string& name) {
    const auto& trailers = context.GetServerTrailingMetadata();
    auto it = trailers.find(name);
    return it == trailers.end() ? "" : std::string(it->second.data(), it->second.size());
  }

  /// `call` answered the redirect to node a at `home`.
  static void ExpectRedirect(const grpc::Status& status, const grpc::ClientContext& context,
                             const ServerProcess& home) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("lives on node a at " + home.address()));
    EXPECT_EQ(Trailer(context, "tessera-home-address"), home.address());
    EXPECT_EQ(Trailer(context, "tessera-home-node"), "a");
  }

  static std::unique_ptr<Client> Admin(const ServerProcess& node) {
    auto admin = Client::Connect(
        {.address = node.address(), .token = kAdminToken, .timeout = absl::Seconds(20)});
    EXPECT_TRUE(admin.ok()) << admin.status();
    return admin.ok() ? *std::move(admin) : nullptr;
  }

  /// Waits up to `limit` until `node` serves tenant `id` as its home and `old_home` no longer
  /// knows it (it forgets a moved tenant at its next scan; a dead one knows nothing).
  static bool WaitUntilMoved(const std::string& id, const ServerProcess& node,
                             const std::string& name, const ServerProcess* old_home,
                             absl::Duration limit) {
    const absl::Time deadline = absl::Now() + limit;
    auto admin = Admin(node);
    std::unique_ptr<Client> old_admin = old_home != nullptr ? Admin(*old_home) : nullptr;
    for (;;) {
      auto there = admin->GetTenant(id);
      const bool moved =
          there.ok() && there->home_node() == name &&
          (old_admin == nullptr || absl::IsNotFound(old_admin->GetTenant(id).status()));
      if (moved) return true;
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  static constexpr char kAdminToken[] = "fleet-forward-test-admin-token-shared-by-all-0123";

  testing::TempDir dir_;
  std::unique_ptr<testing::EtcdProcess> etcd_;
};

// f32 values 0, 1, 2, ... as bytes.
std::string Ramp(size_t n) {
  std::string bytes(n * sizeof(float), '\0');
  for (size_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(i % 4096);
    std::memcpy(&bytes[i * sizeof(float)], &v, sizeof(float));
  }
  return bytes;
}

// Every Compute RPC of a tenant through another node, from a plain stub that sends no follow
// metadata: answered by the home, through b, with the data intact and the home's errors,
// request id and retry hints unchanged.
TEST_F(FleetForwardTest, ATenantsCallsThroughAnotherNodeAreAnsweredByItsHome) {
  auto a = StartNode("a");
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string key = Register(**a, "roamer");
  ASSERT_FALSE(key.empty());
  auto b = StartNode("b");
  ASSERT_TRUE(b.ok()) << b.status();
  auto stub = RawStub(**b);

  // CreateTensor (unary, inline data).
  v1::CreateTensorRequest create;
  create.mutable_spec()->set_dtype(v1::DTYPE_F32);
  create.mutable_spec()->add_shape(4);
  create.set_data(Ramp(4));
  v1::TensorInfo small;
  auto context = Context(key, {{"x-request-id", "forwarded-create-1"}});
  grpc::Status status = stub->CreateTensor(context.get(), create, &small);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(small.size_bytes(), 16u);
  // The home saw the caller's request id (it echoes it; so does b).
  const auto& initial = context->GetServerInitialMetadata();
  auto id = initial.find("x-request-id");
  ASSERT_NE(id, initial.end());
  EXPECT_EQ(std::string(id->second.data(), id->second.size()), "forwarded-create-1");

  // WriteTensor: 4 MiB in 1 MiB chunks, relayed message by message.
  constexpr size_t kElements = 1 << 20;
  const std::string data = Ramp(kElements);
  v1::TensorInfo x;
  {
    auto write_context = Context(key);
    auto writer = stub->WriteTensor(write_context.get(), &x);
    v1::WriteTensorRequest header;
    header.mutable_header()->mutable_create()->set_dtype(v1::DTYPE_F32);
    header.mutable_header()->mutable_create()->add_shape(kElements);
    ASSERT_TRUE(writer->Write(header));
    constexpr size_t kChunk = 1 << 20;
    for (size_t offset = 0; offset < data.size(); offset += kChunk) {
      v1::WriteTensorRequest chunk;
      chunk.mutable_chunk()->set_offset(offset);
      chunk.mutable_chunk()->set_data(data.substr(offset, kChunk));
      ASSERT_TRUE(writer->Write(chunk));
    }
    ASSERT_TRUE(writer->WritesDone());
    status = writer->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_EQ(x.size_bytes(), data.size());
  EXPECT_FALSE(x.handle().empty());

  // Launch with wait: y = x + x.
  v1::LaunchRequest launch;
  launch.set_kernel("add");
  launch.add_inputs(x.handle());
  launch.add_inputs(x.handle());
  launch.set_wait(true);
  v1::Job done;
  context = Context(key);
  status = stub->Launch(context.get(), launch, &done);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.DebugString();
  ASSERT_EQ(done.outputs_size(), 1);
  const std::string y = done.outputs(0).handle();

  // Launch without wait, then WaitJob.
  launch.set_wait(false);
  v1::Job queued;
  context = Context(key);
  status = stub->Launch(context.get(), launch, &queued);
  ASSERT_TRUE(status.ok()) << status.error_message();
  v1::WaitJobRequest wait;
  wait.set_job_id(queued.job_id());
  v1::Job waited;
  context = Context(key);
  status = stub->WaitJob(context.get(), wait, &waited);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(waited.job_id(), queued.job_id());
  EXPECT_EQ(waited.state(), v1::JOB_STATE_SUCCEEDED) << waited.DebugString();

  // ReadTensor: y in 1 MiB chunks, relayed message by message; y[i] = 2 x[i].
  {
    v1::ReadTensorRequest read;
    read.set_handle(y);
    read.set_chunk_bytes(1 << 20);
    auto read_context = Context(key);
    auto reader = stub->ReadTensor(read_context.get(), read);
    std::string got;
    v1::ReadTensorResponse reply;
    int messages = 0;
    while (reader->Read(&reply)) {
      ++messages;
      EXPECT_EQ(reply.chunk().offset(), got.size());
      got += reply.chunk().data();
    }
    status = reader->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(messages, 4);
    ASSERT_EQ(got.size(), data.size());
    for (size_t i = 0; i < kElements; i += 997) {
      float in = 0, out = 0;
      std::memcpy(&in, &data[i * sizeof(float)], sizeof(float));
      std::memcpy(&out, &got[i * sizeof(float)], sizeof(float));
      ASSERT_EQ(out, 2 * in) << "element " << i;
    }
  }

  // GetUsage: the home's tenant, with its three tensors and y's twin.
  v1::Usage usage;
  context = Context(key);
  status = stub->GetUsage(context.get(), v1::GetUsageRequest(), &usage);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(usage.tensors(), 4u);
  EXPECT_GT(usage.memory_used_bytes(), 2 * data.size());

  // DeleteTensor, then the home's NOT_FOUND for it comes back unchanged.
  v1::DeleteTensorRequest remove;
  remove.set_handle(x.handle());
  v1::DeleteTensorResponse removed;
  context = Context(key);
  status = stub->DeleteTensor(context.get(), remove, &removed);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(removed.released_bytes(), data.size());
  v1::GetTensorRequest get;
  get.set_handle(x.handle());
  context = Context(key);
  status = stub->GetTensor(context.get(), get, &small);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();

  // The C++ client with follow_home=false sends no follow metadata: b forwards its calls.
  auto stays = Client::Connect({.address = (*b)->address(),
                                .token = key,
                                .timeout = absl::Seconds(20),
                                .follow_home = false});
  ASSERT_TRUE(stays.ok()) << stays.status();
  EXPECT_EQ((*stays)->address(), (*b)->address());
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_F32);
  spec.add_shape(3 << 18);
  const std::string three = Ramp(3 << 18);
  auto uploaded = (*stays)->Upload(spec, three);
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  auto downloaded = (*stays)->Download(uploaded->handle());
  ASSERT_TRUE(downloaded.ok()) << downloaded.status();
  EXPECT_EQ(*downloaded, three);
}

// A refusal at the home (RESOURCE_EXHAUSTED with its retry hint) reaches the caller through
// b unchanged, and b takes no ticket of its own: the first call passes.
TEST_F(FleetForwardTest, TheHomesRefusalsAndRetryHintsComeBackThroughTheNode) {
  auto a = StartNode("a");
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string key = Register(**a, "limited", /*requests_per_second=*/1);
  ASSERT_FALSE(key.empty());
  auto b = StartNode("b");
  ASSERT_TRUE(b.ok()) << b.status();
  auto stub = RawStub(**b);
  v1::Usage usage;
  auto first = Context(key);
  grpc::Status status = stub->GetUsage(first.get(), v1::GetUsageRequest(), &usage);
  ASSERT_TRUE(status.ok()) << status.error_message();
  auto second = Context(key);
  status = stub->GetUsage(second.get(), v1::GetUsageRequest(), &usage);
  ASSERT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_FALSE(Trailer(*second, "grpc-retry-pushback-ms").empty());
}

// The caller's deadline and its cancellation reach the home: a waiting launch through b,
// queued behind a long job, expires there at the caller's deadline (the home knew it) or is
// cancelled there when the caller cancels, and never runs.
TEST_F(FleetForwardTest, TheCallersDeadlineAndCancellationReachTheHome) {
  // The long job is sized to outlast the two launches and the polls by far, on a loaded CI
  // machine too.
  // One job on the device at a time: the launch behind the long job stays in the core's
  // queue, where a deadline or a cancellation can still take it (on every backend).
  auto a = StartNode("a", {"--device_in_flight=1"});
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string key = Register(**a, "patient");
  ASSERT_FALSE(key.empty());
  auto b = StartNode("b");
  ASSERT_TRUE(b.ok()) << b.status();
  auto home =
      Client::Connect({.address = (*a)->address(), .token = key, .timeout = absl::Seconds(60)});
  ASSERT_TRUE(home.ok()) << home.status();
  auto work = testing::SlowWork::Calibrate(**home, absl::Seconds(8), 16 << 20);
  ASSERT_TRUE(work.ok()) << work.status();
  auto stub = RawStub(**b);
  v1::Job slow;
  auto context = Context(key);
  grpc::Status status = stub->Submit(context.get(), work->Program(), &slow);
  ASSERT_TRUE(status.ok()) << status.error_message();
  v1::LaunchRequest behind;
  behind.set_kernel("neg");
  behind.add_inputs(work->operand());
  behind.set_wait(true);
  // Polls the home (through b) until `done` holds of its usage.
  auto eventually = [&](auto done) {
    v1::Usage usage;
    for (int i = 0; i < 40; ++i) {
      auto ask = Context(key);
      EXPECT_TRUE(stub->GetUsage(ask.get(), v1::GetUsageRequest(), &usage).ok());
      if (done(usage)) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return usage;
  };

  grpc::ClientContext timed;
  timed.AddMetadata("authorization", "Bearer " + key);
  timed.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  v1::Job job;
  const absl::Time start = absl::Now();
  status = stub->Launch(&timed, behind, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  v1::Usage usage = eventually([](const v1::Usage& u) { return u.jobs_expired() == 1; });
  EXPECT_EQ(usage.jobs_expired(), 1u);
  EXPECT_EQ(usage.jobs_queued(), 0u);

  grpc::ClientContext cancelled;
  cancelled.AddMetadata("authorization", "Bearer " + key);
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(300));
    cancelled.TryCancel();
  });
  status = stub->Launch(&cancelled, behind, &job);
  canceller.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
  usage = eventually([](const v1::Usage& u) { return u.jobs_cancelled() == 2; });
  EXPECT_EQ(usage.jobs_cancelled(), 2u);
  EXPECT_EQ(usage.jobs_expired(), 1u);
  EXPECT_EQ(usage.jobs_queued(), 0u);
  EXPECT_EQ(usage.jobs_running(), 1u) << "the long job should still run";
}

// Clients that follow redirects, calls forwarded once already, region RPCs and a node with
// --fleet_forward=false get the redirect; a wrong key learns nothing; the C++ client follows
// to the home and says so on every call.
TEST_F(FleetForwardTest, RedirectsWhereACallIsNotForwarded) {
  auto a = StartNode("a");
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string key = Register(**a, "roamer");
  ASSERT_FALSE(key.empty());
  auto b = StartNode("b");
  ASSERT_TRUE(b.ok()) << b.status();
  auto stub = RawStub(**b);
  v1::Usage usage;

  auto follows = Context(key, {{"tessera-follow-home", "1"}});
  ExpectRedirect(stub->GetUsage(follows.get(), v1::GetUsageRequest(), &usage), *follows, **a);

  auto forwarded = Context(key, {{"tessera-forwarded-by", "c"}});
  ExpectRedirect(stub->GetUsage(forwarded.get(), v1::GetUsageRequest(), &usage), *forwarded, **a);

  // Streams too.
  {
    auto read_context = Context(key, {{"tessera-follow-home", "1"}});
    v1::ReadTensorRequest read;
    read.set_handle("t-anything");
    auto reader = stub->ReadTensor(read_context.get(), read);
    v1::ReadTensorResponse reply;
    EXPECT_FALSE(reader->Read(&reply));
    ExpectRedirect(reader->Finish(), *read_context, **a);
  }

  // Regions are never forwarded: they need the home's Unix socket.
  v1::BeginRegionRequest begin;
  begin.set_size_bytes(1 << 20);
  v1::RegionTicket ticket;
  auto region = Context(key);
  grpc::Status status = stub->BeginRegion(region.get(), begin, &ticket);
  ExpectRedirect(status, *region, **a);
  EXPECT_THAT(status.error_message(), HasSubstr("regions are never forwarded"));

  // A wrong secret for the right tenant is refused as any bad key, never forwarded.
  std::string wrong = key;
  wrong.back() = wrong.back() == 'A' ? 'B' : 'A';
  auto bad = Context(wrong);
  status = stub->GetUsage(bad.get(), v1::GetUsageRequest(), &usage);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  EXPECT_TRUE(Trailer(*bad, "tessera-home-address").empty());

  // Locate is answered by b itself.
  v1::Location location;
  auto where = Context(key);
  ASSERT_TRUE(stub->Locate(where.get(), v1::LocateRequest(), &location).ok());
  EXPECT_FALSE(location.here());
  EXPECT_EQ(location.address(), (*a)->address());

  // The C++ client follows to the home and works there; its calls declare it follows, so b
  // answers them with the redirect.
  auto client =
      Client::Connect({.address = (*b)->address(), .token = key, .timeout = absl::Seconds(20)});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->address(), (*a)->address());
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_F32);
  spec.add_shape(8);
  const std::string bytes(32, '\7');
  auto uploaded = (*client)->Upload(spec, bytes);
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  EXPECT_EQ(*(*client)->Download(uploaded->handle()), bytes);
  auto declared = (*client)->NewContext();
  ExpectRedirect(stub->GetUsage(declared.get(), v1::GetUsageRequest(), &usage), *declared, **a);

  // A node with --fleet_forward=false answers everyone with the redirect.
  auto c = StartNode("c", {"--fleet_forward=false"});
  ASSERT_TRUE(c.ok()) << c.status();
  auto off = Context(key);
  ExpectRedirect(RawStub(**c)->GetUsage(off.get(), v1::GetUsageRequest(), &usage), *off, **a);
}

// A C++ client connected to the tenant's home before a drain with --move keeps working: its
// next call (a streamed upload) is answered with the redirect by the old home, sent again to
// the new one, and the client stays there; the tenant's tensors from before are gone.
TEST_F(FleetForwardTest, TheClientFollowsATenantDrainedToAnotherNode) {
  auto a = StartNode("a");
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string key = Register(**a, "drifter");
  ASSERT_FALSE(key.empty());
  auto b = StartNode("b");
  ASSERT_TRUE(b.ok()) << b.status();
  auto client =
      Client::Connect({.address = (*a)->address(), .token = key, .timeout = absl::Seconds(20)});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_EQ((*client)->address(), (*a)->address());
  v1::TensorSpec small;
  small.set_dtype(v1::DTYPE_F32);
  small.add_shape(8);
  auto before = (*client)->Upload(small, std::string(32, '\3'));
  ASSERT_TRUE(before.ok()) << before.status();

  ASSERT_TRUE(Admin(**b)->DrainNode("a", /*undo=*/false, /*move_tenants=*/true).ok());
  ASSERT_TRUE(WaitUntilMoved("drifter", **b, "b", a->get(), absl::Seconds(10)));

  // 3 MiB in 1 MiB chunks: refused by a before it ran, re-sent whole to b.
  constexpr size_t kElements = 3 << 18;
  const std::string data = Ramp(kElements);
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_F32);
  spec.add_shape(kElements);
  auto uploaded = (*client)->Upload(spec, data, 1 << 20);
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  EXPECT_EQ((*client)->address(), (*b)->address());
  auto downloaded = (*client)->Download(uploaded->handle());
  ASSERT_TRUE(downloaded.ok()) << downloaded.status();
  EXPECT_EQ(*downloaded, data);
  auto usage = (*client)->GetUsage();
  ASSERT_TRUE(usage.ok()) << usage.status();
  EXPECT_EQ(usage->tensors(), 1u);
  auto old = (*client)->Download(before->handle());
  EXPECT_EQ(old.status().code(), absl::StatusCode::kNotFound) << old.status();
  EXPECT_THAT(old.status().message(), HasSubstr("moved to node b"));
  // The channel is the new home's too.
  v1::Usage raw;
  auto context = (*client)->NewContext();
  EXPECT_TRUE(v1::Compute::NewStub((*client)->channel())
                  ->GetUsage(context.get(), v1::GetUsageRequest(), &raw)
                  .ok());
}

// The home killed (-9): the client, which reached it through b (its seed), may see UNAVAILABLE
// while the tenant waits for the lease and the grace, then asks b where it went and, within
// the lease TTL + 5 s, works there with its old key; a handle from before says it moved.
TEST_F(FleetForwardTest, TheClientFindsATenantWhoseHomeWasKilled) {
  auto a = StartNode("a");
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string key = Register(**a, "survivor");
  ASSERT_FALSE(key.empty());
  auto b = StartNode("b");
  ASSERT_TRUE(b.ok()) << b.status();
  auto client =
      Client::Connect({.address = (*b)->address(), .token = key, .timeout = absl::Seconds(20)});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_EQ((*client)->address(), (*a)->address());
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_F32);
  spec.add_shape(8);
  auto before = (*client)->Upload(spec, std::string(32, '\5'));
  ASSERT_TRUE(before.ok()) << before.status();

  ASSERT_TRUE((*a)->Stop(SIGKILL).ok());
  const absl::Time killed = absl::Now();
  absl::Status last;
  int unavailable = 0;
  while (absl::Now() - killed < absl::Seconds(2 + 5)) {
    last = (*client)->GetUsage().status();
    if (last.ok()) break;
    EXPECT_EQ(last.code(), absl::StatusCode::kUnavailable) << last;
    ++unavailable;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(last.ok()) << "not served again within the lease TTL + 5 s: " << last;
  EXPECT_GT(unavailable, 0);
  EXPECT_EQ((*client)->address(), (*b)->address());
  auto old = (*client)->Download(before->handle());
  EXPECT_EQ(old.status().code(), absl::StatusCode::kNotFound) << old.status();
  EXPECT_THAT(old.status().message(), HasSubstr("moved to node b"));
  auto fresh = (*client)->Upload(spec, std::string(32, '\6'));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(*(*client)->Download(fresh->handle()), std::string(32, '\6'));
}

}  // namespace
}  // namespace tessera
