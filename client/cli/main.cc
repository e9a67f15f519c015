// tessera: command-line client for a Tessera server. Run `tessera --help` for usage.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"

#include "server/common/byte_size.h"
#include "tessera/client.h"
#include "tessera/npy.h"

ABSL_FLAG(std::string, addr, "",
          "Server address host:port (default $TESSERA_ADDR or 127.0.0.1:50051)");
ABSL_FLAG(std::string, token, "",
          "Bearer token (visible in `ps`; prefer --token_file or $TESSERA_TOKEN)");
ABSL_FLAG(std::string, token_file, "", "File whose first line is the bearer token");
ABSL_FLAG(bool, tls, false, "Use TLS (implied by --tls_ca/--tls_cert)");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle to verify the server");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate (mutual TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM client key (mutual TLS)");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(30), "Per-call deadline");
ABSL_FLAG(std::string, output, "text", "Output format: text or json");
// tenant register / update
ABSL_FLAG(std::string, display_name, "", "Tenant display name");
ABSL_FLAG(std::vector<std::string>, labels, {}, "Tenant labels, key=value[,key=value...]");
ABSL_FLAG(tessera::ByteSize, memory, tessera::ByteSize{0},
          "Quota: device memory, e.g. 2GiB (required to register)");
ABSL_FLAG(uint32_t, compute_share, 0, "Quota: compute share percent 1..100 (default 100)");
ABSL_FLAG(uint32_t, max_streams, 0, "Quota: streams 1..64 (default 4)");
ABSL_FLAG(uint32_t, max_queued_jobs, 0, "Quota: queued jobs 1..65536 (default 1024)");
ABSL_FLAG(std::string, priority, "", "Quota: normal or low (default normal)");
ABSL_FLAG(int32_t, device, -1, "Device index to place the tenant on (-1: most free memory)");
ABSL_FLAG(int32_t, page_size, 0, "tenant list: page size (0: server default)");
// tensors and runs
ABSL_FLAG(std::string, o, "", "tensor get: output .npy file");
ABSL_FLAG(std::vector<std::string>, in, {}, "run: input tensor handles, comma-separated");
ABSL_FLAG(std::vector<std::string>, out, {},
          "run: output tensor handles (default: new tensors with inferred shapes)");
ABSL_FLAG(std::string, attr, "",
          "run: attributes k=v;k=v (v: int, float, true/false, [1,2] list, or a string)");
ABSL_FLAG(uint32_t, stream, 0, "run: stream index");
ABSL_FLAG(std::string, file, "", "kernel define: the definition file (- for stdin)");
ABSL_FLAG(bool, wait, true, "run: wait for the job to finish");
ABSL_FLAG(tessera::ByteSize, chunk, tessera::ByteSize{1 << 20}, "tensor put/get: chunk size");

namespace {

constexpr char kUsage[] = R"(Command-line client for a Tessera server.

usage: tessera [flags] COMMAND [ARGS]

commands:
  tenant register ID --memory=SIZE [--compute_share=N] [--max_streams=N]
                     [--max_queued_jobs=N] [--priority=normal|low] [--device=N]
                     [--display_name=NAME] [--labels=k=v,...]
  tenant get ID
  tenant list
  tenant update ID [--display_name=NAME] [--labels=k=v,...]
  tenant deregister ID
  tenant rotate-key ID
  server info
  mps status                          MPS decision, control daemons, servers, clients
  mps terminate TENANT                stop a tenant's queued GPU work
  tensor put FILE.npy                 upload (prints the new handle)
  tensor get HANDLE -o FILE.npy       download
  tensor ls | tensor rm HANDLE...
  run KERNEL --in=H1,H2 [--out=H] [--attr='axes=[0];keepdims=true'] [--stream=N]
  kernels                             the kernel catalog and your own kernels
  kernel define NAME --file=K.tk      define a kernel of yours (docs/kernels.md); - reads stdin
  kernel ls                           your kernels, with their definitions
  kernel rm NAME...                   delete kernels of yours
  usage                               memory and job counters

The address comes from --addr or $TESSERA_ADDR, the token from --token, --token_file or
$TESSERA_TOKEN. Exit status: 0 success, 1 the server refused, 2 bad usage.)";

int UsageError(absl::string_view message) {
  std::fprintf(stderr, "tessera: %s\nrun `tessera --help` for usage\n",
               std::string(message).c_str());
  return 2;
}

