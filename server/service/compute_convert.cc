#include "server/service/compute_convert.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#include "kernels/expr/compile.h"
#include "server/common/status_macros.h"
#include "server/service/convert.h"

namespace tessera {
namespace {

void AttrToProto(const kernels::AttrValue& value, v1::AttrValue* proto) {
  std::visit(
      [proto](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          proto->set_i(v);
        } else if constexpr (std::is_same_v<T, double>) {
          proto->set_f(v);
        } else if constexpr (std::is_same_v<T, bool>) {
          proto->set_b(v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          proto->set_s(v);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          proto->mutable_ints()->mutable_values()->Add(v.begin(), v.end());
        } else {
          proto->mutable_floats()->mutable_values()->Add(v.begin(), v.end());
        }
      },
      value);
}

v1::KernelParam ParamToProto(const kernels::ParamDef& p) {
  v1::KernelParam proto;
  proto.set_name(p.name);
  for (kernels::DType d : p.dtypes) proto.add_dtypes(static_cast<v1::DType>(d));
  proto.set_shape_rule(p.shape_rule);
  proto.set_optional(p.optional);
  return proto;
}

// Bounds a value quoted in an error message (the message is logged whole).
std::string Excerpt(absl::string_view s) {
  constexpr size_t kMax = 64;
  return s.size() <= kMax ? std::string(s) : absl::StrCat(s.substr(0, kMax), "...");
}

size_t MaxOfCatalog(size_t from_expr, size_t (*count)(const kernels::KernelDef&)) {
  size_t most = from_expr;
  for (const kernels::KernelDef& k : kernels::Registry::Global().kernels()) {
    most = std::max(most, count(k));
  }
  return most;
}

}  // namespace

size_t MaxKernelInputs() {
  static const size_t most = MaxOfCatalog(
      kernels::expr::kMaxInputs, [](const kernels::KernelDef& k) { return k.inputs.size(); });
  return most;
}

size_t MaxKernelOutputs() {
  static const size_t most = MaxOfCatalog(
      kernels::expr::kMaxOutputs, [](const kernels::KernelDef& k) { return k.outputs.size(); });
  return most;
}

absl::Status CheckReference(absl::string_view value, absl::string_view field,
                            absl::string_view what) {
  if (value.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is empty; give ", what));
  }
  if (value.size() > kMaxReferenceBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is ", value.size(),
                                                   " bytes; the limit is ", kMaxReferenceBytes,
                                                   " (it should be ", what, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Duration> DurationFromProto(const google::protobuf::Duration& duration,
                                                 absl::string_view field) {
  if (duration.seconds() < 0 || duration.seconds() > kMaxDurationSeconds) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".seconds is ", duration.seconds(),
                                                   "; the range is 0..", kMaxDurationSeconds));
  }
  if (duration.nanos() < 0 || duration.nanos() > 999'999'999) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".nanos is ", duration.nanos(), "; the range is 0..999999999"));
  }
  return absl::Seconds(duration.seconds()) + absl::Nanoseconds(duration.nanos());
}

absl::StatusOr<kernels::DType> DTypeFromProto(int value, absl::string_view field) {
  std::optional<kernels::DType> d = kernels::DTypeFromInt(value);
  if (!d) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is ", value, "; use DTYPE_F32, F16, BF16, F64, I32, I64, U8 or BOOL"));
  }
  return *d;
}

absl::StatusOr<kernels::TensorMeta> MetaFromProto(const v1::TensorSpec& spec,
                                                  absl::string_view field) {
  kernels::TensorMeta meta;
  absl::StatusOr<kernels::DType> d = DTypeFromProto(spec.dtype(), absl::StrCat(field, ".dtype"));
  if (!d.ok()) return d.status();
  meta.dtype = *d;
  // Counted before the copy: a huge repeated field costs nothing.
  if (static_cast<size_t>(spec.shape_size()) > kernels::kMaxRank) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".shape has ", spec.shape_size(), " dimensions; the limit is ", kernels::kMaxRank));
  }
  meta.shape.assign(spec.shape().begin(), spec.shape().end());
  absl::Status valid = kernels::ByteSize(meta, absl::StrCat(field, ".shape")).status();
  if (!valid.ok()) return valid;
  return meta;
}

