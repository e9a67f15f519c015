// The operator's view (issue 18): one access log line per RPC, stdout pure JSON with
// --log_format=json, Prometheus metrics that promtool accepts (histograms included) behind
// access control, and the health service described by reflection.
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"

#include "tests/testing/certs.h"
#include "tests/testing/server_fixture.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using testing::kGiB;
using ::testing::Not;

// One HTTP/1.1 request to host:port (IPv4 or IPv6 literal); the whole response, or "" when it
// cannot connect. Reads for at most 3 s.
std::string Http(const std::string& host, int port, const std::string& path,
                 const std::string& headers = "") {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return "";
  int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval timeout{3, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const bool connected = connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  freeaddrinfo(found);
  if (!connected) {
    close(fd);
    return "";
  }
  std::string request =
      absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: ", host, "\r\n", headers, "\r\n");
  (void)!write(fd, request.data(), request.size());
  std::string response;
  char buffer[8192];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, n);
  close(fd);
  return response;
}

std::string Body(const std::string& response) {
  size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

class ObservabilityTest : public testing::ServerTest {
 protected:
  void SetUp() override {}  // each test starts the server it needs

  // The port of "metrics on http(s)://HOST:PORT/metrics" in the server's log.
  int MetricsPort() {
    EXPECT_TRUE(server_->WaitForOutput("/metrics (", absl::Seconds(10)));
    std::smatch match;
    std::string out = server_->output();
    static const std::regex kLine(R"(metrics on https?://[^ ]*:(\d+)/metrics)");
    if (!std::regex_search(out, match, kLine)) return 0;
    return std::stoi(match[1]);
  }

  // Runs the server with more flags; returns its exit code and output when it fails to start.
  absl::StatusOr<testing::CommandResult> FailToStart(std::vector<std::string> flags) {
    std::vector<std::string> argv = {testing::ServerBinary(), "--listen=127.0.0.1:0",
                                     "--state_dir=" + dir_.File("refused")};
    argv.insert(argv.end(), backend().args.begin(), backend().args.end());
    argv.insert(argv.end(), flags.begin(), flags.end());
    return testing::RunCommand(argv, backend().env, absl::Seconds(30));
  }

  std::unique_ptr<Client> Tenant(const std::string& id, uint64_t memory = kGiB) {
    return ClientWith(MustRegister(id, memory));
  }
};

TEST_F(ObservabilityTest, EveryRpcLeavesOneJsonAccessLineAndStdoutIsPureJson) {
  // stdout alone is captured (stderr to a file), as a log shipper reading stdout sees it.
  const std::string stderr_file = dir_.File("stderr.log");
  std::string command =
      absl::StrCat("exec '", testing::ServerBinary(),
                   "' --listen=127.0.0.1:0 --state_dir=", dir_.File("var"), " --log_format=json");
  for (const std::string& a : backend().args) absl::StrAppend(&command, " '", a, "'");
  absl::StrAppend(&command, " 2>", stderr_file);
  auto server = testing::ServerProcess::Start({.state_dir = dir_.File("var"),
                                               .binary = "/bin/sh",
                                               .args = {"-c", command},
                                               .env = backend().env});
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);
  admin_ = ClientWith(server_->AdminToken());

  ASSERT_TRUE(admin_->GetServerInfo().ok());
  auto tenant = Tenant("logged");
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_F32);
  spec.add_shape(1024);
  auto tensor = tenant->CreateTensor(spec, std::string(4096, '\0'));
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  v1::LaunchRequest launch;
  launch.set_kernel("add");
  launch.add_inputs(tensor->handle());
  launch.add_inputs(tensor->handle());
  launch.set_wait(true);
  ASSERT_TRUE(tenant->Launch(launch).ok());
  {  // a failure, with the client's request id
    auto context = tenant->NewContext();
    context->AddMetadata("x-request-id", "req-obs-1");
    v1::GetTensorRequest request;
    request.set_handle("tn_missing");
    v1::TensorInfo info;
    grpc::Status s =
        v1::Compute::NewStub(tenant->channel())->GetTensor(context.get(), request, &info);
    ASSERT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  }
  ASSERT_EQ(*server_->Stop(SIGTERM), 0);

  std::map<std::string, std::vector<google::protobuf::Struct>> access;  // by method
  std::istringstream lines(server_->output());
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    google::protobuf::Struct object;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &object).ok())
        << "not a JSON object: " << line;
    ++count;
    const auto& f = object.fields();
    ASSERT_TRUE(f.contains("time") && f.contains("level") && f.contains("msg")) << line;
    if (f.at("msg").string_value() == "access") {
      access[f.at("method").string_value()].push_back(object);
    }
  }
  EXPECT_GT(count, 5);  // the banner and the start-up lines are JSON too
  EXPECT_THAT(server_->output(), HasSubstr("\"admin_token\":"));
  std::ifstream err(stderr_file);
  std::string err_text((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  EXPECT_EQ(err_text, "");

  for (const char* method :
       {"tessera.v1.TenantAdmin/GetServerInfo", "tessera.v1.TenantAdmin/RegisterTenant",
        "tessera.v1.Compute/CreateTensor", "tessera.v1.Compute/Launch",
        "tessera.v1.Compute/GetTensor"}) {
    ASSERT_EQ(access[method].size(), 1u) << method;
    const auto& f = access[method][0].fields();
    for (const char* key : {"request_id", "tenant", "method", "code", "peer"}) {
      EXPECT_TRUE(f.contains(key) && f.at(key).has_string_value()) << method << " " << key;
    }
    for (const char* key : {"duration_ms", "bytes_in", "bytes_out"}) {
      EXPECT_TRUE(f.contains(key) && f.at(key).has_number_value()) << method << " " << key;
    }
    EXPECT_EQ(access[method][0].fields().at("level").string_value(), "info");
    EXPECT_THAT(f.at("peer").string_value(), HasSubstr("127.0.0.1"));
  }
  const auto& create = access["tessera.v1.Compute/CreateTensor"][0].fields();
  EXPECT_EQ(create.at("tenant").string_value(), "logged");
  EXPECT_EQ(create.at("code").string_value(), "OK");
  EXPECT_GE(create.at("bytes_in").number_value(), 4096);
  EXPECT_GT(create.at("bytes_out").number_value(), 0);
  const auto& missing = access["tessera.v1.Compute/GetTensor"][0].fields();
  EXPECT_EQ(missing.at("code").string_value(), "NOT_FOUND");
  EXPECT_EQ(missing.at("request_id").string_value(), "req-obs-1");
  EXPECT_EQ(missing.at("tenant").string_value(), "logged");
  EXPECT_THAT(missing.at("error").string_value(), HasSubstr("tn_missing"));
  EXPECT_EQ(access["tessera.v1.TenantAdmin/GetServerInfo"][0].fields().at("tenant").string_value(),
            "-");
}

TEST_F(ObservabilityTest, AccessLogSwitches) {
  StartServer({"--log_level=info", "--access_log=errors"});
  ASSERT_TRUE(admin_->GetServerInfo().ok());
  EXPECT_FALSE(admin_->GetTenant("nobody").ok());
  ASSERT_TRUE(server_->WaitForOutput("code=NOT_FOUND", absl::Seconds(10)));
  EXPECT_THAT(server_->output(), Not(HasSubstr("GetServerInfo code=OK")));
  EXPECT_THAT(server_->output(), HasSubstr("access request_id="));
  auto refused = FailToStart({"--access_log=loud"});
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->exit_code, 2);
  EXPECT_THAT(refused->output, HasSubstr("--access_log=loud"));
}