int RpcError(const absl::Status& status) {
  std::fprintf(stderr, "tessera: %s: %s\n", absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str());
  return 1;
}

// Names of the flags given on the command line (Debian's Abseil keeps
// CommandLineFlag::IsSpecifiedOnCommandLine private), filled before parsing.
std::set<std::string>& GivenFlags() {
  static std::set<std::string> given;
  return given;
}

void RecordGivenFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) continue;
    GivenFlags().insert(std::string(arg.substr(0, arg.find('='))));
  }
}

bool Specified(const std::string& flag) { return GivenFlags().contains(flag); }

bool Json() { return absl::GetFlag(FLAGS_output) == "json"; }

void PrintJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  std::cout << json;
}

std::string Bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string Time(const google::protobuf::Timestamp& t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(t.seconds()),
                          absl::UTCTimeZone());
}

std::string KindName(tessera::v1::ContextKind kind) {
  std::string name = tessera::v1::ContextKind_Name(kind);
  return name.substr(absl::string_view("CONTEXT_KIND_").size());
}

void PrintTenant(const tessera::v1::Tenant& t) {
  std::vector<std::string> labels;
  for (const auto& [k, v] : t.labels()) labels.push_back(absl::StrCat(k, "=", v));
  std::sort(labels.begin(), labels.end());
  const tessera::v1::Quota& q = t.quota();
  std::cout << "tenant_id:       " << t.tenant_id() << "\n"
            << "display_name:    " << t.display_name() << "\n"
            << "labels:          " << absl::StrJoin(labels, ",") << "\n"
            << "memory quota:    " << Bytes(q.device_memory_bytes()) << " ("
            << q.device_memory_bytes() << " bytes)\n"
            << "compute share:   " << q.compute_share_percent() << "%\n"
            << "max streams:     " << q.max_streams() << "\n"
            << "max queued jobs: " << q.max_queued_jobs() << "\n"
            << "priority:        " << (q.priority() == tessera::v1::PRIORITY_LOW ? "low" : "normal")
            << "\n"
            << "device:          " << t.device_index() << "\n"
            << "context:         " << KindName(t.context().kind()) << " (" << t.context().reason()
            << ")\n"
            << "created:         " << Time(t.create_time()) << "\n"
            << "key issued:      " << Time(t.key_create_time()) << "\n";
}

absl::StatusOr<std::map<std::string, std::string>> ParseLabels() {
  std::map<std::string, std::string> labels;
  for (const std::string& item : absl::GetFlag(FLAGS_labels)) {
    if (item.empty()) continue;
    std::vector<std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("--labels: \"", item, "\" is not key=value"));
    }
    labels[kv[0]] = kv[1];
  }
  return labels;
}

absl::StatusOr<tessera::v1::Priority> ParsePriority() {
  std::string p = absl::GetFlag(FLAGS_priority);
  if (p.empty()) return tessera::v1::PRIORITY_UNSPECIFIED;
  if (p == "normal") return tessera::v1::PRIORITY_NORMAL;
  if (p == "low") return tessera::v1::PRIORITY_LOW;
  return absl::InvalidArgumentError(absl::StrCat("--priority=", p, ": use normal or low"));
}

absl::StatusOr<std::string> ResolveToken() {
  if (std::string token = absl::GetFlag(FLAGS_token); !token.empty()) return token;
  if (std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    std::ifstream in(path);
    std::string line;
    if (!in || !std::getline(in, line)) {
      return absl::InvalidArgumentError(absl::StrCat("--token_file=", path, ": cannot read"));
    }
    return std::string(absl::StripAsciiWhitespace(line));
  }
  if (const char* env = std::getenv("TESSERA_TOKEN")) return std::string(env);
  return std::string();
}

