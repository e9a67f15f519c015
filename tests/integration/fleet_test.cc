// Fleet mode (docs/fleet.md, issue 32) with a real etcd on loopback and real servers: nodes
// join under leases, ids are unique across the fleet, and the data plane outlives etcd.
#include "server/fleet/fleet.h"

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "server/fleet/etcd_client.h"
#include "tessera/client.h"
#include "tessera/v1/compute.grpc.pb.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using testing::ServerProcess;

class FleetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto etcd = testing::EtcdProcess::Start(dir_.File("etcd"));
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    auto client = fleet::EtcdClient::Create({.endpoints = {etcd_->endpoint()}});
    ASSERT_TRUE(client.ok()) << client.status();
    etcd_client_ = *std::move(client);
  }

  /// A node of the fleet named `name`, on a port of its own that it advertises.
  absl::StatusOr<std::unique_ptr<ServerProcess>> StartNode(const std::string& name,
                                                           std::vector<std::string> extra = {}) {
    const int port = testing::UnusedLoopbackPort();
    std::vector<std::string> args = {
        absl::StrCat("--listen=127.0.0.1:", port), absl::StrCat("--fleet_etcd=", etcd_->endpoint()),
        absl::StrCat("--node_name=", name), "--fleet_lease_ttl=2s", "--log_level=warn"};
    args.insert(args.end(), extra.begin(), extra.end());
    // The fleet's nodes share one admin token: a registration may be forwarded to the node
    // placement chooses, with the caller's credentials.
    return ServerProcess::Start(
        testing::OnTestBackend({.state_dir = dir_.File(absl::StrCat("node-", name, "-", ++starts_)),
                                .args = args,
                                .env = {{"TESSERA_ADMIN_TOKEN", kAdminToken}}}));
  }

  static constexpr char kAdminToken[] = "fleet-test-admin-token-shared-by-every-node-0123";

  static std::unique_ptr<Client> Admin(const ServerProcess& node) {
    auto client = Client::Connect(
        {.address = node.address(), .token = kAdminToken, .timeout = absl::Seconds(20)});
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  static v1::RegisterTenantRequest Registration(const std::string& id) {
    v1::RegisterTenantRequest request;
    request.set_tenant_id(id);
    request.mutable_quota()->set_device_memory_bytes(64 << 20);
    return request;
  }

  /// The nodes in etcd, by name.
  std::vector<std::string> NodesInEtcd() {
    std::vector<std::string> names;
    auto keys = etcd_client_->GetPrefix("/tessera/v1/nodes/");
    EXPECT_TRUE(keys.ok()) << keys.status();
    if (!keys.ok()) return names;
    for (const auto& kv : *keys) {
      auto node = fleet::NodeRecordFromJson(kv.value);
      EXPECT_TRUE(node.ok()) << node.status();
      if (node.ok()) names.push_back(node->name);
    }
    return names;
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<fleet::EtcdClient> etcd_client_;
  int starts_ = 0;
};

// Two nodes join; the same id registered through both at once is registered exactly once,
// and etcd names the node that won as the tenant's home.
TEST_F(FleetTest, AnIdRegisteredThroughTwoNodesAtOnceIsRegisteredExactlyOnce) {
  auto a = StartNode("a");
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = StartNode("b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(NodesInEtcd(), ::testing::ElementsAre("a", "b"));
  auto node = etcd_client_->Get("/tessera/v1/nodes/a");
  ASSERT_TRUE(node.ok() && node->has_value());
  auto record = fleet::NodeRecordFromJson((*node)->value);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->address, (*a)->address());
  ASSERT_FALSE(record->devices.empty());
  EXPECT_GT(record->devices[0].free_memory_bytes, 0u);

  auto admin_a = Admin(**a), admin_b = Admin(**b);
  ASSERT_TRUE(admin_a != nullptr && admin_b != nullptr);
  // Any node lists the fleet; GetServerInfo names the node and the directory.
  auto nodes = admin_b->ListNodes();
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_EQ(nodes->nodes_size(), 2);
  EXPECT_EQ(nodes->nodes(0).name(), "a");
  EXPECT_EQ(nodes->nodes(0).address(), (*a)->address());
  EXPECT_EQ(nodes->nodes(1).address(), (*b)->address());
  ASSERT_GT(nodes->nodes(1).devices_size(), 0);
  EXPECT_GT(nodes->nodes(1).devices(0).free_memory_bytes(), 0u);
  auto info = admin_a->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->node_name(), "a");
  EXPECT_EQ(info->fleet_directory(), "etcd " + etcd_->endpoint());
  auto listed =
      testing::RunCommand({testing::CliBinary(), "node", "list"},
                          {{"TESSERA_ADDR", (*a)->address()}, {"TESSERA_TOKEN", kAdminToken}});
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->exit_code, 0) << listed->output;
  EXPECT_THAT(listed->output, HasSubstr((*b)->address()));
  for (int round = 0; round < 8; ++round) {
    const std::string id = absl::StrCat("race-", round);
    absl::Status at_a, at_b;
    std::thread ta([&] { at_a = admin_a->RegisterTenant(Registration(id)).status(); });
    std::thread tb([&] { at_b = admin_b->RegisterTenant(Registration(id)).status(); });
    ta.join();
    tb.join();
    ASSERT_NE(at_a.ok(), at_b.ok()) << id << ": " << at_a << " / " << at_b;
    const absl::Status& lost = at_a.ok() ? at_b : at_a;
    EXPECT_EQ(lost.code(), absl::StatusCode::kAlreadyExists) << lost;
    auto stored = etcd_client_->Get(absl::StrCat("/tessera/v1/tenants/", id));
    ASSERT_TRUE(stored.ok() && stored->has_value());
    std::string home;
    ASSERT_TRUE(fleet::TenantFromJson((*stored)->value, &home).ok());
    ASSERT_TRUE(home == "a" || home == "b") << home;
    // Only the home knows the tenant (wherever the registration was sent), and shows it.
    auto& at_home = home == "a" ? admin_a : admin_b;
    auto& away = home == "a" ? admin_b : admin_a;
    EXPECT_EQ(away->GetTenant(id).status().code(), absl::StatusCode::kNotFound);
    auto tenant = at_home->GetTenant(id);
    ASSERT_TRUE(tenant.ok()) << tenant.status();
    EXPECT_EQ(tenant->home_node(), home);
  }
  // Placement spreads tenants registered through one node over the fleet (the node with the
  // most free memory; each node republishes its capacity after every registration).
  std::map<std::string, int> homes;
  for (int i = 0; i < 6; ++i) {
    auto placed = admin_a->RegisterTenant(Registration(absl::StrCat("spread-", i)));
    ASSERT_TRUE(placed.ok()) << placed.status();
    ++homes[placed->tenant().home_node()];
  }
  EXPECT_GE(homes["a"], 2) << "a " << homes["a"] << ", b " << homes["b"];
  EXPECT_GE(homes["b"], 2) << "a " << homes["a"] << ", b " << homes["b"];
  // `tessera tenant list` in a fleet has a HOME column.
  auto tenants =
      testing::RunCommand({testing::CliBinary(), "tenant", "list"},
                          {{"TESSERA_ADDR", (*b)->address()}, {"TESSERA_TOKEN", kAdminToken}});
  ASSERT_TRUE(tenants.ok()) << tenants.status();
  EXPECT_EQ(tenants->exit_code, 0) << tenants->output;
  EXPECT_THAT(tenants->output, HasSubstr("HOME"));
  EXPECT_THAT(tenants->output, ::testing::ContainsRegex("spread-[0-9] .* b "));

  // A draining node takes no new tenant: everything registered through b goes to a.
  ASSERT_TRUE(admin_a->DrainNode("b").ok());
  EXPECT_EQ(admin_a->DrainNode("nobody").code(), absl::StatusCode::kNotFound);
  auto b_drains = [&] {
    auto listed_nodes = admin_a->ListNodes();
    return listed_nodes.ok() && listed_nodes->nodes_size() == 2 &&
           listed_nodes->nodes(1).draining();
  };
  const absl::Time drained_by = absl::Now() + absl::Seconds(5);
  while (!b_drains() && absl::Now() < drained_by) absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(b_drains()) << "node b never showed it drains";
  for (int i = 0; i < 3; ++i) {
    auto placed = admin_b->RegisterTenant(Registration(absl::StrCat("drained-", i)));
    ASSERT_TRUE(placed.ok()) << placed.status();
    EXPECT_EQ(placed->tenant().home_node(), "a");
  }
  auto undone =
      testing::RunCommand({testing::CliBinary(), "node", "drain", "b", "--undo"},
                          {{"TESSERA_ADDR", (*a)->address()}, {"TESSERA_TOKEN", kAdminToken}});
  ASSERT_TRUE(undone.ok()) << undone.status();
  EXPECT_EQ(undone->exit_code, 0) << undone->output;
  const absl::Time undone_by = absl::Now() + absl::Seconds(5);
  while (b_drains() && absl::Now() < undone_by) absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(b_drains());

  // Deregistering removes the tenant from the fleet: the id is free again, on any node.
  auto dereg = admin_a->DeregisterTenant("race-0");
  if (!dereg.ok()) dereg = admin_b->DeregisterTenant("race-0");
  ASSERT_TRUE(dereg.ok()) << dereg.status();
  EXPECT_FALSE((*etcd_client_->Get("/tessera/v1/tenants/race-0")).has_value());
  EXPECT_TRUE(admin_b->RegisterTenant(Registration("race-0")).ok());
}

