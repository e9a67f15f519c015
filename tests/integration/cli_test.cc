// The `tessera` CLI (and tessera-server's --help and --version) as a user meets them, against
// a real server on loopback: help, version, every exit status, stdin/stdout pipes, size units,
// attribute errors, human and JSON output, the progress bar; and over the server's Unix socket,
// transfers through shared-memory regions (with the C++ client library underneath them).
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

#include "tessera/npy.h"
#include "tests/testing/server_fixture.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// The documented exit statuses (client/cli/command_tree.h).
constexpr int kOk = 0;
constexpr int kRefused = 1;
constexpr int kUsage = 2;
constexpr int kUnreachable = 3;

// A loopback port nothing listens on: bound, then closed.
int ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  close(fd);
  return ntohs(address.sin_port);
}

// Debian's python3 with numpy (python3-numpy), for the pipe tests; not whatever is first on
// PATH.
constexpr char kPython[] = "/usr/bin/python3";

bool HasNumpy() {
  auto result = testing::RunCommand({kPython, "-c", "import numpy"}, {});
  return result.ok() && result->exit_code == 0;
}

// `text` in single quotes for sh.
std::string Quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

class CliTest : public testing::ServerTest {
 protected:
  std::map<std::string, std::string> Env(const std::string& token = "") const {
    return {{"TESSERA_ADDR", server_->address()},
            {"TESSERA_TOKEN", token.empty() ? server_->AdminToken() : token}};
  }

  // Runs the CLI with `args`; stdout and stderr together.
  testing::CommandResult Cli(std::vector<std::string> args, const std::string& token = "") {
    args.insert(args.begin(), testing::CliBinary());
    auto result = testing::RunCommand(args, Env(token));
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : testing::CommandResult{};
  }

  // Runs a sh command line in which $TESSERA is the CLI and $PYTHON Debian's python3.
  testing::CommandResult Shell(const std::string& line, const std::string& token = "") {
    std::map<std::string, std::string> env = Env(token);
    env["TESSERA"] = testing::CliBinary();
    env["PYTHON"] = kPython;
    auto result = testing::RunCommand({"/bin/sh", "-c", line}, env);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : testing::CommandResult{};
  }

  // A tenant with a 2x3 f32 tensor of 2.5: its key and the tensor's handle.
  std::pair<std::string, std::string> TenantWithTensor() {
    const std::string key = MustRegister("alpha");
    auto run = Cli({"run", "fill", "--attr=shape=[2,3];value=2.5", "--output=json"}, key);
    EXPECT_EQ(run.exit_code, kOk) << run.output;
    v1::Job job;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(run.output, &job).ok()) << run.output;
    EXPECT_EQ(job.outputs_size(), 1);
    return {key, job.outputs_size() == 1 ? job.outputs(0).handle() : ""};
  }
};

// ---- help --------------------------------------------------------------------------------------

TEST_F(CliTest, HelpAtTheTopListsCommandsFlagsAndExitStatuses) {
  auto help = Cli({"--help"});
  EXPECT_EQ(help.exit_code, kOk) << help.output;
  EXPECT_THAT(help.output, StartsWith("Command-line client for a Tessera server"));
  EXPECT_THAT(help.output, HasSubstr("Usage: tessera [GLOBAL FLAGS] COMMAND"));
  for (const char* command :
       {"tenant register ID", "tenant rotate-key ID", "server info", "mps status",
        "tensor put FILE|-", "tensor get HANDLE", "run KERNEL", "kernel define [NAME]",
        "region list", "region rm HANDLE...", "usage", "help [COMMAND...]", "completion bash"}) {
    EXPECT_THAT(help.output, HasSubstr(command));
  }
  EXPECT_THAT(help.output, HasSubstr("--addr=HOST:PORT"));
  EXPECT_THAT(help.output, HasSubstr("--output=text|json"));
  EXPECT_THAT(help.output, HasSubstr("Exit status:"));
  EXPECT_THAT(help.output, HasSubstr("3  could not reach the server"));
  EXPECT_THAT(help.output, Not(HasSubstr("No flags matched")));
  EXPECT_EQ(Cli({"-h"}).output, help.output);
  auto help_command = Cli({"help"});
  EXPECT_EQ(help_command.exit_code, kOk);
  EXPECT_EQ(help_command.output, help.output);
}

TEST_F(CliTest, HelpPerCommandWithExamples) {
  auto help = Cli({"tenant", "register", "--help"});
  EXPECT_EQ(help.exit_code, kOk) << help.output;
  EXPECT_THAT(help.output, HasSubstr("Usage: tessera tenant register ID --memory=SIZE"));
  EXPECT_THAT(help.output, HasSubstr("--memory=SIZE"));
  EXPECT_THAT(help.output, HasSubstr("--compute_share=N"));
  EXPECT_THAT(help.output, HasSubstr("Examples:\n  tessera tenant register alpha --memory=2Gi"));
  EXPECT_THAT(help.output, HasSubstr("Global flags"));
  EXPECT_THAT(help.output, Not(HasSubstr("--page_size")));  // tenant list's
  EXPECT_EQ(Cli({"help", "tenant", "register"}).output, help.output);

  auto get = Cli({"tensor", "get", "--help"});
  EXPECT_EQ(get.exit_code, kOk);
  EXPECT_THAT(get.output, HasSubstr("-o FILE"));
  EXPECT_THAT(get.output, HasSubstr("-o - | python3"));

  auto group = Cli({"tenant", "--help"});
  EXPECT_EQ(group.exit_code, kOk);
  for (const char* verb :
       {"register ID", "get ID", "list", "update ID", "deregister ID", "rotate-key ID"}) {
    EXPECT_THAT(group.output, HasSubstr(verb));
  }
  auto unknown = Cli({"help", "frobnicate"});
  EXPECT_EQ(unknown.exit_code, kUsage);
  EXPECT_THAT(unknown.output, HasSubstr("unknown command \"frobnicate\""));
}

TEST_F(CliTest, CompletionScriptIsValidBash) {
  auto script = Cli({"completion", "bash"});
  EXPECT_EQ(script.exit_code, kOk);
  EXPECT_THAT(script.output, HasSubstr("complete -o default -F _tessera tessera"));
  EXPECT_THAT(script.output, HasSubstr("\"tenant register\"|\"tenant register \"*)"));
  if (access("/bin/bash", X_OK) == 0) {
    auto checked = Shell("\"$TESSERA\" completion bash | /bin/bash -n");
    EXPECT_EQ(checked.exit_code, 0) << checked.output;
  }
}

// ---- version -----------------------------------------------------------------------------------