int TenantCommand(tessera::Client& client, const std::vector<std::string>& args) {
  if (args.size() < 2)
    return UsageError("tenant: which command? register|get|list|update|deregister|rotate-key");
  const std::string& verb = args[1];
  if (verb == "list") {
    if (absl::GetFlag(FLAGS_page_size) != 0) {
      auto page = client.ListTenants(absl::GetFlag(FLAGS_page_size));
      if (!page.ok()) return RpcError(page.status());
      if (Json()) {
        PrintJson(*page);
        return 0;
      }
    }
    auto tenants = client.ListAllTenants();
    if (!tenants.ok()) return RpcError(tenants.status());
    if (Json()) {
      tessera::v1::ListTenantsResponse all;
      for (auto& t : *tenants) *all.add_tenants() = t;
      all.set_total_size(static_cast<int32_t>(tenants->size()));
      PrintJson(all);
      return 0;
    }
    std::cout << absl::StrFormat("%-24s %-9s %10s %6s %7s %6s  %s\n", "TENANT", "CONTEXT", "MEMORY",
                                 "SHARE", "STREAMS", "DEVICE", "DISPLAY NAME");
    for (const auto& t : *tenants) {
      std::cout << absl::StrFormat(
          "%-24s %-9s %10s %5d%% %7d %6d  %s\n", t.tenant_id(), KindName(t.context().kind()),
          Bytes(t.quota().device_memory_bytes()), t.quota().compute_share_percent(),
          t.quota().max_streams(), t.device_index(), t.display_name());
    }
    return 0;
  }
  if (args.size() != 3)
    return UsageError(absl::StrCat("tenant ", verb, ": expected one tenant id"));
  const std::string& id = args[2];
  if (verb == "register") {
    tessera::v1::RegisterTenantRequest request;
    request.set_tenant_id(id);
    request.set_display_name(absl::GetFlag(FLAGS_display_name));
    auto labels = ParseLabels();
    if (!labels.ok()) return UsageError(labels.status().message());
    request.mutable_labels()->insert(labels->begin(), labels->end());
    tessera::v1::Quota* q = request.mutable_quota();
    q->set_device_memory_bytes(absl::GetFlag(FLAGS_memory).bytes);
    q->set_compute_share_percent(absl::GetFlag(FLAGS_compute_share));
    q->set_max_streams(absl::GetFlag(FLAGS_max_streams));
    q->set_max_queued_jobs(absl::GetFlag(FLAGS_max_queued_jobs));
    auto priority = ParsePriority();
    if (!priority.ok()) return UsageError(priority.status().message());
    q->set_priority(*priority);
    if (absl::GetFlag(FLAGS_device) >= 0) request.set_device_index(absl::GetFlag(FLAGS_device));
    auto registered = client.RegisterTenant(request);
    if (!registered.ok()) return RpcError(registered.status());
    if (Json()) {
      PrintJson(*registered);
      return 0;
    }
    PrintTenant(registered->tenant());
    std::cout << "api key:         " << registered->api_key() << "\n"
              << "(the API key is shown only now; store it securely)\n";
    return 0;
  }
  if (verb == "get") {
    auto tenant = client.GetTenant(id);
    if (!tenant.ok()) return RpcError(tenant.status());
    Json() ? PrintJson(*tenant) : PrintTenant(*tenant);
    return 0;
  }
  if (verb == "update") {
    tessera::v1::Tenant tenant;
    tenant.set_tenant_id(id);
    std::vector<std::string> paths;
    if (Specified("display_name")) {
      tenant.set_display_name(absl::GetFlag(FLAGS_display_name));
      paths.push_back("display_name");
    }
    if (Specified("labels")) {
      auto labels = ParseLabels();
      if (!labels.ok()) return UsageError(labels.status().message());
      tenant.mutable_labels()->insert(labels->begin(), labels->end());
      paths.push_back("labels");
    }
    // Quota flags are passed on so the server can explain how quotas change.
    for (const char* quota_flag :
         {"memory", "compute_share", "max_streams", "max_queued_jobs", "priority"}) {
      if (Specified(quota_flag)) paths.push_back(absl::StrCat("quota.", quota_flag));
    }
    if (paths.empty()) return UsageError("tenant update: give --display_name and/or --labels");
    auto updated = client.UpdateTenant(tenant, paths);
    if (!updated.ok()) return RpcError(updated.status());
    Json() ? PrintJson(*updated) : PrintTenant(*updated);
    return 0;
  }
  if (verb == "deregister") {
    auto gone = client.DeregisterTenant(id);
    if (!gone.ok()) return RpcError(gone.status());
    if (Json()) {
      PrintJson(*gone);
      return 0;
    }
    std::cout << "deregistered " << id << "; released " << Bytes(gone->released_memory_bytes())
              << "\n";
    return 0;
  }
  if (verb == "rotate-key") {
    auto rotated = client.RotateTenantKey(id);
    if (!rotated.ok()) return RpcError(rotated.status());
    if (Json()) {
      PrintJson(*rotated);
      return 0;
    }
    std::cout << "api key: " << rotated->api_key() << "\n"
              << "(the previous key is revoked; the new one is shown only now)\n";
    return 0;
  }
  return UsageError(absl::StrCat("tenant ", verb, ": unknown command"));
}

