// tensor ..., run, kernels, kernel ..., region ..., usage: the Compute service (a tenant's API
// key).
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

#include "client/cli/commands.h"
#include "client/cli/format.h"
#include "client/cli/parse.h"
#include "client/cli/session.h"
#include "client/cli/transfer.h"
#include "common/fd_io.h"
#include "tessera/npy.h"

namespace tessera::cli {
namespace {

constexpr char kComputeSection[] = "Compute (a tenant's API key)";

std::string DTypeShort(int dtype) {
  std::string name = v1::DType_Name(static_cast<v1::DType>(dtype));
  return absl::AsciiStrToLower(name.substr(std::string_view("DTYPE_").size()));
}

std::string TensorLine(const v1::TensorInfo& t) {
  return absl::StrFormat("%-26s %-5s %-20s %12s", t.handle(), DTypeShort(t.dtype()),
                         absl::StrCat("[", absl::StrJoin(t.shape(), ", "), "]"),
                         FormatBytes(t.size_bytes()));
}

// A --chunk value: a size from 1 byte to 64 MiB (the server's default message limit).
CLI::Validator ChunkSize() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        absl::StatusOr<Size> size = ParseSize(text);
        if (!size.ok()) return std::string(size.status().message());
        if (size->bytes == 0 || size->bytes > (uint64_t{64} << 20)) {
          return "the chunk size must be from 1 byte to 64Mi";
        }
        return "";
      },
      "", "SIZE");
}

// ---- tensor put, get, ls, rm -------------------------------------------------------------------

struct PutFlags {
  std::string file;
  std::string chunk = "1Mi";
  bool no_regions = false;
};

constexpr char kNoRegionsHelp[] =
    "Stream the bytes even over the server's Unix socket (default there: through a "
    "shared-memory region; also $TESSERA_REGIONS=off)";

int Put(Session& s, const PutFlags& f) {
  absl::StatusOr<int> fd = s.OpenInput(f.file, "FILE");
  if (!fd.ok()) return s.Usage(fd.status().message());
  absl::Cleanup close_fd = [fd = *fd] {
    if (fd != STDIN_FILENO) close(fd);
  };
  const std::string name = DisplayName(f.file);
  absl::StatusOr<NpyHeader> header = ReadNpyHeader(*fd, name);
  if (!header.ok()) return s.Usage(header.status().message());
  // A file (also `< FILE`) says its size: a wrong one is refused before the call.
  struct stat st;
  const off_t position = lseek(*fd, 0, SEEK_CUR);
  if (position >= 0 && fstat(*fd, &st) == 0 && S_ISREG(st.st_mode) &&
      static_cast<uint64_t>(st.st_size - position) != header->data_bytes) {
    return s.Usage(absl::StrCat(name, ": .npy data is ", st.st_size - position, " bytes; shape ",
                                header->shape_text, " of ", header->descr, " needs ",
                                header->data_bytes));
  }
  const size_t chunk = static_cast<size_t>(ParseSize(f.chunk)->bytes);
  std::optional<Transfer> through_region;
  if (!f.no_regions) through_region = UploadThroughRegion(s, *header, *fd, name, chunk);
  const Transfer put = through_region.has_value() ? *std::move(through_region)
                                                  : UploadFrom(s, *header, *fd, name, chunk);
  if (!put.local_error.empty()) return s.Usage(put.local_error);
  if (!put.status.ok()) return s.Failed(put.status);
  s.json() ? s.PrintJson(put.info) : void(std::cout << put.info.handle() << "\n");
  return kExitOk;
}

struct GetFlags {
  std::string handle;
  std::string out;
  std::string chunk = "1Mi";
  bool no_regions = false;
};