TEST_F(CliTest, VersionOfTheCliAndTheServer) {
  auto version = Cli({"--version"});
  EXPECT_EQ(version.exit_code, kOk) << version.output;
  EXPECT_TRUE(std::regex_search(version.output, std::regex(R"(^tessera \d+\.\d+\.\d+ \(git )")))
      << version.output;
  EXPECT_THAT(version.output, Not(HasSubstr("NDEBUG")));

  auto server = testing::RunCommand({testing::ServerBinary(), "--version"}, {});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(server->exit_code, 0) << server->output;
  EXPECT_TRUE(std::regex_search(server->output, std::regex(R"(^tessera-server \d+\.\d+\.\d+\n)")))
      << server->output;
  EXPECT_THAT(server->output, HasSubstr("build type:"));
  EXPECT_THAT(server->output, HasSubstr("git revision:"));
  EXPECT_THAT(server->output, HasSubstr("CUDA toolkit:"));
  // The allocator the process actually runs on (the library the loader bound malloc to).
#if TESSERA_SERVER_TCMALLOC
  EXPECT_TRUE(std::regex_search(
      server->output, std::regex(R"(\nallocator: +tcmalloc \(gperftools \d+\.\d+.*libtcmalloc)")))
      << server->output;
#else
  EXPECT_THAT(server->output, HasSubstr("allocator:    malloc from "));
#endif
  // The server and the CLI come from one build: the same version.
  const std::string cli_version = version.output.substr(8, version.output.find(' ', 8) - 8);
  EXPECT_THAT(server->output, StartsWith(absl::StrCat("tessera-server ", cli_version, "\n")));
}

TEST_F(CliTest, ServerHelpListsEveryFlagByTopicWithDefaults) {
  auto help = testing::RunCommand({testing::ServerBinary(), "--help"}, {});
  ASSERT_TRUE(help.ok()) << help.status();
  EXPECT_EQ(help->exit_code, 0) << help->output;
  EXPECT_THAT(help->output, Not(HasSubstr("No flags matched")));
  for (const char* topic : {"\nServing:\n", "\nTLS:\n", "\nBackend and admission:\n", "\nMPS:\n",
                            "\nMetrics:\n", "\nLogging:\n"}) {
    EXPECT_THAT(help->output, HasSubstr(topic));
  }
  EXPECT_THAT(help->output, HasSubstr("--listen (default: 127.0.0.1:50051)"));
  EXPECT_THAT(help->output, HasSubstr("--backend (default: auto)"));

  // Every flag that absl's --helpfull lists for server/main.cc is in --help.
  auto full = testing::RunCommand({testing::ServerBinary(), "--helpfull"}, {});
  ASSERT_TRUE(full.ok()) << full.status();
  const size_t section = full->output.find("Flags from server/main.cc:");
  ASSERT_NE(section, std::string::npos) << full->output;
  const size_t end = full->output.find("Flags from", section + 1);
  const std::string flags = full->output.substr(section, end - section);
  std::set<std::string> names;
  const std::regex flag(R"(--([a-z0-9_]+) \()");
  for (auto it = std::sregex_iterator(flags.begin(), flags.end(), flag);
       it != std::sregex_iterator(); ++it) {
    names.insert((*it)[1]);
  }
  EXPECT_GT(names.size(), 25u);
  for (const std::string& name : names) {
    EXPECT_THAT(help->output, HasSubstr(absl::StrCat("  --", name, " (default: "))) << name;
  }
}

// ---- exit statuses -----------------------------------------------------------------------------

TEST_F(CliTest, ExitStatusZeroAndOneForWhatTheServerSays) {
  EXPECT_EQ(Cli({"tenant", "list"}).exit_code, kOk);
  auto missing = Cli({"tenant", "get", "nobody"});
  EXPECT_EQ(missing.exit_code, kRefused);
  EXPECT_THAT(missing.output, HasSubstr("NOT_FOUND"));
  auto denied = Cli({"server", "info"}, "wrong-token");
  EXPECT_EQ(denied.exit_code, kRefused);
  EXPECT_THAT(denied.output, HasSubstr("UNAUTHENTICATED"));
  auto quota = Cli({"tenant", "register", "big", "--memory=1Pi"});
  EXPECT_EQ(quota.exit_code, kRefused) << quota.output;
  EXPECT_THAT(quota.output, HasSubstr("RESOURCE_EXHAUSTED"));
}

TEST_F(CliTest, ExitStatusTwoForUsageErrors) {
  ASSERT_EQ(Cli({"tenant", "register", "alpha", "--memory=1Gi", "--display_name=Alpha"}).exit_code,
            kOk);
  struct Case {
    std::vector<std::string> args;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {{}, "no command given"},
           {{"frobnicate"}, "unknown command \"frobnicate\""},
           {{"tenant"}, "which command?"},
           {{"tenant", "frobnicate"}, "unknown command \"frobnicate\""},
           {{"tenant", "list", "--frobnicate"}, "unknown flag --frobnicate"},
           {{"--frobnicate", "tenant", "list"}, "unknown flag --frobnicate"},
           {{"tenant", "get", "alpha", "--display_name=oops"},
            "--display_name does not apply to `tenant get`"},
           {{"tenant", "get", "alpha", "--memory=1Gi"}, "--memory does not apply"},
           {{"tenant", "get"}, "ID is required"},
           {{"tenant", "get", "alpha", "beta"}, "unexpected argument \"beta\""},
           {{"tenant", "register", "x", "--memory=lots"}, "\"lots\" is not a size"},
           {{"tenant", "register", "x", "--memory=1m"}, "milli"},
           {{"tenant", "register", "x", "--memory=0"}, "more than 0"},
           {{"tenant", "register", "x", "--memory=1Gi", "--compute_share=0"}, "--compute_share"},
           {{"tenant", "register", "x", "--memory=1Gi", "--compute_share=lots"}, "--compute_share"},
           {{"tenant", "register", "x", "--memory=1Gi", "--priority=high"}, "--priority"},
           {{"tenant", "register", "x", "--memory=1Gi", "--labels=team"}, "not key=value"},
           {{"tenant", "update", "alpha"}, "give --display_name and/or --labels"},
           {{"tenant", "list", "--output=yaml"}, "--output"},
           {{"tenant", "list", "--timeout=soon"}, "not a duration"},
           {{"tensor", "get", "t_x"}, "-o is required"},
           {{"tensor", "put", "/nonexistent/x.npy"}, "cannot read /nonexistent/x.npy"},
           {{"tensor", "get", "t_x", "-o", "/nonexistent/dir/x.npy"}, "cannot write"},
           {{"tensor", "put", "x.npy", "--chunk=0"}, "chunk size"},
           {{"run"}, "KERNEL is required"},
           {{"run", "fill", "--attr=shape"}, "is not k=v"},
           {{"run", "fill", "--attr=shape=[a]"}, "list item \"a\""},
           {{"kernel", "define", "--file=/nonexistent.tk"}, "cannot read"},
       }) {
    auto result = Cli(c.args);
    EXPECT_EQ(result.exit_code, kUsage) << absl::StrJoin(c.args, " ") << "\n" << result.output;
    EXPECT_THAT(result.output, HasSubstr(c.says)) << absl::StrJoin(c.args, " ");
    EXPECT_THAT(result.output, HasSubstr("--help` for usage")) << absl::StrJoin(c.args, " ");
  }
  // The refused flag changed nothing.
  auto alpha = Cli({"tenant", "get", "alpha"});
  EXPECT_THAT(alpha.output, HasSubstr("display_name:    Alpha\n"));
}

