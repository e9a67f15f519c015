// Right answers to bad requests (issue 18): every index, count, offset, length, enum value,
// stream number, duration, reference and size a request carries is checked before any lookup
// or narrowing cast, and refused INVALID_ARGUMENT naming the field and the limit. Bytes that
// are not a request at all are answered by the gRPC library, and the server goes on serving.
#include <cstdint>
#include <limits>
#include <regex>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"

#include "tests/testing/server_fixture.h"

namespace tessera {
namespace {

using testing::Spec;

using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

constexpr uint32_t kMaxU32 = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();

// INVALID_ARGUMENT whose message names every one of `parts`.
::testing::AssertionResult IsInvalid(const absl::Status& status,
                                     std::initializer_list<absl::string_view> parts) {
  if (status.code() != absl::StatusCode::kInvalidArgument) {
    return ::testing::AssertionFailure() << "expected INVALID_ARGUMENT, got " << status;
  }
  for (absl::string_view part : parts) {
    if (status.message().find(part) == absl::string_view::npos) {
      return ::testing::AssertionFailure()
             << "\"" << status.message() << "\" lacks \"" << part << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

// A unary call of `method` with `bytes` as the request, whatever they are.
grpc::Status CallWithBytes(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                           const std::string& token, const std::string& bytes) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

// A streaming call of `method` sending `messages` as they are, then half-closing; reads what
// comes back until the end and returns the status.
grpc::Status StreamWithBytes(const std::shared_ptr<grpc::Channel>& channel,
                             const std::string& method, const std::string& token,
                             const std::vector<std::string>& messages) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  grpc::CompletionQueue cq;
  auto wait = [&cq] {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    return ok;
  };
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, method, &cq);
  call->StartCall(nullptr);
  bool open = wait();
  for (const std::string& bytes : messages) {
    if (!open) break;
    grpc::Slice slice(bytes);
    grpc::ByteBuffer message(&slice, 1);
    call->Write(message, nullptr);
    open = wait();
  }
  if (open) {
    call->WritesDone(nullptr);
    wait();
  }
  for (bool more = true; more;) {
    grpc::ByteBuffer reply;
    call->Read(&reply, nullptr);
    more = wait();
  }
  grpc::Status status;
  call->Finish(&status, nullptr);
  wait();
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

class BadRequestTest : public testing::ServerTest {
 protected:
  void SetUp() override {
    ServerTest::SetUp();
    key_ = MustRegister("alpha");
    tenant_ = ClientWith(key_);
    compute_ = v1::Compute::NewStub(tenant_->channel());
    auto x = tenant_->CreateTensor(Spec(v1::DTYPE_F32, {4}), std::string(16, '\0'));
    ASSERT_TRUE(x.ok()) << x.status();
    x_ = x->handle();
  }

  // One relu step on `operand`.
  static v1::ProgramStep Relu(const v1::Operand& operand) {
    v1::ProgramStep step;
    step.set_kernel("relu");
    *step.add_inputs() = operand;
    return step;
  }
  v1::Operand Handle() const {
    v1::Operand op;
    op.set_handle(x_);
    return op;
  }
  static v1::Operand StepOutput(uint32_t step, uint32_t output) {
    v1::Operand op;
    op.mutable_step_output()->set_step(step);
    op.mutable_step_output()->set_output(output);
    return op;
  }
  v1::LaunchRequest Neg() const {
    v1::LaunchRequest request;
    request.set_kernel("neg");
    request.add_inputs(x_);
    request.set_wait(true);
    return request;
  }

  // The server's health, and a call that does real work: it still serves.
  void ExpectServing() {
    auto health = Health::NewStub(admin_->channel());
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    HealthCheckResponse response;
    ASSERT_TRUE(health->Check(&context, HealthCheckRequest(), &response).ok());
    EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
    EXPECT_TRUE(admin_->GetServerInfo().ok());
    auto job = tenant_->Launch(Neg());
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED);
  }

  std::string key_;
  std::unique_ptr<Client> tenant_;
  std::unique_ptr<v1::Compute::Stub> compute_;
  std::string x_;
};

TEST_F(BadRequestTest, StepOutputMustReferToAnEarlierStepsOutput) {
  auto submit = [&](std::vector<v1::ProgramStep> steps) {
    v1::SubmitRequest request;
    for (v1::ProgramStep& s : steps) *request.add_steps() = std::move(s);
    request.set_wait(true);
    return tenant_->Submit(request).status();
  };
  // The issue's case: 4294967295 once became step -1, then the handle "" (NOT_FOUND).
  EXPECT_TRUE(IsInvalid(submit({Relu(Handle()), Relu(StepOutput(kMaxU32, 0))}),
                        {"steps[1].inputs[0].step_output.step is 4294967295",
                         "not an earlier step: the range is 0..0"}));
  // The step itself and later ones are not earlier; step 0 has no earlier step at all.
  EXPECT_TRUE(IsInvalid(submit({Relu(Handle()), Relu(StepOutput(1, 0))}),
                        {"steps[1].inputs[0].step_output.step is 1, not an earlier step", "0..0"}));
  EXPECT_TRUE(IsInvalid(submit({Relu(Handle()), Relu(StepOutput(0, 0)), Relu(StepOutput(7, 0))}),
                        {"steps[2].inputs[0].step_output.step is 7", "0..1"}));
  EXPECT_TRUE(IsInvalid(
      submit({Relu(StepOutput(0, 0))}),
      {"steps[0].inputs[0].step_output.step is 0, not an earlier step", "step 0 has none"}));
  // Outputs: beyond what any kernel has, and beyond what that step's kernel has.
  EXPECT_TRUE(IsInvalid(submit({Relu(Handle()), Relu(StepOutput(0, kMaxU32))}),
                        {"steps[1].inputs[0].step_output.output is 4294967295", "no kernel has"}));
  EXPECT_TRUE(IsInvalid(
      submit({Relu(Handle()), Relu(StepOutput(0, 1))}),
      {"steps[1].inputs[0].step_output.output is 1", "steps[0] (relu) has 1 output(s): 0..0"}));
  // The right reference works.
  auto ok = submit({Relu(Handle()), Relu(StepOutput(0, 0))});
  EXPECT_TRUE(ok.ok()) << ok;
}

TEST_F(BadRequestTest, ProgramLengthIsCheckedBeforeAnythingElse) {
  v1::SubmitRequest empty;
  EXPECT_TRUE(IsInvalid(tenant_->Submit(empty).status(), {"steps has 0 entries", "1..256"}));
  v1::SubmitRequest long_program;
  for (int i = 0; i < 10000; ++i) *long_program.add_steps() = Relu(StepOutput(kMaxU32, 0));
  EXPECT_TRUE(
      IsInvalid(tenant_->Submit(long_program).status(), {"steps has 10000 entries", "1..256"}));
}

TEST_F(BadRequestTest, LaunchListsAndReferencesAreCheckedBeforeLookups) {
  v1::LaunchRequest many_inputs = Neg();
  for (int i = 0; i < 1000; ++i) many_inputs.add_inputs("tn_nothing");
  EXPECT_TRUE(IsInvalid(tenant_->Launch(many_inputs).status(),
                        {"inputs has 1001 entries", "no kernel takes more than"}));
  v1::LaunchRequest many_outputs = Neg();
  for (int i = 0; i < 100; ++i) many_outputs.add_outputs()->set_infer(true);
  EXPECT_TRUE(IsInvalid(tenant_->Launch(many_outputs).status(),
                        {"outputs has 100 entries", "no kernel has more than"}));
  // Empty references were looked up as the handle "" (NOT_FOUND `tensor "" not found`).
  v1::LaunchRequest empty_input = Neg();
  empty_input.set_inputs(0, "");
  EXPECT_TRUE(IsInvalid(tenant_->Launch(empty_input).status(), {"inputs[0] is empty"}));
  v1::LaunchRequest empty_output = Neg();
  empty_output.add_outputs()->set_handle("");
  EXPECT_TRUE(IsInvalid(tenant_->Launch(empty_output).status(), {"outputs[0].handle is empty"}));
  v1::LaunchRequest no_kernel = Neg();
  no_kernel.clear_kernel();
  EXPECT_TRUE(IsInvalid(tenant_->Launch(no_kernel).status(), {"kernel is empty"}));
  v1::LaunchRequest long_handle = Neg();
  long_handle.set_inputs(0, std::string(5000, 'h'));
  EXPECT_TRUE(IsInvalid(tenant_->Launch(long_handle).status(),
                        {"inputs[0] is 5000 bytes; the limit is 256"}));
  v1::SubmitRequest program;
  v1::Operand empty;
  empty.set_handle("");
  *program.add_steps() = Relu(empty);
  EXPECT_TRUE(IsInvalid(tenant_->Submit(program).status(), {"steps[0].inputs[0].handle is empty"}));
  // A well-formed handle that does not exist is still NOT_FOUND.
  v1::LaunchRequest unknown = Neg();
  unknown.set_inputs(0, "tn_unknown");
  EXPECT_EQ(tenant_->Launch(unknown).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BadRequestTest, AttributesAreBounded) {
  v1::LaunchRequest long_string = Neg();
  long_string.set_kernel("cast");
  (*long_string.mutable_attrs())["dtype"].set_s(std::string(100000, 'f'));
  EXPECT_TRUE(IsInvalid(tenant_->Launch(long_string).status(),
                        {"attrs[dtype].s is 100000 bytes; the limit is 256"}));
  v1::LaunchRequest long_list = Neg();
  long_list.set_kernel("sum");
  for (int i = 0; i < 1000; ++i) (*long_list.mutable_attrs())["axes"].mutable_ints()->add_values(0);
  EXPECT_TRUE(IsInvalid(tenant_->Launch(long_list).status(),
                        {"attrs[axes] has 1000 values; the limit is 64"}));
  v1::LaunchRequest many = Neg();
  for (int i = 0; i < 100; ++i) (*many.mutable_attrs())[absl::StrCat("a", i)].set_i(i);
  EXPECT_TRUE(
      IsInvalid(tenant_->Launch(many).status(), {"attrs has 100 entries; the limit is 64"}));
  v1::LaunchRequest long_name = Neg();
  (*long_name.mutable_attrs())[std::string(1000, 'n')].set_i(1);
  EXPECT_TRUE(IsInvalid(tenant_->Launch(long_name).status(), {"attrs key", "1..64"}));
  v1::SubmitRequest unset;
  *unset.add_steps() = Relu(Handle());
  (*unset.mutable_steps(0)->mutable_attrs())["alpha"];
  EXPECT_TRUE(IsInvalid(tenant_->Submit(unset).status(), {"steps[0].attrs[alpha] has no value"}));
}

TEST_F(BadRequestTest, KernelDefinitionsAreCountedBeforeTheyAreCopied) {
  v1::KernelDefinition many_inputs;
  many_inputs.set_name("wide");
  for (int i = 0; i < 100; ++i) {
    v1::KernelOperandDef* in = many_inputs.add_inputs();
    in->set_name(absl::StrCat("x", i));
    in->set_dtype(v1::DTYPE_F32);
  }
  EXPECT_TRUE(IsInvalid(tenant_->DefineKernel(many_inputs).status(),
                        {"definition.inputs has 100 entries; the limit is 16"}));
  v1::KernelDefinition long_body;
  long_body.set_name("long");
  long_body.set_body(std::string(100000, ' '));
  EXPECT_TRUE(IsInvalid(tenant_->DefineKernel(long_body).status(),
                        {"definition.body is 100000 bytes; the limit is 16384"}));
  v1::KernelDefinition bad_dtype;
  bad_dtype.set_name("odd");
  bad_dtype.add_inputs()->set_dtype(static_cast<v1::DType>(-7));
  EXPECT_TRUE(
      IsInvalid(tenant_->DefineKernel(bad_dtype).status(), {"definition.inputs[0].dtype is -7"}));
}

TEST_F(BadRequestTest, StreamNumbersNameTheRange) {
  v1::LaunchRequest launch = Neg();
  launch.set_stream(kMaxU32);
  EXPECT_TRUE(IsInvalid(tenant_->Launch(launch).status(),
                        {"stream is 4294967295; the tenant has 4 streams (0..3)"}));
  v1::SubmitRequest submit;
  *submit.add_steps() = Relu(Handle());
  submit.set_stream(4);
  EXPECT_TRUE(IsInvalid(tenant_->Submit(submit).status(), {"stream is 4", "(0..3)"}));
  EXPECT_TRUE(IsInvalid(tenant_->Synchronize(kMaxU32).status(),
                        {"stream is 4294967295; the tenant has 4 streams (0..3)"}));
}

TEST_F(BadRequestTest, DurationsAreValidGoogleProtobufDurations) {
  struct Case {
    int64_t seconds;
    int32_t nanos;
    const char* expect;
  };
  const Case cases[] = {
      {0, -1, "queue_timeout.nanos is -1; the range is 0..999999999"},
      {0, 1'000'000'000, "queue_timeout.nanos is 1000000000; the range is 0..999999999"},
      {-5, 0, "queue_timeout.seconds is -5; the range is 0..315576000000"},
      {std::numeric_limits<int64_t>::max(), 0, "queue_timeout.seconds is 9223372036854775807"},
  };
  for (const Case& c : cases) {
    v1::LaunchRequest launch = Neg();
    launch.mutable_queue_timeout()->set_seconds(c.seconds);
    launch.mutable_queue_timeout()->set_nanos(c.nanos);
    EXPECT_TRUE(IsInvalid(tenant_->Launch(launch).status(), {c.expect}));
  }
  auto job = tenant_->Launch(Neg());
  ASSERT_TRUE(job.ok());
  v1::WaitJobRequest wait;
  wait.set_job_id(job->job_id());
  wait.mutable_timeout()->set_seconds(std::numeric_limits<int64_t>::max());
  grpc::ClientContext context;
  context.AddMetadata("authorization", absl::StrCat("Bearer ", key_));
  v1::Job response;
  absl::Status waited = FromGrpcStatus(compute_->WaitJob(&context, wait, &response));
  EXPECT_TRUE(IsInvalid(waited, {"timeout.seconds is 9223372036854775807", "0..315576000000"}));
  // Job ids are references: empty is malformed, unknown is NOT_FOUND.
  EXPECT_TRUE(IsInvalid(tenant_->WaitJob("").status(), {"job_id is empty"}));
  EXPECT_TRUE(IsInvalid(tenant_->CancelJob("").status(), {"job_id is empty"}));
  EXPECT_EQ(tenant_->CancelJob("job_999999").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BadRequestTest, TensorSpecsAreCheckedBeforeTheyAreUsed) {
  // Open enums: any int32 arrives.
  for (int dtype : {-1, 9, 1000, std::numeric_limits<int32_t>::max()}) {
    EXPECT_TRUE(IsInvalid(tenant_->CreateTensor(Spec(static_cast<v1::DType>(dtype), {1})).status(),
                          {absl::StrCat("spec.dtype is ", dtype)}));
  }
  std::vector<int64_t> dims(100000, 1);
  EXPECT_TRUE(IsInvalid(tenant_->CreateTensor(Spec(v1::DTYPE_F32, dims)).status(),
                        {"spec.shape has 100000 dimensions; the limit is 8"}));
  EXPECT_TRUE(IsInvalid(tenant_->CreateTensor(Spec(v1::DTYPE_F32, {2, -1})).status(),
                        {"spec.shape[1] is -1"}));
  const int64_t huge = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(IsInvalid(tenant_->CreateTensor(Spec(v1::DTYPE_F32, {huge, huge})).status(),
                        {"spec.shape", "2^62"}));
  v1::LaunchRequest launch = Neg();
  launch.add_outputs()->mutable_create()->set_dtype(static_cast<v1::DType>(77));
  EXPECT_TRUE(IsInvalid(tenant_->Launch(launch).status(), {"outputs[0].create.dtype is 77"}));
  v1::WriteTensorRequest header;
  *header.mutable_header()->mutable_create() = Spec(v1::DTYPE_U8, {1, 1, 1, 1, 1, 1, 1, 1, 1});
  EXPECT_TRUE(IsInvalid(
      FromGrpcStatus(StreamWithBytes(tenant_->channel(), "/tessera.v1.Compute/WriteTensor", key_,
                                     {header.SerializeAsString()})),
      {"header.create.shape has 9 dimensions; the limit is 8"}));
}

TEST_F(BadRequestTest, HandlesAreCheckedBeforeLookups) {
  const std::string long_handle(300, 'h');
  EXPECT_TRUE(IsInvalid(tenant_->GetTensor("").status(), {"handle is empty"}));
  EXPECT_TRUE(IsInvalid(tenant_->GetTensor(long_handle).status(),
                        {"handle is 300 bytes; the limit is 256"}));
  EXPECT_TRUE(IsInvalid(tenant_->DeleteTensor("").status(), {"handle is empty"}));
  EXPECT_TRUE(IsInvalid(tenant_->Download("").status(), {"handle is empty"}));
  EXPECT_TRUE(IsInvalid(tenant_->Overwrite(long_handle, "x").status(),
                        {"header.handle is 300 bytes; the limit is 256"}));
  EXPECT_TRUE(IsInvalid(tenant_->DeleteKernel(""), {"name is empty"}));
  v1::ListTensorsRequest list;
  list.set_page_token(std::string(100000, 'A'));
  grpc::ClientContext context;
  context.AddMetadata("authorization", absl::StrCat("Bearer ", key_));
  v1::ListTensorsResponse page;
  EXPECT_TRUE(IsInvalid(FromGrpcStatus(compute_->ListTensors(&context, list, &page)),
                        {"page_token is 100000 bytes; the limit is 512"}));
  // Well-formed but unknown: NOT_FOUND, as another tenant's handle is.
  EXPECT_EQ(tenant_->GetTensor("tn_0123456789abcdef").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BadRequestTest, ReadRangesAreOverflowSafe) {
  EXPECT_TRUE(IsInvalid(tenant_->Download(x_, kMaxU64, 1).status(),
                        {"offset 18446744073709551615 + length 1", "16 bytes"}));
  EXPECT_TRUE(IsInvalid(tenant_->Download(x_, 1, kMaxU64).status(),
                        {"offset 1 + length 18446744073709551615", "16 bytes"}));
  EXPECT_TRUE(IsInvalid(tenant_->Download(x_, 0, 0, kMaxU32).status(),
                        {"chunk_bytes is 4294967295; the range is 4096.."}));
  EXPECT_TRUE(IsInvalid(tenant_->Download(x_, 0, 0, 1).status(), {"chunk_bytes is 1"}));
  auto tail = tenant_->Download(x_, 16, 0);  // an empty range at the end is fine
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_TRUE(tail->empty());
}

TEST_F(BadRequestTest, UploadChunksAreBoundedAndMerged) {
  auto write = [&](const std::vector<std::pair<uint64_t, std::string>>& chunks, int64_t size) {
    v1::WriteTensorRequest header;
    *header.mutable_header()->mutable_create() = Spec(v1::DTYPE_U8, {size});
    std::vector<std::string> messages = {header.SerializeAsString()};
    for (const auto& [offset, data] : chunks) {
      v1::WriteTensorRequest chunk;
      chunk.mutable_chunk()->set_offset(offset);
      chunk.mutable_chunk()->set_data(data);
      messages.push_back(chunk.SerializeAsString());
    }
    return FromGrpcStatus(
        StreamWithBytes(tenant_->channel(), "/tessera.v1.Compute/WriteTensor", key_, messages));
  };
  EXPECT_TRUE(IsInvalid(write({{kMaxU64, "x"}}, 4), {"chunk at offset 18446744073709551615"}));
  EXPECT_TRUE(IsInvalid(write({{0, "ab"}, {1, "b"}}, 4), {"overlaps bytes already written"}));
  // One byte at a time, last byte first: every chunk merges with the one before it.
  std::string data(3000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  std::vector<std::pair<uint64_t, std::string>> backwards;
  for (size_t i = data.size(); i-- > 0;) backwards.emplace_back(i, data.substr(i, 1));
  ASSERT_TRUE(write(backwards, 3000).ok());
  auto tensors = tenant_->ListAllTensors();
  ASSERT_TRUE(tensors.ok());
  std::string uploaded;
  for (const v1::TensorInfo& t : *tensors) {
    if (t.size_bytes() == 3000) uploaded = t.handle();
  }
  EXPECT_EQ(*tenant_->Download(uploaded), data);
  // Scattered one-byte chunks, each leaving a gap: refused past 16384 separate ranges.
  const int64_t chunks = 16384 + 1;
  std::vector<std::pair<uint64_t, std::string>> scattered;
  for (int64_t i = 0; i < chunks; ++i) scattered.emplace_back(2 * i, "x");
  EXPECT_TRUE(IsInvalid(write(scattered, 2 * chunks), {"more than 16384 separate written ranges"}));
}

TEST_F(BadRequestTest, AdminFieldsNameTheirLimits) {
  struct Case {
    void (*set)(v1::RegisterTenantRequest*);
    const char* expect;
  };
  const Case cases[] = {
      {[](v1::RegisterTenantRequest* r) {
         r->mutable_quota()->set_priority(static_cast<v1::Priority>(-1));
       },
       "quota.priority is -1"},
      {[](v1::RegisterTenantRequest* r) {
         r->mutable_quota()->set_priority(static_cast<v1::Priority>(99));
       },
       "quota.priority is 99"},
      {[](v1::RegisterTenantRequest* r) { r->mutable_quota()->set_compute_share_percent(kMaxU32); },
       "quota.compute_share_percent is 4294967295; the range is 1..100"},
      {[](v1::RegisterTenantRequest* r) { r->mutable_quota()->set_max_streams(kMaxU32); },
       "quota.max_streams is 4294967295; the range is 1..64"},
      {[](v1::RegisterTenantRequest* r) { r->mutable_quota()->set_max_queued_jobs(kMaxU32); },
       "quota.max_queued_jobs is 4294967295; the range is 1..65536"},
      {[](v1::RegisterTenantRequest* r) { r->mutable_quota()->set_device_memory_bytes(kMaxU64); },
       "quota.device_memory_bytes is 18446744073709551615"},
      {[](v1::RegisterTenantRequest* r) {
         r->set_device_index(std::numeric_limits<int32_t>::max());
       },
       "device_index is 2147483647; the range is 0..0"},
      {[](v1::RegisterTenantRequest* r) { r->set_device_index(-1); }, "device_index is -1"},
      {[](v1::RegisterTenantRequest* r) { r->set_tenant_id(std::string(64, 'a')); },
       "tenant_id is 64 characters; the limit is 63"},
      {[](v1::RegisterTenantRequest* r) { r->set_display_name(std::string(300, 'd')); },
       "display_name is 300 bytes; the limit is 256"},
      {[](v1::RegisterTenantRequest* r) {
         // push_back, not = "v": GCC 12's -O3 -Wrestrict misfires on the assignment here.
         for (int i = 0; i < 100000; ++i)
           (*r->mutable_labels())[absl::StrCat("k", i)].push_back('v');
       },
       "labels has 100000 entries; the limit is 64"},
  };
  for (const Case& c : cases) {
    v1::RegisterTenantRequest request = Registration("beta");
    c.set(&request);
    EXPECT_TRUE(IsInvalid(admin_->RegisterTenant(request).status(), {c.expect}));
  }
  EXPECT_TRUE(
      IsInvalid(admin_->ListTenants(-1).status(), {"page_size is -1; the range is 0..1000"}));
  EXPECT_TRUE(IsInvalid(admin_->ListTenants(1001).status(), {"page_size is 1001"}));
  EXPECT_TRUE(IsInvalid(admin_->ListTenants(0, "garbage!").status(), {"page_token"}));
  v1::Tenant update;
  update.set_tenant_id("alpha");
  for (int i = 0; i < 1000; ++i) (*update.mutable_labels())[absl::StrCat("k", i)].push_back('v');
  EXPECT_TRUE(IsInvalid(admin_->UpdateTenant(update, {"labels"}).status(),
                        {"tenant.labels has 1000 entries; the limit is 64"}));
  EXPECT_TRUE(IsInvalid(admin_->RotateTenantKey("").status(), {"tenant_id is required"}));
  EXPECT_EQ(admin_->ListAllTenants()->size(), 1u);  // nothing half-registered
}

TEST_F(BadRequestTest, CreateTensorDataOverItsLimitPointsToWriteTensor) {
  const size_t limit = size_t{16} << 20;
  // The client library refuses locally, naming Upload.
  absl::Status local = tenant_
                           ->CreateTensor(Spec(v1::DTYPE_U8, {static_cast<int64_t>(limit + 1)}),
                                          std::string(limit + 1, 'x'))
                           .status();
  EXPECT_TRUE(IsInvalid(local, {"16777217 bytes", "16777216", "Client::Upload", "WriteTensor"}));
  // The server answers the same, below the transport's limit (--max_message_bytes, 64 MiB).
  v1::CreateTensorRequest request;
  *request.mutable_spec() = Spec(v1::DTYPE_U8, {static_cast<int64_t>(limit + 1)});
  request.set_data(std::string(limit + 1, 'x'));
  grpc::ClientContext context;
  context.AddMetadata("authorization", absl::StrCat("Bearer ", key_));
  v1::TensorInfo info;
  EXPECT_TRUE(IsInvalid(FromGrpcStatus(compute_->CreateTensor(&context, request, &info)),
                        {"data is 16777217 bytes", "at most 16777216", "WriteTensor"}));
  // Exactly the limit is fine.
  auto at_limit = tenant_->CreateTensor(Spec(v1::DTYPE_U8, {static_cast<int64_t>(limit)}),
                                        std::string(limit, 'y'));
  EXPECT_TRUE(at_limit.ok()) << at_limit.status();
}

// gRPC C++ 1.51's callback API answers a request it cannot parse UNIMPLEMENTED with an empty
// message, before any Tessera code runs (docs/api.md, "Requests that are not requests").
TEST_F(BadRequestTest, UndecodableRequestsAreUnimplementedAndTheServerKeepsServing) {
  const std::string garbage[] = {
      std::string(11, '\xff'),  // a varint that never ends
      std::string("\x0f", 1),   // wire type 7 does not exist
      std::string("\x0a\x05"
                  "ab",
                  4),  // a length past the end
  };
  for (const std::string& bytes : garbage) {
    for (const char* method :
         {"/tessera.v1.TenantAdmin/GetTenant", "/tessera.v1.TenantAdmin/RegisterTenant",
          "/tessera.v1.Compute/Launch", "/tessera.v1.Compute/Submit"}) {
      const std::string& token =
          absl::StartsWith(method, "/tessera.v1.Compute") ? key_ : server_->AdminToken();
      grpc::Status s = CallWithBytes(admin_->channel(), method, token, bytes);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << method;
    }
    // Server streaming: ReadTensor parses its raw request itself and answers as gRPC does for
    // the others, naming the message.
    grpc::Status read =
        StreamWithBytes(tenant_->channel(), "/tessera.v1.Compute/ReadTensor", key_, {bytes});
    EXPECT_EQ(read.error_code(), grpc::StatusCode::UNIMPLEMENTED);
    EXPECT_THAT(read.error_message(), HasSubstr("tessera.v1.ReadTensorRequest"));
    // Client streaming: WriteTensor names the message that is not a request and commits
    // nothing.
    v1::WriteTensorRequest header;
    *header.mutable_header()->mutable_create() = Spec(v1::DTYPE_U8, {4});
    grpc::Status write = StreamWithBytes(tenant_->channel(), "/tessera.v1.Compute/WriteTensor",
                                         key_, {header.SerializeAsString(), bytes});
    EXPECT_EQ(write.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << write.error_message();
    EXPECT_THAT(write.error_message(),
                HasSubstr("message 2 of the upload is not a tessera.v1.WriteTensorRequest"));
  }
  auto tensors = tenant_->ListAllTensors();
  ASSERT_TRUE(tensors.ok());
  EXPECT_EQ(tensors->size(), 1u);  // x_ only
  ExpectServing();
}

// Invalid UTF-8 in a string field fails the parse (UNIMPLEMENTED, above) and makes libprotobuf
// log an error. The server routes that log through its own (tessera::RouteProtobufLogging):
// our format, at most 10 lines a second, the rest counted.
TEST_F(BadRequestTest, InvalidUtf8IsLoggedInOurFormatAndRateLimited) {
  const std::string request("\x0a\x02\xff\xfe", 4);  // GetTenantRequest{tenant_id: ff fe}
  const absl::Time start = absl::Now();
  constexpr int kRequests = 200;
  for (int i = 0; i < kRequests; ++i) {
    grpc::Status s = CallWithBytes(admin_->channel(), "/tessera.v1.TenantAdmin/GetTenant",
                                   server_->AdminToken(), request);
    ASSERT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  const int64_t seconds = absl::ToInt64Seconds(absl::Now() - start) + 1;
  // A later second: its first line reports what the limit dropped.
  absl::SleepFor(absl::Seconds(1.1));
  ASSERT_EQ(CallWithBytes(admin_->channel(), "/tessera.v1.TenantAdmin/GetTenant",
                          server_->AdminToken(), request)
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  ASSERT_TRUE(server_->WaitForOutput("suppressed", absl::Seconds(10))) << server_->output();
  ExpectServing();

  std::istringstream lines(server_->output());
  int utf8_lines = 0, summaries = 0;
  const std::regex ours(R"(^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} [EW] \d+ .*source=libprotobuf)");
  for (std::string line; std::getline(lines, line);) {
    EXPECT_THAT(line, ::testing::Not(HasSubstr("[libprotobuf")));  // protobuf's own format
    if (line.find("invalid UTF-8") != std::string::npos) {
      ++utf8_lines;
      EXPECT_TRUE(std::regex_search(line, ours)) << line;
      EXPECT_THAT(line, HasSubstr("tessera.v1.GetTenantRequest.tenant_id"));
    }
    if (line.find("suppressed") != std::string::npos) {
      ++summaries;
      EXPECT_TRUE(std::regex_search(line, ours)) << line;
    }
  }
  EXPECT_GE(utf8_lines, 2);                       // logged, the last request's included
  EXPECT_LE(utf8_lines, 10 * (seconds + 1) + 1);  // at most 10 a second
  EXPECT_LT(utf8_lines, kRequests);               // and so not one per request
  EXPECT_GE(summaries, 1);
}

}  // namespace
}  // namespace tessera