TEST_F(ObservabilityTest, ScrapePassesPromtoolWithTheHistograms) {
  StartServer({"--log_level=info", "--metrics_listen=127.0.0.1:0"});
  const int port = MetricsPort();
  ASSERT_GT(port, 0);
  auto tenant = Tenant("obs", 1 << 20);
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_F32);
  spec.add_shape(1024);
  auto tensor = tenant->Upload(spec, std::string(4096, '\0'));
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  ASSERT_TRUE(tenant->Download(tensor->handle()).ok());
  v1::LaunchRequest launch;
  launch.set_kernel("add");
  launch.add_inputs(tensor->handle());
  launch.add_inputs(tensor->handle());
  launch.set_wait(true);
  ASSERT_TRUE(tenant->Launch(launch).ok());
  v1::TensorSpec too_big;
  too_big.set_dtype(v1::DTYPE_F32);
  too_big.add_shape(1 << 20);  // 4 MiB > the 1 MiB quota
  EXPECT_EQ(tenant->CreateTensor(too_big).status().code(), absl::StatusCode::kResourceExhausted);
  v1::RegisterTenantRequest huge = Registration("huge", uint64_t{1} << 50);
  EXPECT_EQ(admin_->RegisterTenant(huge).status().code(), absl::StatusCode::kResourceExhausted);

  const std::string response = Http("127.0.0.1", port, "/metrics");
  ASSERT_THAT(response, HasSubstr("HTTP/1.1 200 OK"));
  EXPECT_THAT(response, HasSubstr("text/plain; version=0.0.4"));
  const std::string body = Body(response);
  std::ofstream(dir_.File("scrape.txt")) << body;
  auto promtool = testing::RunCommand(
      {"/bin/sh", "-c", absl::StrCat("promtool check metrics < ", dir_.File("scrape.txt"))}, {});
  ASSERT_TRUE(promtool.ok()) << promtool.status();
  EXPECT_EQ(promtool->exit_code, 0) << promtool->output;
  EXPECT_EQ(promtool->output, "") << "promtool lint findings";

  // The state families kept from before, and the new ones.
  EXPECT_THAT(body, HasSubstr("tessera_tenant_memory_quota_bytes{tenant=\"obs\"} 1048576"));
  EXPECT_THAT(body, HasSubstr("tessera_device_reserved_bytes{device=\"0\"}"));
  EXPECT_THAT(body, HasSubstr("# TYPE grpc_server_handling_seconds histogram"));
  EXPECT_THAT(
      body,
      HasSubstr("grpc_server_handled_total{code=\"OK\",method=\"tessera.v1.Compute/Launch\"} 1"));
  EXPECT_THAT(body, HasSubstr("grpc_server_handling_seconds_bucket{method=\"tessera.v1.Compute/"
                              "Launch\",le=\"+Inf\"} 1"));
  EXPECT_THAT(body,
              HasSubstr("tessera_job_queue_wait_seconds_count{kernel=\"add\",tenant=\"obs\"} 1"));
  EXPECT_THAT(body, HasSubstr("tessera_job_run_seconds_count{kernel=\"add\",tenant=\"obs\"} 1"));
  EXPECT_THAT(body,
              HasSubstr("tessera_transfer_bytes_count{direction=\"upload\",tenant=\"obs\"} 1"));
  EXPECT_THAT(body,
              HasSubstr("tessera_transfer_bytes_sum{direction=\"download\",tenant=\"obs\"} "));
  EXPECT_THAT(body,
              HasSubstr("tessera_transfer_seconds_count{direction=\"download\",tenant=\"obs\"} 1"));
  EXPECT_THAT(body, HasSubstr("tessera_admission_refusals_total{reason=\"tenant_memory\"} 1"));
  EXPECT_THAT(body, HasSubstr("tessera_admission_refusals_total{reason=\"device_memory\"} 1"));
  EXPECT_THAT(body, HasSubstr("tessera_admission_refusals_total{reason=\"queue_depth\"} 0"));
  // The call quotas' and the transfer queue's reasons exist before their first refusal.
  for (const char* reason : {"requests_in_flight", "request_rate", "transfer_queue"}) {
    EXPECT_THAT(body, HasSubstr(absl::StrCat("tessera_admission_refusals_total{reason=\"", reason,
                                             "\"} 0")));
  }
  EXPECT_THAT(body, HasSubstr("tessera_build_info{"));
  EXPECT_THAT(body, HasSubstr("version=\"" + admin_->GetServerInfo()->version() + "\""));

  // A deregistered tenant's series go.
  ASSERT_TRUE(admin_->DeregisterTenant("obs").ok());
  EXPECT_THAT(Body(Http("127.0.0.1", port, "/metrics")), Not(HasSubstr("tenant=\"obs\"")));
  EXPECT_THAT(Http("127.0.0.1", port, "/other"), HasSubstr("404"));

  // The same id registered again starts new series (the server finds a tenant's series
  // through a cache, which must not keep the removed ones), and repeated calls add up.
  auto again = Tenant("obs", 1 << 20);
  auto operand = again->Upload(spec, std::string(4096, '\0'));
  ASSERT_TRUE(operand.ok()) << operand.status();
  launch.clear_inputs();
  launch.add_inputs(operand->handle());
  launch.add_inputs(operand->handle());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(again->Launch(launch).ok());
  // A method no service has: gRPC answers UNIMPLEMENTED, and the made-up name is not a label.
  {
    grpc::GenericStub generic(again->channel());
    grpc::ClientContext context;
    grpc::Slice nothing("");
    grpc::ByteBuffer empty(&nothing, 1), reply;  // an empty message (a default one is none)
    absl::Notification done;
    grpc::Status status;
    generic.UnaryCall(&context, "/tessera.v1.Compute/NoSuchMethod", grpc::StubOptions(), &empty,
                      &reply, [&](grpc::Status s) {
                        status = std::move(s);
                        done.Notify();
                      });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  // A call is counted when gRPC tears it down, which may come a moment after its reply.
  const std::string last_counted =
      "grpc_server_handled_total{code=\"UNIMPLEMENTED\",method=\"unknown\"} 1";
  std::string later;
  for (int i = 0; i < 100; ++i) {
    later = Body(Http("127.0.0.1", port, "/metrics"));
    if (absl::StrContains(later, last_counted)) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_THAT(later, HasSubstr(last_counted));
  EXPECT_THAT(later, Not(HasSubstr("NoSuchMethod")));
  EXPECT_THAT(later, HasSubstr("tessera_job_run_seconds_count{kernel=\"add\",tenant=\"obs\"} 2"));
  EXPECT_THAT(later,
              HasSubstr("tessera_transfer_bytes_count{direction=\"upload\",tenant=\"obs\"} 1"));
  EXPECT_THAT(
      later,
      HasSubstr("grpc_server_handled_total{code=\"OK\",method=\"tessera.v1.Compute/Launch\"} 3"));
}

TEST_F(ObservabilityTest, IdleConnectionsDoNotDelayAScrape) {
  StartServer({"--log_level=info", "--metrics_listen=127.0.0.1:0"});
  const int port = MetricsPort();
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    (void)!write(fd, "GET /metr", 9);  // a request head that never completes
    idle.push_back(fd);
  }
  // Answered while they stay open (the client gives up after 3 s; the server waits 5 s for an
  // idle connection's head).
  EXPECT_THAT(Http("127.0.0.1", port, "/metrics"), HasSubstr("HTTP/1.1 200 OK"));
  for (int fd : idle) close(fd);
}