TEST_F(CliTest, UsageErrorsAreFoundBeforeAnyCall) {
  // No server at this address: a command that got as far as a call would exit 3.
  const std::string nowhere = absl::StrCat("--addr=127.0.0.1:", ClosedPort());
  auto no_memory = Cli({"tenant", "register", "beta", nowhere});
  EXPECT_EQ(no_memory.exit_code, kUsage) << no_memory.output;
  EXPECT_THAT(no_memory.output, HasSubstr("--memory is required"));
  EXPECT_EQ(Cli({"tenant", "get", "alpha", "--display_name=oops", nowhere}).exit_code, kUsage);
  EXPECT_EQ(Cli({"tenant", "register", "x", "--memory=lots", nowhere}).exit_code, kUsage);
  EXPECT_EQ(Cli({"run", "sum", "--attr=axes=[1,x]", nowhere}).exit_code, kUsage);
  EXPECT_EQ(Cli({"tensor", "put", "/nonexistent.npy", nowhere}).exit_code, kUsage);
}

TEST_F(CliTest, ExitStatusThreeWhenTheServerCannotBeReached) {
  const std::string nowhere = absl::StrCat("--addr=127.0.0.1:", ClosedPort());
  auto refused = Cli({"server", "info", nowhere});
  EXPECT_EQ(refused.exit_code, kUnreachable) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("could not reach the server at 127.0.0.1:"));
  EXPECT_THAT(refused.output, HasSubstr("--addr or $TESSERA_ADDR"));
  auto registering = Cli({"tenant", "register", "x", "--memory=1Gi", nowhere});
  EXPECT_EQ(registering.exit_code, kUnreachable) << registering.output;
  auto usage = Cli({"usage", nowhere});
  EXPECT_EQ(usage.exit_code, kUnreachable) << usage.output;
}

// ---- pipes -------------------------------------------------------------------------------------

TEST_F(CliTest, TensorGetWritesStdoutForAPipe) {
  if (!HasNumpy()) GTEST_SKIP() << kPython << " cannot import numpy (python3-numpy)";
  const auto [key, handle] = TenantWithTensor();
  // numpy.load needs a seekable file: hence io.BytesIO.
  auto piped = Shell(absl::StrCat("\"$TESSERA\" tensor get ", handle,
                                  " -o - | \"$PYTHON\" -c 'import io, numpy, sys; "
                                  "a = numpy.load(io.BytesIO(sys.stdin.buffer.read())); "
                                  "print(a.dtype, a.shape, float(a.sum()))'"),
                     key);
  EXPECT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_EQ(piped.output, "float32 (2, 3) 15.0\n");

  // stdout carries the array and nothing else; nothing named "-" is written.
  testing::TempDir files;
  auto redirected = Shell(absl::StrCat("cd ", Quoted(files.path()), " && \"$TESSERA\" tensor get ",
                                       handle, " -o - > out.npy"),
                          key);
  EXPECT_EQ(redirected.exit_code, 0) << redirected.output;
  EXPECT_EQ(redirected.output, "");
  auto array = ReadNpyFile(files.File("out.npy"));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->shape, (std::vector<int64_t>{2, 3}));
  float first;
  std::memcpy(&first, array->data.data(), 4);
  EXPECT_EQ(first, 2.5f);
  EXPECT_NE(access(files.File("-").c_str(), F_OK), 0);
}

TEST_F(CliTest, TensorPutReadsStdin) {
  if (!HasNumpy()) GTEST_SKIP() << kPython << " cannot import numpy (python3-numpy)";
  const std::string key = MustRegister("alpha");
  auto put = Shell(
      "\"$PYTHON\" -c 'import numpy, sys; numpy.save(sys.stdout.buffer, "
      "numpy.arange(6, dtype=numpy.float32).reshape(2, 3))' | \"$TESSERA\" tensor put -",
      key);
  ASSERT_EQ(put.exit_code, 0) << put.output;
  const std::string handle(absl::StripAsciiWhitespace(put.output));
  auto tenant = ClientWith(key);
  auto info = tenant->GetTensor(handle);
  ASSERT_TRUE(info.ok()) << info.status() << " for " << put.output;
  EXPECT_EQ(info->dtype(), v1::DTYPE_F32);
  EXPECT_THAT(info->shape(), ::testing::ElementsAre(2, 3));
  auto bytes = tenant->Download(handle);
  ASSERT_TRUE(bytes.ok());
  std::vector<float> values(6);
  std::memcpy(values.data(), bytes->data(), 24);
  EXPECT_THAT(values, ::testing::ElementsAre(0, 1, 2, 3, 4, 5));

  // A redirected file on stdin, and garbage on stdin.
  testing::TempDir files;
  NpyArray array{v1::DTYPE_I32, {3}, std::string(12, '\1')};
  ASSERT_TRUE(WriteNpyFile(files.File("x.npy"), array).ok());
  auto redirected =
      Shell(absl::StrCat("\"$TESSERA\" tensor put - < ", Quoted(files.File("x.npy"))), key);
  EXPECT_EQ(redirected.exit_code, 0) << redirected.output;
  auto garbage = Shell("echo 'not an array' | \"$TESSERA\" tensor put -", key);
  EXPECT_EQ(garbage.exit_code, kUsage) << garbage.output;
  EXPECT_THAT(garbage.output, HasSubstr("stdin: not a .npy file"));
  // The data cut short: 6 of its 12 bytes.
  const uintmax_t size = std::filesystem::file_size(files.File("x.npy"));
  auto truncated = Shell(absl::StrCat("head -c ", size - 6, " ", Quoted(files.File("x.npy")),
                                      " | \"$TESSERA\" tensor put -"),
                         key);
  EXPECT_EQ(truncated.exit_code, kUsage) << truncated.output;
  EXPECT_THAT(truncated.output,
              HasSubstr("stdin: .npy data is 6 bytes; shape (3,) of <i4 needs 12"));
}

TEST_F(CliTest, KernelDefinitionAndTokenFromStdin) {
  const std::string key = MustRegister("alpha");
  auto defined = Shell(
      "echo 'kernel swish(x: f32) -> (y: f32) { y = x * sigmoid(x) }' | "
      "\"$TESSERA\" kernel define --file -",
      key);
  EXPECT_EQ(defined.exit_code, 0) << defined.output;
  EXPECT_THAT(defined.output, HasSubstr("defined swish"));
  auto mismatch = Shell(
      "echo 'kernel swish2(x: f32) -> (y: f32) { y = x }' | "
      "\"$TESSERA\" kernel define other --file -",
      key);
  EXPECT_EQ(mismatch.exit_code, kUsage);
  EXPECT_THAT(mismatch.output, HasSubstr("defines \"swish2\", not \"other\""));

  auto token = Shell(absl::StrCat("echo ", key,
                                  " | TESSERA_TOKEN= \"$TESSERA\" --token_file=- "
                                  "kernel ls"));
  EXPECT_EQ(token.exit_code, 0) << token.output;
  EXPECT_THAT(token.output, HasSubstr("kernel swish"));
  auto both = Shell("echo x | \"$TESSERA\" --token_file=- tensor put -", key);
  EXPECT_EQ(both.exit_code, kUsage);
  EXPECT_THAT(both.output, HasSubstr("cannot both read stdin"));
}

// ---- units, attributes, formatting, JSON --------------------------------------------------------

