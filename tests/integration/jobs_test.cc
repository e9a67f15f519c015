// The job model every backend shares (server/core/job_scheduler.h): queue bounds, cancel,
// deadlines, transfers that commit only when complete, memory that outlives a deregistration
// only while it is really held, and a server that stays responsive and stops cleanly under
// concurrent load. Runs on each backend under test (tests/testing/server_fixture.h).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/testing/server_fixture.h"
#include "tests/testing/slow_work.h"

namespace tessera::testing {
namespace {

using ::testing::HasSubstr;

// How long a blocker keeps its stream busy: long enough for a test's calls behind it, short
// enough to wait for. Its size is measured on the backend under test in SetUp (SlowWork).
constexpr absl::Duration kBlockerTime = absl::Seconds(2);

class JobsTest : public ServerTest {
 protected:
  void SetUp() override {
    // Lock-order checking on: a potential deadlock aborts the server and fails the test.
    StartServer({"--drain_timeout=2s", "--deadlock_detection=abort"});
    v1::RegisterTenantRequest r = Registration("jobs", 2 * kGiB);
    r.mutable_quota()->set_max_streams(2);
    r.mutable_quota()->set_max_queued_jobs(4);
    auto registered = admin_->RegisterTenant(r);
    ASSERT_TRUE(registered.ok()) << registered.status();
    key_ = registered->api_key();
    tenant_ = ClientWith(key_);
    ones_ = MustCreate(4, std::vector<float>{1, 1, 1, 1});
    target_ = MustCreate(4);
    auto blocker = SlowWork::Calibrate(*tenant_, kBlockerTime, kGiB);
    ASSERT_TRUE(blocker.ok()) << blocker.status();
    blocker_ = *std::move(blocker);
  }

  std::string MustCreate(int elements, std::vector<float> values = {}) {
    v1::TensorSpec spec;
    spec.set_dtype(v1::DTYPE_F32);
    spec.add_shape(elements);
    std::string data(reinterpret_cast<const char*>(values.data()), values.size() * 4);
    auto t =
        data.size() > (1 << 20) ? tenant_->Upload(spec, data) : tenant_->CreateTensor(spec, data);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? t->handle() : "";
  }

  // A job that keeps stream `stream` busy for about kBlockerTime.
  absl::StatusOr<v1::Job> Blocker(int stream = 0, bool wait = false) {
    return tenant_->Submit(blocker_.Program(static_cast<uint32_t>(stream), wait));
  }

  // Fills `stream` so that the next job on it waits in the core's queue: as many blockers
  // as the backend keeps in flight per stream (one on the CPU, two on a GPU).
  void BlockStream(int stream = 0) {
    for (int i = 0; i < (OnCpu() ? 1 : 2); ++i) ASSERT_TRUE(Blocker(stream).ok());
    // Released to the backend (running), not still in the core's queue where a test's
    // cancellation would count it among the jobs it cancels.
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (absl::Now() < give_up) {
      auto usage = tenant_->GetUsage();
      ASSERT_TRUE(usage.ok()) << usage.status();
      if (usage->jobs_running() > 0) break;
      absl::SleepFor(absl::Milliseconds(2));
    }
  }

  // target = ones: the job whose effect shows whether it ran.
  v1::LaunchRequest CopyOnesToTarget(int stream = 0) {
    v1::LaunchRequest request;
    request.set_kernel("copy");
    request.add_inputs(ones_);
    request.add_outputs()->set_handle(target_);
    request.set_stream(stream);
    return request;
  }

  std::vector<float> Target() {
    auto bytes = tenant_->Download(target_);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    std::vector<float> v(4, -1);
    if (bytes.ok() && bytes->size() == 16) std::memcpy(v.data(), bytes->data(), 16);
    return v;
  }

  // A server of its own (another state directory) with `args`.
  void StartServerFresh(std::vector<std::string> args) {
    server_.reset();
    args.push_back("--deadlock_detection=abort");
    StartServer(args);
  }