int Get(Session& s, const GetFlags& f) {
  // The output first: a bad path fails before anything is asked of the server.
  absl::StatusOr<std::unique_ptr<OutputFile>> out = OutputFile::Open(f.out);
  if (!out.ok()) return s.Usage(out.status().message());
  // Through a region, or streamed: only one chunk is held in memory (Client::Download would
  // hold the whole tensor).
  std::optional<Transfer> through_region;
  if (!f.no_regions)
    through_region = DownloadThroughRegion(s, f.handle, (*out)->fd(), (*out)->name());
  const Transfer got = through_region.has_value()
                           ? *std::move(through_region)
                           : DownloadTo(s, f.handle, static_cast<size_t>(ParseSize(f.chunk)->bytes),
                                        (*out)->fd(), (*out)->name());
  if (!got.local_error.empty()) return s.LocalFailure(got.local_error);
  if (!got.status.ok()) return s.Failed(got.status);
  const v1::TensorInfo& info = got.info;
  if (absl::Status committed = (*out)->Commit(); !committed.ok()) {
    return s.LocalFailure(committed.message());
  }
  if (f.out == "-") return kExitOk;  // stdout carries the array and nothing else
  if (s.json()) {
    s.PrintJson(info);
  } else {
    std::cout << "wrote " << f.out << " (" << DTypeShort(info.dtype()) << "["
              << absl::StrJoin(info.shape(), ", ") << "], " << FormatBytes(info.size_bytes())
              << ")\n";
  }
  return kExitOk;
}

int List(Session& s) {
  auto tensors = s.client().ListAllTensors();
  if (!tensors.ok()) return s.Failed(tensors.status());
  if (s.json()) {
    v1::ListTensorsResponse all;
    for (auto& t : *tensors) *all.add_tensors() = t;
    s.PrintJson(all);
    return kExitOk;
  }
  std::cout << absl::StrFormat("%-26s %-5s %-20s %12s\n", "HANDLE", "DTYPE", "SHAPE", "BYTES");
  for (const auto& t : *tensors) std::cout << TensorLine(t) << "\n";
  return kExitOk;
}

int Remove(Session& s, const std::vector<std::string>& handles) {
  v1::ListTensorsResponse deleted;  // in JSON: the handles deleted, with the bytes released
  for (const std::string& handle : handles) {
    auto released = s.client().DeleteTensor(handle);
    if (!released.ok()) {
      if (s.json()) s.PrintJson(deleted);
      return s.Failed(released.status());
    }
    v1::TensorInfo* t = deleted.add_tensors();
    t->set_handle(handle);
    t->set_size_bytes(*released);
    if (!s.json()) std::cout << "deleted " << handle << " (" << FormatBytes(*released) << ")\n";
  }
  if (s.json()) s.PrintJson(deleted);
  return kExitOk;
}

