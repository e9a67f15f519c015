// The fleet's etcd client against a real etcd (Debian's etcd-server) on loopback.
#include "server/fleet/etcd_client.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/testing/etcd_process.h"
#include "tests/testing/temp_dir.h"

namespace tessera::fleet {
namespace {

using ::testing::HasSubstr;

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto etcd = testing::EtcdProcess::Start(dir_.path());
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    auto client = EtcdClient::Create({.endpoints = {etcd_->endpoint()}});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> client_;
};

TEST(EtcdClientOptionsTest, EndpointsMustBeHttpHostAndPort) {
  for (const char* bad : {"localhost", "http://host:", "http://host:99999", "https://host:2379"}) {
    auto client = EtcdClient::Create({.endpoints = {bad}});
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(client.status().message(), HasSubstr("--fleet_etcd")) << bad;
  }
  EXPECT_EQ(EtcdClient::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(EtcdClient::Create({.endpoints = {"http://127.0.0.1:2379/"}}).ok());
  EXPECT_EQ(PrefixEnd("/a/"), "/a0");
  EXPECT_EQ(PrefixEnd(std::string("a\xff", 2)), "b");
}

TEST_F(EtcdClientTest, KeysAreReadWrittenListedAndReplacedByRevision) {
  auto missing = client_->Get("/t/none");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->has_value());
  ASSERT_TRUE(client_->Put("/t/a", "1").ok());
  ASSERT_TRUE(client_->Put("/t/b", "2").ok());
  ASSERT_TRUE(client_->Put("/u/c", "3").ok());
  auto listed = client_->GetPrefix("/t/");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].key, "/t/a");
  EXPECT_EQ((*listed)[1].value, "2");
  auto a = *client_->Get("/t/a");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*client_->CreateIfAbsent("/t/a", "other"), false);
  EXPECT_EQ((*client_->Get("/t/a"))->value, "1");
  EXPECT_EQ(*client_->ReplaceIfUnchanged("/t/a", "1b", a->mod_revision), true);
  EXPECT_EQ(*client_->ReplaceIfUnchanged("/t/a", "1c", a->mod_revision), false);  // stale
  EXPECT_EQ((*client_->Get("/t/a"))->value, "1b");
  auto b = *client_->Get("/t/b");
  EXPECT_EQ(*client_->DeleteIfUnchanged("/t/b", b->mod_revision + 1000), false);
  EXPECT_EQ(*client_->DeleteIfUnchanged("/t/b", b->mod_revision), true);
  EXPECT_FALSE((*client_->Get("/t/b")).has_value());
}

// Many writers creating the same key at once: exactly one wins, whatever the interleaving.
TEST_F(EtcdClientTest, OfWritersCreatingTheSameKeyAtOnceExactlyOneWins) {
  for (int round = 0; round < 10; ++round) {
    const std::string key = absl::StrCat("/race/", round);
    std::atomic<int> winners{0}, errors{0};
    std::vector<std::thread> threads;
    for (int w = 0; w < 8; ++w) {
      threads.emplace_back([&, w] {
        absl::StatusOr<bool> created = client_->CreateIfAbsent(key, absl::StrCat("writer ", w));
        if (!created.ok()) {
          ++errors;
        } else if (*created) {
          ++winners;
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(errors.load(), 0);
    EXPECT_EQ(winners.load(), 1) << key;
  }
}

TEST_F(EtcdClientTest, AKeyOnALeaseGoesWhenTheLeaseEndsAndStaysWhileRenewed) {
  auto lease = client_->GrantLease(absl::Seconds(2));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client_->Put("/node/renewed", "x", *lease).ok());
  EXPECT_EQ((*client_->Get("/node/renewed"))->lease, *lease);
  for (int i = 0; i < 5; ++i) {  // 2.5 s, past the TTL, renewed every half second
    auto ttl = client_->KeepAlive(*lease);
    ASSERT_TRUE(ttl.ok()) << ttl.status();
    absl::SleepFor(absl::Milliseconds(500));
  }
  EXPECT_TRUE((*client_->Get("/node/renewed")).has_value());
  ASSERT_TRUE(client_->RevokeLease(*lease).ok());
  EXPECT_FALSE((*client_->Get("/node/renewed")).has_value());
  EXPECT_EQ(client_->KeepAlive(*lease).status().code(), absl::StatusCode::kNotFound);

  auto expiring = *client_->GrantLease(absl::Seconds(1));
  ASSERT_TRUE(client_->Put("/node/expiring", "y", expiring).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline && (*client_->Get("/node/expiring")).has_value()) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_FALSE((*client_->Get("/node/expiring")).has_value()) << "the lease never expired";
}

TEST_F(EtcdClientTest, AnEtcdThatIsDownIsUnavailableNamingEtcdAndTheClientRecovers) {
  ASSERT_TRUE(client_->Put("/kept", "v").ok());
  etcd_->Stop();
  auto client = EtcdClient::Create({.endpoints = {etcd_->endpoint()}, .timeout = absl::Seconds(1)});
  ASSERT_TRUE(client.ok());
  absl::Status down = (*client)->Put("/x", "y");
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
  EXPECT_THAT(down.message(), HasSubstr("etcd (" + etcd_->endpoint() + ")"));
  EXPECT_EQ((*client)->CreateIfAbsent("/x", "y").status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(etcd_->Restart().ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  absl::StatusOr<std::optional<KeyValue>> kept = (*client)->Get("/kept");
  while (!kept.ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    kept = (*client)->Get("/kept");
  }
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(kept->has_value());
  EXPECT_EQ((*kept)->value, "v");
}

}  // namespace
}  // namespace tessera::fleet