  std::string key_;
  SlowWork blocker_;
  std::unique_ptr<Client> tenant_;
  std::string ones_, target_;
};

const std::vector<float> kZeros = {0, 0, 0, 0};

TEST_F(JobsTest, TheQueueBoundHoldsWhateverRunsAlready) {
  BlockStream();
  int accepted = 0, refused = 0;
  for (int i = 0; i < 64; ++i) {
    auto job = tenant_->Launch(CopyOnesToTarget());
    if (job.ok()) {
      ++accepted;
    } else {
      ASSERT_EQ(job.status().code(), absl::StatusCode::kResourceExhausted) << job.status();
      EXPECT_THAT(job.status().message(), HasSubstr("quota.max_queued_jobs is 4"));
      ++refused;
    }
  }
  // Blockers hold the stream's in-flight slots: every later job waits in the queue. On a GPU
  // the second blocker, handed to the device behind the first, is one of the 4 waiting.
  EXPECT_EQ(accepted, OnCpu() ? 4 : 3);
  EXPECT_EQ(refused, OnCpu() ? 60 : 61);
  auto usage = tenant_->GetUsage();
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->jobs_queued(), OnCpu() ? 4u : 3u);
  EXPECT_EQ(usage->jobs_running(), OnCpu() ? 1u : 2u);
}

// Behind one slow job, max_queued_jobs more are accepted on every backend: a GPU hands the
// next one to the device ahead of time, and that one counts as waiting (docs/api.md, Jobs).
// It cannot be cancelled there: CancelJob answers RUNNING and it runs; on the CPU backend it
// is still queued, and cancelled it never runs.
TEST_F(JobsTest, BehindOneSlowJobTheQueueBoundIsTheSameOnEveryBackend) {
  ASSERT_TRUE(Blocker().ok());
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  for (;;) {
    auto usage = tenant_->GetUsage();
    ASSERT_TRUE(usage.ok()) << usage.status();
    if (usage->jobs_running() > 0) break;
    ASSERT_LT(absl::Now(), give_up) << "the blocker never started";
    absl::SleepFor(absl::Milliseconds(2));
  }
  std::vector<std::string> accepted;
  absl::Status refused;
  for (int i = 0; i < 8 && refused.ok(); ++i) {
    auto job = tenant_->Launch(CopyOnesToTarget());
    if (job.ok()) {
      accepted.push_back(job->job_id());
    } else {
      refused = job.status();
    }
  }
  EXPECT_EQ(accepted.size(), 4u);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("4 jobs waiting to start"));
  EXPECT_THAT(refused.message(), HasSubstr("quota.max_queued_jobs is 4"));
  if (!OnCpu()) {
    EXPECT_THAT(refused.message(), HasSubstr("1 of them handed to the device"));
  }
  ASSERT_FALSE(accepted.empty());

  auto first = tenant_->CancelJob(accepted[0]);
  ASSERT_TRUE(first.ok()) << first.status();
  for (size_t i = 1; i < accepted.size(); ++i) {
    auto cancelled = tenant_->CancelJob(accepted[i]);
    ASSERT_TRUE(cancelled.ok()) << cancelled.status();
    EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED) << i;
  }
  auto done = tenant_->WaitJob(accepted[0]);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_TRUE(tenant_->Synchronize().ok());
  if (OnCpu()) {
    EXPECT_EQ(first->state(), v1::JOB_STATE_CANCELLED);
    EXPECT_EQ(done->state(), v1::JOB_STATE_CANCELLED);
    EXPECT_EQ(Target(), kZeros);
  } else {
    EXPECT_EQ(first->state(), v1::JOB_STATE_RUNNING);
    EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED);
    EXPECT_EQ(Target(), std::vector<float>(4, 1));
  }
}