TEST_F(ObservabilityTest, OffLoopbackMetricsNeedATokenAndRefuseAnonymousScrapes) {
  auto refused = FailToStart({"--metrics_listen=0.0.0.0:0"});
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->exit_code, 2) << refused->output;
  EXPECT_THAT(refused->output, HasSubstr("not a loopback address"));
  EXPECT_THAT(refused->output, HasSubstr("--metrics_token_file"));

  std::ofstream(dir_.File("metrics.token")) << "s3cret-scrape-token\n";
  StartServer({"--log_level=info", "--metrics_listen=0.0.0.0:0",
               "--metrics_token_file=" + dir_.File("metrics.token")});
  const int port = MetricsPort();
  ASSERT_GT(port, 0);
  EXPECT_THAT(Http("127.0.0.1", port, "/metrics"), HasSubstr("HTTP/1.1 401 Unauthorized"));
  EXPECT_THAT(Http("127.0.0.1", port, "/metrics", "Authorization: Bearer wrong\r\n"),
              HasSubstr("401"));
  const std::string ok =
      Http("127.0.0.1", port, "/metrics", "Authorization: Bearer s3cret-scrape-token\r\n");
  EXPECT_THAT(ok, HasSubstr("HTTP/1.1 200 OK"));
  EXPECT_THAT(ok, HasSubstr("tessera_build_info"));
}