void AddTensorCommands(CommandTree& tree) {
  CLI::App* tensor = tree.Group(tree.root(), "tensor", "Tensors", kComputeSection);

  auto* put = tree.Make<PutFlags>();
  CLI::App* put_cmd = tree.Command(
      tensor, "put", "Upload a .npy file (- reads stdin); prints the new handle",
      {.usage = "FILE|- [--chunk=SIZE] [--no_regions]",
       .details = "Reads NumPy .npy files (C order, little-endian f2, f4, f8, i4, i8, u1, b1). "
                  "A progress\nbar with rate and ETA goes to stderr when it is a terminal.\n"
                  "Over the server's Unix socket (--addr=unix:PATH) the array is read into a "
                  "shared-memory region\nand the server copies it from there: no messages carry "
                  "it.",
       .examples = {"tessera tensor put x.npy",
                    "python3 -c 'import numpy, sys; numpy.save(sys.stdout.buffer, "
                    "numpy.ones((2, 3), numpy.float32))' | tessera tensor put -",
                    "H=$(tessera tensor put weights.npy)"}},
      [put](Session& s) { return Put(s, *put); });
  put_cmd->add_option("FILE", put->file, "The .npy file; - reads stdin")->required();
  put_cmd->add_option("--chunk", put->chunk, "Bytes per streamed message (default 1Mi)")
      ->type_name("SIZE")
      ->check(ChunkSize());
  put_cmd->add_flag("--no_regions", put->no_regions, kNoRegionsHelp);

  auto* get = tree.Make<GetFlags>();
  CLI::App* get_cmd = tree.Command(
      tensor, "get", "Download a tensor as .npy (-o FILE, or -o - for stdout)",
      {.usage = "HANDLE -o FILE|- [--chunk=SIZE] [--no_regions]",
       .details = "Writes FILE only once the whole tensor has arrived. With -o -, stdout "
                  "carries the .npy and\nnothing else (it must not be a terminal). Over the "
                  "server's Unix socket the server copies the\ntensor into a shared-memory "
                  "region and FILE is written from there.",
       .examples = {"tessera tensor get tn_1a2b3c -o y.npy",
                    "tessera tensor get tn_1a2b3c -o - | python3 -c 'import numpy, sys; "
                    "print(numpy.load(io.BytesIO(sys.stdin.buffer.read())))'"}},
      [get](Session& s) { return Get(s, *get); });
  get_cmd->add_option("HANDLE", get->handle, "The tensor's handle")->required();
  get_cmd->add_option("-o", get->out, "Output .npy file; - writes stdout (required)")
      ->type_name("FILE")
      ->required();
  get_cmd->add_option("--chunk", get->chunk, "Bytes per streamed message (default 1Mi)")
      ->type_name("SIZE")
      ->check(ChunkSize());
  get_cmd->add_flag("--no_regions", get->no_regions, kNoRegionsHelp);

  tree.Command(tensor, "ls", "List your tensors",
               {.examples = {"tessera tensor ls", "tessera tensor ls --output=json"}}, List);

  auto* handles = tree.Make<std::vector<std::string>>();
  CLI::App* rm = tree.Command(tensor, "rm", "Delete tensors",
                              {.usage = "HANDLE...", .examples = {"tessera tensor rm tn_1a2b3c"}},
                              [handles](Session& s) { return Remove(s, *handles); });
  rm->add_option("HANDLE", *handles, "Tensor handles")->required();
}

// ---- run ---------------------------------------------------------------------------------------

struct RunFlags {
  std::string kernel;
  std::vector<std::string> in;
  std::vector<std::string> out;
  std::vector<std::string> attrs;
  uint32_t stream = 0;
  bool wait = true;
};

int Run(Session& s, const RunFlags& f) {
  absl::StatusOr<Attrs> attrs = ParseAttrs(f.attrs);
  if (!attrs.ok()) return s.Usage(absl::StrCat("--attr: ", attrs.status().message()));
  v1::LaunchRequest request;
  request.set_kernel(f.kernel);
  for (const std::string& h : f.in) request.add_inputs(h);
  for (const std::string& h : f.out) request.add_outputs()->set_handle(h);
  *request.mutable_attrs() = attrs->values;
  request.set_stream(f.stream);
  request.set_wait(f.wait);
  auto job = s.client().Launch(request);
  if (!job.ok()) {
    return s.Failed(job.status(), absl::IsInvalidArgument(job.status())
                                      ? AttrHint(job.status().message(), attrs->written)
                                      : "");
  }
  if (s.json()) {
    s.PrintJson(*job);
    return job->state() == v1::JOB_STATE_FAILED ? kExitRefused : kExitOk;
  }
  std::string state = v1::JobState_Name(job->state()).substr(std::string_view("JOB_STATE_").size());
  std::cout << "job " << job->job_id() << ": " << state;
  if (std::optional<absl::Duration> took = JobRunTime(*job)) {
    std::cout << " in " << HumanDuration(*took);
  }
  std::cout << "\n";
  if (!job->error_message().empty()) std::cout << "error: " << job->error_message() << "\n";
  for (const auto& t : job->outputs()) std::cout << "  out " << TensorLine(t) << "\n";
  return job->state() == v1::JOB_STATE_FAILED ? kExitRefused : kExitOk;
}