TEST_F(CliTest, DecimalAndBinarySizesRegisterDifferentQuotas) {
  auto decimal = Cli({"tenant", "register", "dec", "--memory=1G"});
  ASSERT_EQ(decimal.exit_code, kOk) << decimal.output;
  EXPECT_THAT(decimal.output, HasSubstr("memory quota:    1 GB (1,000,000,000 bytes)"));
  EXPECT_THAT(decimal.output, HasSubstr("decimal units"));
  auto binary = Cli({"tenant", "register", "bin", "--memory=1Gi"});
  ASSERT_EQ(binary.exit_code, kOk) << binary.output;
  EXPECT_THAT(binary.output, HasSubstr("memory quota:    1 GiB (1,073,741,824 bytes)"));
  EXPECT_THAT(binary.output, Not(HasSubstr("decimal")));

  auto dec = admin_->GetTenant("dec");
  auto bin = admin_->GetTenant("bin");
  ASSERT_TRUE(dec.ok() && bin.ok());
  EXPECT_EQ(dec->quota().device_memory_bytes(), 1'000'000'000u);
  EXPECT_EQ(bin->quota().device_memory_bytes(), uint64_t{1} << 30);
  EXPECT_EQ(Cli({"tenant", "register", "gib", "--memory=2GiB"}).exit_code, kOk);
  EXPECT_EQ(admin_->GetTenant("gib")->quota().device_memory_bytes(), uint64_t{2} << 30);
}

TEST_F(CliTest, AttributeErrorsShowTheSyntax) {
  const auto [key, handle] = TenantWithTensor();
  auto scalar = Cli({"run", "sum", "--in=" + handle, "--attr=axes=1"}, key);
  EXPECT_EQ(scalar.exit_code, kRefused) << scalar.output;
  EXPECT_THAT(scalar.output, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(scalar.output, HasSubstr("axes must be ints"));
  EXPECT_THAT(scalar.output, HasSubstr("write --attr='axes=[1]'"));
  auto fixed = Cli({"run", "sum", "--in=" + handle, "--attr=axes=[1]"}, key);
  EXPECT_EQ(fixed.exit_code, kOk) << fixed.output;
  auto list = Cli({"run", "sum", "--in=" + handle, "--attr=axes=[1,x]"}, key);
  EXPECT_EQ(list.exit_code, kUsage);
  EXPECT_THAT(list.output, HasSubstr("lists hold ints ([0,1]) or floats"));
}

TEST_F(CliTest, ARefusalPastTheTenantsCallRateShowsTheServersRetryHint) {
  v1::RegisterTenantRequest request = Registration("slow");
  request.mutable_quota()->set_max_requests_in_flight(1);
  request.mutable_quota()->set_requests_per_second(1);  // a bucket of one call
  auto registered = admin_->RegisterTenant(request);
  ASSERT_TRUE(registered.ok()) << registered.status();
  const std::string key = registered->api_key();
  EXPECT_EQ(Cli({"usage"}, key).exit_code, kOk);
  // The next call within the second is refused (a refusal takes no token); a slow machine
  // may let a second pass, so try a few times.
  testing::CommandResult refused;
  for (int i = 0; i < 5 && refused.exit_code != kRefused; ++i) refused = Cli({"usage"}, key);
  EXPECT_EQ(refused.exit_code, kRefused) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_THAT(refused.output, HasSubstr("quota.requests_per_second"));
  EXPECT_THAT(refused.output, HasSubstr("hint: the server asks to retry in"));
  // The C++ client keeps the same hint on the status it returns.
  auto client = Client::Connect({.address = server_->address(), .token = key});
  ASSERT_TRUE(client.ok());
  absl::Status status;
  for (int i = 0; i < 5 && !absl::IsResourceExhausted(status); ++i) {
    status = (*client)->GetUsage().status();
  }
  ASSERT_TRUE(absl::IsResourceExhausted(status)) << status;
  const std::optional<absl::Duration> wait = RetryAfter(status);
  ASSERT_TRUE(wait.has_value());
  EXPECT_GT(*wait, absl::ZeroDuration());
  EXPECT_LE(*wait, absl::Seconds(1));
  EXPECT_FALSE(RetryAfter(absl::NotFoundError("x")).has_value());
}

TEST_F(CliTest, HumanOutputFormatsDurationsAndBytes) {
  const auto [key, handle] = TenantWithTensor();
  auto summed = Cli({"run", "sum", "--in=" + handle}, key);
  ASSERT_EQ(summed.exit_code, kOk) << summed.output;
  EXPECT_TRUE(std::regex_search(summed.output,
                                std::regex(R"(job \S+: SUCCEEDED in [0-9.]+ (ns|µs|ms|s)\n)")))
      << summed.output;
  auto usage = Cli({"usage"}, key);
  ASSERT_EQ(usage.exit_code, kOk) << usage.output;
  EXPECT_TRUE(std::regex_search(
      usage.output, std::regex(R"(\nbusy: +([0-9]{1,3}(\.[0-9]{1,2})? (ns|µs|ms|s)|0 s)\n)")))
      << usage.output;
  EXPECT_THAT(usage.output, HasSubstr("used of 1 GiB"));
  EXPECT_THAT(usage.output, HasSubstr("calls:   1 in flight (this one included), 0 refused past "
                                      "max_requests_in_flight, 0 past requests_per_second\n"));
  EXPECT_THAT(usage.output, HasSubstr("2 succeeded"));
  EXPECT_THAT(usage.output, HasSubstr("tensors: 2\n"));
  auto ls = Cli({"tensor", "ls"}, key);
  EXPECT_THAT(ls.output, HasSubstr("24 B"));
}

TEST_F(CliTest, JsonOutputIsMachineReadable) {
  const auto [key, handle] = TenantWithTensor();
  v1::Tenant tenant;
  auto get = Cli({"tenant", "get", "alpha", "--output=json"});
  ASSERT_EQ(get.exit_code, kOk);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.output, &tenant).ok()) << get.output;
  EXPECT_EQ(tenant.tenant_id(), "alpha");
  EXPECT_EQ(tenant.quota().device_memory_bytes(), testing::kGiB);

  v1::ListTenantsResponse tenants;
  auto list = Cli({"--output=json", "tenant", "list"});
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(list.output, &tenants).ok())
      << list.output;
  EXPECT_EQ(tenants.tenants_size(), 1);

  v1::Usage usage;
  auto usage_json = Cli({"usage", "--output=json"}, key);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(usage_json.output, &usage).ok())
      << usage_json.output;
  EXPECT_EQ(usage.tensors(), 1u);

  v1::ListTensorsResponse tensors;
  auto ls = Cli({"tensor", "ls", "--output=json"}, key);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ls.output, &tensors).ok()) << ls.output;
  ASSERT_EQ(tensors.tensors_size(), 1);
  EXPECT_EQ(tensors.tensors(0).handle(), handle);

  v1::ListTensorsResponse deleted;
  auto rm = Cli({"tensor", "rm", handle, "--output=json"}, key);
  ASSERT_EQ(rm.exit_code, kOk) << rm.output;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(rm.output, &deleted).ok()) << rm.output;
  ASSERT_EQ(deleted.tensors_size(), 1);
  EXPECT_EQ(deleted.tensors(0).size_bytes(), 24u);
}

// ---- whole workflows ---------------------------------------------------------------------------

