// The data plane through a real server process: tensors, transfers, jobs, programs, quotas,
// queue bounds, cancellation, deadlines and tenant isolation.
#include <atomic>
#include <csignal>
#include <cstring>
#include <random>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/npy.h"
#include "tests/testing/server_fixture.h"
#include "tests/testing/slow_work.h"

namespace tessera {
namespace {

using testing::Spec;

using testing::AsFloats;
using testing::Floats;
using ::testing::HasSubstr;
using testing::kGiB;
using testing::SlowWork;

class ComputeTest : public testing::ServerTest {
 protected:
  void SetUp() override {
    ServerTest::SetUp();
    tenant_ = Tenant("alpha", kGiB);
  }

  /// Registers `id` with the quota fields given and returns a client with its key.
  std::unique_ptr<Client> Tenant(const std::string& id, uint64_t memory, uint32_t streams = 4,
                                 uint32_t max_queued = 0) {
    v1::RegisterTenantRequest request = Registration(id, memory);
    request.mutable_quota()->set_max_streams(streams);
    request.mutable_quota()->set_max_queued_jobs(max_queued);
    auto registered = admin_->RegisterTenant(request);
    EXPECT_TRUE(registered.ok()) << registered.status();
    keys_[id] = registered->api_key();
    return ClientWith(registered->api_key());
  }

  std::string Put(const std::vector<float>& values, std::vector<int64_t> shape) {
    auto info = tenant_->CreateTensor(Spec(v1::DTYPE_F32, std::move(shape)), Floats(values));
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->handle() : "";
  }

  static v1::LaunchRequest Launch(const std::string& kernel, std::vector<std::string> inputs,
                                  bool wait = true) {
    v1::LaunchRequest request;
    request.set_kernel(kernel);
    for (auto& h : inputs) request.add_inputs(h);
    request.set_wait(wait);
    return request;
  }

  std::unique_ptr<Client> tenant_;
  std::map<std::string, std::string> keys_;
};

TEST_F(ComputeTest, CreateLaunchAndRead) {
  std::string a = Put({1, 2, 3, 4, 5, 6}, {2, 3});
  std::string b = Put({10, 20, 30}, {3});
  auto job = tenant_->Launch(Launch("add", {a, b}));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(job->outputs_size(), 1);
  EXPECT_THAT(job->outputs(0).shape(), ::testing::ElementsAre(2, 3));
  auto bytes = tenant_->Download(job->outputs(0).handle());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(AsFloats(*bytes), (std::vector<float>{11, 22, 33, 14, 25, 36}));
  // Write into an existing tensor, with attributes.
  v1::LaunchRequest scale = Launch("scale", {a});
  scale.add_outputs()->set_handle(job->outputs(0).handle());
  (*scale.mutable_attrs())["alpha"].set_f(2);
  (*scale.mutable_attrs())["beta"].set_i(1);
  ASSERT_TRUE(tenant_->Launch(scale).ok());
  EXPECT_EQ(AsFloats(*tenant_->Download(job->outputs(0).handle())),
            (std::vector<float>{3, 5, 7, 9, 11, 13}));
  auto info = tenant_->GetTensor(a);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->size_bytes(), 24u);
  EXPECT_EQ(info->dtype(), v1::DTYPE_F32);
}

TEST_F(ComputeTest, UploadDownloadRoundTrips) {
  std::mt19937 gen(5);
  for (size_t size : {size_t{0}, size_t{1}, size_t{7}, size_t{4097}, size_t{3 << 20} + 5}) {
    SCOPED_TRACE(size);
    std::string data(size, '\0');
    for (char& c : data) c = static_cast<char>(gen());
    auto info = tenant_->Upload(Spec(v1::DTYPE_U8, {static_cast<int64_t>(size)}), data, 1 << 16);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->size_bytes(), size);
    auto back = tenant_->Download(info->handle(), 0, 0, 4096 * 3);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(*back == data);
    if (size > 10) {  // a byte range
      auto part = tenant_->Download(info->handle(), 3, 5);
      ASSERT_TRUE(part.ok());
      EXPECT_EQ(*part, data.substr(3, 5));
    }
  }
  EXPECT_EQ(tenant_->Download("tn_nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ComputeTest, LargeStreamedTransfer) {
  // 256 MiB up and down in 4 MiB chunks through the real server.
  const size_t size = size_t{256} << 20;
  std::string data(size, '\0');
  for (size_t i = 0; i < size; i += 4096) data[i] = static_cast<char>(i / 4096);
  data[size - 1] = 'z';
  auto info = tenant_->Upload(Spec(v1::DTYPE_U8, {static_cast<int64_t>(size)}), data, 4 << 20);
  ASSERT_TRUE(info.ok()) << info.status();
  auto back = tenant_->Download(info->handle(), 0, 0, 4 << 20);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), size);
  EXPECT_TRUE(*back == data);
}