TEST_F(JobsTest, ACancelledQueuedJobNeverRuns) {
  BlockStream();
  auto job = tenant_->Launch(CopyOnesToTarget());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_QUEUED);
  auto cancelled = tenant_->CancelJob(job->job_id());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled->error_code(), static_cast<int>(absl::StatusCode::kCancelled));
  ASSERT_TRUE(tenant_->Synchronize().ok());
  EXPECT_EQ(Target(), kZeros);
  auto usage = tenant_->GetUsage();
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->jobs_cancelled(), 1u);
}

TEST_F(JobsTest, TerminateTenantWorkCancelsEveryQueuedJob) {
  BlockStream();
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto job = tenant_->Launch(CopyOnesToTarget());
    ASSERT_TRUE(job.ok()) << job.status();
    ids.push_back(job->job_id());
  }
  auto terminated = admin_->TerminateTenantWork("jobs");
  ASSERT_TRUE(terminated.ok()) << terminated.status();
  EXPECT_EQ(terminated->cancelled_jobs(), 3u);
  for (const std::string& id : ids) {
    auto job = tenant_->WaitJob(id);
    ASSERT_TRUE(job.ok());
    EXPECT_EQ(job->state(), v1::JOB_STATE_CANCELLED);
  }
  ASSERT_TRUE(tenant_->Synchronize().ok());
  EXPECT_EQ(Target(), kZeros);
}

TEST_F(JobsTest, AQueueTimeoutEndsTheJobWithoutRunningIt) {
  BlockStream();
  v1::LaunchRequest request = CopyOnesToTarget();
  request.mutable_queue_timeout()->set_nanos(100'000'000);
  auto job = tenant_->Launch(request);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->has_deadline());
  auto done = tenant_->WaitJob(job->job_id());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(done->error_code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  ASSERT_TRUE(tenant_->Synchronize().ok());
  EXPECT_EQ(Target(), kZeros);
  auto usage = tenant_->GetUsage();
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->jobs_expired(), 1u);

  request.mutable_queue_timeout()->set_seconds(-1);
  auto refused = tenant_->Launch(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("queue_timeout"));
}

TEST_F(JobsTest, AWaitingCallsDeadlineIsTheJobsDeadline) {
  BlockStream();
  auto impatient = Client::Connect(
      {.address = server_->address(), .token = key_, .timeout = absl::Milliseconds(300)});
  ASSERT_TRUE(impatient.ok());
  v1::LaunchRequest request = CopyOnesToTarget();
  request.set_wait(true);
  auto job = (*impatient)->Launch(request);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kDeadlineExceeded)
      << (job.ok() ? job->DebugString() : job.status().ToString());
  ASSERT_TRUE(tenant_->Synchronize().ok());
  EXPECT_EQ(Target(), kZeros);
  auto usage = tenant_->GetUsage();
  ASSERT_TRUE(usage.ok());
  // The calibration's jobs and the blockers.
  EXPECT_EQ(usage->jobs_succeeded(), blocker_.calibration_jobs() + (OnCpu() ? 1u : 2u));
  EXPECT_EQ(usage->jobs_cancelled(), 1u);
}

TEST_F(JobsTest, AClientThatCancelsItsWaitingCallCancelsTheJob) {
  BlockStream();
  auto stub = v1::Compute::NewStub(tenant_->channel());
  std::unique_ptr<grpc::ClientContext> context = tenant_->NewContext();
  v1::LaunchRequest request = CopyOnesToTarget();
  request.set_wait(true);
  v1::Job response;
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(300));
    context->TryCancel();
  });
  grpc::Status status = stub->Launch(context.get(), request, &response);
  canceller.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
  ASSERT_TRUE(tenant_->Synchronize().ok());
  EXPECT_EQ(Target(), kZeros);
  auto usage = tenant_->GetUsage();
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->jobs_cancelled(), 1u);
}