// A progress bar on stderr for transfers over 4 MiB when it is a terminal.
tessera::Client::Progress ProgressBar(const std::string& label, uint64_t total) {
  if (total <= (4u << 20) || !isatty(2)) return nullptr;
  return [label, last = -1](uint64_t done, uint64_t all) mutable {
    int percent = all == 0 ? 100 : static_cast<int>(100 * done / all);
    if (percent == last) return;
    last = percent;
    std::string bar(static_cast<size_t>(percent / 4), '=');
    bar.resize(25, ' ');
    std::fprintf(stderr, "\r%s [%s] %3d%% %s / %s", label.c_str(), bar.c_str(), percent,
                 Bytes(done).c_str(), Bytes(all).c_str());
    if (done >= all) std::fprintf(stderr, "\n");
  };
}

std::string DTypeShort(int dtype) {
  std::string name = tessera::v1::DType_Name(static_cast<tessera::v1::DType>(dtype));
  return absl::AsciiStrToLower(name.substr(std::string_view("DTYPE_").size()));
}

std::string TensorLine(const tessera::v1::TensorInfo& t) {
  return absl::StrFormat("%-26s %-5s %-20s %12s", t.handle(), DTypeShort(t.dtype()),
                         absl::StrCat("[", absl::StrJoin(t.shape(), ", "), "]"),
                         Bytes(t.size_bytes()));
}

int TensorCommand(tessera::Client& client, const std::vector<std::string>& args) {
  if (args.size() < 2) return UsageError("tensor: which command? put|get|ls|rm");
  const std::string& verb = args[1];
  if (verb == "ls") {
    auto tensors = client.ListAllTensors();
    if (!tensors.ok()) return RpcError(tensors.status());
    if (Json()) {
      tessera::v1::ListTensorsResponse all;
      for (auto& t : *tensors) *all.add_tensors() = t;
      PrintJson(all);
      return 0;
    }
    std::cout << absl::StrFormat("%-26s %-5s %-20s %12s\n", "HANDLE", "DTYPE", "SHAPE", "BYTES");
    for (const auto& t : *tensors) std::cout << TensorLine(t) << "\n";
    return 0;
  }
  if (verb == "rm") {
    if (args.size() < 3) return UsageError("tensor rm: which handles?");
    for (size_t i = 2; i < args.size(); ++i) {
      auto released = client.DeleteTensor(args[i]);
      if (!released.ok()) return RpcError(released.status());
      std::cout << "deleted " << args[i] << " (" << Bytes(*released) << ")\n";
    }
    return 0;
  }
  if (args.size() != 3) return UsageError(absl::StrCat("tensor ", verb, ": expected one argument"));
  size_t chunk = static_cast<size_t>(absl::GetFlag(FLAGS_chunk).bytes);
  if (verb == "put") {
    auto array = tessera::ReadNpyFile(args[2]);
    if (!array.ok()) return UsageError(array.status().message());
    tessera::v1::TensorSpec spec;
    spec.set_dtype(array->dtype);
    spec.mutable_shape()->Add(array->shape.begin(), array->shape.end());
    auto info = client.Upload(spec, array->data, chunk, ProgressBar("put", array->data.size()));
    if (!info.ok()) return RpcError(info.status());
    Json() ? PrintJson(*info) : void(std::cout << info->handle() << "\n");
    return 0;
  }
  if (verb == "get") {
    std::string path = absl::GetFlag(FLAGS_o);
    if (path.empty()) return UsageError("tensor get: give -o FILE.npy");
    auto info = client.GetTensor(args[2]);
    if (!info.ok()) return RpcError(info.status());
    tessera::NpyArray array;
    array.dtype = info->dtype();
    array.shape.assign(info->shape().begin(), info->shape().end());
    auto bytes = client.Download(args[2], 0, 0, static_cast<uint32_t>(chunk),
                                 ProgressBar("get", info->size_bytes()));
    if (!bytes.ok()) return RpcError(bytes.status());
    array.data = *std::move(bytes);
    if (absl::Status s = tessera::WriteNpyFile(path, array); !s.ok())
      return UsageError(s.message());
    std::cout << "wrote " << path << " (" << DTypeShort(info->dtype()) << "["
              << absl::StrJoin(info->shape(), ", ") << "], " << Bytes(info->size_bytes()) << ")\n";
    return 0;
  }
  return UsageError(absl::StrCat("tensor ", verb, ": unknown command"));
}