absl::StatusOr<kernels::Attrs> AttrsFromProto(
    const google::protobuf::Map<std::string, v1::AttrValue>& attrs, absl::string_view field) {
  if (attrs.size() > kMaxAttrs) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", attrs.size(), " entries; the limit is ", kMaxAttrs));
  }
  kernels::Attrs out;
  for (const auto& [name, value] : attrs) {
    if (name.empty() || name.size() > kMaxAttrNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(field, " key \"", Excerpt(name), "\" is ",
                                                     name.size(), " bytes; the range is 1..",
                                                     kMaxAttrNameBytes));
    }
    const std::string entry = absl::StrCat(field, "[", name, "]");
    if (value.value_case() == v1::AttrValue::kS && value.s().size() > kMaxAttrStringBytes) {
      return absl::InvalidArgumentError(absl::StrCat(entry, ".s is ", value.s().size(),
                                                     " bytes; the limit is ", kMaxAttrStringBytes));
    }
    const int list_size = value.value_case() == v1::AttrValue::kInts ? value.ints().values_size()
                          : value.value_case() == v1::AttrValue::kFloats
                              ? value.floats().values_size()
                              : 0;
    if (static_cast<size_t>(list_size) > kMaxAttrListValues) {
      return absl::InvalidArgumentError(
          absl::StrCat(entry, " has ", list_size, " values; the limit is ", kMaxAttrListValues));
    }
    switch (value.value_case()) {
      case v1::AttrValue::kI:
        out[name] = value.i();
        break;
      case v1::AttrValue::kF:
        out[name] = value.f();
        break;
      case v1::AttrValue::kB:
        out[name] = value.b();
        break;
      case v1::AttrValue::kS:
        out[name] = value.s();
        break;
      case v1::AttrValue::kInts:
        out[name] =
            std::vector<int64_t>(value.ints().values().begin(), value.ints().values().end());
        break;
      case v1::AttrValue::kFloats:
        out[name] =
            std::vector<double>(value.floats().values().begin(), value.floats().values().end());
        break;
      case v1::AttrValue::VALUE_NOT_SET:
        return absl::InvalidArgumentError(
            absl::StrCat(entry, " has no value; set one of i, f, b, s, ints, floats"));
    }
  }
  return out;
}

