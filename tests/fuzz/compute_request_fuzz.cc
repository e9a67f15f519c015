// The Compute service's request converters and checks (server/service/compute_convert.cc:
// CheckReference, DurationFromProto, MetaFromProto, AttrsFromProto, OutputsFromProto;
// server/service/call.cc: PageLimit, DecodePageToken) and the launch validator they feed
// (kernels::Registry::Prepare, the one check of a launch before it is enqueued), followed by
// a run of every accepted launch on the CPU kernels.
//
// Input: a serialized tessera.fuzz.ComputeCase (tests/fuzz/fuzz_inputs.proto): one request,
// and the metas of the tensors its handles name (a handle's meta is tensors[i % size]; in
// the server they are the tenant's tensors). Launch and Submit are resolved as
// TenantRuntime::ResolveLocked resolves them (handles to metas, output hints): the adapter's
// StepFromProto (compute_service.cc) and the runtime's resolution are not callable alone.
//
// Properties: refusals are INVALID_ARGUMENT (NOT_FOUND for an unknown kernel); an accepted
// launch has valid outputs that match the given ones, and runs; the bytes a program's new
// outputs need are representable (the runtime adds them up before charging the quota).
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/time/time.h"

#include "kernels/registry.h"
#include "server/service/call.h"
#include "server/service/compute_convert.h"
#include "tests/fuzz/fuzz_inputs.pb.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tessera::OutputSpec;
__extension__ using Uint128 = unsigned __int128;  // GCC's -Wpedantic: an extension
using tessera::kernels::TensorMeta;

void CheckRefusal(const absl::Status& status) {
  FUZZ_CHECK(absl::IsInvalidArgument(status) || absl::IsNotFound(status), status.ToString());
  FUZZ_CHECK(status.message().size() <= 2048, "an error message of ", status.message().size(),
             " bytes");
}

// The tenant's tensors; nullopt when one of them could not exist (an invalid spec).
std::optional<std::vector<TensorMeta>> Tensors(const tessera::fuzz::ComputeCase& input) {
  std::vector<TensorMeta> tensors;
  for (const tessera::v1::TensorSpec& spec : input.tensors()) {
    absl::StatusOr<TensorMeta> meta = tessera::MetaFromProto(spec, "tensor");
    if (!meta.ok()) return std::nullopt;
    tensors.push_back(*std::move(meta));
  }
  return tensors;
}

std::optional<TensorMeta> ByHandle(const std::vector<TensorMeta>& tensors, size_t i) {
  if (tensors.empty()) return std::nullopt;
  return tensors[i % tensors.size()];
}

// One step, resolved and validated; the plan, or nullopt after a refusal.
std::optional<tessera::kernels::Plan> PrepareStep(
    const std::string& kernel, std::vector<TensorMeta> inputs,
    const google::protobuf::RepeatedPtrField<tessera::v1::Output>& outputs,
    const google::protobuf::Map<std::string, tessera::v1::AttrValue>& attrs,
    const std::vector<TensorMeta>& tensors) {
  absl::StatusOr<std::vector<OutputSpec>> specs = tessera::OutputsFromProto(outputs, "outputs");
  if (!specs.ok()) {
    CheckRefusal(specs.status());
    return std::nullopt;
  }
  FUZZ_CHECK(specs->size() == static_cast<size_t>(outputs.size()), "outputs lost");
  absl::StatusOr<tessera::kernels::Attrs> converted = tessera::AttrsFromProto(attrs, "attrs");
  if (!converted.ok()) {
    CheckRefusal(converted.status());
    return std::nullopt;
  }
  tessera::kernels::OutputHints hints;
  for (size_t k = 0; k < specs->size(); ++k) {
    const OutputSpec& out = (*specs)[k];
    if (out.kind == OutputSpec::Kind::kHandle) {
      std::optional<TensorMeta> meta = ByHandle(tensors, k);
      if (!meta) return std::nullopt;  // NOT_FOUND in the server
      hints.push_back(meta);
    } else if (out.kind == OutputSpec::Kind::kCreate) {
      absl::StatusOr<int64_t> bytes = tessera::kernels::ByteSize(out.create);
      FUZZ_CHECK(bytes.ok(), "OutputsFromProto accepted an invalid create spec");
      hints.push_back(out.create);
    } else {
      hints.push_back(std::nullopt);
    }
  }
  absl::StatusOr<tessera::kernels::Plan> plan =
      tessera::kernels::Registry::Global().Prepare(kernel, std::move(inputs), *converted, hints);
  if (!plan.ok()) {
    CheckRefusal(plan.status());
    return std::nullopt;
  }
  FUZZ_CHECK(plan->outputs.size() == plan->kernel->outputs.size(), plan->kernel->name, " has ",
             plan->kernel->outputs.size(), " outputs; the plan ", plan->outputs.size());
  for (size_t k = 0; k < plan->outputs.size(); ++k) {
    absl::StatusOr<int64_t> bytes = tessera::kernels::ByteSize(plan->outputs[k]);
    FUZZ_CHECK(bytes.ok(), "an accepted launch of ", plan->kernel->name,
               " has an invalid output: ", bytes.status().ToString());
    if (k < hints.size() && hints[k]) {
      FUZZ_CHECK(*hints[k] == plan->outputs[k], "output ", k, " of ", plan->kernel->name,
                 " is not the tensor given for it");
    }
  }
  return *std::move(plan);
}