TEST_F(CliTest, TenantLifecycle) {
  auto registered =
      Cli({"tenant", "register", "alpha", "--memory=2Gi", "--compute_share=30",
           "--display_name=Alpha team", "--labels=team=ml,env=dev", "--max_requests_in_flight=8"});
  ASSERT_EQ(registered.exit_code, kOk) << registered.output;
  EXPECT_THAT(registered.output, HasSubstr("api key:         tsk_alpha."));
  EXPECT_THAT(registered.output, HasSubstr("compute share:   30%"));
  // The request quotas: 8 given, the rate derived from the 30 % share.
  EXPECT_THAT(registered.output, HasSubstr("requests:        8 in flight, 300000 per second"));
  const std::string kind = v1::ContextKind_Name(ExpectedContextKind(30));
  EXPECT_THAT(registered.output, HasSubstr(absl::StrCat("context:         ",
                                                        absl::StripPrefix(kind, "CONTEXT_KIND_"))));

  auto listed = Cli({"tenant", "list"});
  ASSERT_EQ(listed.exit_code, kOk) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr("alpha"));
  EXPECT_THAT(listed.output, HasSubstr("2 GiB"));
  EXPECT_THAT(listed.output, HasSubstr("IN FLIGHT   CALLS/S"));
  EXPECT_THAT(listed.output, HasSubstr("        8    300000"));

  // A flag may come before the ID: --labels takes one argument.
  auto updated = Cli({"tenant", "update", "--labels", "env=prod", "alpha"});
  ASSERT_EQ(updated.exit_code, kOk) << updated.output;
  EXPECT_THAT(updated.output, HasSubstr("labels:          env=prod\n"));
  EXPECT_THAT(updated.output, HasSubstr("display_name:    Alpha team"));  // untouched
  auto cleared = Cli({"tenant", "update", "alpha", "--labels", ""});
  ASSERT_EQ(cleared.exit_code, kOk) << cleared.output;
  EXPECT_THAT(cleared.output, HasSubstr("labels:          \n"));

  auto quota = Cli({"tenant", "update", "alpha", "--memory=4Gi"});
  EXPECT_EQ(quota.exit_code, kRefused);
  EXPECT_THAT(quota.output, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(quota.output, HasSubstr("deregister the tenant and register it again"));

  auto rotated = Cli({"tenant", "rotate-key", "alpha"});
  ASSERT_EQ(rotated.exit_code, kOk) << rotated.output;
  EXPECT_THAT(rotated.output, HasSubstr("api key: tsk_alpha."));

  auto info = Cli({"server", "info"});
  ASSERT_EQ(info.exit_code, kOk) << info.output;
  EXPECT_THAT(info.output, HasSubstr("backend:    " + backend().name));
  EXPECT_THAT(info.output, HasSubstr("reserved 2 GiB of 8 GiB"));

  auto gone = Cli({"tenant", "deregister", "alpha"});
  ASSERT_EQ(gone.exit_code, kOk) << gone.output;
  EXPECT_THAT(gone.output, HasSubstr("released 2 GiB"));
  EXPECT_THAT(Cli({"tenant", "list"}).output, Not(HasSubstr("alpha")));
}

TEST_F(CliTest, TensorsKernelsAndUsage) {
  const auto [key, handle] = TenantWithTensor();
  testing::TempDir files;
  auto got = Cli({"tensor", "get", handle, "-o", files.File("x.npy")}, key);
  ASSERT_EQ(got.exit_code, kOk) << got.output;
  EXPECT_THAT(got.output, HasSubstr("wrote " + files.File("x.npy") + " (f32[2, 3], 24 B)"));
  auto array = ReadNpyFile(files.File("x.npy"));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dtype, v1::DTYPE_F32);

  // A device is written as it is; a failed download leaves an existing file untouched.
  EXPECT_EQ(Cli({"tensor", "get", handle, "-o", "/dev/null"}, key).exit_code, kOk);
  EXPECT_EQ(Cli({"tensor", "get", handle, "-o", files.path()}, key).exit_code, kUsage);
  { std::ofstream(files.File("keep.npy")) << "keep"; }
  auto missing = Cli({"tensor", "get", "tn_missing", "-o", files.File("keep.npy")}, key);
  EXPECT_EQ(missing.exit_code, kRefused) << missing.output;
  std::ifstream kept(files.File("keep.npy"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "keep");
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(files.path())) {
    ++entries;
  }
  EXPECT_EQ(entries, 2);  // x.npy and keep.npy: no temporary file left behind

  auto put = Cli({"tensor", "put", files.File("x.npy"), "--chunk=8"}, key);
  ASSERT_EQ(put.exit_code, kOk) << put.output;
  std::string uploaded(absl::StripAsciiWhitespace(put.output));
  auto summed = Cli({"run", "add", "--in=" + handle + "," + uploaded}, key);
  ASSERT_EQ(summed.exit_code, kOk) << summed.output;
  EXPECT_THAT(summed.output, HasSubstr("SUCCEEDED"));

  auto ls = Cli({"tensor", "ls"}, key);
  EXPECT_THAT(ls.output, HasSubstr(handle));
  EXPECT_THAT(ls.output, HasSubstr("[2, 3]"));
  EXPECT_THAT(Cli({"kernels"}, key).output, HasSubstr("matmul"));
  auto usage = Cli({"usage"}, key);
  EXPECT_THAT(usage.output, HasSubstr("tensors: 3"));
  EXPECT_THAT(usage.output, HasSubstr("2 succeeded"));
  auto rm = Cli({"tensor", "rm", uploaded}, key);
  EXPECT_EQ(rm.exit_code, kOk) << rm.output;
  auto bad = Cli({"run", "matmul", "--in=" + handle + "," + handle}, key);
  EXPECT_EQ(bad.exit_code, kRefused);
  EXPECT_THAT(bad.output, HasSubstr("inner dimensions differ"));
}

TEST_F(CliTest, ProgressBarWithRateOnTerminalsOnly) {
  if (access("/usr/bin/script", X_OK) != 0) GTEST_SKIP() << "util-linux script(1) is missing";
  const std::string key = MustRegister("alpha");
  testing::TempDir files;
  NpyArray array{v1::DTYPE_F32, {2 << 20}, std::string(size_t{8} << 20, '\0')};  // 8 MiB
  ASSERT_TRUE(WriteNpyFile(files.File("big.npy"), array).ok());
  // script(1) gives the CLI a pseudo-terminal.
  std::string command = absl::StrCat(testing::CliBinary(), " tensor put ", files.File("big.npy"));
  auto on_terminal =
      testing::RunCommand({"/usr/bin/script", "-qec", command, "/dev/null"}, Env(key));
  ASSERT_TRUE(on_terminal.ok()) << on_terminal.status();
  EXPECT_EQ(on_terminal->exit_code, 0) << on_terminal->output;
  EXPECT_THAT(on_terminal->output, HasSubstr("put [====================] 100%  8 MiB in "));
  EXPECT_TRUE(std::regex_search(on_terminal->output, std::regex(R"(\(\S+ [KMGT]?i?B/s\))")))
      << on_terminal->output;
  auto piped = Cli({"tensor", "put", files.File("big.npy")}, key);
  EXPECT_EQ(piped.exit_code, kOk);
  EXPECT_THAT(piped.output, Not(HasSubstr("put [")));
}