// A tenant's key used at another node: the C++ client follows the redirect to the tenant's
// home at connect time and works there; a client that does not follow is told the home in
// the status and in trailing metadata; a wrong key is refused as any bad key is.
TEST_F(FleetTest, ATenantsCallsAtAnotherNodeAreSentToItsHome) {
  auto a = StartNode("a");
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = StartNode("b");
  ASSERT_TRUE(b.ok()) << b.status();
  auto registered = Admin(**a)->RegisterTenant(Registration("roamer"));
  ASSERT_TRUE(registered.ok()) << registered.status();
  const std::string key = registered->api_key();

  auto followed =
      Client::Connect({.address = (*b)->address(), .token = key, .timeout = absl::Seconds(20)});
  ASSERT_TRUE(followed.ok()) << followed.status();
  EXPECT_EQ((*followed)->address(), (*a)->address());
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_F32);
  spec.add_shape(8);
  const std::string bytes(32, '\7');
  auto uploaded = (*followed)->Upload(spec, bytes);
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  EXPECT_EQ(*(*followed)->Download(uploaded->handle()), bytes);

  auto stays = Client::Connect({.address = (*b)->address(),
                                .token = key,
                                .timeout = absl::Seconds(20),
                                .follow_home = false});
  ASSERT_TRUE(stays.ok()) << stays.status();
  auto stub = v1::Compute::NewStub((*stays)->channel());
  auto context = (*stays)->NewContext();
  v1::Usage usage;
  grpc::Status redirected = stub->GetUsage(context.get(), v1::GetUsageRequest(), &usage);
  EXPECT_EQ(redirected.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(redirected.error_message(), HasSubstr("lives on node a at " + (*a)->address()));
  const auto& trailers = context->GetServerTrailingMetadata();
  auto home = trailers.find("tessera-home-address");
  ASSERT_NE(home, trailers.end());
  EXPECT_EQ(std::string(home->second.data(), home->second.size()), (*a)->address());

  // Locate says the same without an error, and "here" at home.
  grpc::ClientContext where_context;
  where_context.AddMetadata("authorization", "Bearer " + key);
  v1::Location location;
  ASSERT_TRUE(stub->Locate(&where_context, v1::LocateRequest(), &location).ok());
  EXPECT_FALSE(location.here());
  EXPECT_EQ(location.node_name(), "a");
  EXPECT_EQ(location.address(), (*a)->address());
  auto home_stub = v1::Compute::NewStub((*followed)->channel());
  grpc::ClientContext home_context;
  home_context.AddMetadata("authorization", "Bearer " + key);
  ASSERT_TRUE(home_stub->Locate(&home_context, v1::LocateRequest(), &location).ok());
  EXPECT_TRUE(location.here());
  EXPECT_EQ(location.node_name(), "a");

  // The right tenant with a wrong secret learns nothing.
  std::string wrong = key;
  wrong.back() = wrong.back() == 'A' ? 'B' : 'A';
  auto bad =
      Client::Connect({.address = (*b)->address(), .token = wrong, .timeout = absl::Seconds(20)});
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ((*bad)->address(), (*b)->address());
  EXPECT_EQ((*bad)->GetUsage().status().code(), absl::StatusCode::kUnauthenticated);
}