void AddRun(CommandTree& tree) {
  auto* f = tree.Make<RunFlags>();
  CLI::App* cmd = tree.Command(
      tree.root(), "run", "Launch a kernel on your tensors",
      {.usage = "KERNEL [--in=H,...] [--out=H,...] [--attr='K=V;...'] [--stream=N] [--no-wait]",
       .details = absl::StrCat("Attributes: ", kAttrSyntax,
                               ".\n`tessera kernels` lists each kernel's inputs and attributes "
                               "with their types.\nExits 1 when the job fails."),
       .examples = {"tessera run fill --attr='shape=[2,3];value=2.5'",
                    "tessera run add --in=tn_a,tn_b",
                    "tessera run sum --in=tn_a --attr='axes=[1];keepdims=true'",
                    "tessera run matmul --in=tn_a,tn_b --out=tn_c --stream=1 --no-wait"}},
      [f](Session& s) { return Run(s, *f); }, kComputeSection);
  cmd->add_option("KERNEL", f->kernel, "Kernel name (see `tessera kernels`)")->required();
  cmd->add_option("--in", f->in, "Input tensor handles, in order")
      ->type_name("H,...")
      ->delimiter(',')
      ->allow_extra_args(false);
  cmd->add_option("--out", f->out,
                  "Output tensors to write (default: new tensors with inferred shapes)")
      ->type_name("H,...")
      ->delimiter(',')
      ->allow_extra_args(false);
  cmd->add_option("--attr", f->attrs, "Attributes K=V;K2=V2 (the flag may repeat)")
      ->type_name("K=V;...")
      ->allow_extra_args(false);  // one argument per --attr: KERNEL may follow
  cmd->add_option("--stream", f->stream, "Stream index (default 0)")->type_name("N");
  cmd->add_flag("--wait,!--no-wait", f->wait,
                "Wait for the job to finish (default); --no-wait prints the queued job");
}

// ---- kernels, kernel define/ls/rm --------------------------------------------------------------

