#include "server/core/token.h"

#include <set>

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(TokenTest, RandomTokensCarry256BitsAndDiffer) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<std::string> t = RandomToken();
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->size(), 43u);  // 32 bytes base64url, no padding
    EXPECT_EQ(
        t->find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"),
        std::string::npos);
    seen.insert(*t);
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(TokenTest, HashIsSha256) {
  // SHA-256("abc"), FIPS 180-2 test vector.
  EXPECT_EQ(HexOf(HashCredential("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(TokenTest, HashesEqualComparesAllBytes) {
  KeyHash a = HashCredential("secret");
  KeyHash b = a;
  EXPECT_TRUE(HashesEqual(a, b));
  b[31] ^= 1;
  EXPECT_FALSE(HashesEqual(a, b));
  b = a;
  b[0] ^= 0x80;
  EXPECT_FALSE(HashesEqual(a, b));
}

TEST(TokenTest, TenantKeyNamesItsTenant) {
  absl::StatusOr<std::string> key = NewTenantKey("team-7");
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(key->rfind("tsk_team-7.", 0), 0u);
  EXPECT_EQ(TenantIdOfKey(*key), "team-7");
  EXPECT_NE(*key, *NewTenantKey("team-7"));
}

TEST(TokenTest, MalformedKeysNameNoTenant) {
  for (const char* key : {"", "tsk_", "tsk_.abc", "abc", "tsk_alpha", "TSK_alpha.x"}) {
    EXPECT_EQ(TenantIdOfKey(key), "") << key;
  }
}

}  // namespace
}  // namespace tessera
