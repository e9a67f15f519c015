// A libFuzzer stand-in for compilers without -fsanitize=fuzzer (GCC): runs each target's seed
// corpus and then a bounded number of deterministic mutations of it, so that ctest exercises
// every fuzz target briefly in the normal build (docs/fuzzing.md). It takes the libFuzzer
// flags that matter here, so the tests call both kinds of binary alike:
//
//   <target> [-runs=N] [-max_total_time=S] [-seed=S] [-max_len=N] PATH...
//
// PATH is a corpus directory (every regular file in it, sorted) or one input file; with only
// files given (a reproducer) nothing is mutated. Exits 0 unless the target crashes (it aborts,
// as a sanitizer or a check would under libFuzzer).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

using Bytes = std::vector<uint8_t>;

// SplitMix64: small, fast, and the same sequence on every platform.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n); n > 0.
  size_t Below(size_t n) { return static_cast<size_t>(Next() % n); }

 private:
  uint64_t state_;
};

// Values that tend to sit on boundaries (as libFuzzer's "interesting" integers do).
constexpr uint8_t kInteresting[] = {0x00, 0x01, 0x02, 0x07, 0x08, 0x0a, 0x10, 0x1f, 0x20, 0x2c,
                                    0x30, 0x39, 0x3a, 0x40, 0x5b, 0x5d, 0x7f, 0x80, 0xfe, 0xff};

// One random edit of `in` (another corpus entry may be spliced in), at most `max_len` bytes.
Bytes Mutate(const Bytes& in, const std::vector<Bytes>& corpus, size_t max_len, Random& rng) {
  Bytes out = in;
  const int edits = 1 + static_cast<int>(rng.Below(4));
  for (int e = 0; e < edits; ++e) {
    switch (rng.Below(8)) {
      case 0:  // flip a bit
        if (!out.empty()) out[rng.Below(out.size())] ^= static_cast<uint8_t>(1u << rng.Below(8));
        break;
      case 1:  // a random byte
        if (!out.empty()) out[rng.Below(out.size())] = static_cast<uint8_t>(rng.Next());
        break;
      case 2:  // a boundary byte
        if (!out.empty()) {
          out[rng.Below(out.size())] = kInteresting[rng.Below(std::size(kInteresting))];
        }
        break;
      case 3: {  // insert a few bytes
        size_t at = rng.Below(out.size() + 1);
        size_t n = 1 + rng.Below(4);
        for (size_t i = 0; i < n; ++i) {
          out.insert(out.begin() + static_cast<std::ptrdiff_t>(at),
                     kInteresting[rng.Below(std::size(kInteresting))]);
        }
        break;
      }
      case 4: {  // erase a range
        if (out.empty()) break;
        size_t at = rng.Below(out.size());
        size_t n = 1 + rng.Below(std::min<size_t>(8, out.size() - at));
        out.erase(out.begin() + static_cast<std::ptrdiff_t>(at),
                  out.begin() + static_cast<std::ptrdiff_t>(at + n));
        break;
      }
      case 5: {  // duplicate a range
        if (out.empty()) break;
        size_t at = rng.Below(out.size());
        size_t n = 1 + rng.Below(std::min<size_t>(16, out.size() - at));
        Bytes piece(out.begin() + static_cast<std::ptrdiff_t>(at),
                    out.begin() + static_cast<std::ptrdiff_t>(at + n));
        size_t to = rng.Below(out.size() + 1);
        out.insert(out.begin() + static_cast<std::ptrdiff_t>(to), piece.begin(), piece.end());
        break;
      }
      case 6: {  // splice: a prefix of this one and a suffix of another
        const Bytes& other = corpus[rng.Below(corpus.size())];
        if (other.empty()) break;
        size_t cut = rng.Below(out.size() + 1);
        size_t from = rng.Below(other.size());
        out.resize(cut);
        out.insert(out.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
        break;
      }
      default:  // truncate
        if (!out.empty()) out.resize(rng.Below(out.size()));
        break;
    }
  }
  if (out.size() > max_len) out.resize(max_len);
  return out;
}

bool ReadFile(const std::filesystem::path& path, Bytes* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

bool Flag(const char* arg, const char* name, long long* value) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *value = std::atoll(arg + n + 1);
  return true;
}

void Run(const Bytes& input) {
  // A copy of exactly the input's size, so that ASan catches a read one past its end.
  Bytes copy(input);
  LLVMFuzzerTestOneInput(copy.empty() ? nullptr : copy.data(), copy.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  long long runs = 20000, max_total_time = 10, seed = 1, max_len = 4096;
  std::vector<std::filesystem::path> dirs, files;
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    if (Flag(arg, "-runs", &runs) || Flag(arg, "-max_total_time", &max_total_time) ||
        Flag(arg, "-seed", &seed) || Flag(arg, "-max_len", &max_len)) {
      continue;
    }
    if (arg[0] == '-') {
      std::fprintf(stderr, "ignoring flag %s (libFuzzer only)\n", arg);
      continue;
    }
    std::error_code ec;
    (std::filesystem::is_directory(arg, ec) ? dirs : files).emplace_back(arg);
  }

  std::vector<Bytes> corpus;
  std::vector<std::filesystem::path> paths = files;
  for (const auto& dir : dirs) {
    std::vector<std::filesystem::path> in_dir;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.is_regular_file()) in_dir.push_back(entry.path());
    }
    std::sort(in_dir.begin(), in_dir.end());
    paths.insert(paths.end(), in_dir.begin(), in_dir.end());
  }
  for (const auto& path : paths) {
    Bytes bytes;
    if (!ReadFile(path, &bytes)) {
      std::fprintf(stderr, "cannot read %s\n", path.c_str());
      return 1;
    }
    std::fprintf(stderr, "Running: %s\n", path.c_str());
    Run(bytes);
    corpus.push_back(std::move(bytes));
  }
  if (dirs.empty()) {
    std::fprintf(stderr, "Executed %zu inputs (no corpus directory: no mutations)\n",
                 corpus.size());
    return 0;
  }
  if (corpus.empty()) corpus.emplace_back();

  // Mutations, each of an entry of the seed corpus; deterministic for a given seed.
  Random rng(static_cast<uint64_t>(seed));
  const auto start = std::chrono::steady_clock::now();
  const auto limit = std::chrono::seconds(max_total_time);
  long long done = 0;
  for (; done < runs; ++done) {
    if ((done & 63) == 0 && max_total_time > 0 &&
        std::chrono::steady_clock::now() - start > limit) {
      break;
    }
    Run(Mutate(corpus[rng.Below(corpus.size())], corpus, static_cast<size_t>(max_len), rng));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "Executed %zu corpus inputs and %lld mutations in %.1f s (seed %lld)\n",
               corpus.size(), done, seconds, seed);
  return 0;
}