void CheckDuration(const google::protobuf::Duration& wire) {
  absl::StatusOr<absl::Duration> duration = tessera::DurationFromProto(wire, "timeout");
  if (!duration.ok()) {
    CheckRefusal(duration.status());
    return;
  }
  FUZZ_CHECK(*duration >= absl::ZeroDuration() && *duration < absl::InfiniteDuration(), "duration ",
             absl::FormatDuration(*duration));
  FUZZ_CHECK(absl::ToInt64Seconds(*duration) == wire.seconds(), "seconds");
  // What Enqueue and WaitJob make of it: a deadline that is not before now.
  const absl::Time now = absl::Now();
  FUZZ_CHECK(now + *duration >= now, "a deadline in the past");
}

void CheckReference(const std::string& value) {
  absl::Status valid = tessera::CheckReference(value, "handle", "a tensor handle");
  if (!valid.ok()) CheckRefusal(valid);
}

void Launch(const tessera::v1::LaunchRequest& request, const std::vector<TensorMeta>& tensors,
            uint64_t seed) {
  if (request.has_queue_timeout()) CheckDuration(request.queue_timeout());
  CheckReference(request.kernel());
  std::vector<TensorMeta> inputs;
  for (int i = 0; i < request.inputs_size(); ++i) {
    CheckReference(request.inputs(i));
    std::optional<TensorMeta> meta = ByHandle(tensors, static_cast<size_t>(i));
    if (!meta) return;
    inputs.push_back(*meta);
  }
  std::optional<tessera::kernels::Plan> plan =
      PrepareStep(request.kernel(), std::move(inputs), request.outputs(), request.attrs(), tensors);
  if (plan) tessera::fuzz::RunPlanOnCpu(*plan, seed);
}