// A download keeps its tensor from changing until its last byte has left the server (on the
// CPU backend the bytes are sent from the tensor's own memory): every download is one whole
// version, and a write made once a download has ended is never refused as "in use".
TEST_F(ComputeTest, ADownloadIsOneVersionAndEndsBeforeItsTensorCanChange) {
  const size_t size = size_t{4} << 20;
  auto info = tenant_->Upload(Spec(v1::DTYPE_U8, {static_cast<int64_t>(size)}),
                              std::string(size, '\0'), 1 << 20);
  ASSERT_TRUE(info.ok()) << info.status();
  const std::string handle = info->handle();
  auto writer = ClientWith(keys_["alpha"]);  // a connection of its own
  for (int version = 1; version <= 8; ++version) {
    auto back = tenant_->Download(handle);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, std::string(size, static_cast<char>(version - 1)));
    // At once, from the same connection and from another one.
    auto same = tenant_->Overwrite(handle, std::string(size, static_cast<char>(version)));
    ASSERT_TRUE(same.ok()) << same.status();
    back = tenant_->Download(handle, 0, 0, 64 << 10);
    ASSERT_TRUE(back.ok()) << back.status();
    auto other = writer->Overwrite(handle, std::string(size, static_cast<char>(version)));
    ASSERT_TRUE(other.ok()) << other.status();
  }
  // Downloads and writes racing: a write is refused while a download runs, never interleaved.
  std::atomic<bool> stop{false};
  std::atomic<int> written{0}, refused{0};
  std::thread writes([&] {
    for (int i = 0; i < 40 && !stop; ++i) {
      auto done = writer->Overwrite(handle, std::string(size, static_cast<char>(100 + i)));
      if (done.ok()) {
        ++written;
      } else {
        EXPECT_EQ(done.status().code(), absl::StatusCode::kFailedPrecondition) << done.status();
        ++refused;
      }
    }
  });
  for (int i = 0; i < 20; ++i) {
    auto back = tenant_->Download(handle, 0, 0, 256 << 10);
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(back->size(), size);
    EXPECT_EQ(back->find_first_not_of((*back)[0]), std::string::npos) << "a torn download";
  }
  stop = true;
  writes.join();
  EXPECT_GT(written.load(), 0);
}

// The memory of a tensor deleted right after its download is free at once: the download's
// answer comes after the server let go of the tensor's bytes.
TEST_F(ComputeTest, ATensorDeletedRightAfterItsDownloadIsFreedAtOnce) {
  auto before = tenant_->GetUsage();
  ASSERT_TRUE(before.ok()) << before.status();
  const size_t size = size_t{8} << 20;
  for (int round = 0; round < 20; ++round) {
    auto info = tenant_->Upload(Spec(v1::DTYPE_U8, {static_cast<int64_t>(size)}),
                                std::string(size, static_cast<char>(round)));
    ASSERT_TRUE(info.ok()) << info.status();
    auto back = tenant_->Download(info->handle());
    ASSERT_TRUE(back.ok()) << back.status();
    auto deleted = tenant_->DeleteTensor(info->handle());
    ASSERT_TRUE(deleted.ok()) << deleted.status();
    auto usage = tenant_->GetUsage();
    ASSERT_TRUE(usage.ok()) << usage.status();
    ASSERT_EQ(usage->memory_used_bytes(), before->memory_used_bytes()) << "round " << round;
  }
}