absl::StatusOr<std::vector<OutputSpec>> OutputsFromProto(
    const google::protobuf::RepeatedPtrField<v1::Output>& outputs, absl::string_view field) {
  if (static_cast<size_t>(outputs.size()) > MaxKernelOutputs()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " has ", outputs.size(),
                                                   " entries; no kernel has more than ",
                                                   MaxKernelOutputs(), " outputs"));
  }
  std::vector<OutputSpec> specs;
  for (int i = 0; i < outputs.size(); ++i) {
    const v1::Output& o = outputs[i];
    OutputSpec spec;
    switch (o.target_case()) {
      case v1::Output::kHandle:
        RETURN_IF_ERROR(
            CheckReference(o.handle(), absl::StrCat(field, "[", i, "].handle"), "a tensor handle"));
        spec.kind = OutputSpec::Kind::kHandle;
        spec.handle = o.handle();
        break;
      case v1::Output::kCreate: {
        spec.kind = OutputSpec::Kind::kCreate;
        absl::StatusOr<kernels::TensorMeta> meta =
            MetaFromProto(o.create(), absl::StrCat(field, "[", i, "].create"));
        if (!meta.ok()) return meta.status();
        spec.create = *meta;
        break;
      }
      case v1::Output::kInfer:
      case v1::Output::TARGET_NOT_SET:
        spec.kind = OutputSpec::Kind::kInfer;
        break;
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

void TensorInfoToProto(const TensorInfo& info, v1::TensorInfo* proto) {
  proto->set_handle(info.handle);
  proto->set_dtype(static_cast<v1::DType>(info.meta.dtype));
  proto->mutable_shape()->Add(info.meta.shape.begin(), info.meta.shape.end());
  proto->set_size_bytes(info.size_bytes);
  TimeToProto(info.create_time, proto->mutable_create_time());
}

void JobToProto(const JobInfo& job, v1::Job* proto) {
  proto->set_job_id(job.id);
  switch (job.state) {
    case JobState::kQueued:
      proto->set_state(v1::JOB_STATE_QUEUED);
      break;
    case JobState::kRunning:
      proto->set_state(v1::JOB_STATE_RUNNING);
      break;
    case JobState::kSucceeded:
      proto->set_state(v1::JOB_STATE_SUCCEEDED);
      break;
    case JobState::kFailed:
      proto->set_state(v1::JOB_STATE_FAILED);
      break;
    case JobState::kCancelled:
      proto->set_state(v1::JOB_STATE_CANCELLED);
      break;
  }
  proto->set_stream(static_cast<uint32_t>(job.stream));
  for (const TensorInfo& t : job.outputs) TensorInfoToProto(t, proto->add_outputs());
  if (!job.error.ok()) {
    proto->set_error_code(static_cast<int32_t>(job.error.code()));
    std::string message(job.error.message());
    if (job.failed_step >= 0) message = absl::StrCat("step ", job.failed_step, ": ", message);
    proto->set_error_message(message);
  }
  TimeToProto(job.enqueue_time, proto->mutable_enqueue_time());
  if (job.start_time != absl::Time()) TimeToProto(job.start_time, proto->mutable_start_time());
  if (job.end_time != absl::Time()) TimeToProto(job.end_time, proto->mutable_end_time());
  if (job.deadline != absl::InfiniteFuture()) TimeToProto(job.deadline, proto->mutable_deadline());
}

void UsageToProto(const UsageInfo& u, v1::Usage* proto) {
  proto->set_memory_used_bytes(u.memory_used_bytes);
  proto->set_memory_peak_bytes(u.memory_peak_bytes);
  proto->set_memory_quota_bytes(u.memory_quota_bytes);
  proto->set_tensors(u.tensors);
  proto->set_jobs_queued(u.jobs_queued);
  proto->set_jobs_running(u.jobs_running);
  proto->set_jobs_succeeded(u.jobs_succeeded);
  proto->set_jobs_failed(u.jobs_failed);
  proto->set_jobs_cancelled(u.jobs_cancelled);
  proto->set_jobs_expired(u.jobs_expired);
  proto->set_memory_tensor_bytes(u.memory_tensor_bytes);
  proto->set_memory_scratch_bytes(u.memory_scratch_bytes);
  proto->set_memory_staging_bytes(u.memory_staging_bytes);
  int64_t ns = absl::ToInt64Nanoseconds(u.busy_time);
  proto->mutable_busy_time()->set_seconds(ns / 1000000000);
  proto->mutable_busy_time()->set_nanos(static_cast<int32_t>(ns % 1000000000));
  proto->set_requests_in_flight(u.requests.in_flight);
  proto->set_requests_refused_in_flight(u.requests.refused_in_flight);
  proto->set_requests_refused_rate(u.requests.refused_rate);
  proto->set_regions(u.regions);
  proto->set_region_bytes(u.region_bytes);
  proto->set_region_quota_bytes(u.region_quota_bytes);
}

void RegionToProto(const RegionInfo& region, v1::Region* proto) {
  proto->set_handle(region.handle);
  proto->set_size_bytes(region.size_bytes);
  TimeToProto(region.create_time, proto->mutable_create_time());
  proto->set_transfers(region.transfers);
}

void KernelDefToProto(const kernels::KernelDef& k, v1::KernelInfo* info) {
  info->set_name(k.name);
  info->set_description(k.description);
  for (const auto& p : k.inputs) *info->add_inputs() = ParamToProto(p);
  for (const auto& p : k.outputs) *info->add_outputs() = ParamToProto(p);
  for (const auto& a : k.attrs) {
    v1::KernelAttr* attr = info->add_attrs();
    attr->set_name(a.name);
    attr->set_type(std::string(kernels::AttrTypeName(a.type)));
    if (a.default_value) AttrToProto(*a.default_value, attr->mutable_default_value());
    attr->set_description(absl::StrCat(a.required ? "(required) " : "", a.description));
  }
}

const v1::ListKernelsResponse& KernelCatalogProto() {
  static const v1::ListKernelsResponse* catalog = [] {
    auto* response = new v1::ListKernelsResponse();
    for (const kernels::KernelDef& k : kernels::Registry::Global().kernels()) {
      KernelDefToProto(k, response->add_kernels());
    }
    return response;
  }();
  return *catalog;
}

void UserKernelToProto(const kernels::expr::UserKernel& kernel, v1::KernelInfo* info) {
  KernelDefToProto(kernel.def, info);
  info->set_tenant_defined(true);
  info->set_source(kernels::expr::FormatDefinition(kernel.program.definition));
  info->set_hash(kernel.program.hash);
}

absl::StatusOr<kernels::expr::Definition> DefinitionFromProto(
    const v1::DefineKernelRequest& request) {
  const bool has_source = !request.source().empty();
  const bool has_definition = request.has_definition();
  if (has_source == has_definition) {
    return absl::InvalidArgumentError(
        "give exactly one of source (the definition as text) and definition");
  }
  if (has_source) {
    if (request.source().size() > kMaxKernelSourceBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "source is ", request.source().size(), " bytes; the limit is ", kMaxKernelSourceBytes));
    }
    return kernels::expr::ParseSource(request.source());
  }
  const v1::KernelDefinition& proto = request.definition();
  kernels::expr::Definition d;
  d.name = proto.name();
  d.body = proto.body();
  // Counted before anything is copied, so that an absurd request costs nothing and the
  // message has the real count (Compile checks the same limits for source text).
  const struct {
    int count;
    size_t limit;
    const char* field;
  } lists[] = {{proto.inputs_size(), kernels::expr::kMaxInputs, "definition.inputs"},
               {proto.outputs_size(), kernels::expr::kMaxOutputs, "definition.outputs"},
               {proto.params_size(), kernels::expr::kMaxParams, "definition.params"}};
  for (const auto& list : lists) {
    if (static_cast<size_t>(list.count) > list.limit) {
      return absl::InvalidArgumentError(
          absl::StrCat(list.field, " has ", list.count, " entries; the limit is ", list.limit));
    }
  }
  if (proto.body().size() > kernels::expr::kMaxBodyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("definition.body is ", proto.body().size(),
                                                   " bytes; the limit is ",
                                                   kernels::expr::kMaxBodyBytes));
  }
  auto operands = [](const auto& list, absl::string_view field,
                     std::vector<kernels::expr::OperandDef>& out) -> absl::Status {
    for (int i = 0; i < list.size(); ++i) {
      const v1::KernelOperandDef& o = list[i];
      ASSIGN_OR_RETURN(kernels::DType dtype,
                       DTypeFromProto(o.dtype(), absl::StrCat(field, "[", i, "].dtype")));
      if (o.has_rank() && (o.rank() < 0 || o.rank() > static_cast<int>(kernels::kMaxRank))) {
        return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "].rank is ", o.rank(),
                                                       "; the range is 0..", kernels::kMaxRank));
      }
      out.push_back({o.name(), dtype, o.has_rank() ? o.rank() : -1});
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(operands(proto.inputs(), "definition.inputs", d.inputs));
  RETURN_IF_ERROR(operands(proto.outputs(), "definition.outputs", d.outputs));
  for (int i = 0; i < proto.params_size(); ++i) {
    const v1::KernelScalarDef& p = proto.params(i);
    kernels::expr::ScalarDef param{.name = p.name()};
    if (p.type() == "int") {
      param.kind = kernels::expr::ScalarKind::kInt;
    } else if (p.type() != "float" && !p.type().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("definition.params[", i, "].type is \"",
                                                     p.type().substr(0, 32),
                                                     "\"; use \"float\" or \"int\""));
    }
    if (p.has_default_value()) param.default_value = p.default_value();
    d.params.push_back(std::move(param));
  }
  return d;
}