// "3" int, "2.5" float, "true" bool, "[0,1]" list, anything else a string.
tessera::v1::AttrValue ParseAttr(absl::string_view text) {
  tessera::v1::AttrValue value;
  int64_t i;
  double f;
  if (text == "true" || text == "false") {
    value.set_b(text == "true");
  } else if (absl::SimpleAtoi(text, &i)) {
    value.set_i(i);
  } else if (absl::SimpleAtod(text, &f) && text.find_first_of("0123456789") != text.npos) {
    value.set_f(f);
  } else if (absl::ConsumePrefix(&text, "[") && absl::ConsumeSuffix(&text, "]")) {
    std::vector<std::string> items = absl::StrSplit(text, ',', absl::SkipWhitespace());
    bool all_ints = true;
    for (const auto& item : items) all_ints = all_ints && absl::SimpleAtoi(item, &i);
    for (const auto& item : items) {
      if (all_ints) {
        absl::SimpleAtoi(item, &i);
        value.mutable_ints()->add_values(i);
      } else {
        absl::SimpleAtod(item, &f);
        value.mutable_floats()->add_values(f);
      }
    }
    if (items.empty()) value.mutable_ints();
  } else {
    value.set_s(std::string(text));
  }
  return value;
}

int RunCommand(tessera::Client& client, const std::vector<std::string>& args) {
  if (args.size() != 2) return UsageError("run: give one kernel name (see `tessera kernels`)");
  tessera::v1::LaunchRequest request;
  request.set_kernel(args[1]);
  for (const std::string& h : absl::GetFlag(FLAGS_in)) request.add_inputs(h);
  for (const std::string& h : absl::GetFlag(FLAGS_out)) request.add_outputs()->set_handle(h);
  for (absl::string_view item :
       absl::StrSplit(absl::GetFlag(FLAGS_attr), ';', absl::SkipWhitespace())) {
    std::vector<std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() != 2) return UsageError(absl::StrCat("--attr: \"", item, "\" is not k=v"));
    (*request.mutable_attrs())[std::string(absl::StripAsciiWhitespace(kv[0]))] =
        ParseAttr(absl::StripAsciiWhitespace(kv[1]));
  }
  request.set_stream(absl::GetFlag(FLAGS_stream));
  request.set_wait(absl::GetFlag(FLAGS_wait));
  auto job = client.Launch(request);
  if (!job.ok()) return RpcError(job.status());
  if (Json()) {
    PrintJson(*job);
    return 0;
  }
  std::string state = tessera::v1::JobState_Name(job->state()).substr(10);
  std::cout << "job " << job->job_id() << ": " << state << "\n";
  if (!job->error_message().empty()) std::cout << "error: " << job->error_message() << "\n";
  for (const auto& t : job->outputs()) std::cout << "  out " << TensorLine(t) << "\n";
  return job->state() == tessera::v1::JOB_STATE_FAILED ? 1 : 0;
}

int KernelsCommand(tessera::Client& client) {
  auto catalog = client.ListKernels();
  if (!catalog.ok()) return RpcError(catalog.status());
  if (Json()) {
    PrintJson(*catalog);
    return 0;
  }
  for (const auto& k : catalog->kernels()) {
    std::vector<std::string> ins, attrs;
    for (const auto& p : k.inputs()) ins.push_back(p.optional() ? p.name() + "?" : p.name());
    for (const auto& a : k.attrs()) attrs.push_back(absl::StrCat(a.name(), ":", a.type()));
    std::cout << absl::StrFormat(
        "%-12s (%s)%s  %s\n", k.name(), absl::StrJoin(ins, ", "),
        attrs.empty() ? "" : absl::StrCat(" [", absl::StrJoin(attrs, ", "), "]"),
        k.tenant_defined() ? absl::StrCat("yours: ", k.description()) : k.description());
  }
  return 0;
}

