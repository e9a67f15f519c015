// Isolation of server work between tenants (issue 20): each tenant's calls in flight and call
// rate are bounded by its quota (max_requests_in_flight, requests_per_second), refused with
// RESOURCE_EXHAUSTED naming the field and carrying a `grpc-retry-pushback-ms` hint, and one
// tenant at its bounds never slows or refuses another.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

#include "tessera/v1/compute.grpc.pb.h"
#include "tests/testing/server_fixture.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

class IsolationTest : public testing::ServerTest {
 protected:
  std::string Register(const std::string& id, uint32_t in_flight, uint32_t per_second) {
    v1::RegisterTenantRequest request = Registration(id);
    request.mutable_quota()->set_max_requests_in_flight(in_flight);
    request.mutable_quota()->set_requests_per_second(per_second);
    auto registered = admin_->RegisterTenant(request);
    EXPECT_TRUE(registered.ok()) << registered.status();
    return registered.ok() ? registered->api_key() : "";
  }

  std::unique_ptr<v1::Compute::Stub> Stub() {
    return v1::Compute::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  static void Prepare(grpc::ClientContext* context, const std::string& key) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", key));
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  }

  // `count` uploads as `key`, started and left open: each holds one of the tenant's call
  // slots until it ends.
  struct OpenUploads {
    OpenUploads(v1::Compute::Stub* stub, const std::string& key, int count)
        : infos(static_cast<size_t>(count)) {
      for (int i = 0; i < count; ++i) {
        contexts.push_back(std::make_unique<grpc::ClientContext>());
        Prepare(contexts.back().get(), key);
        writers.push_back(stub->WriteTensor(contexts.back().get(), &infos[static_cast<size_t>(i)]));
      }
    }
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    std::vector<v1::TensorInfo> infos;
    std::vector<std::unique_ptr<grpc::ClientWriter<v1::WriteTensorRequest>>> writers;
  };

  // GetUsage as `key`; `pushback_ms` gets the grpc-retry-pushback-ms trailer (-1 if none).
  static grpc::Status Usage(v1::Compute::Stub* stub, const std::string& key,
                            int64_t* pushback_ms = nullptr) {
    grpc::ClientContext context;
    Prepare(&context, key);
    v1::GetUsageRequest request;
    v1::Usage usage;
    grpc::Status status = stub->GetUsage(&context, request, &usage);
    if (pushback_ms != nullptr) {
      *pushback_ms = -1;
      auto it = context.GetServerTrailingMetadata().find("grpc-retry-pushback-ms");
      if (it != context.GetServerTrailingMetadata().end()) {
        (void)absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()),
                               pushback_ms);
      }
    }
    return status;
  }
};

TEST_F(IsolationTest, RequestQuotasHaveDefaultsDerivedFromTheShare) {
  MustRegister("plain");
  v1::RegisterTenantRequest small = Registration("small");
  small.mutable_quota()->set_compute_share_percent(5);
  ASSERT_TRUE(admin_->RegisterTenant(small).ok());
  auto plain = admin_->GetTenant("plain");
  auto fifth = admin_->GetTenant("small");
  ASSERT_TRUE(plain.ok() && fifth.ok());
  EXPECT_EQ(plain->quota().max_requests_in_flight(), 64u);
  EXPECT_EQ(plain->quota().requests_per_second(), 1000000u);
  EXPECT_EQ(fifth->quota().max_requests_in_flight(), 64u);
  EXPECT_EQ(fifth->quota().requests_per_second(), 50000u);
}

TEST_F(IsolationTest, OutOfRangeRequestQuotasNameTheFieldAndTheRange) {
  v1::RegisterTenantRequest request = Registration("alpha");
  request.mutable_quota()->set_max_requests_in_flight(5000);
  absl::Status s = admin_->RegisterTenant(request).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("quota.max_requests_in_flight is 5000; the range is 1..4096"));
  request.mutable_quota()->set_max_requests_in_flight(0);
  request.mutable_quota()->set_requests_per_second(2000000);
  s = admin_->RegisterTenant(request).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("quota.requests_per_second is 2000000; the range is 1..1000000"));
  EXPECT_EQ(admin_->ListAllTenants()->size(), 0u);
}