void Submit(const tessera::v1::SubmitRequest& request, const std::vector<TensorMeta>& tensors,
            uint64_t seed) {
  if (request.has_queue_timeout()) CheckDuration(request.queue_timeout());
  std::vector<tessera::kernels::Plan> plans;
  Uint128 new_bytes = 0;
  for (const tessera::v1::ProgramStep& step : request.steps()) {
    std::vector<TensorMeta> inputs;
    for (int k = 0; k < step.inputs_size(); ++k) {
      const tessera::v1::Operand& op = step.inputs(k);
      if (op.has_step_output()) {
        const uint32_t s = op.step_output().step(), o = op.step_output().output();
        if (s >= plans.size() || o >= plans[s].outputs.size()) return;  // refused
        inputs.push_back(plans[s].outputs[o]);
      } else if (op.source_case() == tessera::v1::Operand::kHandle) {
        CheckReference(op.handle());
        std::optional<TensorMeta> meta = ByHandle(tensors, static_cast<size_t>(k));
        if (!meta) return;
        inputs.push_back(*meta);
      } else {
        return;  // refused by StepFromProto
      }
    }
    std::optional<tessera::kernels::Plan> plan =
        PrepareStep(step.kernel(), std::move(inputs), step.outputs(), step.attrs(), tensors);
    if (!plan) return;
    for (size_t k = 0; k < plan->outputs.size(); ++k) {
      const bool existing = k < static_cast<size_t>(step.outputs_size()) &&
                            step.outputs(static_cast<int>(k)).has_handle();
      if (!existing) {
        new_bytes += static_cast<uint64_t>(*tessera::kernels::ByteSize(plan->outputs[k]));
      }
    }
    plans.push_back(*std::move(plan));
    if (plans.size() > 64) return;
  }
  // TenantRuntime::Prepare sums the new outputs' bytes in a uint64_t before charging them.
  FUZZ_CHECK(new_bytes <= UINT64_MAX, "a program's new outputs need 2^64 bytes or more");
  for (const tessera::kernels::Plan& plan : plans) tessera::fuzz::RunPlanOnCpu(plan, seed++);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::fuzz::ComputeCase input;
  if (!tessera::fuzz::ParseMessage(data, size, &input)) return 0;
  std::optional<std::vector<TensorMeta>> tensors = Tensors(input);
  if (!tensors) return 0;
  const uint64_t seed = size;
  switch (input.request_case()) {
    case tessera::fuzz::ComputeCase::kCreate: {
      absl::StatusOr<TensorMeta> meta = tessera::MetaFromProto(input.create().spec(), "spec");
      if (!meta.ok()) {
        CheckRefusal(meta.status());
        break;
      }
      absl::StatusOr<int64_t> bytes = tessera::kernels::ByteSize(*meta);
      FUZZ_CHECK(bytes.ok() && *bytes >= 0, "MetaFromProto accepted an invalid spec");
      FUZZ_CHECK(meta->shape.size() <= tessera::kernels::kMaxRank, "rank ", meta->shape.size());
      break;
    }
    case tessera::fuzz::ComputeCase::kLaunch:
      Launch(input.launch(), *tensors, seed);
      break;
    case tessera::fuzz::ComputeCase::kSubmit:
      Submit(input.submit(), *tensors, seed);
      break;
    case tessera::fuzz::ComputeCase::kList: {
      absl::StatusOr<size_t> limit = tessera::PageLimit(input.list().page_size());
      if (limit.ok()) FUZZ_CHECK(*limit >= 1 && *limit <= 1000, "page limit ", *limit);
      if (!input.list().page_token().empty()) {
        absl::StatusOr<std::string> after =
            tessera::DecodePageToken("tensors", input.list().page_token(), "ListTensors");
        if (after.ok()) {
          FUZZ_CHECK(tessera::DecodePageToken(
                         "tensors", tessera::EncodePageToken("tensors", *after), "ListTensors")
                             .value_or("?") == *after,
                     "page tokens do not round-trip");
        } else {
          CheckRefusal(after.status());
        }
      }
      break;
    }
    case tessera::fuzz::ComputeCase::kRead:
      CheckReference(input.read().handle());
      break;
    case tessera::fuzz::ComputeCase::kWaitJob:
      CheckDuration(input.wait_job().timeout());
      CheckReference(input.wait_job().job_id());
      break;
    case tessera::fuzz::ComputeCase::kCancelJob:
      CheckReference(input.cancel_job().job_id());
      break;
    case tessera::fuzz::ComputeCase::kWrite:
      if (input.write().has_header() && input.write().header().has_create()) {
        absl::StatusOr<TensorMeta> meta =
            tessera::MetaFromProto(input.write().header().create(), "header.create");
        if (!meta.ok()) CheckRefusal(meta.status());
      }
      break;
    case tessera::fuzz::ComputeCase::REQUEST_NOT_SET:
      break;
  }
  return 0;
}
