#include "server/core/validation.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

Quota ValidQuota() {
  Quota q;
  q.device_memory_bytes = 1 << 30;
  return q;
}

TEST(TenantIdTest, AcceptsDnsLabels) {
  for (const std::string& id :
       {std::string("a"), std::string("0"), std::string("alpha"), std::string("team-7"),
        std::string("a1-b2-c3"), std::string(63, 'x')}) {
    EXPECT_TRUE(ValidateTenantId(id).ok()) << id;
  }
}

TEST(TenantIdTest, RefusesEverythingElseNamingTheField) {
  for (const std::string& id : {std::string(), std::string(64, 'x'), std::string("Alpha"),
                                std::string("-a"), std::string("a-"), std::string("a_b"),
                                std::string("a.b"), std::string("a b"), std::string("ä")}) {
    absl::Status s = ValidateTenantId(id);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << id;
    EXPECT_THAT(s.message(), HasSubstr("tenant_id")) << id;
  }
  EXPECT_THAT(ValidateTenantId(std::string(64, 'x')).message(), HasSubstr("63"));
}

TEST(DisplayNameTest, LimitsLengthAndControlCharacters) {
  EXPECT_TRUE(ValidateDisplayName("").ok());
  EXPECT_TRUE(ValidateDisplayName("Team Ünïcode ✓").ok());
  EXPECT_TRUE(ValidateDisplayName(std::string(256, 'n')).ok());
  absl::Status too_long = ValidateDisplayName(std::string(257, 'n'));
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_long.message(), HasSubstr("256"));
  EXPECT_EQ(ValidateDisplayName("a\nb").code(), absl::StatusCode::kInvalidArgument);
}

TEST(LabelsTest, LimitsCountKeysAndValues) {
  EXPECT_TRUE(ValidateLabels({{"team", "ml"}, {"cost.center", "42"}, {"a_b-c", ""}}).ok());
  Labels many;
  for (int i = 0; i < 65; ++i) many.emplace(absl::StrCat("k", i), "v");
  EXPECT_THAT(ValidateLabels(many).message(), HasSubstr("64"));
  EXPECT_EQ(ValidateLabels({{"", "v"}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateLabels({{"Team", "v"}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateLabels({{"-k", "v"}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateLabels({{std::string(64, 'k'), "v"}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ValidateLabels({{"k", std::string(257, 'v')}}).message(), HasSubstr("256"));
  EXPECT_EQ(ValidateLabels({{"k", "a\tb"}}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(QuotaTest, FillsDefaults) {
  absl::StatusOr<Quota> q = NormalizeQuota(ValidQuota());
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->device_memory_bytes, uint64_t{1} << 30);
  EXPECT_EQ(q->compute_share_percent, kDefaultComputeSharePercent);
  EXPECT_EQ(q->max_streams, kDefaultMaxStreams);
  EXPECT_EQ(q->max_queued_jobs, kDefaultMaxQueuedJobs);
  EXPECT_EQ(q->priority, Priority::kNormal);
  EXPECT_EQ(q->max_region_bytes, q->device_memory_bytes);
}

TEST(QuotaTest, RegionBytesAreBounded) {
  Quota q = ValidQuota();
  q.max_region_bytes = kMinRegionBytes - 1;
  absl::Status low = NormalizeQuota(q).status();
  EXPECT_EQ(low.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(low.message(), HasSubstr("quota.max_region_bytes is 1048575"));
  q.max_region_bytes = kMinRegionBytes;
  EXPECT_EQ(NormalizeQuota(q)->max_region_bytes, kMinRegionBytes);
  q.max_region_bytes = kMaxRegionBytes;
  EXPECT_TRUE(NormalizeQuota(q).ok());
  q.max_region_bytes = kMaxRegionBytes + 1;
  EXPECT_THAT(NormalizeQuota(q).status().message(), HasSubstr("1 PiB"));
}

TEST(QuotaTest, DeviceMemoryIsRequiredAndBounded) {
  Quota q = ValidQuota();
  q.device_memory_bytes = 0;
  EXPECT_THAT(NormalizeQuota(q).status().message(),
              HasSubstr("quota.device_memory_bytes is required"));
  q.device_memory_bytes = kMinDeviceMemoryBytes - 1;
  absl::Status low = NormalizeQuota(q).status();
  EXPECT_EQ(low.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(low.message(), HasSubstr("1048576"));
  q.device_memory_bytes = kMinDeviceMemoryBytes;
  EXPECT_TRUE(NormalizeQuota(q).ok());
  q.device_memory_bytes = kMaxDeviceMemoryBytes;
  EXPECT_TRUE(NormalizeQuota(q).ok());
  q.device_memory_bytes = kMaxDeviceMemoryBytes + 1;
  EXPECT_THAT(NormalizeQuota(q).status().message(), HasSubstr("1 PiB"));
}

TEST(QuotaTest, EachFieldsUpperLimit) {
  struct Case {
    void (*set)(Quota&, uint32_t);
    uint32_t max;
    const char* field;
  };
  const Case cases[] = {
      {[](Quota& q, uint32_t v) { q.compute_share_percent = v; }, 100,
       "quota.compute_share_percent"},
      {[](Quota& q, uint32_t v) { q.max_streams = v; }, 64, "quota.max_streams"},
      {[](Quota& q, uint32_t v) { q.max_queued_jobs = v; }, 65536, "quota.max_queued_jobs"},
  };
  for (const Case& c : cases) {
    Quota q = ValidQuota();
    c.set(q, 1);
    EXPECT_TRUE(NormalizeQuota(q).ok()) << c.field;
    c.set(q, c.max);
    EXPECT_TRUE(NormalizeQuota(q).ok()) << c.field;
    c.set(q, c.max + 1);
    absl::Status s = NormalizeQuota(q).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(s.message(), HasSubstr(c.field));
    EXPECT_THAT(s.message(), HasSubstr("1.." + std::to_string(c.max)));
  }
}

TEST(QuotaTest, RefusesUnknownPriority) {
  Quota q = ValidQuota();
  q.priority = static_cast<Priority>(7);
  EXPECT_THAT(NormalizeQuota(q).status().message(), HasSubstr("quota.priority"));
  q.priority = Priority::kLow;
  EXPECT_EQ(NormalizeQuota(q)->priority, Priority::kLow);
}

TEST(TenantSpecTest, ValidatesEveryPart) {
  TenantSpec spec{.id = "alpha",
                  .display_name = "A",
                  .labels = {{"k", "v"}},
                  .quota = ValidQuota(),
                  .device_index = std::nullopt};
  ASSERT_TRUE(ValidateTenantSpec(spec).ok());
  TenantSpec bad = spec;
  bad.device_index = -1;
  EXPECT_THAT(ValidateTenantSpec(bad).status().message(), HasSubstr("device_index"));
  bad = spec;
  bad.id = "Alpha";
  EXPECT_EQ(ValidateTenantSpec(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = spec;
  bad.quota.device_memory_bytes = 0;
  EXPECT_EQ(ValidateTenantSpec(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