TEST_F(IsolationTest, CallsBeyondTheInFlightQuotaAreRefusedWithAPushbackHint) {
  const std::string busy = Register("busy", /*in_flight=*/2, /*per_second=*/100000);
  const std::string quiet = MustRegister("quiet");
  std::unique_ptr<v1::Compute::Stub> stub = Stub();
  // Two uploads left open hold both of the tenant's slots until they end.
  OpenUploads open(stub.get(), busy, 2);
  auto& writers = open.writers;
  // The server takes the slots when it starts handling the uploads: poll (bounded) until a
  // third call is refused.
  grpc::Status refused;
  int64_t pushback_ms = -1;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (absl::Now() < give_up) {
    refused = Usage(stub.get(), busy, &pushback_ms);
    if (!refused.ok()) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("quota.max_requests_in_flight"));
  EXPECT_THAT(refused.error_message(), HasSubstr("2 requests in flight"));
  EXPECT_GT(pushback_ms, 0);
  // Another tenant is not affected.
  EXPECT_TRUE(Usage(stub.get(), quiet).ok());
  // Ending one upload frees a slot (the upload itself is refused: it sent no tensor).
  writers[0]->WritesDone();
  EXPECT_FALSE(writers[0]->Finish().ok());
  EXPECT_TRUE(Usage(stub.get(), busy).ok());
  writers[1]->WritesDone();
  (void)writers[1]->Finish();
  // Sequential calls never find their previous call still counted.
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(Usage(stub.get(), busy).ok()) << i;
}

TEST_F(IsolationTest, CallsBeyondTheRateQuotaAreRefusedUntilThePushbackHasPassed) {
  // One call in flight at most, so the bucket holds max(1, 5 / 10) = 1 call.
  const std::string slow = Register("slow", /*in_flight=*/1, /*per_second=*/5);
  const std::string quiet = MustRegister("quiet");
  std::unique_ptr<v1::Compute::Stub> stub = Stub();
  ASSERT_TRUE(Usage(stub.get(), slow).ok());
  int64_t pushback_ms = -1;
  grpc::Status refused = Usage(stub.get(), slow, &pushback_ms);
  ASSERT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("quota.requests_per_second (5 per second"));
  EXPECT_GT(pushback_ms, 0);
  EXPECT_LE(pushback_ms, 200);  // one call at 5 per second
  EXPECT_TRUE(Usage(stub.get(), quiet).ok());
  absl::SleepFor(absl::Milliseconds(pushback_ms + 20));
  EXPECT_TRUE(Usage(stub.get(), slow).ok());
}

TEST_F(IsolationTest, ASaturatingTenantDoesNotRefuseAQuietOne) {
  const std::string noisy = Register("noisy", /*in_flight=*/2, /*per_second=*/1000000);
  const std::string quiet = MustRegister("quiet");
  std::unique_ptr<v1::Compute::Stub> stub = Stub();
  // The noisy tenant's slots are all taken (two uploads held open) ...
  OpenUploads open(stub.get(), noisy, 2);
  auto& writers = open.writers;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (absl::Now() < give_up && Usage(stub.get(), noisy).ok()) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  // ... and it keeps calling from 4 threads (bounded in count and time) while the quiet
  // tenant makes 200 calls: every quiet call passes, every extra noisy one is refused.
  std::atomic<bool> stop{false};
  std::atomic<int> noisy_calls{0};
  std::atomic<int> noisy_refused{0};
  std::vector<std::thread> load;
  for (int t = 0; t < 4; ++t) {
    load.emplace_back([&] {
      std::unique_ptr<v1::Compute::Stub> own = Stub();
      for (int i = 0; i < 2000 && !stop.load(); ++i) {
        ++noisy_calls;
        if (Usage(own.get(), noisy).error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
          ++noisy_refused;
        }
      }
    });
  }
  int quiet_failed = 0;
  for (int i = 0; i < 200; ++i) quiet_failed += Usage(stub.get(), quiet).ok() ? 0 : 1;
  stop = true;
  for (std::thread& t : load) t.join();
  EXPECT_EQ(quiet_failed, 0);
  EXPECT_GT(noisy_calls.load(), 0);
  EXPECT_EQ(noisy_refused.load(), noisy_calls.load());
  for (auto& writer : writers) {
    writer->WritesDone();
    (void)writer->Finish();
  }
  EXPECT_TRUE(Usage(stub.get(), noisy).ok());
}

}  // namespace
}  // namespace tessera