// A download its client abandons releases its tensor: it can be deleted, and the server,
// which may still hold the abandoned chunks in its transport, goes on serving.
TEST_F(ComputeTest, AnAbandonedDownloadReleasesItsTensor) {
  const size_t size = size_t{16} << 20;
  for (int round = 0; round < 4; ++round) {
    auto info = tenant_->Upload(Spec(v1::DTYPE_U8, {static_cast<int64_t>(size)}),
                                std::string(size, static_cast<char>('a' + round)));
    ASSERT_TRUE(info.ok()) << info.status();
    testing::OpenDownload download = testing::StartDownload(*tenant_, info->handle(), 64 << 10);
    ASSERT_TRUE(download.started);
    EXPECT_EQ(download.first.chunk().data(), std::string(64 << 10, static_cast<char>('a' + round)));
    download.context->TryCancel();
    EXPECT_EQ(download.reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
    // The server hears of the cancel on its own time.
    absl::StatusOr<uint64_t> deleted;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    do {
      deleted = tenant_->DeleteTensor(info->handle());
      if (deleted.ok()) break;
      ASSERT_EQ(deleted.status().code(), absl::StatusCode::kFailedPrecondition) << deleted.status();
      absl::SleepFor(absl::Milliseconds(10));
    } while (absl::Now() < deadline);
    ASSERT_TRUE(deleted.ok()) << deleted.status();
    EXPECT_EQ(*deleted, size);
  }
  auto again = tenant_->Upload(Spec(v1::DTYPE_U8, {4 << 20}), std::string(4 << 20, 'z'));
  ASSERT_TRUE(again.ok()) << again.status();
  auto back = tenant_->Download(again->handle());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, std::string(4 << 20, 'z'));
}

TEST_F(ComputeTest, DownloadToFillsTheCallersMemory) {
  // The client library's download into memory the caller owns (the Python package's arrays
  // use it): asked for once the size is known, written once, the tensor's TensorInfo returned.
  const size_t size = (size_t{3} << 20) + 5;
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>(i * 7 + i / 4096);
  auto info = tenant_->Upload(Spec(v1::DTYPE_U8, {static_cast<int64_t>(size)}), data);
  ASSERT_TRUE(info.ok()) << info.status();
  std::vector<char> out(size);
  int asked = 0;
  auto got = tenant_->DownloadTo(
      info->handle(),
      [&](const v1::TensorInfo& tensor, uint64_t bytes) -> absl::StatusOr<char*> {
        ++asked;
        EXPECT_EQ(tensor.handle(), info->handle());
        EXPECT_EQ(bytes, size);
        return out.data();
      },
      0, 0, 64 << 10);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(got->size_bytes(), size);
  EXPECT_TRUE(std::string(out.begin(), out.end()) == data);
  // A range: `length` bytes from `offset`, and an empty one at the end.
  std::vector<char> part(1000);
  got = tenant_->DownloadTo(
      info->handle(),
      [&](const v1::TensorInfo&, uint64_t bytes) -> absl::StatusOr<char*> {
        EXPECT_EQ(bytes, part.size());
        return part.data();
      },
      12345, part.size());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(std::string(part.begin(), part.end()) == data.substr(12345, part.size()));
  got = tenant_->DownloadTo(
      info->handle(),
      [](const v1::TensorInfo&, uint64_t bytes) -> absl::StatusOr<char*> {
        EXPECT_EQ(bytes, 0u);
        return nullptr;
      },
      size);
  EXPECT_TRUE(got.ok()) << got.status();
  // The destination's error cancels the call and is its answer; the client goes on.
  got = tenant_->DownloadTo(info->handle(), [](const v1::TensorInfo&, uint64_t) {
    return absl::StatusOr<char*>(absl::ResourceExhaustedError("no room for it here"));
  });
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(got.status().message(), HasSubstr("no room for it here"));
  // An unknown handle is the server's NOT_FOUND, the destination never asked.
  got = tenant_->DownloadTo("t_unknown", [&](const v1::TensorInfo&, uint64_t) {
    ADD_FAILURE() << "asked for memory";
    return absl::StatusOr<char*>(out.data());
  });
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  std::fill(out.begin(), out.end(), 0);
  got = tenant_->DownloadTo(info->handle(), [&](const v1::TensorInfo&, uint64_t) {
    return absl::StatusOr<char*>(out.data());
  });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(std::string(out.begin(), out.end()) == data);
}

