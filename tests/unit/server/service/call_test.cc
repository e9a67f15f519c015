#include "server/service/call.h"

#include <string>

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(ToGrpcStatusTest, KeepsCodeAndMessage) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  grpc::Status s = ToGrpcStatus(absl::ResourceExhaustedError("quota: 5 > 4"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "quota: 5 > 4");
  // Every absl code maps to the grpc code of the same meaning.
  EXPECT_EQ(ToGrpcStatus(absl::DataLossError("x")).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(ToGrpcStatus(absl::UnauthenticatedError("x")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ToGrpcStatus(absl::FailedPreconditionError("x")).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST(ToGrpcStatusTest, TruncatesLongMessages) {
  grpc::Status s = ToGrpcStatus(absl::InvalidArgumentError(std::string(5000, 'x')));
  EXPECT_EQ(s.error_message().size(), kMaxStatusMessageBytes);
  EXPECT_EQ(s.error_message().substr(kMaxStatusMessageBytes - 3), "...");
}

}  // namespace
}  // namespace tessera
