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

  // `count` downloads as `key` of one tensor far larger than a stream's flow-control window,
  // each read to its first message and left there: each holds one of the tenant's call slots
  // until it is read to the end or cancelled. The first message proves that the server took
  // the call before the next one starts. (An upload's start cannot be confirmed without
  // another call of the same tenant, which may reach the server first and take the slot:
  // that made this test flaky when it held its slots with uploads.)
  class OpenReads {
   public:
    OpenReads(const std::string& address, const std::string& key, int count) {
      // No BDP probing: the client's stream windows stay at their initial size, so the
      // server cannot send the whole tensor ahead of the reads.
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
      args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, -1);
      stub_ = v1::Compute::NewStub(
          grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
      grpc::ClientContext create_context;
      Prepare(&create_context, key);
      v1::CreateTensorRequest create;
      create.mutable_spec()->set_dtype(v1::DTYPE_F32);
      create.mutable_spec()->add_shape(kElements);
      v1::TensorInfo info;
      grpc::Status created = stub_->CreateTensor(&create_context, create, &info);
      EXPECT_TRUE(created.ok()) << created.error_message();
      for (int i = 0; i < count; ++i) {
        contexts_.push_back(std::make_unique<grpc::ClientContext>());
        Prepare(contexts_.back().get(), key);
        v1::ReadTensorRequest request;
        request.set_handle(info.handle());
        readers_.push_back(stub_->ReadTensor(contexts_.back().get(), request));
        v1::ReadTensorResponse first;
        EXPECT_TRUE(readers_.back()->Read(&first)) << "download " << i << " did not start";
      }
    }
    ~OpenReads() {
      for (size_t i = 0; i < readers_.size(); ++i) {
        if (readers_[i] == nullptr) continue;
        contexts_[i]->TryCancel();
        (void)readers_[i]->Finish();
      }
    }
    // Reads download `i` to its end; the server answers (and frees its slot) before Finish
    // returns.
    grpc::Status Drain(size_t i) {
      v1::ReadTensorResponse response;
      while (readers_[i]->Read(&response)) {
      }
      grpc::Status status = readers_[i]->Finish();
      readers_[i].reset();
      return status;
    }

   private:
    static constexpr int64_t kElements = int64_t{16} << 20;  // 64 MiB of f32
    std::unique_ptr<v1::Compute::Stub> stub_;
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
    std::vector<std::unique_ptr<grpc::ClientReader<v1::ReadTensorResponse>>> readers_;
  };

  // The grpc-retry-pushback-ms trailer of a finished call (-1 if none).
  static int64_t PushbackMs(const grpc::ClientContext& context) {
    int64_t ms = -1;
    auto it = context.GetServerTrailingMetadata().find("grpc-retry-pushback-ms");
    if (it != context.GetServerTrailingMetadata().end()) {
      (void)absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &ms);
    }
    return ms;
  }

  // GetUsage as `key`; `pushback_ms` gets the grpc-retry-pushback-ms trailer (-1 if none).
  static grpc::Status Usage(v1::Compute::Stub* stub, const std::string& key,
                            int64_t* pushback_ms = nullptr) {
    grpc::ClientContext context;
    Prepare(&context, key);
    v1::GetUsageRequest request;
    v1::Usage usage;
    grpc::Status status = stub->GetUsage(&context, request, &usage);
    if (pushback_ms != nullptr) *pushback_ms = PushbackMs(context);
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
  // Two downloads left open hold both of the tenant's slots until they end.
  OpenReads open(server_->address(), busy, 2);
  int64_t pushback_ms = -1;
  const grpc::Status refused = Usage(stub.get(), busy, &pushback_ms);
  ASSERT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("quota.max_requests_in_flight"));
  EXPECT_THAT(refused.error_message(), HasSubstr("2 requests in flight"));
  EXPECT_GT(pushback_ms, 0);
  // Another tenant is not affected.
  EXPECT_TRUE(Usage(stub.get(), quiet).ok());
  // Ending one download frees a slot; GetUsage then shows the calls in flight (the other
  // download and itself) and the refusal.
  EXPECT_TRUE(open.Drain(0).ok());
  {
    grpc::ClientContext context;
    Prepare(&context, busy);
    v1::Usage usage;
    ASSERT_TRUE(stub->GetUsage(&context, v1::GetUsageRequest(), &usage).ok());
    EXPECT_EQ(usage.requests_in_flight(), 2u);
    EXPECT_EQ(usage.requests_refused_in_flight(), 1u);
    EXPECT_EQ(usage.requests_refused_rate(), 0u);
  }
  EXPECT_TRUE(open.Drain(1).ok());
  // Sequential calls never find their previous call still counted.
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(Usage(stub.get(), busy).ok()) << i;
}

