// Shared-memory regions in the core: the descriptor checks (SharedMemory), the one-time
// tickets that bind a descriptor to a tenant (RegionTickets) and a tenant's regions and
// region transfers (TenantRuntime), on the CPU backend, without gRPC or sockets.
#include "server/core/region_tickets.h"

#include <cstring>
#include <memory>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "server/backend/cpu/cpu_backend.h"
#include "server/common/shared_memory.h"
#include "tests/testing/region_handover.h"
#include "tests/testing/sizes.h"

namespace tessera {
namespace {

using kernels::DType;
using kernels::TensorMeta;
using ::testing::HasSubstr;
using testing::MakeMemfd;

using testing::kMiB;

class RegionsCoreTest : public ::testing::Test {
 protected:
  std::shared_ptr<TenantRuntime> Runtime(uint64_t region_quota = 0) {
    Quota quota{.device_memory_bytes = 64 * kMiB,
                .compute_share_percent = 100,
                .max_streams = 2,
                .max_queued_jobs = 16,
                .priority = Priority::kNormal,
                .max_region_bytes = region_quota};
    auto context = backend_.CreateContext({"t", quota, 0});
    EXPECT_TRUE(context.ok());
    return std::make_shared<TenantRuntime>("t", quota, *std::move(context));
  }

  // A memfd of `size` bytes shrink-sealed, mapped by the test too.
  struct Memfd {
    int fd = -1;
    char* data = nullptr;
    uint64_t size = 0;
    ~Memfd() {
      if (data != nullptr) munmap(data, size);
      if (fd >= 0) close(fd);
    }
  };
  static std::unique_ptr<Memfd> NewMemfd(uint64_t size) {
    auto m = std::make_unique<Memfd>();
    m->fd = MakeMemfd(size);
    m->size = size;
    m->data = static_cast<char*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0));
    return m;
  }

  static int OpenFds() {
    int n = 0;
    for (int fd = 0; fd < 4096; ++fd) n += fcntl(fd, F_GETFD) != -1;
    return n;
  }

  CpuBackend backend_{{.memory_bytes = uint64_t{1} << 30, .worker_threads = 1, .reason = "test"}};
};

TEST_F(RegionsCoreTest, SharedMemoryAcceptsOnlyShrinkSealedWritableMemfds) {
  const int fds_before = OpenFds();
  auto good = SharedMemory::Map(MakeMemfd(kMiB), kMiB);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*good)->size(), kMiB);
  (*good)->data()[kMiB - 1] = 1;  // writable to its end

  EXPECT_THAT(SharedMemory::Map(MakeMemfd(kMiB, 0), kMiB).status().message(),
              HasSubstr("not sealed against shrinking"));
  EXPECT_THAT(SharedMemory::Map(MakeMemfd(kMiB), 2 * kMiB).status().message(),
              HasSubstr("holds 1048576 bytes"));
  EXPECT_THAT(SharedMemory::Map(MakeMemfd(kMiB), 0).status().message(),
              HasSubstr("size_bytes is 0"));
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  close(fds[1]);
  EXPECT_THAT(SharedMemory::Map(fds[0], kMiB).status().message(), HasSubstr("a pipe"));
  EXPECT_EQ(SharedMemory::Map(-1, kMiB).status().code(), absl::StatusCode::kInvalidArgument);
  // Every descriptor was closed, refused or not; the mapping holds none.
  EXPECT_EQ(OpenFds(), fds_before);
}

TEST_F(RegionsCoreTest, TransfersCopyBetweenRegionAndTensor) {
  auto rt = Runtime();
  auto memfd = NewMemfd(kMiB);
  auto added = rt->AddRegion(*SharedMemory::Map(dup(memfd->fd), kMiB));
  ASSERT_TRUE(added.ok()) << added.status();
  for (int i = 0; i < 256; ++i) {
    const float v = static_cast<float>(i);
    std::memcpy(memfd->data + 4096 + i * 4, &v, 4);
  }
  auto created = rt->WriteFromRegion("", TensorMeta{DType::kF32, {16, 16}}, added->handle, 4096, 0);
  ASSERT_TRUE(created.ok()) << created.status();
  auto read = rt->ReadIntoRegion(created->handle, 16, 64, added->handle, 0);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->bytes, 64u);
  EXPECT_EQ(std::memcmp(memfd->data, memfd->data + 4096 + 16, 64), 0);

  // Ranges: past the region, overflowing, past the tensor.
  EXPECT_EQ(rt->WriteFromRegion(created->handle, std::nullopt, added->handle, kMiB - 100, 0)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      rt->ReadIntoRegion(created->handle, 0, 0, added->handle, ~uint64_t{0} - 8).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rt->ReadIntoRegion(created->handle, 1000, 100, added->handle, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rt->ReadIntoRegion(created->handle, 0, 0, "rg_nope", 0).status().code(),
            absl::StatusCode::kNotFound);

  UsageInfo usage = rt->Usage();
  EXPECT_EQ(usage.regions, 1u);
  EXPECT_EQ(usage.region_bytes, kMiB);
  EXPECT_EQ(usage.region_quota_bytes, 64 * kMiB);
  EXPECT_EQ(*rt->UnregisterRegion(added->handle), kMiB);
  EXPECT_EQ(rt->Usage().regions, 0u);
}