int Kernels(Session& s) {
  auto catalog = s.client().ListKernels();
  if (!catalog.ok()) return s.Failed(catalog.status());
  if (s.json()) {
    s.PrintJson(*catalog);
    return kExitOk;
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
  return kExitOk;
}

struct DefineFlags {
  std::string name;
  std::string file;
};

int Define(Session& s, const DefineFlags& f) {
  absl::StatusOr<int> fd = s.OpenInput(f.file, "--file");
  if (!fd.ok()) return s.Usage(fd.status().message());
  std::string text;
  const bool read = ReadAll(*fd, &text);
  if (*fd != STDIN_FILENO) close(*fd);
  if (!read) return s.Usage(absl::StrCat("--file: cannot read ", DisplayName(f.file)));
  const std::string named = DefinedName(text);
  if (named.empty()) {
    return s.Usage(absl::StrCat(DisplayName(f.file),
                                " does not start with `kernel NAME(...)` (see docs/kernels.md)"));
  }
  if (!f.name.empty() && named != f.name) {
    return s.Usage(absl::StrCat(DisplayName(f.file), " defines \"", named, "\", not \"", f.name,
                                "\" (it must start with `kernel ", f.name, "(...)`)"));
  }
  auto defined = s.client().DefineKernel(text);
  if (!defined.ok()) return s.Failed(defined.status());
  if (s.json()) {
    s.PrintJson(*defined);
  } else {
    std::cout << "defined " << defined->name() << " (" << defined->hash().substr(0, 12) << ")\n";
  }
  return kExitOk;
}

int KernelList(Session& s) {
  auto listed = s.client().ListKernels();
  if (!listed.ok()) return s.Failed(listed.status());
  v1::ListKernelsResponse own;
  for (const auto& k : listed->kernels()) {
    if (k.tenant_defined()) *own.add_kernels() = k;
  }
  if (s.json()) {
    s.PrintJson(own);
    return kExitOk;
  }
  if (own.kernels_size() == 0) std::cout << "no kernels of yours; see `tessera kernel define`\n";
  for (const auto& k : own.kernels()) std::cout << k.source() << "\n";
  return kExitOk;
}

int KernelRemove(Session& s, const std::vector<std::string>& names) {
  v1::ListKernelsResponse deleted;  // in JSON: the kernels deleted, by name
  for (const std::string& name : names) {
    absl::Status gone = s.client().DeleteKernel(name);
    if (!gone.ok()) {
      if (s.json()) s.PrintJson(deleted);
      return s.Failed(gone);
    }
    deleted.add_kernels()->set_name(name);
    if (!s.json()) std::cout << "deleted " << name << "\n";
  }
  if (s.json()) s.PrintJson(deleted);
  return kExitOk;
}

void AddKernelCommands(CommandTree& tree) {
  tree.Command(tree.root(), "kernels", "The kernel catalog and your own kernels",
               {.details = "One line per kernel: its inputs (? when optional), its attributes "
                           "with their types, what\nit computes.",
                .examples = {"tessera kernels", "tessera kernels --output=json"}},
               Kernels, kComputeSection);
  CLI::App* kernel = tree.Group(tree.root(), "kernel", "Your own kernels", kComputeSection);
  auto* f = tree.Make<DefineFlags>();
  CLI::App* define = tree.Command(
      kernel, "define", "Define a kernel of yours from a file (--file, - for stdin)",
      {.usage = "[NAME] --file=FILE|-",
       .details = "The file holds one definition in the kernel language (docs/kernels.md). "
                  "NAME, when given,\nmust be the name the file defines.",
       .examples = {"tessera kernel define swish --file=swish.tk",
                    "echo 'kernel swish(x: f32) -> (y: f32) { y = x * sigmoid(x) }' | "
                    "tessera kernel define --file -"}},
      [f](Session& s) { return Define(s, *f); });
  define->add_option("NAME", f->name, "The kernel's name (checked against the file)");
  define->add_option("--file", f->file, "The definition; - reads stdin (required)")
      ->type_name("FILE")
      ->required();
  tree.Command(kernel, "ls", "Your kernels, with their definitions",
               {.examples = {"tessera kernel ls"}}, KernelList);
  auto* names = tree.Make<std::vector<std::string>>();
  CLI::App* rm = tree.Command(kernel, "rm", "Delete kernels of yours",
                              {.usage = "NAME...", .examples = {"tessera kernel rm swish"}},
                              [names](Session& s) { return KernelRemove(s, *names); });
  rm->add_option("NAME", *names, "Kernel names")->required();
}

// ---- region list, rm ---------------------------------------------------------------------------

int RegionList(Session& s) {
  auto regions = s.client().ListRegions();
  if (!regions.ok()) return s.Failed(regions.status());
  if (s.json()) {
    s.PrintJson(*regions);
    return kExitOk;
  }
  std::cout << absl::StrFormat("%-26s %12s  %-20s  %s\n", "HANDLE", "BYTES", "CREATED",
                               "TRANSFERS");
  for (const v1::Region& r : regions->regions()) {
    std::cout << absl::StrFormat("%-26s %12s  %-20s  %d\n", r.handle(), FormatBytes(r.size_bytes()),
                                 FormatUtc(absl::FromUnixSeconds(r.create_time().seconds())),
                                 r.transfers());
  }
  return kExitOk;
}

int RegionRemove(Session& s, const std::vector<std::string>& handles) {
  v1::ListRegionsResponse removed;  // in JSON: the regions unregistered, with the bytes released
  for (const std::string& handle : handles) {
    auto released = s.client().UnregisterRegion(handle);
    if (!released.ok()) {
      if (s.json()) s.PrintJson(removed);
      return s.Failed(released.status());
    }
    v1::Region* r = removed.add_regions();
    r->set_handle(handle);
    r->set_size_bytes(*released);
    if (!s.json()) {
      std::cout << "unregistered " << handle << " (" << FormatBytes(*released) << ")\n";
    }
  }
  if (s.json()) s.PrintJson(removed);
  return kExitOk;
}

void AddRegionCommands(CommandTree& tree) {
  CLI::App* region =
      tree.Group(tree.root(), "region", "Shared-memory regions (clients on the server's node)",
                 kComputeSection);
  CLI::App* list = tree.Command(
      region, "list", "List your shared-memory regions",
      {.details = "The regions that programs of yours registered through the server's Unix "
                  "socket (docs/api.md):\ntheir size, when, and the transfers using each now. "
                  "`tessera tensor put` and `get` unregister\ntheirs before they exit.",
       .examples = {"tessera region list", "tessera region list --output=json"}},
      RegionList);
  list->alias("ls");
  auto* handles = tree.Make<std::vector<std::string>>();
  CLI::App* rm = tree.Command(
      region, "rm", "Unregister regions (e.g. a crashed program's), freeing their quota",
      {.usage = "HANDLE...",
       .details = "Refused (FAILED_PRECONDITION) while a transfer uses the region.",
       .examples = {"tessera region rm rg_1a2b3c"}},
      [handles](Session& s) { return RegionRemove(s, *handles); });
  rm->add_option("HANDLE", *handles, "Region handles")->required();
}

// ---- usage -------------------------------------------------------------------------------------

int Usage(Session& s) {
  auto usage = s.client().GetUsage();
  if (!usage.ok()) return s.Failed(usage.status());
  if (s.json()) {
    s.PrintJson(*usage);
    return kExitOk;
  }
  const absl::Duration busy =
      absl::Seconds(usage->busy_time().seconds()) + absl::Nanoseconds(usage->busy_time().nanos());
  std::cout << "memory:  " << FormatBytes(usage->memory_used_bytes()) << " used of "
            << FormatBytes(usage->memory_quota_bytes()) << " (tensors "
            << FormatBytes(usage->memory_tensor_bytes()) << ", scratch "
            << FormatBytes(usage->memory_scratch_bytes()) << ", staging "
            << FormatBytes(usage->memory_staging_bytes()) << "), peak "
            << FormatBytes(usage->memory_peak_bytes()) << "\n"
            << "tensors: " << usage->tensors() << "\n"
            << "jobs:    " << usage->jobs_queued() << " queued, " << usage->jobs_running()
            << " running, " << usage->jobs_succeeded() << " succeeded, " << usage->jobs_failed()
            << " failed, " << usage->jobs_cancelled() << " cancelled (" << usage->jobs_expired()
            << " expired)\n"
            << "busy:    " << HumanDuration(busy) << "\n"
            << "calls:   " << usage->requests_in_flight() << " in flight (this one included), "
            << usage->requests_refused_in_flight() << " refused past max_requests_in_flight, "
            << usage->requests_refused_rate() << " past requests_per_second\n"
            << "regions: " << usage->regions() << ", " << FormatBytes(usage->region_bytes())
            << " of " << FormatBytes(usage->region_quota_bytes()) << " (max_region_bytes)\n";
  return kExitOk;
}

}  // namespace

void AddComputeCommands(CommandTree& tree) {
  AddTensorCommands(tree);
  AddRun(tree);
  AddKernelCommands(tree);
  AddRegionCommands(tree);
  tree.Command(tree.root(), "usage", "Your memory, tensors, jobs, busy time, calls and regions",
               {.examples = {"tessera usage", "tessera usage --output=json"}}, Usage,
               kComputeSection);
}

}  // namespace tessera::cli