TEST_F(JobsTest, ARefusedPartialWriteLeavesThePreviousBytes) {
  const std::string before = *tenant_->Download(ones_);
  auto stub = v1::Compute::NewStub(tenant_->channel());
  std::unique_ptr<grpc::ClientContext> context = tenant_->NewContext();
  v1::TensorInfo response;
  auto writer = stub->WriteTensor(context.get(), &response);
  v1::WriteTensorRequest message;
  message.mutable_header()->set_handle(ones_);
  ASSERT_TRUE(writer->Write(message));
  message.Clear();
  message.mutable_chunk()->set_offset(0);
  message.mutable_chunk()->set_data(std::string(8, '\x7f'));
  ASSERT_TRUE(writer->Write(message));
  message.mutable_chunk()->set_offset(4);  // overlaps: refused
  writer->Write(message);
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_EQ(*tenant_->Download(ones_), before);
}

TEST_F(JobsTest, ACancelledCompleteUploadLeavesNoTensorAndNoCharge) {
  auto usage_before = tenant_->GetUsage();
  ASSERT_TRUE(usage_before.ok());
  auto stub = v1::Compute::NewStub(tenant_->channel());
  for (int attempt = 0; attempt < 10; ++attempt) {
    std::unique_ptr<grpc::ClientContext> context = tenant_->NewContext();
    v1::TensorInfo response;
    auto writer = stub->WriteTensor(context.get(), &response);
    v1::WriteTensorRequest message;
    message.mutable_header()->mutable_create()->set_dtype(v1::DTYPE_U8);
    message.mutable_header()->mutable_create()->add_shape(8192);
    ASSERT_TRUE(writer->Write(message));
    message.Clear();
    message.mutable_chunk()->set_data(std::string(8192, 'x'));
    ASSERT_TRUE(writer->Write(message));
    context->TryCancel();  // every byte sent, never half-closed
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The server may still be finishing the cancelled calls: give it a moment.
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  absl::StatusOr<v1::Usage> usage;
  do {
    usage = tenant_->GetUsage();
    ASSERT_TRUE(usage.ok());
    if (usage->memory_used_bytes() == usage_before->memory_used_bytes()) break;
    absl::SleepFor(absl::Milliseconds(20));
  } while (absl::Now() < deadline);
  EXPECT_EQ(usage->tensors(), usage_before->tensors());
  EXPECT_EQ(usage->memory_used_bytes(), usage_before->memory_used_bytes());
}

TEST_F(JobsTest, DeregistrationCancelsStalledTransfersAndFreesTheReservationAfterwards) {
  const uint64_t device = 8 * kGiB;
  for (int cycle = 0; cycle < 4; ++cycle) {
    const std::string id = absl::StrCat("staller", cycle);
    const std::string key = MustRegister(id, 4 * kGiB);
    auto client = ClientWith(key);
    v1::TensorSpec spec;
    spec.set_dtype(v1::DTYPE_U8);
    spec.add_shape(16 << 20);
    auto tensor = client->Upload(spec, std::string(16 << 20, 'a'));
    ASSERT_TRUE(tensor.ok()) << tensor.status();
    // A reader that takes one chunk and stops reading.
    testing::OpenDownload download = testing::StartDownload(*client, tensor->handle(), 1 << 20);
    ASSERT_TRUE(download.started);
    auto usage = client->GetUsage();
    ASSERT_TRUE(usage.ok());
    if (OnCpu()) {
      EXPECT_EQ(usage->memory_staging_bytes(), 0u);  // sent from the tensor's own bytes
    } else {
      EXPECT_GT(usage->memory_staging_bytes(), 0u);  // the stalled chunk is charged
    }
    // Either way the tensor is pinned while its download is open.
    EXPECT_EQ(client->DeleteTensor(tensor->handle()).status().code(),
              absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(admin_->DeregisterTenant(id).ok());
    // The stalled stream is cancelled by the deregistration.
    v1::ReadTensorResponse chunk;
    while (download.reader->Read(&chunk)) {
    }
    grpc::Status ended = download.reader->Finish();
    EXPECT_FALSE(ended.ok());
    // Once the memory is free, the whole device can be promised again.
    absl::Time deadline = absl::Now() + absl::Seconds(10);
    absl::StatusOr<v1::RegisterTenantResponse> whole;
    do {
      whole = admin_->RegisterTenant(Registration(absl::StrCat("whole", cycle), device - 2 * kGiB));
      if (whole.ok()) break;
      EXPECT_EQ(whole.status().code(), absl::StatusCode::kResourceExhausted) << whole.status();
      absl::SleepFor(absl::Milliseconds(20));
    } while (absl::Now() < deadline);
    ASSERT_TRUE(whole.ok()) << whole.status();
    ASSERT_TRUE(admin_->DeregisterTenant(absl::StrCat("whole", cycle)).ok());
  }
}

// Two clients, one creating tensors and one launching, used to hang the CUDA path (a lock
// cycle between the runtime and the context). The server runs with deadlock detection on
// (see SetUp), so a lock-order cycle aborts it even where the timing does not hang.
TEST_F(JobsTest, CreatingAndLaunchingAtOnceNeverHangs) {
  const std::string key = MustRegister("racer", 2 * kGiB);
  auto creator = ClientWith(key);
  auto launcher = ClientWith(key);
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_F32);
  spec.add_shape(1024);
  auto x = creator->CreateTensor(spec);
  ASSERT_TRUE(x.ok());
  std::atomic<int> created{0}, launched{0};
  const absl::Time end = absl::Now() + absl::Seconds(3);
  std::thread a([&] {
    for (int i = 0; i < 400 && absl::Now() < end; ++i) {
      auto t = creator->CreateTensor(spec, std::string(4096, '\1'));
      if (t.ok() && creator->DeleteTensor(t->handle()).ok()) ++created;
    }
  });
  std::thread b([&] {
    for (int i = 0; i < 400 && absl::Now() < end; ++i) {
      v1::LaunchRequest request;
      request.set_kernel("neg");
      request.add_inputs(x->handle());
      request.set_wait(true);
      auto job = launcher->Launch(request);
      if (job.ok() && job->state() == v1::JOB_STATE_SUCCEEDED) {
        for (const auto& out : job->outputs()) (void)launcher->DeleteTensor(out.handle());
        ++launched;
      }
    }
  });
  a.join();
  b.join();
  EXPECT_GT(created.load(), 0);
  EXPECT_GT(launched.load(), 0);
  EXPECT_TRUE(admin_->GetServerInfo().ok());
  auto stopped = server_->Stop(SIGTERM, absl::Seconds(10));
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(*stopped, 0) << server_->output();
}

// Many tenants at once: create, write, launch, cancel, delete, deregister and register
// again, bounded in time; then the server answers and stops within its drain timeout.
TEST_F(JobsTest, UnderConcurrentLoadTheServerStaysResponsiveAndStopsCleanly) {
  const absl::Time end = absl::Now() + absl::Seconds(4);
  std::atomic<int> operations{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&, w] {
      for (int round = 0; round < 50 && absl::Now() < end; ++round) {
        const std::string id = absl::StrCat("load", w, "-", round);
        v1::RegisterTenantRequest r = Registration(id, 256 << 20);
        r.mutable_quota()->set_max_queued_jobs(8);
        auto registered = admin_->RegisterTenant(r);
        if (!registered.ok()) continue;
        auto client = ClientWith(registered->api_key());
        v1::TensorSpec spec;
        spec.set_dtype(v1::DTYPE_F32);
        spec.add_shape(64 << 10);
        auto x = client->Upload(spec, std::string(256 << 10, '\2'), 64 << 10);
        if (!x.ok()) continue;
        std::vector<std::string> jobs;
        for (int j = 0; j < 8; ++j) {
          v1::LaunchRequest request;
          request.set_kernel(j % 2 ? "exp" : "neg");
          request.add_inputs(x->handle());
          request.set_stream(0);
          auto job = client->Launch(request);
          if (job.ok()) jobs.push_back(job->job_id());
        }
        if (!jobs.empty()) (void)client->CancelJob(jobs.back());
        (void)client->Download(x->handle());
        (void)client->Overwrite(x->handle(), std::string(256 << 10, '\3'), 64 << 10);
        if (round % 2 == 0) (void)client->Synchronize();
        (void)client->DeleteTensor(x->handle());
        (void)admin_->DeregisterTenant(id);  // with work possibly still queued or running
        ++operations;
      }
    });
  }
  for (std::thread& t : workers) t.join();
  EXPECT_GT(operations.load(), 4);
  EXPECT_TRUE(admin_->GetServerInfo().ok());
  const absl::Time stop_start = absl::Now();
  auto stopped = server_->Stop(SIGTERM, absl::Seconds(15));
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(*stopped, 0) << server_->output();
  EXPECT_LT(absl::Now() - stop_start, absl::Seconds(8));
}