// A Canceller whose watch, called every 20 ms, cancels on its third call.
struct CancelOnThirdWatch {
  int watched = 0;
  Canceller cancel{[this] {
                     if (++watched == 3) cancel.Cancel();
                   },
                   absl::Milliseconds(20)};
};

TEST_F(ComputeTest, ACancellerEndsAStreamedTransfer) {
  // Client::Canceller (what the Python package's Ctrl-C uses): a transfer it cancels ends
  // CANCELLED, an upload cancelled midway leaves no tensor, and one cancelled before it starts
  // sends nothing.
  const size_t size = size_t{8} << 20;
  auto info =
      tenant_->Upload(Spec(v1::DTYPE_U8, {static_cast<int64_t>(size)}), std::string(size, 'c'));
  ASSERT_TRUE(info.ok()) << info.status();
  {
    Canceller cancel;
    int calls = 0;
    auto read = tenant_->Download(
        info->handle(), 0, 0, 64 << 10,
        [&](uint64_t, uint64_t) {
          if (++calls == 1) std::thread([&cancel] { cancel.Cancel(); }).join();
        },
        &cancel);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kCancelled) << read.status();
    EXPECT_TRUE(cancel.cancelled());
    EXPECT_LT(calls, static_cast<int>(size / (64 << 10)));
  }
  {
    Canceller cancel;
    auto written = tenant_->Upload(
        Spec(v1::DTYPE_U8, {static_cast<int64_t>(size)}), std::string(size, 'd'), 64 << 10,
        [&](uint64_t done, uint64_t) {
          if (done == (64 << 10)) cancel.Cancel();
        },
        &cancel);
    EXPECT_EQ(written.status().code(), absl::StatusCode::kCancelled) << written.status();
  }
  {
    Canceller cancel;
    cancel.Cancel();
    EXPECT_EQ(
        tenant_->Upload(Spec(v1::DTYPE_U8, {16}), std::string(16, 'e'), 1 << 20, nullptr, &cancel)
            .status()
            .code(),
        absl::StatusCode::kCancelled);
    std::vector<char> out(size);
    auto got = tenant_->DownloadTo(
        info->handle(),
        [&](const v1::TensorInfo&, uint64_t) { return absl::StatusOr<char*>(out.data()); }, 0, 0, 0,
        nullptr, &cancel);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled);
  }
  {
    // A watch, called while the call waits, may cancel it: a server that stopped answering
    // (SIGSTOP) does not hold the caller past its watch (the Python package's Ctrl-C).
    CancelOnThirdWatch third;
    ASSERT_EQ(kill(server_->pid(), SIGSTOP), 0);
    const absl::Time started = absl::Now();
    auto read = tenant_->Download(info->handle(), 0, 0, 0, nullptr, &third.cancel);
    const absl::Duration took = absl::Now() - started;
    ASSERT_EQ(kill(server_->pid(), SIGCONT), 0);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kCancelled) << read.status();
    EXPECT_GE(third.watched, 3);
    EXPECT_LT(took, absl::Seconds(10));
  }
  {
    // The watch also runs while the call never waits long: here each chunk's progress takes
    // 2 ms and every wait is short, yet the watch comes every 20 ms and cancels.
    CancelOnThirdWatch third;
    int chunks = 0;
    auto read = tenant_->Download(
        info->handle(), 0, 0, 64 << 10,
        [&](uint64_t, uint64_t) {
          ++chunks;
          absl::SleepFor(absl::Milliseconds(2));
        },
        &third.cancel);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kCancelled) << read.status();
    EXPECT_GE(third.watched, 3);
    EXPECT_LT(chunks, static_cast<int>(size / (64 << 10)));
  }
  // Only the first tensor is left, once the server has heard of the cancelled upload.
  absl::StatusOr<std::vector<v1::TensorInfo>> tensors;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  do {
    tensors = tenant_->ListAllTensors();
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    if (tensors->size() == 1) break;
    absl::SleepFor(absl::Milliseconds(10));
  } while (absl::Now() < deadline);
  ASSERT_EQ(tensors->size(), 1u);
  EXPECT_EQ((*tensors)[0].handle(), info->handle());
  auto back = tenant_->Download(info->handle());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == std::string(size, 'c'));
}

