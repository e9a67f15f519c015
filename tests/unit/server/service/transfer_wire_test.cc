#include "server/service/transfer_wire.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

// `bytes` as a received message cut into slices at `cuts` (increasing offsets).
grpc::ByteBuffer Received(const std::string& bytes, const std::vector<size_t>& cuts = {}) {
  std::vector<grpc::Slice> slices;
  size_t from = 0;
  for (size_t cut : cuts) {
    slices.emplace_back(bytes.data() + from, cut - from);
    from = cut;
  }
  slices.emplace_back(bytes.data() + from, bytes.size() - from);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Chunk(uint64_t offset, const std::string& data) {
  v1::WriteTensorRequest request;
  request.mutable_chunk()->set_offset(offset);
  request.mutable_chunk()->set_data(data);
  return request.SerializeAsString();
}

std::string Joined(const ChunkView& chunk) {
  std::string out;
  for (absl::string_view piece : chunk.pieces) out.append(piece.data(), piece.size());
  return out;
}

// Every piece lies inside one of the message's slices: the view copied nothing.
bool InsideSlices(const ChunkView& chunk) {
  for (absl::string_view piece : chunk.pieces) {
    bool inside = false;
    for (const grpc::Slice& slice : chunk.slices) {
      const char* begin = reinterpret_cast<const char*>(slice.begin());
      inside =
          inside || (piece.data() >= begin && piece.data() + piece.size() <= begin + slice.size());
    }
    if (!inside) return false;
  }
  return true;
}

TEST(FindChunkTest, FindsTheDataWhereItLiesAcrossAnySlicing) {
  std::string data(300, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 13);
  for (uint64_t offset : {uint64_t{0}, uint64_t{5}, uint64_t{1} << 40, ~uint64_t{0}}) {
    const std::string bytes = Chunk(offset, data);
    // Every single cut, and slices of 7 bytes (varints and tags split between slices).
    std::vector<std::vector<size_t>> slicings = {{}};
    for (size_t cut = 1; cut < bytes.size(); ++cut) slicings.push_back({cut});
    std::vector<size_t> sevens;
    for (size_t cut = 7; cut < bytes.size(); cut += 7) sevens.push_back(cut);
    slicings.push_back(sevens);
    for (const std::vector<size_t>& cuts : slicings) {
      ChunkView chunk;
      absl::StatusOr<bool> found = FindChunk(Received(bytes, cuts), &chunk);
      ASSERT_TRUE(found.ok()) << found.status();
      ASSERT_TRUE(*found);
      EXPECT_EQ(chunk.offset, offset);
      EXPECT_EQ(chunk.size, data.size());
      EXPECT_EQ(Joined(chunk), data);
      EXPECT_TRUE(InsideSlices(chunk));
      EXPECT_LE(chunk.pieces.size(), cuts.size() + 1);
    }
  }
}

TEST(FindChunkTest, LeavesOtherFormsToProtobuf) {
  auto found = [](const std::string& bytes) {
    ChunkView chunk;
    absl::StatusOr<bool> result = FindChunk(Received(bytes), &chunk);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() && *result;
  };
  v1::WriteTensorRequest header;
  header.mutable_header()->set_handle("tn_1");
  EXPECT_FALSE(found(header.SerializeAsString()));
  EXPECT_FALSE(found(""));
  EXPECT_FALSE(found(Chunk(3, "")));  // no data: empty bytes, refused by the caller
  // Data before the offset, an unknown field inside or after the chunk, a repeated offset,
  // two chunks (protobuf merges them).
  EXPECT_FALSE(found(std::string("\x12\x05\x12\x01x\x08\x03", 7)));
  EXPECT_FALSE(found(std::string("\x12\x05\x18\x01\x12\x01x", 7)));
  EXPECT_FALSE(found(Chunk(1, "x") + std::string("\x18\x01", 2)));
  EXPECT_FALSE(found(std::string("\x12\x07\x08\x01\x08\x02\x12\x01x", 9)));
  EXPECT_FALSE(found(Chunk(1, "x") + Chunk(2, "y")));
  // Each of those parses with protobuf as the chunk it is.
  v1::WriteTensorRequest request;
  ASSERT_TRUE(ParseMessage(Received(std::string("\x12\x05\x12\x01x\x08\x03", 7)), &request));
  EXPECT_EQ(request.chunk().offset(), 3u);
  EXPECT_EQ(request.chunk().data(), "x");
}

TEST(FindChunkTest, NamesTheFieldOfBytesThatAreNoMessage) {
  auto error = [](const std::string& bytes) {
    ChunkView chunk;
    absl::StatusOr<bool> result = FindChunk(Received(bytes), &chunk);
    EXPECT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(result.status().message());
  };
  const std::string whole = Chunk(9, std::string(200, 'z'));
  EXPECT_THAT(error(whole.substr(0, whole.size() - 1)), HasSubstr("chunk's length"));
  // offset 9, then data that claims 10 bytes and has 2.
  EXPECT_THAT(
      error(std::string("\x12\x06\x08\x09\x12\x0a"
                        "zz",
                        8)),
      HasSubstr("chunk.data's length (10 bytes) runs past the message's end (2 bytes left)"));
  EXPECT_THAT(error(std::string("\x12\x09\x08\x01", 4)), HasSubstr("chunk's length (9 bytes)"));
  EXPECT_THAT(error(std::string("\x12\x0b\x08") + std::string(10, '\xff')),
              HasSubstr("chunk.offset"));
  EXPECT_THAT(error(std::string("\x12") + std::string(11, '\xff')), HasSubstr("chunk's length"));
  // The same bytes do not parse with protobuf either.
  v1::WriteTensorRequest request;
  EXPECT_FALSE(ParseMessage(Received(whole.substr(0, whole.size() - 1)), &request));
}

TEST(ReadReplyPrefixTest, PrefixAndDataAreWhatProtobufWrites) {
  v1::TensorInfo info;
  info.set_handle("tn_0123456789abcdef");
  info.set_size_bytes(1 << 20);
  for (bool first : {true, false}) {
    for (uint64_t offset : {uint64_t{0}, uint64_t{1}, uint64_t{200}, ~uint64_t{0}}) {
      for (size_t size : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{70000}}) {
        const std::string data(size, 'd');
        v1::ReadTensorResponse expected;
        if (first) *expected.mutable_info() = info;
        expected.mutable_chunk()->set_offset(offset);
        expected.mutable_chunk()->set_data(data);
        EXPECT_EQ(ReadReplyPrefix(first ? &info : nullptr, offset, size) + data,
                  expected.SerializeAsString())
            << "first " << first << ", offset " << offset << ", size " << size;
      }
    }
  }
}

TEST(SerializeMessageTest, RoundTrips) {
  v1::TensorInfo info;
  info.set_handle("tn_1");
  info.set_size_bytes(42);
  grpc::ByteBuffer buffer;
  SerializeMessage(info, &buffer);
  v1::TensorInfo back;
  ASSERT_TRUE(ParseMessage(buffer, &back));
  EXPECT_EQ(back.handle(), "tn_1");
  EXPECT_EQ(back.size_bytes(), 42u);
  EXPECT_TRUE(ParseMessage(grpc::ByteBuffer(), &back));  // no buffer: the empty message
  EXPECT_EQ(back.size_bytes(), 0u);
}

}  // namespace
}  // namespace tessera