TEST_F(ObservabilityTest, MetricsOverHttpsWithClientCertificates) {
  const std::string certs = dir_.File("certs");
  ASSERT_EQ(mkdir(certs.c_str(), 0700), 0);
  ASSERT_TRUE(testing::MintTestCertificates(certs).ok());
  // Client certificates stand in for the token off loopback.
  StartServer({"--log_level=info", "--metrics_listen=0.0.0.0:0",
               "--metrics_tls_cert=" + certs + "/server.pem",
               "--metrics_tls_key=" + certs + "/server.key",
               "--metrics_tls_client_ca=" + certs + "/ca.pem"});
  const int port = MetricsPort();
  ASSERT_GT(port, 0);
  EXPECT_THAT(server_->output(), HasSubstr("metrics on https://0.0.0.0:"));
  const std::string url = absl::StrCat("https://127.0.0.1:", port, "/metrics");
  auto with_cert = testing::RunCommand(
      {"/usr/bin/env", "curl", "-sS", "--max-time", "10", "--cacert", certs + "/ca.pem", "--cert",
       certs + "/client.pem", "--key", certs + "/client.key", url},
      {});
  ASSERT_TRUE(with_cert.ok()) << with_cert.status();
  EXPECT_EQ(with_cert->exit_code, 0) << with_cert->output;
  EXPECT_THAT(with_cert->output, HasSubstr("tessera_build_info"));
  auto anonymous = testing::RunCommand(
      {"/usr/bin/env", "curl", "-sS", "--max-time", "10", "--cacert", certs + "/ca.pem", url}, {});
  ASSERT_TRUE(anonymous.ok());
  EXPECT_NE(anonymous->exit_code, 0) << anonymous->output;
  EXPECT_THAT(anonymous->output, Not(HasSubstr("tessera_build_info")));
  // Plain HTTP to the HTTPS port gets nothing.
  EXPECT_THAT(Http("127.0.0.1", port, "/metrics"), Not(HasSubstr("tessera_build_info")));
}