// ---- the Unix socket and shared-memory regions
// ---------------------------------------------------

// A server that also listens on a Unix socket (and the descriptor socket beside it), with its
// access log on: the log says which RPCs moved a transfer's bytes.
class CliRegionTest : public CliTest {
 protected:
  void SetUp() override {
    socket_ = dir_.File("t.sock");
    StartServer(Flags());
  }
  // A client's idle connection holds a shutdown for the whole --drain_timeout (10 s).
  std::vector<std::string> Flags() const {
    return {"--unix_socket=" + socket_, "--log_level=info", "--drain_timeout=1s"};
  }

  // The CLI over the Unix socket, with `env` added to its environment.
  testing::CommandResult UnixCli(std::vector<std::string> args, const std::string& token,
                                 const std::map<std::string, std::string>& env = {}) {
    args.insert(args.begin(), testing::CliBinary());
    std::map<std::string, std::string> all = Env(token);
    all["TESSERA_ADDR"] = "unix:" + socket_;
    for (const auto& [k, v] : env) all[k] = v;
    auto result = testing::RunCommand(args, all);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : testing::CommandResult{};
  }

  std::unique_ptr<Client> UnixClient(const std::string& key, bool use_regions = true) {
    auto client = Client::Connect({.address = "unix:" + socket_,
                                   .token = key,
                                   .timeout = absl::Seconds(20),
                                   .use_regions = use_regions});
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

  // Calls of Compute's `method` in the access log so far.
  int Calls(const std::string& method) const {
    const std::string needle = absl::StrCat("method=tessera.v1.Compute/", method, " ");
    const std::string log = server_->output();
    int n = 0;
    for (size_t at = log.find(needle); at != std::string::npos; at = log.find(needle, at + 1)) {
      ++n;
    }
    return n;
  }
  // Waits until the access log has `n` calls of `method` (the log is read as it comes).
  bool WaitForCalls(const std::string& method, int n) const {
    for (int i = 0; i < 200 && Calls(method) < n; ++i) absl::SleepFor(absl::Milliseconds(25));
    return Calls(method) >= n;
  }

  // An .npy file of `elements` distinct f32 values; its path.
  std::string ArrayFile(const testing::TempDir& files, const std::string& name, int64_t elements) {
    std::string data(static_cast<size_t>(elements) * 4, '\0');
    for (int64_t i = 0; i < elements; ++i) {
      const float v = static_cast<float>(i) * 0.5f;
      std::memcpy(&data[static_cast<size_t>(i) * 4], &v, 4);
    }
    NpyArray array{v1::DTYPE_F32, {elements}, std::move(data)};
    EXPECT_TRUE(WriteNpyFile(files.File(name), array).ok());
    return files.File(name);
  }

  static std::string FileBytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  std::string socket_;
};

TEST_F(CliRegionTest, TensorPutAndGetGoThroughARegionOverTheUnixSocket) {
  const std::string key = MustRegister("alpha");
  testing::TempDir files;
  const std::string x = ArrayFile(files, "x.npy", 700'000);  // 2.7 MiB: a region of 3 MiB
  auto put = UnixCli({"tensor", "put", x}, key);
  ASSERT_EQ(put.exit_code, kOk) << put.output;
  const std::string handle(absl::StripAsciiWhitespace(put.output));
  EXPECT_THAT(handle, StartsWith("tn_"));
  auto got = UnixCli({"tensor", "get", handle, "-o", files.File("y.npy")}, key);
  ASSERT_EQ(got.exit_code, kOk) << got.output;
  EXPECT_THAT(got.output, HasSubstr("(f32[700000], 2.7 MiB)"));
  EXPECT_EQ(FileBytes(files.File("y.npy")), FileBytes(x));
  // Into a pipe too.
  auto piped = Shell(absl::StrCat("TESSERA_ADDR=unix:", Quoted(socket_),
                                  " \"$TESSERA\" tensor get ", handle, " -o - | cmp - ", Quoted(x)),
                     key);
  EXPECT_EQ(piped.exit_code, 0) << piped.output;

  // The bytes went through regions, which each command unregistered before it exited.
  EXPECT_TRUE(WaitForCalls("UnregisterRegion", 3)) << server_->output();
  EXPECT_EQ(Calls("WriteTensorFromRegion"), 1);
  EXPECT_EQ(Calls("ReadTensorIntoRegion"), 2);
  EXPECT_EQ(Calls("FinishRegion"), 3);
  EXPECT_EQ(Calls("WriteTensor"), 0);
  EXPECT_EQ(Calls("ReadTensor"), 0);
  auto listed = UnixCli({"region", "list"}, key);
  ASSERT_EQ(listed.exit_code, kOk) << listed.output;
  EXPECT_THAT(listed.output, Not(HasSubstr("rg_")));
  EXPECT_THAT(server_->output(), HasSubstr("peer=unix:" + socket_));
}

TEST_F(CliRegionTest, ProgressBarForATransferThroughARegion) {
  if (access("/usr/bin/script", X_OK) != 0) GTEST_SKIP() << "util-linux script(1) is missing";
  const std::string key = MustRegister("alpha");
  testing::TempDir files;
  const std::string big = ArrayFile(files, "big.npy", 2 << 20);  // 8 MiB
  std::map<std::string, std::string> env = Env(key);
  env["TESSERA_ADDR"] = "unix:" + socket_;
  // script(1) gives the CLI a pseudo-terminal.
  auto put =
      testing::RunCommand({"/usr/bin/script", "-qec",
                           absl::StrCat(testing::CliBinary(), " tensor put ", big), "/dev/null"},
                          env);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->exit_code, 0) << put->output;
  EXPECT_THAT(put->output, HasSubstr("put [====================] 100%  8 MiB in "));
  std::smatch handle;
  ASSERT_TRUE(std::regex_search(put->output, handle, std::regex(R"(tn_\S+)"))) << put->output;
  auto get = testing::RunCommand({"/usr/bin/script", "-qec",
                                  absl::StrCat(testing::CliBinary(), " tensor get ", handle.str(),
                                               " -o ", files.File("out.npy")),
                                  "/dev/null"},
                                 env);
  ASSERT_TRUE(get.ok()) << get.status();
  EXPECT_EQ(get->exit_code, 0) << get->output;
  EXPECT_THAT(get->output, HasSubstr("get [====================] 100%  8 MiB in "));
  EXPECT_EQ(FileBytes(files.File("out.npy")), FileBytes(big));
  EXPECT_TRUE(WaitForCalls("ReadTensorIntoRegion", 1));
}

TEST_F(CliRegionTest, RegionsTurnedOffStreamOverTheUnixSocket) {
  const std::string key = MustRegister("alpha");
  testing::TempDir files;
  const std::string x = ArrayFile(files, "x.npy", 300'000);
  // $TESSERA_REGIONS=off, and --no_regions per command.
  auto put = UnixCli({"tensor", "put", x}, key, {{"TESSERA_REGIONS", "off"}});
  ASSERT_EQ(put.exit_code, kOk) << put.output;
  const std::string handle(absl::StripAsciiWhitespace(put.output));
  auto got = UnixCli({"tensor", "get", handle, "-o", files.File("y.npy"), "--no_regions"}, key);
  ASSERT_EQ(got.exit_code, kOk) << got.output;
  EXPECT_EQ(FileBytes(files.File("y.npy")), FileBytes(x));
  auto again = UnixCli({"tensor", "put", x, "--no_regions", "--chunk=64Ki"}, key);
  ASSERT_EQ(again.exit_code, kOk) << again.output;
  EXPECT_TRUE(WaitForCalls("WriteTensor", 2)) << server_->output();
  EXPECT_TRUE(WaitForCalls("ReadTensor", 1));
  EXPECT_EQ(Calls("BeginRegion"), 0);
  EXPECT_EQ(Calls("WriteTensorFromRegion"), 0);
  EXPECT_EQ(Calls("ReadTensorIntoRegion"), 0);

  auto bad = UnixCli({"usage"}, key, {{"TESSERA_REGIONS", "sometimes"}});
  EXPECT_EQ(bad.exit_code, kUsage) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("$TESSERA_REGIONS is \"sometimes\"; use auto or off"));
  EXPECT_EQ(UnixCli({"usage"}, key, {{"TESSERA_REGIONS", "auto"}}).exit_code, kOk);
}

TEST_F(CliRegionTest, UsageRegionListAndRm) {
  const std::string key = MustRegister("alpha");
  auto client = UnixClient(key);
  auto region = SharedRegion::Register(*client, 3 << 20);
  ASSERT_TRUE(region.ok()) << region.status();
  const std::string handle = (*region)->handle();
  EXPECT_THAT(handle, StartsWith("rg_"));

  auto usage = UnixCli({"usage"}, key);
  ASSERT_EQ(usage.exit_code, kOk) << usage.output;
  EXPECT_THAT(usage.output, HasSubstr("\nregions: 1, 3 MiB of 1 GiB (max_region_bytes)\n"));
  v1::Usage counters;
  auto json = UnixCli({"usage", "--output=json"}, key);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.output, &counters).ok())
      << json.output;
  EXPECT_EQ(counters.regions(), 1u);
  EXPECT_EQ(counters.region_bytes(), uint64_t{3} << 20);
  EXPECT_EQ(counters.region_quota_bytes(), testing::kGiB);

  // Listed from anywhere (TCP too), with `ls` as another name for `list`.
  auto listed = Cli({"region", "list"}, key);
  ASSERT_EQ(listed.exit_code, kOk) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr("HANDLE"));
  EXPECT_TRUE(std::regex_search(
      listed.output, std::regex(handle + R"( +3 MiB  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ +0\n)")))
      << listed.output;
  EXPECT_EQ(Cli({"region", "ls"}, key).output, listed.output);
  v1::ListRegionsResponse regions;
  auto listed_json = Cli({"region", "list", "--output=json"}, key);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(listed_json.output, &regions).ok())
      << listed_json.output;
  ASSERT_EQ(regions.regions_size(), 1);
  EXPECT_EQ(regions.regions(0).handle(), handle);
  EXPECT_EQ(regions.regions(0).size_bytes(), uint64_t{3} << 20);

  auto removed = Cli({"region", "rm", handle}, key);
  ASSERT_EQ(removed.exit_code, kOk) << removed.output;
  EXPECT_EQ(removed.output, absl::StrCat("unregistered ", handle, " (3 MiB)\n"));
  EXPECT_THAT(Cli({"usage"}, key).output, HasSubstr("\nregions: 0, 0 B of 1 GiB"));
  auto again = Cli({"region", "rm", handle, "--output=json"}, key);
  EXPECT_EQ(again.exit_code, kRefused) << again.output;
  EXPECT_THAT(again.output, HasSubstr("NOT_FOUND"));
  EXPECT_EQ(Cli({"region", "rm"}, key).exit_code, kUsage);
  // Another tenant's region is not found either.
  auto beta = UnixClient(MustRegister("beta"));
  auto other_region = SharedRegion::Register(*beta, 1 << 20);
  ASSERT_TRUE(other_region.ok()) << other_region.status();
  EXPECT_EQ(Cli({"region", "rm", (*other_region)->handle()}, key).exit_code, kRefused);
}