// A job's scratch (here the temporary an in-place transpose needs) is memory the tenant
// causes: it counts against the quota beside the tensors, before the job is accepted.
TEST_F(JobsTest, AJobsScratchCountsAgainstTheMemoryQuota) {
  auto client = ClientWith(MustRegister("scratchy", 64 << 20));
  auto square = [&](int n) {
    v1::TensorSpec spec;
    spec.set_dtype(v1::DTYPE_F32);
    spec.add_shape(n);
    spec.add_shape(n);
    return client->CreateTensor(spec);
  };
  auto transpose_in_place = [&](const v1::TensorInfo& x) {
    v1::LaunchRequest request;
    request.set_kernel("transpose");
    request.add_inputs(x.handle());
    request.add_outputs()->set_handle(x.handle());
    request.set_wait(true);
    return client->Launch(request);
  };
  auto small = square(2048);  // 16 MiB: 16 more of scratch fit in 64
  ASSERT_TRUE(small.ok()) << small.status();
  auto fits = transpose_in_place(*small);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->state(), v1::JOB_STATE_SUCCEEDED) << fits->error_message();
  ASSERT_TRUE(client->DeleteTensor(small->handle()).ok());
  auto large = square(3400);  // 46 MB: another 46 of scratch do not
  ASSERT_TRUE(large.ok()) << large.status();
  auto refused = transpose_in_place(*large);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("of scratch the job needs to run"));
  auto usage = client->GetUsage();
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->memory_scratch_bytes(), 0u);  // nothing runs now
  EXPECT_EQ(usage->memory_tensor_bytes(), uint64_t{3400} * 3400 * 4);
}