absl::StatusOr<LaunchSpec> StepFromProto(
    const std::string& kernel, const google::protobuf::RepeatedPtrField<v1::Operand>* operands,
    const google::protobuf::RepeatedPtrField<std::string>* handles,
    const google::protobuf::RepeatedPtrField<v1::Output>& outputs,
    const google::protobuf::Map<std::string, v1::AttrValue>& attrs, absl::string_view field,
    int index) {
  const std::string prefix = field.empty() ? "" : absl::StrCat(field, ".");
  RETURN_IF_ERROR(CheckReference(kernel, absl::StrCat(prefix, "kernel"),
                                 "a kernel name (ListKernels lists them)"));
  const int inputs = handles != nullptr ? handles->size() : operands->size();
  if (static_cast<size_t>(inputs) > MaxKernelInputs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "inputs has ", inputs, " entries; no kernel takes more than ", MaxKernelInputs()));
  }
  LaunchSpec spec;
  spec.kernel = kernel;
  for (int i = 0; i < inputs; ++i) {
    const std::string input = absl::StrCat(prefix, "inputs[", i, "]");
    if (handles != nullptr) {
      RETURN_IF_ERROR(CheckReference((*handles)[i], input, "a tensor handle"));
      spec.inputs.push_back(Operand{(*handles)[i]});
      continue;
    }
    const v1::Operand& op = (*operands)[i];
    if (op.has_step_output()) {
      // Both are uint32 on the wire: bounded here, before they become ints.
      const uint32_t step = op.step_output().step();
      const uint32_t output = op.step_output().output();
      if (step >= static_cast<uint32_t>(index)) {
        return absl::InvalidArgumentError(
            index == 0 ? absl::StrCat(input, ".step_output.step is ", step,
                                      ", not an earlier step: step 0 has none (give a handle)")
                       : absl::StrCat(input, ".step_output.step is ", step,
                                      ", not an earlier step: the range is 0..", index - 1));
      }
      if (output >= MaxKernelOutputs()) {
        return absl::InvalidArgumentError(
            absl::StrCat(input, ".step_output.output is ", output, "; no kernel has more than ",
                         MaxKernelOutputs(), " outputs (0..", MaxKernelOutputs() - 1, ")"));
      }
      spec.inputs.push_back(Operand{"", static_cast<int>(step), static_cast<int>(output)});
    } else if (op.source_case() == v1::Operand::kHandle) {
      RETURN_IF_ERROR(
          CheckReference(op.handle(), absl::StrCat(input, ".handle"), "a tensor handle"));
      spec.inputs.push_back(Operand{op.handle()});
    } else {
      return absl::InvalidArgumentError(absl::StrCat(input, " needs a handle or a step_output"));
    }
  }
  ASSIGN_OR_RETURN(spec.outputs, OutputsFromProto(outputs, absl::StrCat(prefix, "outputs")));
  ASSIGN_OR_RETURN(spec.attrs, AttrsFromProto(attrs, absl::StrCat(prefix, "attrs")));
  return spec;
}

}  // namespace tessera