TEST_F(CliRegionTest, MaxRegionBytesIsAQuota) {
  auto registered = Cli({"tenant", "register", "small", "--memory=1Gi", "--max_region_bytes=2Mi"});
  ASSERT_EQ(registered.exit_code, kOk) << registered.output;
  EXPECT_THAT(registered.output, HasSubstr("region quota:    2 MiB (2,097,152 bytes)\n"));
  std::smatch api_key;
  ASSERT_TRUE(std::regex_search(registered.output, api_key, std::regex(R"(tsk_small\.\S+)")));
  const std::string key = api_key.str();
  EXPECT_THAT(Cli({"tenant", "get", "small"}).output,
              HasSubstr("region quota:    2 MiB (2,097,152 bytes)\n"));
  auto decimal = Cli({"tenant", "register", "dec", "--memory=1Gi", "--max_region_bytes=5M"});
  ASSERT_EQ(decimal.exit_code, kOk) << decimal.output;
  EXPECT_THAT(decimal.output, HasSubstr("region quota:    5 MB (5,000,000 bytes)\n"));
  EXPECT_THAT(decimal.output, HasSubstr("decimal units"));
  auto defaulted = Cli({"tenant", "register", "plain", "--memory=1Gi"});
  EXPECT_THAT(defaulted.output, HasSubstr("region quota:    1 GiB (1,073,741,824 bytes)\n"));
  auto listed = Cli({"tenant", "list"});
  EXPECT_THAT(listed.output, HasSubstr("    MEMORY    REGIONS  SHARE"));
  EXPECT_TRUE(std::regex_search(listed.output, std::regex(R"(\nsmall +\S+ +1 GiB +2 MiB +100%)")))
      << listed.output;
  v1::Tenant tenant;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  Cli({"tenant", "get", "small", "--output=json"}).output, &tenant)
                  .ok());
  EXPECT_EQ(tenant.quota().max_region_bytes(), uint64_t{2} << 20);

  auto lots = Cli({"tenant", "register", "x", "--memory=1Gi", "--max_region_bytes=lots"});
  EXPECT_EQ(lots.exit_code, kUsage) << lots.output;
  EXPECT_THAT(lots.output, HasSubstr("\"lots\" is not a size"));
  EXPECT_EQ(Cli({"tenant", "register", "x", "--memory=1Gi", "--max_region_bytes=0"}).exit_code,
            kUsage);
  auto tiny = Cli({"tenant", "register", "x", "--memory=1Gi", "--max_region_bytes=4Ki"});
  EXPECT_EQ(tiny.exit_code, kRefused) << tiny.output;
  EXPECT_THAT(tiny.output, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(tiny.output, HasSubstr("max_region_bytes"));
  auto update = Cli({"tenant", "update", "small", "--max_region_bytes=4Mi"});
  EXPECT_EQ(update.exit_code, kRefused) << update.output;
  EXPECT_THAT(update.output, HasSubstr("FAILED_PRECONDITION"));

  // Past the quota a region is refused, and `tensor put` streams instead.
  auto client = UnixClient(key);
  auto region = SharedRegion::Register(*client, 3 << 20);
  EXPECT_TRUE(absl::IsResourceExhausted(region.status())) << region.status();
  testing::TempDir files;
  const std::string x = ArrayFile(files, "x.npy", 1 << 20);  // 4 MiB
  auto put = UnixCli({"tensor", "put", x}, key);
  ASSERT_EQ(put.exit_code, kOk) << put.output;
  EXPECT_TRUE(WaitForCalls("WriteTensor", 1)) << server_->output();
  EXPECT_EQ(Calls("WriteTensorFromRegion"), 0);
}