// With one job in flight on the device, the core releases the tenants' queued jobs in
// weighted fair order: a tenant with three times the compute share gets about three times
// the device time while both have work queued.
TEST_F(JobsTest, TheDeviceIsSharedByComputeShareWhenJobsWait) {
  StartServerFresh({"--device_in_flight=1"});
  auto tenant = [&](const std::string& id, uint32_t share) {
    v1::RegisterTenantRequest r = Registration(id, kGiB);
    r.mutable_quota()->set_compute_share_percent(share);
    r.mutable_quota()->set_max_queued_jobs(64);
    auto registered = admin_->RegisterTenant(r);
    EXPECT_TRUE(registered.ok()) << registered.status();
    return ClientWith(registered.ok() ? registered->api_key() : "");
  };
  auto heavy = tenant("heavy", 75), light = tenant("light", 25);
  // A third tenant's job holds the device's one slot for about a second (calibrated on this
  // backend), so that both tenants have all their jobs queued when it ends, however fast the
  // device runs theirs.
  auto first = tenant("first", 100);
  auto hold = SlowWork::Calibrate(*first, absl::Seconds(1), kGiB / 4);
  ASSERT_TRUE(hold.ok()) << hold.status();
  ASSERT_TRUE(first->Submit(hold->Program()).ok());
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_F32);
  spec.add_shape(1 << 16);  // 256 KiB: above the CPU backend's inline size, cheap on the fake
  auto xh = heavy->CreateTensor(spec), xl = light->CreateTensor(spec);
  auto yh = heavy->CreateTensor(spec), yl = light->CreateTensor(spec);
  ASSERT_TRUE(xh.ok() && xl.ok() && yh.ok() && yl.ok());
  auto job = [](const v1::TensorInfo& x, const v1::TensorInfo& y) {
    v1::SubmitRequest request;
    for (int i = 0; i < 8; ++i) {
      v1::ProgramStep* step = request.add_steps();
      step->set_kernel("exp");
      step->add_inputs()->set_handle(x.handle());
      step->add_outputs()->set_handle(y.handle());
    }
    return request;
  };
  std::vector<std::string> heavy_jobs, light_jobs;
  for (int i = 0; i < 40; ++i) {
    auto h = heavy->Submit(job(*xh, *yh));
    auto l = light->Submit(job(*xl, *yl));
    ASSERT_TRUE(h.ok() && l.ok()) << h.status() << l.status();
    heavy_jobs.push_back(h->job_id());
    light_jobs.push_back(l->job_id());
  }
  // Among the jobs released once both tenants had all theirs queued (released before the
  // heavy tenant's 30th finished), about one in four is the light tenant's. Counted from the
  // jobs' own times, so that a slow submission (a sanitizer build) does not skew it.
  auto done = heavy->WaitJob(heavy_jobs[29]);
  ASSERT_TRUE(done.ok()) << done.status();
  auto seconds = [](const google::protobuf::Timestamp& t) {
    return t.seconds() + t.nanos() * 1e-9;
  };
  const double until = seconds(done->end_time());
  std::vector<v1::Job> all;
  double queued = 0;  // when the last job was queued
  const std::pair<Client*, const std::vector<std::string>*> tenants[] = {
      {heavy.get(), &heavy_jobs}, {light.get(), &light_jobs}};
  for (const auto& [client, ids] : tenants) {
    for (const std::string& id : *ids) {
      auto j = client->WaitJob(id, absl::ZeroDuration());
      ASSERT_TRUE(j.ok()) << j.status();
      queued = std::max(queued, seconds(j->enqueue_time()));
      all.push_back(*j);
    }
  }
  // The device time each got: the core charges a job's run time divided by the tenant's
  // weight, so time, not the number of jobs, follows the shares (on a GPU the light tenant's
  // jobs run on a quarter of the SMs and take longer than the heavy one's).
  int heavy_released = 0, light_released = 0;
  double heavy_time = 0, light_time = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (!all[i].has_start_time() || !all[i].has_end_time()) continue;
    const double start = seconds(all[i].start_time());
    if (start < queued || start > until) continue;
    const double ran = seconds(all[i].end_time()) - start;
    if (i < heavy_jobs.size()) {
      ++heavy_released;
      heavy_time += ran;
    } else {
      ++light_released;
      light_time += ran;
    }
  }
  ASSERT_GE(heavy_released + light_released, 8)
      << "too few jobs released after the last was queued";
  const double light_part = light_time / (heavy_time + light_time);
  const std::string counts = absl::StrCat(light_released, " light jobs (", light_time, " s), ",
                                          heavy_released, " heavy (", heavy_time, " s)");
  EXPECT_GE(light_part, 0.1) << counts;
  EXPECT_LE(light_part, 0.45) << counts;
  (void)admin_->TerminateTenantWork("heavy");
  (void)admin_->TerminateTenantWork("light");
}

}  // namespace
}  // namespace tessera::testing