TEST_F(ObservabilityTest, MetricsListenTakesHostNamesAndIpv6) {
  StartServer({"--log_level=info", "--metrics_listen=localhost:0"});
  int port = MetricsPort();
  ASSERT_GT(port, 0);
  EXPECT_THAT(Http("127.0.0.1", port, "/metrics"), HasSubstr("200 OK"));
  ASSERT_EQ(*server_->Stop(SIGTERM), 0);
  StartServer({"--log_level=info", "--metrics_listen=[::1]:0"});
  port = MetricsPort();
  ASSERT_GT(port, 0);
  EXPECT_THAT(server_->output(), HasSubstr("metrics on http://[::1]:"));
  EXPECT_THAT(Http("::1", port, "/metrics"), HasSubstr("200 OK"));
  auto refused = FailToStart({"--metrics_listen=no-such-host.invalid:9464"});
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->exit_code, 2);
  EXPECT_THAT(refused->output, HasSubstr("cannot resolve"));
}

TEST_F(ObservabilityTest, TenantLabelCanBeHashedOrOmitted) {
  StartServer({"--log_level=info", "--metrics_listen=127.0.0.1:0", "--metrics_tenant_label=hash"});
  int port = MetricsPort();
  MustRegister("secret-team");
  std::string body = Body(Http("127.0.0.1", port, "/metrics"));
  EXPECT_THAT(body, Not(HasSubstr("secret-team")));
  EXPECT_TRUE(std::regex_search(
      body, std::regex(R"(tessera_tenant_memory_quota_bytes\{tenant="[0-9a-f]{12}"\} )")))
      << body;
  ASSERT_EQ(*server_->Stop(SIGTERM), 0);
  StartServer({"--log_level=info", "--metrics_listen=127.0.0.1:0", "--metrics_tenant_label=none"});
  port = MetricsPort();
  MustRegister("second-team", 2 * kGiB);  // beside secret-team (1 GiB), restored
  body = Body(Http("127.0.0.1", port, "/metrics"));
  EXPECT_THAT(body, Not(HasSubstr("tenant=")));
  EXPECT_THAT(body, HasSubstr("tessera_tenant_memory_quota_bytes 3221225472"));
}

