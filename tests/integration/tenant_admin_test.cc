// TenantAdmin and Compute authentication through a real server process.
#include <thread>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/testing/server_fixture.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::kGiB;
using ::testing::SizeIs;

class TenantAdminTest : public testing::ServerTest {
 protected:
  /// Calls Compute.GetUsage with `token`: OK means the key was accepted.
  absl::Status ComputeCall(const std::string& token) {
    auto client = ClientWith(token);
    auto stub = v1::Compute::NewStub(client->channel());
    auto context = client->NewContext();
    v1::Usage usage;
    return FromGrpcStatus(stub->GetUsage(context.get(), v1::GetUsageRequest(), &usage));
  }
};

TEST_F(TenantAdminTest, RegisterGetAndList) {
  v1::RegisterTenantRequest request = Registration("alpha", 2 * kGiB);
  request.set_display_name("Alpha team");
  (*request.mutable_labels())["team"] = "ml";
  request.mutable_quota()->set_compute_share_percent(40);
  request.mutable_quota()->set_priority(v1::PRIORITY_LOW);
  auto registered = admin_->RegisterTenant(request);
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_THAT(registered->api_key(), ::testing::StartsWith("tsk_alpha."));
  const v1::Tenant& t = registered->tenant();
  EXPECT_EQ(t.tenant_id(), "alpha");
  EXPECT_EQ(t.quota().device_memory_bytes(), 2 * kGiB);
  EXPECT_EQ(t.quota().compute_share_percent(), 40u);
  EXPECT_EQ(t.quota().max_streams(), 4u);         // default
  EXPECT_EQ(t.quota().max_queued_jobs(), 1024u);  // default
  EXPECT_EQ(t.quota().priority(), v1::PRIORITY_LOW);
  EXPECT_EQ(t.context().kind(), ExpectedContextKind(40));
  EXPECT_THAT(t.context().reason(), HasSubstr(OnCpu() ? "--backend=cpu" : "compute share 40%"));
  EXPECT_GT(t.create_time().seconds(), 1700000000);

  auto got = admin_->GetTenant("alpha");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->SerializeAsString(), t.SerializeAsString());
  EXPECT_EQ(admin_->GetTenant("nobody").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(admin_->GetTenant("Not-A-Label").status().code(), absl::StatusCode::kInvalidArgument);

  MustRegister("beta");
  auto listed = admin_->ListTenants();
  ASSERT_TRUE(listed.ok());
  ASSERT_THAT(listed->tenants(), SizeIs(2));
  EXPECT_EQ(listed->tenants(0).tenant_id(), "alpha");
  EXPECT_EQ(listed->tenants(1).tenant_id(), "beta");
  EXPECT_EQ(listed->total_size(), 2);
  EXPECT_EQ(listed->next_page_token(), "");
}

TEST_F(TenantAdminTest, ListPagesWithTokens) {
  for (const char* id : {"t1", "t2", "t3", "t4", "t5"}) MustRegister(id, kGiB / 4);
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    auto page = admin_->ListTenants(2, token);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const auto& t : page->tenants()) seen.push_back(t.tenant_id());
    token = page->next_page_token();
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_THAT(seen, ElementsAre("t1", "t2", "t3", "t4", "t5"));
  EXPECT_EQ(admin_->ListTenants(2, "garbage!").status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status too_big = admin_->ListTenants(1001).status();
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.message(), HasSubstr("page_size"));
}

TEST_F(TenantAdminTest, UpdateChangesLabelsAndDisplayName) {
  MustRegister("alpha");
  v1::Tenant change;
  change.set_tenant_id("alpha");
  change.set_display_name("Renamed");
  (*change.mutable_labels())["env"] = "prod";
  auto updated = admin_->UpdateTenant(change, {"labels"});
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ(updated->labels().at("env"), "prod");
  EXPECT_EQ(updated->display_name(), "");  // not in the mask
  updated = admin_->UpdateTenant(change, {"display_name"});
  ASSERT_TRUE(updated.ok());
  EXPECT_EQ(updated->display_name(), "Renamed");
  auto got = admin_->GetTenant("alpha");
  EXPECT_EQ(got->display_name(), "Renamed");
  EXPECT_EQ(got->labels().at("env"), "prod");
  EXPECT_GE(got->update_time().seconds(), got->create_time().seconds());
}