TEST_F(RegionsCoreTest, RegionQuotaIsEnforcedAtTicketAndAtHandOver) {
  auto rt = Runtime(2 * kMiB);
  RegionTickets tickets;
  auto t1 = tickets.Issue(rt, 2 * kMiB);
  ASSERT_TRUE(t1.ok());
  EXPECT_EQ(tickets.Issue(rt, 3 * kMiB).status().code(), absl::StatusCode::kResourceExhausted);
  auto t2 = tickets.Issue(rt, kMiB);  // fits now, not once t1 is delivered
  ASSERT_TRUE(t2.ok());
  ASSERT_TRUE(tickets.Deliver(t1->ticket, MakeMemfd(2 * kMiB)).ok());
  absl::Status over = tickets.Deliver(t2->ticket, MakeMemfd(kMiB));
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(tickets.Finish("t", t2->ticket).status().code(), absl::StatusCode::kResourceExhausted);
  auto region = tickets.Finish("t", t1->ticket);
  ASSERT_TRUE(region.ok());
  EXPECT_EQ(region->size_bytes, 2 * kMiB);
  EXPECT_EQ(tickets.size(), 0u);
}

TEST_F(RegionsCoreTest, TicketsAreOneTimeTenantBoundAndExpire) {
  auto rt = Runtime();
  RegionTickets tickets(absl::Milliseconds(200));
  auto t = tickets.Issue(rt, kMiB);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->ticket.size(), 3u + 43u);
  EXPECT_EQ(tickets.Deliver("rt_unknown", MakeMemfd(kMiB)).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(tickets.Finish("t", t->ticket).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(tickets.Deliver(t->ticket, MakeMemfd(kMiB)).ok());
  EXPECT_EQ(tickets.Deliver(t->ticket, MakeMemfd(kMiB)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tickets.Finish("other", t->ticket).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(tickets.Finish("t", t->ticket).ok());
  EXPECT_EQ(tickets.Finish("t", t->ticket).status().code(), absl::StatusCode::kNotFound);

  // Delivered but never claimed: unmapped when the ticket expires.
  auto unclaimed = tickets.Issue(rt, kMiB);
  ASSERT_TRUE(tickets.Deliver(unclaimed->ticket, MakeMemfd(kMiB)).ok());
  EXPECT_EQ(rt->Usage().regions, 2u);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(tickets.Issue(rt, kMiB).status().code(), absl::StatusCode::kOk);  // sweeps
  EXPECT_EQ(rt->Usage().regions, 1u);

  // At most 16 open tickets per tenant.
  absl::Status refused;
  for (int i = 0; i < 20 && refused.ok(); ++i) refused = tickets.Issue(rt, 4096).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("16"));
}

TEST_F(RegionsCoreTest, ClosingTheTenantReleasesRegionsEvenWhileATicketIsOpen) {
  auto rt = Runtime();
  RegionTickets tickets;
  auto t = tickets.Issue(rt, kMiB);
  ASSERT_TRUE(tickets.Deliver(t->ticket, MakeMemfd(kMiB)).ok());
  auto region = tickets.Finish("t", t->ticket);
  ASSERT_TRUE(region.ok());
  auto pending = tickets.Issue(rt, kMiB);
  rt->Close("deregistered");
  EXPECT_EQ(rt->Usage().regions, 0u);
  EXPECT_EQ(rt->ListRegions().size(), 0u);
  EXPECT_EQ(tickets.Deliver(pending->ticket, MakeMemfd(kMiB)).code(),
            absl::StatusCode::kFailedPrecondition);
  rt.reset();
  auto gone = tickets.Issue(Runtime(), kMiB);  // a new tenant still gets tickets
  EXPECT_TRUE(gone.ok());
}

}  // namespace
}  // namespace tessera
