#include "tessera/npy.h"

#include <cerrno>
#include <cstring>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tessera {
namespace {

constexpr absl::string_view kMagic = "\x93NUMPY";
// Largest array, in elements and in bytes (the server's limit, kernels::kMaxTensorBytes).
constexpr int64_t kMaxBytes = int64_t{1} << 62;
// Largest header ReadNpy accepts (NumPy writes well under 1 KiB; format 2.0 allows 4 GiB).
constexpr size_t kMaxHeaderBytes = size_t{1} << 20;

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

// The fixed part before the header dict: magic, version and the dict's length.
struct Preamble {
  size_t size = 0;        // 10 (format 1.0) or 12 (2.0, 3.0)
  size_t header_len = 0;  // bytes of the dict (with its padding and newline) after it
};

// `bytes` holds at least the first 10 bytes of the file (12 for format 2.0 and 3.0).
absl::StatusOr<Preamble> ParsePreamble(absl::string_view bytes) {
  if (bytes.size() < 10 || bytes.substr(0, 6) != kMagic) {
    return absl::InvalidArgumentError("not a .npy file (bad magic)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  Preamble preamble;
  if (major == 1) {
    preamble.header_len = static_cast<unsigned char>(bytes[8]) |
                          (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    preamble.size = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return absl::InvalidArgumentError(".npy file is truncated");
    for (int i = 0; i < 4; ++i) {
      preamble.header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i]))
                             << (8 * i);
    }
    preamble.size = 12;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(".npy format version ", major, " is not supported (1, 2, 3 are)"));
  }
  return preamble;
}

absl::StatusOr<NpyHeader> ParseHeader(absl::string_view header) {
  NpyHeader parsed;
  absl::StatusOr<std::string> descr = HeaderField(header, "descr");
  if (!descr.ok()) return descr.status();
  std::string d = std::string(absl::StripPrefix(absl::StripSuffix(*descr, "'"), "'"));
  if (d.size() == 3 && d[0] == '=') d[0] = '<';  // native order on this little-endian host
  if (d == "<u1" || d == "<b1") d[0] = '|';
  const DTypeDescr* found = nullptr;
  for (const DTypeDescr& k : kDescrs) {
    if (d == k.descr) found = &k;
  }
  if (found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        ".npy dtype ", d, " is not supported (little-endian f2, f4, f8, i4, i8, u1, b1 are)"));
  }
  parsed.dtype = found->dtype;
  parsed.descr = d;

  absl::StatusOr<std::string> fortran = HeaderField(header, "fortran_order");
  if (!fortran.ok()) return fortran.status();
  if (*fortran != "False") {
    return absl::InvalidArgumentError(
        ".npy array is in Fortran order; save it in C order (np.ascontiguousarray)");
  }
  absl::StatusOr<std::string> shape = HeaderField(header, "shape");
  if (!shape.ok()) return shape.status();
  parsed.shape_text = *shape;
  absl::string_view dims = absl::StripSuffix(absl::StripPrefix(*shape, "("), ")");
  int64_t count = 1;
  for (absl::string_view part : absl::StrSplit(dims, ',', absl::SkipWhitespace())) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &n) || n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(".npy shape ", *shape, " is malformed"));
    }
    parsed.shape.push_back(n);
    if (n != 0 && count > kMaxBytes / n) {
      return absl::InvalidArgumentError(absl::StrCat(".npy shape ", *shape, " is too large"));
    }
    count *= n;
  }
  // The byte count too: count * size must not wrap (2^62 elements of 8 bytes would read as 0).
  if (static_cast<uint64_t>(count) > static_cast<uint64_t>(kMaxBytes) / found->size) {
    return absl::InvalidArgumentError(
        absl::StrCat(".npy shape ", *shape, " of ", d, " is too large (more than 2^62 bytes)"));
  }
  parsed.data_bytes = static_cast<uint64_t>(count) * found->size;
  return parsed;
}

absl::Status WrongDataSize(const NpyHeader& header, absl::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat(".npy data is ", got, " bytes; shape ",
                                                 header.shape_text, " of ", header.descr, " needs ",
                                                 header.data_bytes));
}

absl::Status Labeled(absl::string_view name, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(name, ": ", status.message()));
}