// The NAME in "kernel NAME(" at the start of a definition (after comments and blanks).
std::string DefinedName(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (absl::ascii_isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
    } else {
      break;
    }
  }
  if (!absl::StartsWith(text.substr(i), "kernel")) return "";
  i += 6;
  while (i < text.size() && absl::ascii_isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t begin = i;
  while (i < text.size() &&
         (absl::ascii_isalnum(static_cast<unsigned char>(text[i])) || text[i] == '_')) {
    ++i;
  }
  return std::string(text.substr(begin, i - begin));
}

int KernelCommand(tessera::Client& client, const std::vector<std::string>& args) {
  const std::string sub = args.size() > 1 ? args[1] : "";
  if (sub == "define") {
    if (args.size() != 3) return UsageError("usage: tessera kernel define NAME --file=K.tk");
    const std::string path = absl::GetFlag(FLAGS_file);
    if (path.empty()) return UsageError("kernel define: --file is required (- for stdin)");
    std::string text;
    if (path == "-") {
      text.assign(std::istreambuf_iterator<char>(std::cin), {});
    } else {
      std::ifstream in(path, std::ios::binary);
      if (!in) return UsageError(absl::StrCat("kernel define: cannot read ", path));
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    const std::string named = DefinedName(text);
    if (named != args[2]) {
      return UsageError(absl::StrCat("kernel define: ", path, " defines \"", named, "\", not \"",
                                     args[2], "\" (it must start with `kernel ", args[2],
                                     "(...)`)"));
    }
    auto defined = client.DefineKernel(text);
    if (!defined.ok()) return RpcError(defined.status());
    if (Json()) {
      PrintJson(*defined);
    } else {
      std::cout << "defined " << defined->name() << " (" << defined->hash().substr(0, 12) << ")\n";
    }
    return 0;
  }
  if (sub == "ls") {
    if (args.size() != 2) return UsageError("usage: tessera kernel ls");
    auto listed = client.ListKernels();
    if (!listed.ok()) return RpcError(listed.status());
    tessera::v1::ListKernelsResponse own;
    for (const auto& k : listed->kernels()) {
      if (k.tenant_defined()) *own.add_kernels() = k;
    }
    if (Json()) {
      PrintJson(own);
      return 0;
    }
    if (own.kernels_size() == 0) std::cout << "no kernels of yours; see `tessera kernel define`\n";
    for (const auto& k : own.kernels()) std::cout << k.source() << "\n";
    return 0;
  }
  if (sub == "rm") {
    if (args.size() < 3) return UsageError("usage: tessera kernel rm NAME...");
    for (size_t i = 2; i < args.size(); ++i) {
      absl::Status deleted = client.DeleteKernel(args[i]);
      if (!deleted.ok()) return RpcError(deleted);
      if (!Json()) std::cout << "deleted " << args[i] << "\n";
    }
    return 0;
  }
  return UsageError("kernel: the commands are define, ls and rm");
}

int UsageCommand(tessera::Client& client) {
  auto usage = client.GetUsage();
  if (!usage.ok()) return RpcError(usage.status());
  if (Json()) {
    PrintJson(*usage);
    return 0;
  }
  std::cout << "memory:  " << Bytes(usage->memory_used_bytes()) << " used, "
            << Bytes(usage->memory_peak_bytes()) << " peak, " << Bytes(usage->memory_quota_bytes())
            << " quota\n"
            << "tensors: " << usage->tensors() << "\n"
            << "jobs:    " << usage->jobs_queued() << " queued, " << usage->jobs_running()
            << " running, " << usage->jobs_succeeded() << " succeeded, " << usage->jobs_failed()
            << " failed, " << usage->jobs_cancelled() << " cancelled\n"
            << "busy:    " << usage->busy_time().seconds() + usage->busy_time().nanos() / 1e9
            << " s\n";
  return 0;
}

int ServerCommand(tessera::Client& client, const std::vector<std::string>& args) {
  if (args.size() != 2 || args[1] != "info")
    return UsageError("server: the command is `server info`");
  auto info = client.GetServerInfo();
  if (!info.ok()) return RpcError(info.status());
  if (Json()) {
    PrintJson(*info);
    return 0;
  }
  std::cout << "version:   " << info->version() << "\n"
            << "backend:   " << info->backend() << " (" << info->backend_reason() << ")\n"
            << "mps:       " << tessera::v1::MpsDecision_Name(info->mps_decision()) << " ("
            << info->mps_reason() << ")\n"
            << "transport: " << info->transport_security() << "\n"
            << "tenants:   " << info->tenant_count() << "\n"
            << "overcommit:"
            << " " << info->memory_overcommit() << "\n";
  for (const auto& d : info->devices()) {
    std::cout << "device " << d.index() << ":  " << d.name() << ", memory "
              << Bytes(d.memory_bytes()) << ", reserved " << Bytes(d.reserved_bytes()) << " of "
              << Bytes(d.reservable_bytes()) << ", " << d.tenants() << " tenant(s)"
              << (d.context_limit() ? absl::StrCat(" (limit ", d.context_limit(), ")") : "")
              << "\n";
  }
  return 0;
}

int MpsCommand(tessera::Client& client, const std::vector<std::string>& args) {
  if (args.size() == 3 && args[1] == "terminate") {
    auto done = client.TerminateTenantWork(args[2]);
    if (!done.ok()) return RpcError(done.status());
    if (Json()) {
      PrintJson(*done);
      return 0;
    }
    std::cout << done->detail() << "\n";
    return 0;
  }
  if (args.size() != 2 || args[1] != "status") {
    return UsageError("mps: the commands are `mps status` and `mps terminate TENANT`");
  }
  auto status = client.GetMpsStatus();
  if (!status.ok()) return RpcError(status.status());
  if (Json()) {
    PrintJson(*status);
    return 0;
  }
  std::cout << "decision: " << tessera::v1::MpsDecision_Name(status->decision()) << " ("
            << status->reason() << ")\n"
            << "managed:  " << (status->managed() ? "yes (--mps_manage)" : "no") << "\n";
  for (const auto& d : status->daemons()) {
    std::cout << "daemon "
              << (d.gpu() < 0 ? std::string("(all GPUs)") : absl::StrCat("gpu ", d.gpu())) << ": "
              << (d.pid() > 0 ? absl::StrCat("pid ", d.pid()) : std::string("not running"))
              << ", pipe " << d.pipe_directory();
    if (d.managed()) {
      std::cout << ", " << d.tenants() << " tenant(s), "
                << (d.started() ? "started by this server" : "found running (left running)");
    }
    std::cout << "\n";
    if (!d.log_directory().empty()) std::cout << "  logs: " << d.log_directory() << "\n";
    if (d.default_active_thread_percentage() > 0) {
      std::cout << "  default active threads: " << d.default_active_thread_percentage() << "%\n";
    }
    if (!d.default_pinned_mem_limit().empty()) {
      std::cout << "  default pinned memory limit (device 0): " << d.default_pinned_mem_limit()
                << "\n";
    }
    for (const auto& s : d.servers()) {
      std::cout << "  server " << s.pid() << ": " << tessera::v1::MpsServerState_Name(s.state())
                << ", clients [" << absl::StrJoin(s.client_pids(), ", ") << "]\n";
    }
    if (!d.error().empty()) std::cout << "  error: " << d.error() << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  RecordGivenFlags(argc, argv);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> args(positional.begin() + 1, positional.end());
  if (args.empty()) return UsageError("no command given");
  if (absl::GetFlag(FLAGS_output) != "text" && absl::GetFlag(FLAGS_output) != "json") {
    return UsageError("--output: use text or json");
  }

  tessera::ClientOptions options;
  options.address = absl::GetFlag(FLAGS_addr);
  if (options.address.empty()) {
    const char* env = std::getenv("TESSERA_ADDR");
    options.address = env != nullptr && *env != '\0' ? env : "127.0.0.1:50051";
  }
  absl::StatusOr<std::string> token = ResolveToken();
  if (!token.ok()) return UsageError(token.status().message());
  options.token = *token;
  options.tls = absl::GetFlag(FLAGS_tls);
  options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.timeout = absl::GetFlag(FLAGS_timeout);
  auto client = tessera::Client::Connect(std::move(options));
  if (!client.ok()) return UsageError(client.status().message());

  if (args[0] == "tenant") return TenantCommand(**client, args);
  if (args[0] == "server") return ServerCommand(**client, args);
  if (args[0] == "mps") return MpsCommand(**client, args);
  if (args[0] == "tensor") return TensorCommand(**client, args);
  if (args[0] == "run") return RunCommand(**client, args);
  if (args[0] == "kernels") return KernelsCommand(**client);
  if (args[0] == "kernel") return KernelCommand(**client, args);
  if (args[0] == "usage") return UsageCommand(**client);
  return UsageError(absl::StrCat("unknown command \"", args[0], "\""));
}
