// Fleet mode (docs/fleet.md, issue 32) with a real etcd on loopback and real servers: nodes
// join under leases, ids are unique across the fleet, and the data plane outlives etcd.
#include "server/fleet/fleet.h"

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
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

  /// A node of the fleet named `name`, on a port of its own that it advertises; its state
  /// in `state_dir` (default: a new directory).
  absl::StatusOr<std::unique_ptr<ServerProcess>> StartNode(const std::string& name,
                                                           std::vector<std::string> extra = {},
                                                           std::string state_dir = "") {
    const int port = testing::FreePort();
    std::vector<std::string> args = {absl::StrCat("--listen=127.0.0.1:", port), "--log_level=warn"};
    if (!name.empty()) {
      args.push_back(absl::StrCat("--fleet_etcd=", etcd_->endpoint()));
      args.push_back(absl::StrCat("--node_name=", name));
      args.push_back(absl::StrCat("--fleet_lease_ttl=", kLeaseTtlSeconds, "s"));
    }
    args.insert(args.end(), extra.begin(), extra.end());
    if (state_dir.empty()) state_dir = dir_.File(absl::StrCat("node-", name, "-", ++starts_));
    // The fleet's nodes share one admin token: a registration may be forwarded to the node
    // placement chooses, with the caller's credentials.
    return ServerProcess::Start(testing::OnTestBackend(
        {.state_dir = state_dir, .args = args, .env = {{"TESSERA_ADMIN_TOKEN", kAdminToken}}}));
  }

  static constexpr int kLeaseTtlSeconds = 2;

  /// Tenant `id`'s home node in etcd ("" when absent).
  std::string HomeInEtcd(const std::string& id) {
    auto stored = etcd_client_->Get(absl::StrCat("/tessera/v1/tenants/", id));
    if (!stored.ok() || !stored->has_value()) return "";
    std::string home;
    return fleet::TenantFromJson((*stored)->value, &home).ok() ? home : "";
  }

  /// Waits until tenant `id` is homed somewhere other than `from` in etcd, for at most
  /// `limit`: the new home, or "" when it did not move in time.
  std::string WaitForMove(const std::string& id, const std::string& from, absl::Duration limit) {
    const absl::Time deadline = absl::Now() + limit;
    for (;;) {
      const std::string home = HomeInEtcd(id);
      if (!home.empty() && home != from) return home;
      if (absl::Now() > deadline) return "";
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  /// A tenant client through `node` (following the tenant's home).
  static std::unique_ptr<Client> Tenant(const ServerProcess& node, const std::string& key) {
    auto client =
        Client::Connect({.address = node.address(), .token = key, .timeout = absl::Seconds(20)});
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  static v1::TensorSpec Spec() {
    v1::TensorSpec spec;
    spec.set_dtype(v1::DTYPE_F32);
    spec.add_shape(8);
    return spec;
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
// home at connect time and works there; a client that says it follows but has not is told
// the home in the status and in trailing metadata; a wrong key is refused as any bad key is.
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
  // A client that says it follows is redirected rather than forwarded (docs/api.md).
  context->AddMetadata("tessera-follow-home", "1");
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

// kill -9 of a node: once its lease has expired (plus a grace), its tenants are homed on the
// other nodes with their ids, quotas and keys; their old tensors answer NOT_FOUND saying why;
// the node, restarted on its old state, does not serve them (it forgets them and sends their
// calls to the new home).
TEST_F(FleetTest, ALostNodesTenantsMoveWithTheirKeysAndItDoesNotServeThemWhenBack) {
  auto a = StartNode("a");
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string b_state = dir_.File("node-b-kept");
  auto b = StartNode("b", {}, b_state);
  ASSERT_TRUE(b.ok()) << b.status();
  auto c = StartNode("c");
  ASSERT_TRUE(c.ok()) << c.status();
  auto admin = Admin(**a);
  ASSERT_NE(admin, nullptr);
  struct Placed {
    std::string id, key, home, handle;
    v1::Quota quota;
  };
  std::vector<Placed> placed;
  for (int i = 0; i < 6; ++i) {
    v1::RegisterTenantRequest request = Registration(absl::StrCat("lost-", i));
    request.mutable_quota()->set_compute_share_percent(30);
    request.mutable_quota()->set_max_streams(2);
    auto registered = admin->RegisterTenant(request);
    ASSERT_TRUE(registered.ok()) << registered.status();
    Placed p{request.tenant_id(), registered->api_key(), registered->tenant().home_node(), "",
             registered->tenant().quota()};
    auto tenant = Tenant(**a, p.key);
    ASSERT_NE(tenant, nullptr);
    auto uploaded = tenant->Upload(Spec(), std::string(32, '\3'));
    ASSERT_TRUE(uploaded.ok()) << uploaded.status();
    p.handle = uploaded->handle();
    placed.push_back(std::move(p));
  }
  int on_b = 0;
  for (const Placed& p : placed) on_b += p.home == "b" ? 1 : 0;
  ASSERT_GE(on_b, 1) << "placement put nothing on b";

  ASSERT_TRUE((*b)->Stop(SIGKILL).ok());
  const absl::Time killed = absl::Now();
  for (const Placed& p : placed) {
    if (p.home != "b") continue;
    SCOPED_TRACE(p.id);
    // The lease TTL plus 5 s.
    const std::string home =
        WaitForMove(p.id, "b", absl::Seconds(kLeaseTtlSeconds + 5) - (absl::Now() - killed));
    ASSERT_TRUE(home == "a" || home == "c") << "not moved in time: " << HomeInEtcd(p.id);
    // Its old key works through any node, and its quotas are the registered ones.
    auto tenant = Tenant(**a, p.key);
    ASSERT_NE(tenant, nullptr);
    EXPECT_EQ(tenant->address(), home == "a" ? (*a)->address() : (*c)->address());
    auto usage = tenant->GetUsage();
    ASSERT_TRUE(usage.ok()) << usage.status();
    auto got = Admin(home == "a" ? **a : **c)->GetTenant(p.id);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->quota().compute_share_percent(), 30);
    EXPECT_EQ(got->quota().max_streams(), 2);
    EXPECT_EQ(got->quota().device_memory_bytes(), p.quota.device_memory_bytes());
    EXPECT_EQ(got->home_node(), home);
    // Its tensors from before are gone, and the answer says why.
    auto old = tenant->Download(p.handle);
    EXPECT_EQ(old.status().code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(old.status().message(), HasSubstr("moved to node " + home));
    EXPECT_THAT(old.status().message(), HasSubstr("when its node b was lost"));
    auto fresh = tenant->Upload(Spec(), std::string(32, '\4'));
    ASSERT_TRUE(fresh.ok()) << fresh.status();
  }
  // Every tenant is listed once, from any node, with its home; none on b.
  auto listed = Admin(**c)->ListTenants();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->total_size(), 6);
  for (const v1::Tenant& t : listed->tenants()) EXPECT_NE(t.home_node(), "b") << t.tenant_id();

  // b comes back on its old state: it forgets the tenants that moved and sends their calls on.
  auto back = StartNode("b", {}, b_state);
  ASSERT_TRUE(back.ok()) << back.status();
  auto admin_b = Admin(**back);
  ASSERT_NE(admin_b, nullptr);
  for (const Placed& p : placed) {
    if (p.home != "b") continue;
    SCOPED_TRACE(p.id);
    EXPECT_EQ(admin_b->GetTenant(p.id).status().code(), absl::StatusCode::kNotFound);
    auto stays = Client::Connect({.address = (*back)->address(),
                                  .token = p.key,
                                  .timeout = absl::Seconds(20),
                                  .follow_home = false});
    ASSERT_TRUE(stays.ok()) << stays.status();
    auto stub = v1::Compute::NewStub((*stays)->channel());
    auto context = (*stays)->NewContext();
    context->AddMetadata("tessera-follow-home", "1");
    v1::Usage usage;
    grpc::Status redirected = stub->GetUsage(context.get(), v1::GetUsageRequest(), &usage);
    EXPECT_EQ(redirected.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
        << redirected.error_message();
    EXPECT_THAT(redirected.error_message(), HasSubstr("lives on node " + HomeInEtcd(p.id)));
  }
}

// A node stopped on purpose keeps its tenants while it is away (they are not moved); draining
// it with --move moves them; a live node drained with --move gives its tenants up at once.
TEST_F(FleetTest, DrainingWithMoveMovesTenantsAndAStoppedNodesTenantsWaitForIt) {
  auto a = StartNode("a");
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = StartNode("b");
  ASSERT_TRUE(b.ok()) << b.status();
  auto admin_b = Admin(**b);
  ASSERT_NE(admin_b, nullptr);
  auto registered = Admin(**a)->RegisterTenant(Registration("mover"));
  ASSERT_TRUE(registered.ok()) << registered.status();
  const std::string key = registered->api_key();
  const std::string first = registered->tenant().home_node();
  ServerProcess& home = first == "a" ? **a : **b;
  ServerProcess& other = first == "a" ? **b : **a;
  const std::string second = first == "a" ? "b" : "a";
  auto tenant = Tenant(other, key);
  ASSERT_NE(tenant, nullptr);
  auto uploaded = tenant->Upload(Spec(), std::string(32, '\5'));
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();

  // Live, drained with --move (the CLI): the tenant moves to the other node within seconds.
  auto drained =
      testing::RunCommand({testing::CliBinary(), "node", "drain", first, "--move"},
                          {{"TESSERA_ADDR", other.address()}, {"TESSERA_TOKEN", kAdminToken}});
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->exit_code, 0) << drained->output;
  EXPECT_EQ(WaitForMove("mover", first, absl::Seconds(10)), second);
  // The drained node forgets it at its next scan (within a second).
  const absl::Time forgotten_by = absl::Now() + absl::Seconds(5);
  while (Admin(home)->GetTenant("mover").ok() && absl::Now() < forgotten_by) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(Admin(home)->GetTenant("mover").status().code(), absl::StatusCode::kNotFound);
  auto moved = Tenant(home, key);
  ASSERT_NE(moved, nullptr);
  EXPECT_EQ(moved->address(), other.address());
  auto old = moved->Download(uploaded->handle());
  EXPECT_EQ(old.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(old.status().message(), HasSubstr("was drained"));
  ASSERT_TRUE(Admin(other)->DrainNode(first, /*undo=*/true).ok());

  // Stopped on purpose: its tenant waits for it, well past the lease and the grace.
  ASSERT_TRUE(other.Stop(SIGTERM).ok());
  absl::SleepFor(absl::Seconds(kLeaseTtlSeconds + 3));
  EXPECT_EQ(HomeInEtcd("mover"), second);
  // Drained with --move while stopped: it moves to the live node.
  auto admin_home = Admin(home);
  ASSERT_NE(admin_home, nullptr);
  EXPECT_EQ(admin_home->DrainNode(second).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(admin_home->DrainNode(second, false, /*move_tenants=*/true).ok());
  EXPECT_EQ(WaitForMove("mover", second, absl::Seconds(10)), first);
  auto back_home = Tenant(home, key);
  ASSERT_NE(back_home, nullptr);
  auto usage = back_home->GetUsage();
  EXPECT_TRUE(usage.ok()) << usage.status();
}

// The fleet at the scale: 50 tenants registered through random nodes of three; every
// tenant's calls work through every node (forwarded for a plain client, redirected for one
// that says it follows, followed by the C++ client); etcd stopped and restarted under load
// (the data plane keeps serving, registration is UNAVAILABLE, then works again); then one
// node killed: its tenants are served by the others with their old keys within its lease
// TTL plus 5 s.
TEST_F(FleetTest, FiftyTenantsOnThreeNodesAreServedThroughEveryNodeAndOutliveEtcdAndANode) {
  std::vector<std::unique_ptr<ServerProcess>> nodes;
  for (const char* name : {"a", "b", "c"}) {
    auto node = StartNode(name);
    ASSERT_TRUE(node.ok()) << node.status();
    nodes.push_back(*std::move(node));
  }
  std::vector<std::unique_ptr<Client>> admins;
  for (const auto& node : nodes) admins.push_back(Admin(*node));
  struct Placed {
    std::string id, key, home;
  };
  std::vector<Placed> placed;
  std::mt19937 random(32);
  std::map<std::string, int> per_home;
  for (int i = 0; i < 50; ++i) {
    const std::string id = absl::StrCat("t", i);
    v1::RegisterTenantRequest request = Registration(id);
    request.mutable_quota()->set_device_memory_bytes(16 << 20);
    auto registered = admins[random() % admins.size()]->RegisterTenant(request);
    ASSERT_TRUE(registered.ok()) << id << ": " << registered.status();
    placed.push_back({id, registered->api_key(), registered->tenant().home_node()});
    ++per_home[placed.back().home];
  }
  EXPECT_EQ(per_home.size(), 3u) << "placement used only some nodes";
  auto index_of = [](const std::string& name) { return static_cast<size_t>(name[0] - 'a'); };
  // A raw GetUsage through `node`, with or without the follow metadata.
  auto raw_usage = [&](const ServerProcess& node, const std::string& key, bool follows,
                       std::string* home_address) {
    auto channel = grpc::CreateChannel(node.address(), grpc::InsecureChannelCredentials());
    auto stub = v1::Compute::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    context.AddMetadata("authorization", "Bearer " + key);
    if (follows) context.AddMetadata("tessera-follow-home", "1");
    v1::Usage usage;
    grpc::Status status = stub->GetUsage(&context, v1::GetUsageRequest(), &usage);
    auto trailers = context.GetServerTrailingMetadata();
    if (auto it = trailers.find("tessera-home-address"); it != trailers.end()) {
      *home_address = std::string(it->second.data(), it->second.size());
    }
    return status;
  };
  for (const Placed& p : placed) {
    SCOPED_TRACE(p.id + " at " + p.home);
    const ServerProcess& home = *nodes[index_of(p.home)];
    for (const auto& node : nodes) {
      std::string redirect;
      grpc::Status forwarded = raw_usage(*node, p.key, false, &redirect);
      EXPECT_TRUE(forwarded.ok()) << node->address() << ": " << forwarded.error_message();
      grpc::Status told = raw_usage(*node, p.key, true, &redirect);
      if (node.get() == &home) {
        EXPECT_TRUE(told.ok()) << told.error_message();
      } else {
        EXPECT_EQ(told.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
        EXPECT_EQ(redirect, home.address());
      }
      auto tenant = Tenant(*node, p.key);
      ASSERT_NE(tenant, nullptr);
      EXPECT_EQ(tenant->address(), home.address());
      EXPECT_TRUE(tenant->GetUsage().ok());
    }
  }

  // etcd away under load: clients at their tenants' homes keep moving bytes.
  std::atomic<bool> stop{false};
  std::atomic<int> served{0}, failed{0};
  std::vector<std::thread> load;
  for (int t = 0; t < 2; ++t) {
    load.emplace_back([&, t] {
      std::vector<std::unique_ptr<Client>> clients;
      for (int k = t; k < 10; k += 2) clients.push_back(Tenant(*nodes[0], placed[k].key));
      const absl::Time until = absl::Now() + absl::Seconds(60);  // bounded, whatever happens
      for (int n = 0; !stop.load() && n < 100000 && absl::Now() < until; ++n) {
        Client& c = *clients[static_cast<size_t>(n) % clients.size()];
        auto up = c.Upload(Spec(), std::string(32, static_cast<char>(n)));
        auto down = up.ok() ? c.Download(up->handle()) : absl::StatusOr<std::string>(up.status());
        if (down.ok() && *down == std::string(32, static_cast<char>(n)) &&
            c.DeleteTensor(up->handle()).ok()) {
          ++served;
        } else {
          ++failed;
        }
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(300));
  etcd_->Stop();
  const int served_before = served.load();
  absl::SleepFor(absl::Seconds(1));
  absl::Status refused = admins[1]->RegisterTenant(Registration("during-outage")).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("etcd"));
  absl::SleepFor(absl::Seconds(1));
  EXPECT_GT(served.load(), served_before) << "the data plane stopped with etcd";
  ASSERT_TRUE(etcd_->Restart().ok());
  absl::Status registered_later;
  const absl::Time recovered_by = absl::Now() + absl::Seconds(15);
  do {
    registered_later = admins[1]->RegisterTenant(Registration("during-outage")).status();
    if (!registered_later.ok()) absl::SleepFor(absl::Milliseconds(250));
  } while (!registered_later.ok() && absl::Now() < recovered_by);
  EXPECT_TRUE(registered_later.ok()) << registered_later;
  stop = true;
  for (std::thread& t : load) t.join();
  EXPECT_EQ(failed.load(), 0) << served.load() << " served";
  // Every node is back in the fleet (leases may have expired during the outage).
  const absl::Time rejoined_by = absl::Now() + absl::Seconds(10);
  while (NodesInEtcd().size() < 3 && absl::Now() < rejoined_by) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_EQ(NodesInEtcd().size(), 3u);
  // Nothing moved while etcd was away: every node came back before the others' grace.
  for (const Placed& p : placed) EXPECT_EQ(HomeInEtcd(p.id), p.home) << p.id;

  // kill -9 of node c: its tenants are served elsewhere, with their old keys, through every
  // remaining node, within the lease TTL plus 5 s.
  ASSERT_TRUE(nodes[2]->Stop(SIGKILL).ok());
  const absl::Time killed = absl::Now();
  for (const Placed& p : placed) {
    if (p.home != "c") continue;
    SCOPED_TRACE(p.id);
    const std::string home =
        WaitForMove(p.id, "c", absl::Seconds(kLeaseTtlSeconds + 5) - (absl::Now() - killed));
    ASSERT_TRUE(home == "a" || home == "b") << "not moved in time: " << HomeInEtcd(p.id);
  }
  for (const Placed& p : placed) {
    SCOPED_TRACE(p.id);
    for (size_t n = 0; n < 2; ++n) {
      std::string redirect;
      grpc::Status forwarded = raw_usage(*nodes[n], p.key, false, &redirect);
      EXPECT_TRUE(forwarded.ok()) << nodes[n]->address() << ": " << forwarded.error_message();
    }
  }
}

// A single server's tenants join the fleet with it: the first time the server starts as a
// node, its stored tenants are published in etcd, homed there, and reachable through others.
TEST_F(FleetTest, ASingleServersTenantsJoinTheFleetWithIt) {
  const std::string state = dir_.File("single");
  std::string key;
  {
    auto single = StartNode("", {}, state);
    ASSERT_TRUE(single.ok()) << single.status();
    auto registered = Admin(**single)->RegisterTenant(Registration("old-timer"));
    ASSERT_TRUE(registered.ok()) << registered.status();
    key = registered->api_key();
    ASSERT_TRUE((*single)->Stop(SIGTERM).ok());
  }
  auto a = StartNode("a", {}, state);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(HomeInEtcd("old-timer"), "a");
  auto b = StartNode("b");
  ASSERT_TRUE(b.ok()) << b.status();
  auto tenant = Tenant(**b, key);
  ASSERT_NE(tenant, nullptr);
  EXPECT_EQ(tenant->address(), (*a)->address());
  EXPECT_TRUE(tenant->GetUsage().ok());
}

}  // namespace
}  // namespace tessera