TEST_F(TenantAdminTest, UpdatingAQuotaIsFailedPrecondition) {
  MustRegister("alpha");
  auto current = *admin_->GetTenant("alpha");
  v1::Tenant change = current;
  change.mutable_quota()->set_device_memory_bytes(4 * kGiB);
  // Named in the mask.
  absl::Status named = admin_->UpdateTenant(change, {"quota.device_memory_bytes"}).status();
  EXPECT_EQ(named.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(named.message(), HasSubstr("deregister the tenant and register it again"));
  EXPECT_EQ(admin_->UpdateTenant(change, {"quota"}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Implied by an empty mask.
  EXPECT_EQ(admin_->UpdateTenant(change, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // The quota is untouched.
  EXPECT_EQ(admin_->GetTenant("alpha")->quota().device_memory_bytes(), kGiB);
  // The request quotas (issue 20) are quota fields like the others: refused when named (as
  // every quota.* path is) and when a get-modify-put with an empty mask changes them.
  for (const char* field : {"quota.max_requests_in_flight", "quota.requests_per_second"}) {
    v1::Tenant calls = current;
    if (absl::EndsWith(field, "in_flight")) {
      calls.mutable_quota()->set_max_requests_in_flight(current.quota().max_requests_in_flight() +
                                                        1);
    } else {
      calls.mutable_quota()->set_requests_per_second(current.quota().requests_per_second() / 2);
    }
    absl::Status refused = admin_->UpdateTenant(calls, {field}).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << field << ": " << refused;
    EXPECT_EQ(admin_->UpdateTenant(calls, {}).status().code(),
              absl::StatusCode::kFailedPrecondition)
        << field;
  }
  EXPECT_EQ(admin_->GetTenant("alpha")->quota().max_requests_in_flight(),
            current.quota().max_requests_in_flight());
  EXPECT_EQ(admin_->GetTenant("alpha")->quota().requests_per_second(),
            current.quota().requests_per_second());
  // Get-modify-put of other fields with the quota unchanged is fine.
  current.set_display_name("ok");
  EXPECT_TRUE(admin_->UpdateTenant(current, {}).ok());
}

TEST_F(TenantAdminTest, UpdateMaskIsValidated) {
  MustRegister("alpha");
  v1::Tenant change;
  change.set_tenant_id("alpha");
  for (const char* path : {"create_time", "context", "tenant_id", "device_index"}) {
    absl::Status s = admin_->UpdateTenant(change, {path}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(s.message(), HasSubstr(path));
  }
  EXPECT_EQ(admin_->UpdateTenant(change, {"colour"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(admin_->UpdateTenant(change, {}).status().code(),
            absl::StatusCode::kInvalidArgument);  // nothing to update
  change.set_tenant_id("nobody");
  EXPECT_EQ(admin_->UpdateTenant(change, {"labels"}).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TenantAdminTest, DuplicateIdIsAlreadyExists) {
  MustRegister("alpha");
  absl::Status dup = admin_->RegisterTenant(Registration("alpha")).status();
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(dup.message(), HasSubstr("alpha"));
}

TEST_F(TenantAdminTest, OverCapacityIsResourceExhaustedWithTheNumbers) {
  MustRegister("big", 6 * kGiB);
  absl::Status refused = admin_->RegisterTenant(Registration("more", 3 * kGiB)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("3221225472 bytes"));  // requested
  EXPECT_THAT(refused.message(), HasSubstr("6442450944 bytes) reserved"));
  EXPECT_THAT(refused.message(), HasSubstr("8589934592 bytes) reservable"));
  // Exactly what is left still fits.
  EXPECT_TRUE(admin_->RegisterTenant(Registration("rest", 2 * kGiB)).ok());
  auto info = admin_->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->devices(0).reserved_bytes(), 8 * kGiB);
  // A single server is no fleet: no node name, no home, and no nodes to list.
  EXPECT_EQ(info->node_name(), "");
  EXPECT_EQ((*admin_->GetTenant("rest")).home_node(), "");
  absl::Status nodes = admin_->ListNodes().status();
  EXPECT_EQ(nodes.code(), absl::StatusCode::kFailedPrecondition) << nodes;
  EXPECT_THAT(nodes.message(), HasSubstr("--fleet_etcd"));
}

TEST_F(TenantAdminTest, InvalidQuotasNameFieldAndLimit) {
  struct Case {
    void (*set)(v1::Quota*);
    const char* expect;
  };
  const Case cases[] = {
      {[](v1::Quota* q) { q->set_device_memory_bytes(0); }, "quota.device_memory_bytes"},
      {[](v1::Quota* q) { q->set_device_memory_bytes(1000); }, "1048576"},
      {[](v1::Quota* q) { q->set_compute_share_percent(101); }, "1..100"},
      {[](v1::Quota* q) { q->set_max_streams(65); }, "quota.max_streams"},
      {[](v1::Quota* q) { q->set_max_queued_jobs(70000); }, "1..65536"},
      {[](v1::Quota* q) { q->set_priority(static_cast<v1::Priority>(9)); }, "quota.priority"},
  };
  for (const Case& c : cases) {
    v1::RegisterTenantRequest request = Registration("alpha");
    c.set(request.mutable_quota());
    absl::Status s = admin_->RegisterTenant(request).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.expect;
    EXPECT_THAT(s.message(), HasSubstr(c.expect));
  }
  v1::RegisterTenantRequest bad_device = Registration("alpha");
  bad_device.set_device_index(3);
  EXPECT_THAT(admin_->RegisterTenant(bad_device).status().message(),
              HasSubstr("device_index is 3"));
  EXPECT_EQ(admin_->ListTenants()->tenants_size(), 0);  // nothing half-registered
}

TEST_F(TenantAdminTest, MissingOrWrongAdminTokenIsUnauthenticated) {
  absl::Status missing = ClientWith("")->GetServerInfo().status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(missing.message(), HasSubstr("authorization: Bearer"));
  EXPECT_EQ(ClientWith("not-the-admin-token")->GetServerInfo().status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(ClientWith("")->RegisterTenant(Registration("x")).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(admin_->ListTenants()->tenants_size(), 0);
}

TEST_F(TenantAdminTest, TenantKeyOnAdminIsPermissionDenied) {
  std::string key = MustRegister("alpha");
  auto tenant_client = ClientWith(key);
  absl::Status s = tenant_client->ListTenants().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("tenant API key"));
  EXPECT_EQ(tenant_client->RegisterTenant(Registration("evil")).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(TenantAdminTest, ComputeAuthenticatesTenantKeys) {
  std::string key = MustRegister("alpha");
  absl::Status accepted = ComputeCall(key);
  EXPECT_EQ(accepted.code(), absl::StatusCode::kOk);
  EXPECT_EQ(ComputeCall("").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(ComputeCall(key + "x").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(ComputeCall(server_->AdminToken()).code(), absl::StatusCode::kPermissionDenied);

  // Streaming RPCs authenticate too.
  auto client = ClientWith("tsk_alpha.wrong");
  auto stub = v1::Compute::NewStub(client->channel());
  auto context = client->NewContext();
  auto reader = stub->ReadTensor(context.get(), v1::ReadTensorRequest());
  v1::ReadTensorResponse chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(TenantAdminTest, KeyRotationTakesEffectWithoutRestart) {
  std::string old_key = MustRegister("alpha");
  auto rotated = admin_->RotateTenantKey("alpha");
  ASSERT_TRUE(rotated.ok()) << rotated.status();
  EXPECT_NE(rotated->api_key(), old_key);
  EXPECT_EQ(ComputeCall(old_key).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(ComputeCall(rotated->api_key()).code(), absl::StatusCode::kOk);
  EXPECT_EQ(admin_->RotateTenantKey("nobody").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TenantAdminTest, DeregisterRevokesAndReleases) {
  std::string key = MustRegister("alpha", 5 * kGiB);
  auto gone = admin_->DeregisterTenant("alpha");
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_EQ(gone->released_memory_bytes(), 5 * kGiB);
  EXPECT_EQ(gone->tenant().tenant_id(), "alpha");
  EXPECT_EQ(ComputeCall(key).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(admin_->GetTenant("alpha").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(admin_->DeregisterTenant("alpha").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(admin_->GetServerInfo()->devices(0).reserved_bytes(), 0u);
  // The id can be registered again, with a different quota.
  EXPECT_TRUE(admin_->RegisterTenant(Registration("alpha", 7 * kGiB)).ok());
}

TEST_F(TenantAdminTest, ServerInfoDescribesTheHost) {
  MustRegister("alpha", 3 * kGiB);
  auto info = admin_->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->version(), "0.1.0");
  EXPECT_EQ(info->backend(), backend().name);
  EXPECT_THAT(info->backend_reason(), ::testing::StartsWith("--backend=" + backend().name));
  // The suite runs without an MPS daemon: per-tenant contexts on CUDA.
  EXPECT_EQ(info->mps_decision(),
            OnCpu() ? v1::MPS_DECISION_NOT_APPLICABLE : v1::MPS_DECISION_FALLBACK);
  EXPECT_EQ(info->transport_security(), "insecure");
  EXPECT_EQ(info->tenant_count(), 1u);
  ASSERT_THAT(info->devices(), SizeIs(1));
  EXPECT_EQ(info->devices(0).memory_bytes(), 8 * kGiB);
  EXPECT_EQ(info->devices(0).reservable_bytes(), 8 * kGiB);
  EXPECT_EQ(info->devices(0).reserved_bytes(), 3 * kGiB);
  EXPECT_EQ(info->devices(0).tenants(), 1u);
  EXPECT_EQ(info->memory_overcommit(), 1.0);
}

TEST_F(TenantAdminTest, RequestIdsAreEchoed) {
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + server_->AdminToken());
  context.AddMetadata("x-request-id", "trace-42");
  auto stub = v1::TenantAdmin::NewStub(admin_->channel());
  v1::ServerInfo info;
  ASSERT_TRUE(stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  auto it = context.GetServerInitialMetadata().find("x-request-id");
  ASSERT_NE(it, context.GetServerInitialMetadata().end());
  EXPECT_EQ(std::string(it->second.data(), it->second.size()), "trace-42");
}

TEST_F(TenantAdminTest, ConcurrentRegistrationsNeverOverAdmit) {
  // 16 registrations of 1 GiB race for 8 GiB: exactly 8 win, the rest are refused.
  std::vector<std::thread> threads;
  std::atomic<int> admitted{0}, refused{0}, other{0};
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      auto client = ClientWith(server_->AdminToken());
      absl::Status s = client->RegisterTenant(Registration("t" + std::to_string(i))).status();
      if (s.ok()) {
        ++admitted;
      } else if (s.code() == absl::StatusCode::kResourceExhausted) {
        ++refused;
      } else {
        ++other;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(admitted.load(), 8);
  EXPECT_EQ(refused.load(), 8);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(admin_->GetServerInfo()->devices(0).reserved_bytes(), 8 * kGiB);
}

}  // namespace
}  // namespace tessera