// The C++ client library under `tensor put` and `get`: one region kept, grown and reused.
TEST_F(CliRegionTest, TheClientKeepsOneRegionForItsTransfers) {
  const std::string key = MustRegister("alpha");
  auto lister = ClientWith(key);
  auto regions = [&] {
    auto listed = lister->ListRegions();
    EXPECT_TRUE(listed.ok()) << listed.status();
    std::vector<uint64_t> sizes;
    if (listed.ok()) {
      for (const v1::Region& r : listed->regions()) sizes.push_back(r.size_bytes());
    }
    return sizes;
  };
  auto client = UnixClient(key);
  EXPECT_EQ(client->unix_socket_path(), socket_);
  auto bytes = [](size_t n, char seed) {
    std::string data(n, '\0');
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<char>(seed + i * 7);
    return data;
  };
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_U8);
  spec.add_shape(3 << 20);
  const std::string three = bytes(3 << 20, 1);
  int progress_calls = 0;
  auto a = client->Upload(spec, three, 1 << 20, [&](uint64_t done, uint64_t total) {
    ++progress_calls;
    EXPECT_EQ(done, total);
  });
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(progress_calls, 1);
  EXPECT_EQ(regions(), std::vector<uint64_t>{3 << 20});
  auto back = client->Download(a->handle());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == three);
  auto part = client->Download(a->handle(), 1000, 5000);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(*part, three.substr(1000, 5000));
  const std::string other = bytes(3 << 20, 9);
  ASSERT_TRUE(client->Overwrite(a->handle(), other).ok());
  EXPECT_TRUE(*client->Download(a->handle()) == other);
  // Smaller transfers reuse it; a bigger one replaces it.
  spec.set_shape(0, 1000);
  ASSERT_TRUE(client->Upload(spec, bytes(1000, 3)).ok());
  EXPECT_EQ(regions(), std::vector<uint64_t>{3 << 20});
  spec.set_shape(0, (5 << 20) + 1);
  auto big = client->Upload(spec, bytes((5 << 20) + 1, 5));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(regions(), std::vector<uint64_t>{6 << 20});
  EXPECT_EQ(client->Download(big->handle())->size(), (5u << 20) + 1);
  // The server's refusals are the same as when streaming.
  EXPECT_TRUE(absl::IsNotFound(client->Download("tn_missing").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(client->Overwrite(a->handle(), "short").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(client->Download(a->handle(), 4 << 20).status()));
  EXPECT_EQ(Calls("WriteTensor"), 0);
  EXPECT_EQ(Calls("ReadTensor"), 0);

  // Zero copies: the caller fills the client's region, or its own, and reads it.
  {
    auto lease = client->LeaseTransferRegion(1 << 20);
    ASSERT_TRUE(lease.ok()) << lease.status();
    ASSERT_TRUE(lease->has_value());
    std::memcpy((*lease)->data(), three.data(), 1 << 20);
    spec.set_shape(0, 1 << 20);
    auto made = client->UploadFromRegion(spec, (*lease)->region());
    ASSERT_TRUE(made.ok()) << made.status();
    auto own = SharedRegion::Register(*client, 2 << 20);
    ASSERT_TRUE(own.ok()) << own.status();
    auto read = client->DownloadIntoRegion(made->handle(), **own, 1 << 20);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->bytes(), 1u << 20);
    EXPECT_EQ(std::memcmp((*own)->data() + (1 << 20), three.data(), 1 << 20), 0);
    EXPECT_EQ(regions().size(), 2u);
  }
  EXPECT_EQ(regions(), std::vector<uint64_t>{6 << 20});  // its own region went with it

  // A client that does not use regions streams; the client's region goes with it.
  auto streaming = UnixClient(key, /*use_regions=*/false);
  ASSERT_TRUE(streaming->Upload(spec, three.substr(0, 1 << 20)).ok());
  EXPECT_TRUE(WaitForCalls("WriteTensor", 1));
  auto over_tcp = ClientWith(key);
  EXPECT_TRUE(absl::IsFailedPrecondition(SharedRegion::Register(*over_tcp, 1 << 20).status()));
  EXPECT_FALSE(over_tcp->LeaseTransferRegion(1 << 20)->has_value());
  client.reset();
  EXPECT_TRUE(regions().empty());
}

TEST_F(CliRegionTest, TheClientStreamsWhenItCannotUseRegions) {
  const std::string key = MustRegister("alpha");
  // No descriptor socket where the client looks (a container that mounts only the gRPC socket).
  ASSERT_EQ(unlink((socket_ + ".regions").c_str()), 0);
  auto client = UnixClient(key);
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_U8);
  spec.add_shape(1 << 20);
  const std::string data(1 << 20, 'x');
  auto made = client->Upload(spec, data);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(*client->Download(made->handle()), data);
  auto region = SharedRegion::Register(*client, 1 << 20);
  EXPECT_TRUE(absl::IsFailedPrecondition(region.status())) << region.status();
  EXPECT_THAT(region.status().message(), HasSubstr("descriptor socket"));
  EXPECT_TRUE(WaitForCalls("ReadTensor", 1));
  EXPECT_EQ(Calls("WriteTensor"), 1);
  // Once for the client, which then streams; once above. A call is counted as it ends, which
  // may be just after its answer reached the client: wait for the count, then check it.
  EXPECT_TRUE(WaitForCalls("BeginRegion", 2));
  EXPECT_EQ(Calls("BeginRegion"), 2);
}

TEST_F(CliRegionTest, AServerRestartedSinceForgetsTheRegionAndTheClientRegistersAnother) {
  const std::string key = MustRegister("alpha");
  auto client = UnixClient(key);
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_U8);
  spec.add_shape(1 << 20);
  const std::string data(1 << 20, 'y');
  ASSERT_TRUE(client->Upload(spec, data).ok());
  ASSERT_TRUE(server_->Stop(SIGTERM).ok());
  StartServer(Flags());
  absl::StatusOr<v1::TensorInfo> again;
  for (int i = 0; i < 50; ++i) {  // the channel reconnects
    again = client->Upload(spec, data);
    if (!absl::IsUnavailable(again.status())) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*client->Download(again->handle()), data);
  // NOT_FOUND with the old region, then OK. A call is counted as it ends, which may be just
  // after its answer reached the client: wait for the count, then check it.
  EXPECT_TRUE(WaitForCalls("WriteTensorFromRegion", 2)) << server_->output();
  EXPECT_EQ(Calls("WriteTensorFromRegion"), 2);
  EXPECT_EQ(Calls("WriteTensor"), 0);
}

}  // namespace
}  // namespace tessera