TEST_F(ObservabilityTest, HealthIsCallableThroughReflection) {
  StartServer({"--log_level=info"});
  using ::grpc::reflection::v1alpha::ServerReflection;
  using ::grpc::reflection::v1alpha::ServerReflectionRequest;
  using ::grpc::reflection::v1alpha::ServerReflectionResponse;
  // What grpcurl does: find the file defining the service through reflection...
  auto stub = ServerReflection::NewStub(admin_->channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stream = stub->ServerReflectionInfo(&context);
  ServerReflectionRequest request;
  request.set_file_containing_symbol("grpc.health.v1.Health");
  ASSERT_TRUE(stream->Write(request));
  ServerReflectionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_FALSE(response.has_error_response()) << response.error_response().error_message();
  ASSERT_EQ(response.file_descriptor_response().file_descriptor_proto_size(), 1);
  google::protobuf::FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(response.file_descriptor_response().file_descriptor_proto(0)));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());

  // ...then build the request from those descriptors alone and call Check.
  google::protobuf::DescriptorPool pool;
  const google::protobuf::FileDescriptor* fd = pool.BuildFile(file);
  ASSERT_NE(fd, nullptr);
  const google::protobuf::MethodDescriptor* check =
      pool.FindMethodByName("grpc.health.v1.Health.Check");
  ASSERT_NE(check, nullptr);
  google::protobuf::DynamicMessageFactory factory(&pool);
  std::unique_ptr<google::protobuf::Message> in(factory.GetPrototype(check->input_type())->New());
  in->GetReflection()->SetString(in.get(), check->input_type()->FindFieldByName("service"),
                                 "tessera.v1.Compute");
  grpc::GenericStub generic(admin_->channel());
  grpc::ClientContext call;
  call.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  std::string bytes = in->SerializeAsString();
  grpc::Slice slice(bytes);
  grpc::ByteBuffer send(&slice, 1), receive;
  absl::Notification done;
  grpc::Status status;
  generic.UnaryCall(&call, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &send, &receive,
                    [&](grpc::Status s) {
                      status = std::move(s);
                      done.Notify();
                    });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(receive.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  std::unique_ptr<google::protobuf::Message> reply(
      factory.GetPrototype(check->output_type())->New());
  ASSERT_TRUE(reply->ParseFromString(out));
  const google::protobuf::FieldDescriptor* field = check->output_type()->FindFieldByName("status");
  EXPECT_EQ(reply->GetReflection()->GetEnum(*reply, field)->name(), "SERVING");
}

}  // namespace
}  // namespace tessera
