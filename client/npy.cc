#include "tessera/npy.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tessera {
namespace {

constexpr absl::string_view kMagic = "\x93NUMPY";

struct DTypeDescr {
  v1::DType dtype;
  const char* descr;
  size_t size;
};
constexpr DTypeDescr kDescrs[] = {
    {v1::DTYPE_F32, "<f4", 4},  {v1::DTYPE_F16, "<f2", 2}, {v1::DTYPE_F64, "<f8", 8},
    {v1::DTYPE_I32, "<i4", 4},  {v1::DTYPE_I64, "<i8", 8}, {v1::DTYPE_U8, "|u1", 1},
    {v1::DTYPE_BOOL, "|b1", 1},
};

// The value after `'key':` in the header dict, up to the next top-level comma.
absl::StatusOr<std::string> HeaderField(absl::string_view header, absl::string_view key) {
  std::string quoted = absl::StrCat("'", key, "'");
  size_t at = header.find(quoted);
  if (at == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(".npy header has no ", key));
  }
  absl::string_view rest = header.substr(at + quoted.size());
  rest = absl::StripLeadingAsciiWhitespace(rest);
  if (!absl::ConsumePrefix(&rest, ":")) {
    return absl::InvalidArgumentError(".npy header is malformed");
  }
  rest = absl::StripLeadingAsciiWhitespace(rest);
  size_t end = 0;
  int depth = 0;
  for (; end < rest.size(); ++end) {
    char c = rest[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if ((c == ',' || c == '}') && depth == 0) break;
  }
  return std::string(absl::StripAsciiWhitespace(rest.substr(0, end)));
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes) {
  if (bytes.size() < 10 || bytes.substr(0, 6) != kMagic) {
    return absl::InvalidArgumentError("not a .npy file (bad magic)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len, start;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) |
                 (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return absl::InvalidArgumentError(".npy file is truncated");
    header_len = 0;
    for (int i = 0; i < 4; ++i) {
      header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    }
    start = 12;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(".npy format version ", major, " is not supported (1, 2, 3 are)"));
  }
  if (bytes.size() < start + header_len)
    return absl::InvalidArgumentError(".npy header is truncated");
  absl::string_view header = bytes.substr(start, header_len);

  absl::StatusOr<std::string> descr = HeaderField(header, "descr");
  if (!descr.ok()) return descr.status();
  std::string d = std::string(absl::StripPrefix(absl::StripSuffix(*descr, "'"), "'"));
  if (d.size() == 3 && d[0] == '=') d[0] = '<';  // native order on this little-endian host
  if (d == "<u1" || d == "<b1") d[0] = '|';
  NpyArray array;
  const DTypeDescr* found = nullptr;
  for (const DTypeDescr& k : kDescrs) {
    if (d == k.descr) found = &k;
  }
  if (found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        ".npy dtype ", d, " is not supported (little-endian f2, f4, f8, i4, i8, u1, b1 are)"));
  }
  array.dtype = found->dtype;

  absl::StatusOr<std::string> fortran = HeaderField(header, "fortran_order");
  if (!fortran.ok()) return fortran.status();
  if (*fortran != "False") {
    return absl::InvalidArgumentError(
        ".npy array is in Fortran order; save it in C order (np.ascontiguousarray)");
  }
  absl::StatusOr<std::string> shape = HeaderField(header, "shape");
  if (!shape.ok()) return shape.status();
  absl::string_view dims = absl::StripSuffix(absl::StripPrefix(*shape, "("), ")");
  int64_t count = 1;
  for (absl::string_view part : absl::StrSplit(dims, ',', absl::SkipWhitespace())) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &n) || n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(".npy shape ", *shape, " is malformed"));
    }
    array.shape.push_back(n);
    if (n != 0 && count > (int64_t{1} << 62) / n) {
      return absl::InvalidArgumentError(".npy shape is too large");
    }
    count *= n;
  }
  uint64_t expected = static_cast<uint64_t>(count) * found->size;
  absl::string_view data = bytes.substr(start + header_len);
  if (data.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(".npy data is ", data.size(), " bytes; shape ",
                                                   *shape, " of ", d, " needs ", expected));
  }
  array.data = std::string(data);
  return array;
}

absl::StatusOr<std::string> FormatNpy(const NpyArray& array) {
  const DTypeDescr* found = nullptr;
  for (const DTypeDescr& k : kDescrs) {
    if (array.dtype == k.dtype) found = &k;
  }
  if (found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        v1::DType_Name(array.dtype), " has no .npy dtype; cast the tensor to f32 first"));
  }
  std::string shape = array.shape.size() == 1
                          ? absl::StrCat("(", array.shape[0], ",)")
                          : absl::StrCat("(", absl::StrJoin(array.shape, ", "), ")");
  std::string dict = absl::StrCat("{'descr': '", found->descr,
                                  "', 'fortran_order': False, 'shape': ", shape, ", }");
  // Pad so that the data starts on a 64-byte boundary; the header ends with a newline.
  bool v2 = dict.size() + 12 + 1 > 65535;
  size_t prefix = v2 ? 12 : 10;
  size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string out(kMagic);
  out.push_back(static_cast<char>(v2 ? 2 : 1));
  out.push_back(0);
  size_t len = dict.size();
  for (size_t i = 0; i < (v2 ? 4u : 2u); ++i)
    out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out += dict;
  out += array.data;
  return out;
}

absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  absl::StatusOr<NpyArray> array = ParseNpy(buffer.str());
  if (!array.ok()) {
    return absl::Status(array.status().code(), absl::StrCat(path, ": ", array.status().message()));
  }
  return array;
}

absl::Status WriteNpyFile(const std::string& path, const NpyArray& array) {
  absl::StatusOr<std::string> bytes = FormatNpy(array);
  if (!bytes.ok()) return bytes.status();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
  if (!out) return absl::UnavailableError(absl::StrCat(path, ": cannot write"));
  return absl::OkStatus();
}

}  // namespace tessera