// Reads up to `size` bytes (fewer only at the end of the stream); returns how many, or -1
// with errno set.
ssize_t ReadUpTo(int fd, char* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = read(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

absl::Status ReadError(absl::string_view name) {
  return absl::UnavailableError(absl::StrCat(name, ": read failed: ", std::strerror(errno)));
}

// Reads exactly `size` bytes; `what` names them for a stream that ends early.
absl::Status ReadExactly(int fd, char* data, size_t size, absl::string_view what) {
  ssize_t n = ReadUpTo(fd, data, size);
  if (n < 0) return absl::UnavailableError(absl::StrCat("read failed: ", std::strerror(errno)));
  if (static_cast<size_t>(n) < size) {
    return absl::InvalidArgumentError(absl::StrCat(".npy ", what, " is truncated"));
  }
  return absl::OkStatus();
}

// Writes every iovec, resuming after partial writes and EINTR.
absl::Status WriteAll(int fd, struct iovec* parts, int count, absl::string_view name) {
  while (count > 0) {
    ssize_t n = writev(fd, parts, count);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::UnavailableError(absl::StrCat(name, ": write failed: ", std::strerror(errno)));
    }
    size_t left = static_cast<size_t>(n);
    while (count > 0 && left >= parts->iov_len) {
      left -= parts->iov_len;
      ++parts;
      --count;
    }
    if (count > 0) {
      parts->iov_base = static_cast<char*>(parts->iov_base) + left;
      parts->iov_len -= left;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes) {
  absl::StatusOr<Preamble> preamble = ParsePreamble(bytes);
  if (!preamble.ok()) return preamble.status();
  if (bytes.size() - preamble->size < preamble->header_len) {
    return absl::InvalidArgumentError(".npy header is truncated");
  }
  absl::StatusOr<NpyHeader> header =
      ParseHeader(bytes.substr(preamble->size, preamble->header_len));
  if (!header.ok()) return header.status();
  absl::string_view data = bytes.substr(preamble->size + preamble->header_len);
  if (data.size() != header->data_bytes) return WrongDataSize(*header, absl::StrCat(data.size()));
  return NpyArray{header->dtype, std::move(header->shape), std::string(data)};
}

absl::StatusOr<std::string> FormatNpyHeader(v1::DType dtype, const std::vector<int64_t>& shape) {
  const DTypeDescr* found = nullptr;
  for (const DTypeDescr& k : kDescrs) {
    if (dtype == k.dtype) found = &k;
  }
  if (found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(v1::DType_Name(dtype), " has no .npy dtype; cast the tensor to f32 first"));
  }
  std::string shape_text = shape.size() == 1 ? absl::StrCat("(", shape[0], ",)")
                                             : absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
  std::string dict = absl::StrCat("{'descr': '", found->descr,
                                  "', 'fortran_order': False, 'shape': ", shape_text, ", }");
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
  for (size_t i = 0; i < (v2 ? 4u : 2u); ++i) {
    out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  }
  out += dict;
  return out;
}

absl::StatusOr<std::string> FormatNpy(const NpyArray& array) {
  absl::StatusOr<std::string> out = FormatNpyHeader(array.dtype, array.shape);
  if (!out.ok()) return out.status();
  out->reserve(out->size() + array.data.size());
  out->append(array.data);
  return out;
}

absl::StatusOr<NpyHeader> ReadNpyHeader(int fd, absl::string_view name) {
  // The preamble: 10 bytes, 12 for format 2.0 and 3.0.
  char fixed[12];
  ssize_t got = ReadUpTo(fd, fixed, 10);
  if (got < 0) return ReadError(name);
  if (got == 10 && fixed[6] != 1) {
    absl::Status more = ReadExactly(fd, fixed + 10, 2, "file");
    if (!more.ok()) return Labeled(name, more);
    got = 12;
  }
  absl::StatusOr<Preamble> preamble =
      ParsePreamble(absl::string_view(fixed, static_cast<size_t>(got)));
  if (!preamble.ok()) return Labeled(name, preamble.status());
  if (preamble->header_len > kMaxHeaderBytes) {
    return Labeled(name, absl::InvalidArgumentError(
                             absl::StrCat(".npy header is ", preamble->header_len,
                                          " bytes; at most ", kMaxHeaderBytes, " are read")));
  }
  std::string header_text(preamble->header_len, '\0');
  if (absl::Status s = ReadExactly(fd, header_text.data(), header_text.size(), "header"); !s.ok()) {
    return Labeled(name, s);
  }
  absl::StatusOr<NpyHeader> header = ParseHeader(header_text);
  if (!header.ok()) return Labeled(name, header.status());
  return header;
}

absl::StatusOr<NpyArray> ReadNpy(int fd, absl::string_view name) {
  absl::StatusOr<NpyHeader> header = ReadNpyHeader(fd, name);
  if (!header.ok()) return header.status();
  // A regular file says its size: refuse a wrong one before allocating for it.
  struct stat st;
  const off_t position = lseek(fd, 0, SEEK_CUR);
  if (position >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    const uint64_t left = st.st_size > position ? static_cast<uint64_t>(st.st_size - position) : 0;
    if (left != header->data_bytes) {
      return Labeled(name, WrongDataSize(*header, absl::StrCat(left)));
    }
  }
  NpyArray array{header->dtype, header->shape, std::string()};
  array.data.resize(static_cast<size_t>(header->data_bytes));
  ssize_t got = ReadUpTo(fd, array.data.data(), array.data.size());
  if (got < 0) return ReadError(name);
  if (static_cast<uint64_t>(got) < header->data_bytes) {
    return Labeled(name, WrongDataSize(*header, absl::StrCat(got)));
  }
  char extra;
  got = ReadUpTo(fd, &extra, 1);
  if (got < 0) return ReadError(name);
  if (got > 0) {
    return Labeled(name, WrongDataSize(*header, absl::StrCat("more than ", header->data_bytes)));
  }
  return array;
}

absl::Status WriteNpy(int fd, const NpyArray& array, absl::string_view name) {
  absl::StatusOr<std::string> header = FormatNpyHeader(array.dtype, array.shape);
  if (!header.ok()) return header.status();
  struct iovec parts[2] = {
      {header->data(), header->size()},
      {const_cast<char*>(array.data.data()), array.data.size()},
  };
  return WriteAll(fd, parts, 2, name);
}

absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  absl::StatusOr<NpyArray> array = ReadNpy(fd, path);
  close(fd);
  return array;
}

absl::Status WriteNpyFile(const std::string& path, const NpyArray& array) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat(path, ": cannot write: ", std::strerror(errno)));
  }
  absl::Status written = WriteNpy(fd, array, path);
  if (close(fd) != 0 && written.ok()) {
    written = absl::UnavailableError(absl::StrCat(path, ": write failed: ", std::strerror(errno)));
  }
  return written;
}

}  // namespace tessera