// A second node with a live node's name does not start; a node that stops leaves at once, and
// one killed leaves when its lease expires.
TEST_F(FleetTest, NodeNamesAreUniqueAndNodesLeaveWhenStoppedOrKilled) {
  auto a = StartNode("a");
  ASSERT_TRUE(a.ok()) << a.status();
  auto twin = StartNode("a");
  ASSERT_FALSE(twin.ok());
  EXPECT_THAT(twin.status().message(), HasSubstr("is in use by a live node"));
  auto b = StartNode("b");
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE((*b)->Stop(SIGTERM).ok());
  EXPECT_THAT(NodesInEtcd(), ::testing::ElementsAre("a"));
  ASSERT_TRUE((*a)->Stop(SIGKILL).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(2 + 5);  // the TTL plus 5 s
  while (!NodesInEtcd().empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(NodesInEtcd().empty()) << "a killed node stayed in the fleet";
  // Its name is free again.
  auto again = StartNode("a");
  EXPECT_TRUE(again.ok()) << again.status();
}

// etcd stopped: tenants at home keep being served; registration is UNAVAILABLE naming etcd;
// once etcd is back the node registers again without a restart.
TEST_F(FleetTest, WithoutEtcdTheDataPlaneServesAndRegistrationWaitsForEtcd) {
  auto a = StartNode("a");
  ASSERT_TRUE(a.ok()) << a.status();
  auto admin = Admin(**a);
  ASSERT_NE(admin, nullptr);
  auto registered = admin->RegisterTenant(Registration("steady"));
  ASSERT_TRUE(registered.ok()) << registered.status();
  auto tenant = Client::Connect(
      {.address = (*a)->address(), .token = registered->api_key(), .timeout = absl::Seconds(20)});
  ASSERT_TRUE(tenant.ok()) << tenant.status();
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_F32);
  spec.add_shape(4);
  const std::string bytes(16, '\1');
  ASSERT_TRUE((*tenant)->Upload(spec, bytes).ok());

  etcd_->Stop();
  for (int i = 0; i < 5; ++i) {
    auto uploaded = (*tenant)->Upload(spec, bytes);
    ASSERT_TRUE(uploaded.ok()) << uploaded.status();
    auto read = (*tenant)->Download(uploaded->handle());
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, bytes);
  }
  absl::Status refused = admin->RegisterTenant(Registration("later")).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("etcd"));
  EXPECT_EQ(admin->GetTenant("later").status().code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE(etcd_->Restart().ok());
  absl::Status registered_later;
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  do {
    registered_later = admin->RegisterTenant(Registration("later")).status();
    if (!registered_later.ok()) absl::SleepFor(absl::Milliseconds(250));
  } while (!registered_later.ok() && absl::Now() < deadline);
  EXPECT_TRUE(registered_later.ok()) << registered_later;
  // The node's entry comes back too (its lease may have expired meanwhile).
  const absl::Time back = absl::Now() + absl::Seconds(10);
  while (NodesInEtcd().empty() && absl::Now() < back) absl::SleepFor(absl::Milliseconds(200));
  EXPECT_THAT(NodesInEtcd(), ::testing::ElementsAre("a"));
}

}  // namespace
}  // namespace tessera