TEST_F(ComputeTest, AClientWithoutADeadlineWaits) {
  // ClientOptions::timeout = InfiniteDuration: calls carry no deadline (they used to get one
  // in the past, computed from the largest duration).
  auto client = Client::Connect({.address = server_->address(),
                                 .token = keys_["alpha"],
                                 .timeout = absl::InfiniteDuration()});
  ASSERT_TRUE(client.ok()) << client.status();
  auto info = (*client)->Upload(Spec(v1::DTYPE_U8, {3 << 20}), std::string(3 << 20, 'q'));
  ASSERT_TRUE(info.ok()) << info.status();
  auto back = (*client)->Download(info->handle());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == std::string(3 << 20, 'q'));
}

TEST_F(ComputeTest, WritesMustCoverTheTensorExactly) {
  auto created = tenant_->CreateTensor(Spec(v1::DTYPE_F32, {4}));
  ASSERT_TRUE(created.ok());
  absl::Status short_write = tenant_->Overwrite(created->handle(), std::string(15, 'x')).status();
  EXPECT_EQ(short_write.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_write.message(), HasSubstr("needs exactly 16"));
  EXPECT_EQ(tenant_->Overwrite(created->handle(), std::string(17, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(tenant_->Overwrite(created->handle(), Floats({1, 2, 3, 4})).ok());
  EXPECT_EQ(AsFloats(*tenant_->Download(created->handle())), (std::vector<float>{1, 2, 3, 4}));
  // An aborted upload of a new tensor leaves nothing behind.
  auto before = tenant_->GetUsage();
  EXPECT_FALSE(tenant_->Upload(Spec(v1::DTYPE_F32, {8}), std::string(5, 'x')).ok());
  EXPECT_EQ(tenant_->GetUsage()->memory_used_bytes(), before->memory_used_bytes());
  EXPECT_EQ(tenant_->CreateTensor(Spec(v1::DTYPE_F32, {2}), "abc").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tenant_->CreateTensor(Spec(v1::DTYPE_UNSPECIFIED, {2})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      tenant_->CreateTensor(Spec(v1::DTYPE_F32, {1, 1, 1, 1, 1, 1, 1, 1, 1})).status().message(),
      HasSubstr("9 dimensions"));
}

TEST_F(ComputeTest, QuotaExhaustionAndRecovery) {
  auto small = Tenant("small", 4 << 20);
  auto a = small->CreateTensor(Spec(v1::DTYPE_U8, {3 << 20}));
  ASSERT_TRUE(a.ok());
  absl::Status refused = small->CreateTensor(Spec(v1::DTYPE_U8, {2 << 20})).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("3145728 bytes used + 2097152"));
  EXPECT_THAT(refused.message(), HasSubstr("4194304"));
  // A launch whose new output would not fit is refused before anything runs.
  v1::LaunchRequest copy = Launch("copy", {a->handle()});
  EXPECT_EQ(small->Launch(copy).status().code(), absl::StatusCode::kResourceExhausted);
  auto released = small->DeleteTensor(a->handle());
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(*released, 3u << 20);
  EXPECT_TRUE(small->CreateTensor(Spec(v1::DTYPE_U8, {2 << 20})).ok());
  auto usage = small->GetUsage();
  EXPECT_EQ(usage->memory_used_bytes(), 2u << 20);
  EXPECT_EQ(usage->memory_peak_bytes(), 3u << 20);
  EXPECT_EQ(usage->memory_quota_bytes(), 4u << 20);
}

TEST_F(ComputeTest, TenantsCannotSeeEachOthersHandles) {
  auto other = Tenant("beta", kGiB);
  std::string mine = Put({1, 2}, {2});
  EXPECT_EQ(other->GetTensor(mine).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(other->Download(mine).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(other->DeleteTensor(mine).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(other->Launch(Launch("neg", {mine})).status().code(), absl::StatusCode::kNotFound);
  auto job = tenant_->Launch(Launch("neg", {mine}));
  EXPECT_EQ(other->WaitJob(job->job_id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(other->ListAllTensors()->empty());
  EXPECT_TRUE(tenant_->GetTensor(mine).ok());
}

TEST_F(ComputeTest, ProgramsChainStepsAndReportTheFailingStep) {
  std::string x = Put({1, -2, 3, -4}, {2, 2});
  v1::SubmitRequest program;
  program.set_wait(true);
  auto* relu = program.add_steps();
  relu->set_kernel("relu");
  relu->add_inputs()->set_handle(x);
  auto* sum = program.add_steps();
  sum->set_kernel("sum");
  sum->add_inputs()->mutable_step_output()->set_step(0);
  auto job = tenant_->Submit(program);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(job->outputs_size(), 2);
  EXPECT_EQ(AsFloats(*tenant_->Download(job->outputs(1).handle())), (std::vector<float>{4}));

  // A bad middle step: the whole program is refused, naming the step; nothing was created.
  size_t tensors_before = tenant_->ListAllTensors()->size();
  auto* bad = program.add_steps();
  bad->set_kernel("matmul");
  bad->add_inputs()->mutable_step_output()->set_step(1);
  bad->add_inputs()->set_handle(x);
  auto* after = program.add_steps();
  after->set_kernel("neg");
  after->add_inputs()->set_handle(x);
  absl::Status refused = tenant_->Submit(program).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("steps[2] (matmul)"));
  EXPECT_EQ(tenant_->ListAllTensors()->size(), tensors_before);
  EXPECT_EQ(AsFloats(*tenant_->Download(x)), (std::vector<float>{1, -2, 3, -4}));
  // A forward reference is refused too.
  v1::SubmitRequest forward;
  auto* s0 = forward.add_steps();
  s0->set_kernel("neg");
  s0->add_inputs()->mutable_step_output()->set_step(0);
  EXPECT_THAT(tenant_->Submit(forward).status().message(), HasSubstr("not an earlier step"));
}

// A program's temporaries are reused step after step: 22 in-place matmuls on a 4 MiB tensor
// need one 4 MiB temporary (plus, on a GPU, cuBLAS's workspace), not 22, and fit a 64 MiB
// quota on every backend. Each step doubles x, so the result shows that every step read the
// previous one's output.
TEST_F(ComputeTest, AProgramsScratchIsItsPeakNotItsSum) {
  auto tight = Tenant("peak", 64 << 20);
  constexpr int64_t kRows = 65536, kCols = 16;  // 4 MiB of f32
  std::vector<float> x(kRows * kCols), w(kCols * kCols, 0);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 3 + 1);
  for (int64_t i = 0; i < kCols; ++i) w[static_cast<size_t>(i * kCols + i)] = 2;
  auto xt = tight->Upload(Spec(v1::DTYPE_F32, {kRows, kCols}), Floats(x));
  auto wt = tight->CreateTensor(Spec(v1::DTYPE_F32, {kCols, kCols}), Floats(w));
  ASSERT_TRUE(xt.ok()) << xt.status();
  ASSERT_TRUE(wt.ok()) << wt.status();
  v1::SubmitRequest program;
  program.set_wait(true);
  constexpr int kSteps = 22;
  for (int i = 0; i < kSteps; ++i) {
    auto* step = program.add_steps();
    step->set_kernel("matmul");
    step->add_inputs()->set_handle(xt->handle());
    step->add_inputs()->set_handle(wt->handle());
    step->add_outputs()->set_handle(xt->handle());
  }
  auto job = tight->Submit(program);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->error_message();
  auto back = tight->Download(xt->handle());
  ASSERT_TRUE(back.ok()) << back.status();
  const std::vector<float> got = AsFloats(*back);
  ASSERT_EQ(got.size(), x.size());
  const float scale = static_cast<float>(1 << kSteps);
  for (size_t i = 0; i < got.size(); i += 4099) EXPECT_EQ(got[i], x[i] * scale) << i;
  EXPECT_EQ(got.back(), x.back() * scale);
  auto usage = tight->GetUsage();
  ASSERT_TRUE(usage.ok()) << usage.status();
  EXPECT_LE(usage->memory_peak_bytes(), uint64_t{64} << 20);
}

TEST_F(ComputeTest, StreamIndexAndKernelErrorsAreInvalidArgument) {
  std::string x = Put({1}, {1});
  v1::LaunchRequest request = Launch("neg", {x});
  request.set_stream(4);
  absl::Status s = tenant_->Launch(request).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("stream is 4; the tenant has 4 streams"));
  // An unknown kernel is NOT_FOUND (as a handle is), whoever else may have one of that name.
  absl::Status unknown = tenant_->Launch(Launch("conv9d", {x})).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.message(), HasSubstr("kernel \"conv9d\" not found"));
  EXPECT_THAT(tenant_->Launch(Launch("add", {x})).status().message(), HasSubstr("takes 2 inputs"));
  v1::LaunchRequest bad_attr = Launch("sum", {x});
  (*bad_attr.mutable_attrs())["axes"].set_s("zero");
  EXPECT_THAT(tenant_->Launch(bad_attr).status().message(), HasSubstr("must be ints"));
}

TEST_F(ComputeTest, QueueBoundCancelAndWaitTimeout) {
  auto busy = Tenant("busy", kGiB, 1, 2);
  // A program that runs for about two seconds on this backend (calibrated on it).
  auto work = SlowWork::Calibrate(*busy, absl::Seconds(2), kGiB / 4);
  ASSERT_TRUE(work.ok()) << work.status();
  const std::string big = work->operand();
  const absl::Time submitted = absl::Now();
  auto running = busy->Submit(work->Program());
  std::printf("Submit of the slow program returned after %s\n",
              absl::FormatDuration(absl::Now() - submitted).c_str());
  ASSERT_TRUE(running.ok()) << running.status();
  for (int i = 0; i < 500 && busy->GetUsage()->jobs_running() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  // Launch behind it until refused: the stream keeps as many jobs in flight as its backend
  // does (one on the CPU, two on a GPU) and at most max_queued_jobs (2) more wait.
  std::vector<std::string> accepted;
  absl::Status refused;
  for (int i = 0; i < 8 && refused.ok(); ++i) {
    auto job = busy->Launch(Launch("neg", {big}, false));
    if (job.ok()) {
      accepted.push_back(job->job_id());
    } else {
      refused = job.status();
    }
  }
  ASSERT_FALSE(refused.ok()) << "8 launches behind a running program were all accepted";
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("quota.max_queued_jobs is 2"));
  ASSERT_GE(accepted.size(), 2u);
  EXPECT_LE(accepted.size(), 3u);
  const std::string first = accepted.front(), last = accepted.back();

  auto cancelled = busy->CancelJob(last);  // the last one accepted is surely still queued
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  // A tensor in use by a queued job cannot be deleted.
  EXPECT_EQ(busy->DeleteTensor(big).status().code(), absl::StatusCode::kFailedPrecondition);
  // WaitJob with a short timeout returns the job unfinished.
  auto waited = busy->WaitJob(first, absl::Milliseconds(50));
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_THAT(waited->state(), ::testing::AnyOf(v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING));
  // Synchronize waits for everything; then the others have succeeded and the last one stays
  // cancelled.
  auto synced = busy->Synchronize();
  ASSERT_TRUE(synced.ok()) << synced.status();
  for (const std::string& id : accepted) {
    EXPECT_EQ(busy->WaitJob(id)->state(),
              id == last ? v1::JOB_STATE_CANCELLED : v1::JOB_STATE_SUCCEEDED);
  }
  EXPECT_EQ(busy->WaitJob(running->job_id())->state(), v1::JOB_STATE_SUCCEEDED);
  auto usage = busy->GetUsage();
  EXPECT_EQ(usage->jobs_cancelled(), 1u);
  EXPECT_EQ(usage->jobs_succeeded(), work->calibration_jobs() + accepted.size());
  EXPECT_GT(usage->busy_time().seconds() * 1000000000 + usage->busy_time().nanos(), 0);
  EXPECT_TRUE(busy->DeleteTensor(big).ok());
}

TEST_F(ComputeTest, DeadlinesAreHonoured) {
  // A program that runs for about three seconds on this backend, far past the call's 200 ms.
  auto work = SlowWork::Calibrate(*tenant_, absl::Seconds(3), kGiB / 4);
  ASSERT_TRUE(work.ok()) << work.status();
  v1::SubmitRequest slow = work->Program(0, /*wait=*/true);
  auto hurried = Client::Connect(
      {.address = server_->address(), .token = keys_["alpha"], .timeout = absl::Milliseconds(200)});
  ASSERT_TRUE(hurried.ok());
  absl::Time start = absl::Now();
  absl::Status s = (*hurried)->Submit(slow).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // The call's deadline is also the job's: a job that started in time runs to completion
  // regardless; one still queued ends with the call (expired, or cancelled by the client's
  // cancel of the call if that arrived first); and on a slow machine (a sanitizer build) the
  // call may expire before the server makes it a job at all. Never a failure, never left over.
  ASSERT_TRUE(tenant_->Synchronize().ok());
  auto usage = tenant_->GetUsage();
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->jobs_failed(), 0u);
  EXPECT_EQ(usage->jobs_queued() + usage->jobs_running(), 0u);
  EXPECT_LE(usage->jobs_succeeded() + usage->jobs_cancelled(), work->calibration_jobs() + 1);
}

TEST_F(ComputeTest, KernelsAndUsage) {
  auto catalog = tenant_->ListKernels();
  ASSERT_TRUE(catalog.ok());
  EXPECT_GE(catalog->kernels_size(), 32);
  bool found = false;
  for (const auto& k : catalog->kernels()) {
    if (k.name() != "matmul") continue;
    found = true;
    EXPECT_EQ(k.inputs_size(), 2);
    EXPECT_GE(k.attrs_size(), 4);
  }
  EXPECT_TRUE(found);
  auto usage = tenant_->GetUsage();
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->memory_quota_bytes(), kGiB);
}

TEST_F(ComputeTest, DeregisterCancelsQueuedWorkAndRevokesTheKey) {
  auto doomed = Tenant("doomed", kGiB, 1, 0);
  auto work = SlowWork::Calibrate(*doomed, absl::Seconds(1), kGiB / 4);
  ASSERT_TRUE(work.ok()) << work.status();
  ASSERT_TRUE(doomed->Submit(work->Program()).ok());
  auto queued = doomed->Launch(Launch("neg", {work->operand()}, false));
  ASSERT_TRUE(queued.ok());
  ASSERT_TRUE(admin_->DeregisterTenant("doomed").ok());
  EXPECT_EQ(doomed->GetUsage().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(admin_->GetServerInfo()->devices(0).reserved_bytes(), kGiB);  // alpha only
}

}  // namespace
}  // namespace tessera