TEST_F(IsolationTest, EveryKindOfCallPastTheInFlightQuotaIsRefusedWithAPushbackHint) {
  const std::string busy = Register("busy", /*in_flight=*/1, /*per_second=*/100000);
  std::unique_ptr<v1::Compute::Stub> stub = Stub();
  OpenReads open(server_->address(), busy, 1);  // holds the tenant's one slot
  // Each kind of handler (unary on the gRPC thread, queued on the transfer executor, waiting
  // for a job, client and server streams) answers the refusal the same way.
  auto expect_refused = [&](const char* rpc, grpc::ClientContext& context,
                            const grpc::Status& status) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << rpc << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("quota.max_requests_in_flight")) << rpc;
    EXPECT_GT(PushbackMs(context), 0) << rpc;
  };
  {
    grpc::ClientContext context;
    Prepare(&context, busy);
    v1::LaunchRequest request;
    request.set_kernel("fill");
    request.set_wait(true);
    v1::Job job;
    expect_refused("Launch", context, stub->Launch(&context, request, &job));
  }
  {
    grpc::ClientContext context;
    Prepare(&context, busy);
    v1::CreateTensorRequest request;
    request.mutable_spec()->set_dtype(v1::DTYPE_F32);
    request.mutable_spec()->add_shape(4);
    request.set_data(std::string(16, '\0'));
    v1::TensorInfo info;
    expect_refused("CreateTensor", context, stub->CreateTensor(&context, request, &info));
  }
  {
    grpc::ClientContext context;
    Prepare(&context, busy);
    v1::WaitJobRequest request;
    request.set_job_id("job-1");
    v1::Job job;
    expect_refused("WaitJob", context, stub->WaitJob(&context, request, &job));
  }
  {
    grpc::ClientContext context;
    Prepare(&context, busy);
    v1::TensorInfo response;
    auto writer = stub->WriteTensor(&context, &response);
    v1::WriteTensorRequest header;
    header.mutable_header()->mutable_create()->set_dtype(v1::DTYPE_F32);
    header.mutable_header()->mutable_create()->add_shape(4);
    v1::WriteTensorRequest chunk;
    chunk.mutable_chunk()->set_data(std::string(16, '\0'));
    (void)writer->Write(header);
    (void)writer->Write(chunk);
    (void)writer->WritesDone();
    expect_refused("WriteTensor", context, writer->Finish());
  }
  {
    grpc::ClientContext context;
    Prepare(&context, busy);
    v1::ReadTensorRequest request;
    request.set_handle("t-1");
    auto reader = stub->ReadTensor(&context, request);
    v1::ReadTensorResponse response;
    while (reader->Read(&response)) {
    }
    expect_refused("ReadTensor", context, reader->Finish());
  }
  EXPECT_TRUE(open.Drain(0).ok());
  EXPECT_TRUE(Usage(stub.get(), busy).ok());
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
  grpc::ClientContext context;
  Prepare(&context, slow);
  v1::Usage usage;
  ASSERT_TRUE(stub->GetUsage(&context, v1::GetUsageRequest(), &usage).ok());
  EXPECT_EQ(usage.requests_in_flight(), 1u);  // this call
  EXPECT_EQ(usage.requests_refused_rate(), 1u);
  EXPECT_EQ(usage.requests_refused_in_flight(), 0u);
}

TEST_F(IsolationTest, ASaturatingTenantDoesNotRefuseAQuietOne) {
  const std::string noisy = Register("noisy", /*in_flight=*/2, /*per_second=*/1000000);
  const std::string quiet = MustRegister("quiet");
  std::unique_ptr<v1::Compute::Stub> stub = Stub();
  // The noisy tenant's slots are all taken (two downloads held open) ...
  OpenReads open(server_->address(), noisy, 2);
  ASSERT_EQ(Usage(stub.get(), noisy).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
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
  EXPECT_TRUE(open.Drain(0).ok());
  EXPECT_TRUE(open.Drain(1).ok());
  EXPECT_TRUE(Usage(stub.get(), noisy).ok());
}

}  // namespace
}  // namespace tessera
