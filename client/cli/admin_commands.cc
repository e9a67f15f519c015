// tenant ..., server info, mps ...: the TenantAdmin service (admin token).
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

#include "client/cli/commands.h"
#include "client/cli/format.h"
#include "client/cli/parse.h"
#include "client/cli/session.h"

namespace tessera::cli {
namespace {

constexpr char kAdminSection[] = "Tenants and the server (admin token)";

std::string KindName(v1::ContextKind kind) {
  std::string name = v1::ContextKind_Name(kind);
  return name.substr(std::string_view("CONTEXT_KIND_").size());
}

// `memory_units`, `region_units`: how the user wrote --memory and --max_region_bytes, so the
// confirmation speaks the same units.
void PrintTenant(const v1::Tenant& t, SizeUnits memory_units = SizeUnits::kBinary,
                 SizeUnits region_units = SizeUnits::kBinary) {
  std::vector<std::string> labels;
  for (const auto& [k, v] : t.labels()) labels.push_back(absl::StrCat(k, "=", v));
  std::sort(labels.begin(), labels.end());
  const v1::Quota& q = t.quota();
  std::cout << "tenant_id:       " << t.tenant_id() << "\n";
  if (!t.home_node().empty()) std::cout << "home node:       " << t.home_node() << "\n";
  std::cout << "display_name:    " << t.display_name() << "\n"
            << "labels:          " << absl::StrJoin(labels, ",") << "\n"
            << "memory quota:    " << FormatBytesExact(q.device_memory_bytes(), memory_units)
            << "\n"
            << "compute share:   " << q.compute_share_percent() << "%\n"
            << "max streams:     " << q.max_streams() << "\n"
            << "max queued jobs: " << q.max_queued_jobs() << "\n"
            << "requests:        " << q.max_requests_in_flight() << " in flight, "
            << q.requests_per_second() << " per second\n"
            << "region quota:    "
            << (q.max_region_bytes() != 0 ? FormatBytesExact(q.max_region_bytes(), region_units)
                                          : std::string("the memory quota"))
            << "\n"
            << "priority:        " << (q.priority() == v1::PRIORITY_LOW ? "low" : "normal") << "\n"
            << "device:          " << t.device_index() << "\n"
            << "context:         " << KindName(t.context().kind()) << " (" << t.context().reason()
            << ")\n"
            << "created:         " << FormatUtc(absl::FromUnixSeconds(t.create_time().seconds()))
            << "\n"
            << "key issued:      "
            << FormatUtc(absl::FromUnixSeconds(t.key_create_time().seconds())) << "\n";
}

// ---- tenant register ---------------------------------------------------------------------------

struct RegisterFlags {
  std::string id;
  std::string memory;
  uint32_t compute_share = 0;
  uint32_t max_streams = 0;
  uint32_t max_queued_jobs = 0;
  uint32_t max_requests_in_flight = 0;
  uint32_t requests_per_second = 0;
  std::string max_region_bytes;
  std::string priority;
  int32_t device = -1;
  std::string display_name;
  std::vector<std::string> labels;
};

int Register(Session& s, const RegisterFlags& f) {
  const Size memory = *ParseSize(f.memory);  // validated while parsing
  const Size regions =
      f.max_region_bytes.empty() ? Size{0, memory.units} : *ParseSize(f.max_region_bytes);
  absl::StatusOr<std::map<std::string, std::string>> labels = ParseLabels(f.labels);
  if (!labels.ok()) return s.Usage(absl::StrCat("--labels: ", labels.status().message()));
  v1::RegisterTenantRequest request;
  request.set_tenant_id(f.id);
  request.set_display_name(f.display_name);
  request.mutable_labels()->insert(labels->begin(), labels->end());
  v1::Quota* q = request.mutable_quota();
  q->set_device_memory_bytes(memory.bytes);
  q->set_compute_share_percent(f.compute_share);
  q->set_max_streams(f.max_streams);
  q->set_max_queued_jobs(f.max_queued_jobs);
  q->set_max_requests_in_flight(f.max_requests_in_flight);
  q->set_requests_per_second(f.requests_per_second);
  q->set_max_region_bytes(regions.bytes);  // 0: the server's default, the memory quota
  q->set_priority(*ParsePriority(f.priority));
  if (f.device >= 0) request.set_device_index(f.device);

  absl::StatusOr<v1::RegisterTenantResponse> registered = s.client().RegisterTenant(request);
  if (!registered.ok()) return s.Failed(registered.status());
  if (s.json()) {
    s.PrintJson(*registered);
    return kExitOk;
  }
  PrintTenant(registered->tenant(), memory.units, regions.units);
  if (memory.units == SizeUnits::kDecimal || regions.units == SizeUnits::kDecimal) {
    std::cout << "                 (decimal units: K, M, G, T are powers of 1000; Ki, Mi, Gi, Ti "
                 "of 1024)\n";
  }
  std::cout << "api key:         " << registered->api_key() << "\n"
            << "(the API key is shown only now; store it securely)\n";
  return kExitOk;
}

void AddRegister(CommandTree& tree, CLI::App* group) {
  auto* f = tree.Make<RegisterFlags>();
  CLI::App* cmd = tree.Command(
      group, "register", "Register a tenant with fixed quotas; prints its API key once",
      {.usage = "ID --memory=SIZE [FLAGS]",
       .details =
           "Reserves the memory quota on a device and creates the tenant's execution context.\n"
           "Quotas cannot change later: deregister the tenant and register it again. The API\n"
           "key is printed only now; only a hash of it is kept.",
       .examples = {"tessera tenant register alpha --memory=2Gi",
                    "tessera tenant register ml-team --memory=16G --compute_share=30 "
                    "--labels=team=ml,env=dev",
                    "tessera tenant register batch --memory=512Mi --priority=low "
                    "--max_streams=2 --output=json"}},
      [f](Session& s) { return Register(s, *f); });
  cmd->add_option("ID", f->id, "Tenant id: a DNS label (a-z, 0-9, -), at most 63 characters")
      ->required();
  cmd->add_option("--memory", f->memory,
                  "Device memory quota (required): 2Gi is 2^31 bytes, 2G is 2*10^9")
      ->type_name("SIZE")
      ->required()
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            absl::StatusOr<Size> size = ParseSize(text);
            if (!size.ok()) return std::string(size.status().message());
            return size->bytes == 0 ? "the memory quota must be more than 0" : "";
          },
          "", "SIZE"));
  cmd->add_option("--compute_share", f->compute_share,
                  "Compute share in percent, 1..100 (default 100)")
      ->type_name("N")
      ->check(Quiet(CLI::Range(1, 100)));
  cmd->add_option("--max_streams", f->max_streams, "Ordered streams, 1..64 (default 4)")
      ->type_name("N")
      ->check(Quiet(CLI::Range(1, 64)));
  cmd->add_option("--max_queued_jobs", f->max_queued_jobs,
                  "Jobs that may wait, 1..65536 (default 1024)")
      ->type_name("N")
      ->check(Quiet(CLI::Range(1, 65536)));
  cmd->add_option("--max_requests_in_flight", f->max_requests_in_flight,
                  "Calls handled at once, 1..4096 (default 64)")
      ->type_name("N")
      ->check(Quiet(CLI::Range(1, 4096)));
  cmd->add_option("--requests_per_second", f->requests_per_second,
                  "Call rate limit, 1..1000000 (default 10000 per percent of compute share)")
      ->type_name("N")
      ->check(Quiet(CLI::Range(1, 1000000)));
  cmd->add_option("--max_region_bytes", f->max_region_bytes,
                  "Shared-memory regions mapped at once (clients on the server's node), "
                  "1Mi..1Pi (default: the memory quota)")
      ->type_name("SIZE")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            absl::StatusOr<Size> size = ParseSize(text);
            if (!size.ok()) return std::string(size.status().message());
            return size->bytes == 0 ? "the region quota must be more than 0" : "";
          },
          "", "SIZE"));
  cmd->add_option("--priority", f->priority, "Stream priority: normal (default) or low")
      ->type_name("normal|low")
      ->check(Quiet(CLI::IsMember({"normal", "low"})));
  cmd->add_option("--device", f->device, "Device index (default: the one with most free memory)")
      ->type_name("N")
      ->check(Quiet(CLI::NonNegativeNumber));
  cmd->add_option("--display_name", f->display_name, "Display name")->type_name("NAME");
  cmd->add_option("--labels", f->labels, "Labels, key=value pairs")
      ->type_name("K=V,...")
      ->delimiter(',')
      ->allow_extra_args(false);  // one argument per --labels: a later ID stays the ID
}

// ---- tenant get, list, deregister, rotate-key -------------------------------------------------

void AddGet(CommandTree& tree, CLI::App* group) {
  auto* id = tree.Make<std::string>();
  CLI::App* cmd = tree.Command(
      group, "get", "Show a tenant: quotas, context, labels",
      {.usage = "ID",
       .examples = {"tessera tenant get alpha", "tessera tenant get alpha --output=json"}},
      [id](Session& s) {
        absl::StatusOr<v1::Tenant> tenant = s.client().GetTenant(*id);
        if (!tenant.ok()) return s.Failed(tenant.status());
        s.json() ? s.PrintJson(*tenant) : PrintTenant(*tenant);
        return static_cast<int>(kExitOk);
      });
  cmd->add_option("ID", *id, "Tenant id")->required();
}

void AddList(CommandTree& tree, CLI::App* group) {
  auto* page_size = tree.Make<int32_t>();
  CLI::App* cmd = tree.Command(
      group, "list", "List tenants",
      {.usage = "[--page_size=N]",
       .details = "Lists every tenant (following pages). With --output=json and --page_size, "
                  "prints one page with its next_page_token.",
       .examples = {"tessera tenant list", "tessera tenant list --output=json"}},
      [page_size](Session& s) {
        if (*page_size != 0 && s.json()) {
          auto page = s.client().ListTenants(*page_size);
          if (!page.ok()) return s.Failed(page.status());
          s.PrintJson(*page);
          return static_cast<int>(kExitOk);
        }
        auto tenants = s.client().ListAllTenants();
        if (!tenants.ok()) return s.Failed(tenants.status());
        if (s.json()) {
          v1::ListTenantsResponse all;
          for (auto& t : *tenants) *all.add_tenants() = t;
          all.set_total_size(static_cast<int32_t>(tenants->size()));
          s.PrintJson(all);
          return static_cast<int>(kExitOk);
        }
        // In a fleet, a HOME column (the node each tenant lives on).
        const bool fleet = std::any_of(tenants->begin(), tenants->end(),
                                       [](const v1::Tenant& t) { return !t.home_node().empty(); });
        std::cout << absl::StrFormat("%-24s %-9s %10s %10s %6s %7s %9s %9s %6s  %s", "TENANT",
                                     "CONTEXT", "MEMORY", "REGIONS", "SHARE", "STREAMS",
                                     "IN FLIGHT", "CALLS/S", "DEVICE", "");
        std::cout << (fleet ? absl::StrFormat("%-16s ", "HOME") : "") << "DISPLAY NAME\n";
        for (const auto& t : *tenants) {
          const uint64_t region_quota = t.quota().max_region_bytes() != 0
                                            ? t.quota().max_region_bytes()
                                            : t.quota().device_memory_bytes();
          std::cout << absl::StrFormat(
              "%-24s %-9s %10s %10s %5d%% %7d %9d %9d %6d  %s%s\n", t.tenant_id(),
              KindName(t.context().kind()), FormatBytes(t.quota().device_memory_bytes()),
              FormatBytes(region_quota), t.quota().compute_share_percent(), t.quota().max_streams(),
              t.quota().max_requests_in_flight(), t.quota().requests_per_second(), t.device_index(),
              fleet ? absl::StrFormat("%-16s ", t.home_node()) : "", t.display_name());
        }
        return static_cast<int>(kExitOk);
      });
  cmd->add_option("--page_size", *page_size, "Tenants per page (default: the server's, 100)")
      ->type_name("N")
      ->check(Quiet(CLI::Range(1, 1000)));
}

void AddDeregister(CommandTree& tree, CLI::App* group) {
  auto* id = tree.Make<std::string>();
  CLI::App* cmd = tree.Command(
      group, "deregister", "Deregister a tenant: drains its work, frees its memory",
      {.usage = "ID", .examples = {"tessera tenant deregister alpha"}}, [id](Session& s) {
        auto gone = s.client().DeregisterTenant(*id);
        if (!gone.ok()) return s.Failed(gone.status());
        if (s.json()) {
          s.PrintJson(*gone);
        } else {
          std::cout << "deregistered " << *id << "; released "
                    << FormatBytes(gone->released_memory_bytes()) << "\n";
        }
        return static_cast<int>(kExitOk);
      });
  cmd->add_option("ID", *id, "Tenant id")->required();
}

void AddRotateKey(CommandTree& tree, CLI::App* group) {
  auto* id = tree.Make<std::string>();
  CLI::App* cmd = tree.Command(
      group, "rotate-key", "Issue a new API key; the previous one stops working",
      {.usage = "ID", .examples = {"tessera tenant rotate-key alpha"}}, [id](Session& s) {
        auto rotated = s.client().RotateTenantKey(*id);
        if (!rotated.ok()) return s.Failed(rotated.status());
        if (s.json()) {
          s.PrintJson(*rotated);
        } else {
          std::cout << "api key: " << rotated->api_key() << "\n"
                    << "(the previous key is revoked; the new one is shown only now)\n";
        }
        return static_cast<int>(kExitOk);
      });
  cmd->add_option("ID", *id, "Tenant id")->required();
}

// ---- tenant update -----------------------------------------------------------------------------

struct UpdateFlags {
  std::string id;
  std::string display_name;
  std::vector<std::string> labels;
  std::vector<CLI::Option*> quota_flags;
  CLI::Option* display_name_flag = nullptr;
  CLI::Option* labels_flag = nullptr;
};

int Update(Session& s, const UpdateFlags& f) {
  v1::Tenant tenant;
  tenant.set_tenant_id(f.id);
  std::vector<std::string> paths;
  if (f.display_name_flag->count() > 0) {
    tenant.set_display_name(f.display_name);
    paths.push_back("display_name");
  }
  if (f.labels_flag->count() > 0) {
    auto labels = ParseLabels(f.labels);
    if (!labels.ok()) return s.Usage(absl::StrCat("--labels: ", labels.status().message()));
    tenant.mutable_labels()->insert(labels->begin(), labels->end());
    paths.push_back("labels");
  }
  // Quota flags go to the server, which refuses them and says how quotas change.
  for (const CLI::Option* quota : f.quota_flags) {
    if (quota->count() > 0) paths.push_back(absl::StrCat("quota.", quota->get_lnames().front()));
  }
  if (paths.empty()) return s.Usage("give --display_name and/or --labels");
  auto updated = s.client().UpdateTenant(tenant, paths);
  if (!updated.ok()) return s.Failed(updated.status());
  s.json() ? s.PrintJson(*updated) : PrintTenant(*updated);
  return kExitOk;
}

void AddUpdate(CommandTree& tree, CLI::App* group) {
  auto* f = tree.Make<UpdateFlags>();
  CLI::App* cmd = tree.Command(
      group, "update", "Change a tenant's display name or labels",
      {.usage = "ID [--display_name=NAME] [--labels=K=V,...]",
       .details = "Only the flags given change; --labels replaces every label (--labels '' "
                  "clears them).\nQuotas cannot change: the server refuses --memory, "
                  "--compute_share, --max_streams,\n--max_queued_jobs, --max_requests_in_flight, "
                  "--requests_per_second, --max_region_bytes\nand --priority here (deregister "
                  "and register again).",
       .examples = {"tessera tenant update alpha --display_name='Alpha team'",
                    "tessera tenant update alpha --labels=team=ml,env=prod"}},
      [f](Session& s) { return Update(s, *f); });
  cmd->add_option("ID", f->id, "Tenant id")->required();
  f->display_name_flag =
      cmd->add_option("--display_name", f->display_name, "New display name")->type_name("NAME");
  f->labels_flag = cmd->add_option("--labels", f->labels,
                                   "New labels, replacing all of them (--labels '' clears them)")
                       ->type_name("K=V,...")
                       ->delimiter(',')
                       ->allow_extra_args(false);  // one argument per --labels, split at commas
  // Accepted so that the server can explain that quotas are immutable.
  for (const char* name :
       {"memory", "compute_share", "max_streams", "max_queued_jobs", "max_requests_in_flight",
        "requests_per_second", "max_region_bytes", "priority"}) {
    f->quota_flags.push_back(cmd->add_option(absl::StrCat("--", name))
                                 ->description("Refused: quotas cannot change")
                                 ->type_name("VALUE"));
  }
}

// ---- server info, mps status, mps terminate ----------------------------------------------------

int ServerInfo(Session& s) {
  auto info = s.client().GetServerInfo();
  if (!info.ok()) return s.Failed(info.status());
  if (s.json()) {
    s.PrintJson(*info);
    return kExitOk;
  }
  std::cout << "version:    " << info->version() << "\n"
            << "backend:    " << info->backend() << " (" << info->backend_reason() << ")\n"
            << "mps:        " << v1::MpsDecision_Name(info->mps_decision()) << " ("
            << info->mps_reason() << ")\n"
            << "transport:  " << info->transport_security() << "\n"
            << (info->node_name().empty()
                    ? std::string()
                    : absl::StrCat("node:       ", info->node_name(),
                                   " (fleet: ", info->fleet_directory(), ")\n"))
            << "tenants:    " << info->tenant_count() << "\n"
            << "overcommit: " << info->memory_overcommit() << "\n";
  for (const auto& d : info->devices()) {
    std::cout << "device " << d.index() << ":   " << d.name() << ", memory "
              << FormatBytes(d.memory_bytes()) << ", reserved " << FormatBytes(d.reserved_bytes())
              << " of " << FormatBytes(d.reservable_bytes()) << ", " << d.tenants() << " tenant(s)"
              << (d.context_limit() ? absl::StrCat(" (limit ", d.context_limit(), ")") : "")
              << "\n";
  }
  return kExitOk;
}

int MpsStatus(Session& s) {
  auto status = s.client().GetMpsStatus();
  if (!status.ok()) return s.Failed(status.status());
  if (s.json()) {
    s.PrintJson(*status);
    return kExitOk;
  }
  std::cout << "decision: " << v1::MpsDecision_Name(status->decision()) << " (" << status->reason()
            << ")\n"
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
    for (const auto& server : d.servers()) {
      std::cout << "  server " << server.pid() << ": " << v1::MpsServerState_Name(server.state())
                << ", clients [" << absl::StrJoin(server.client_pids(), ", ") << "]\n";
    }
    if (!d.error().empty()) std::cout << "  error: " << d.error() << "\n";
  }
  return kExitOk;
}

int NodeList(Session& s) {
  auto nodes = s.client().ListNodes();
  if (!nodes.ok()) return s.Failed(nodes.status());
  if (s.json()) {
    s.PrintJson(*nodes);
    return kExitOk;
  }
  std::cout << absl::StrFormat("%-20s %-24s %-7s %7s %12s %12s %8s  %s\n", "NODE", "ADDRESS",
                               "BACKEND", "DEVICES", "MEMORY", "FREE", "TENANTS", "STATE");
  for (const auto& n : nodes->nodes()) {
    uint64_t memory = 0, free = 0;
    uint32_t tenants = 0;
    for (const auto& d : n.devices()) {
      memory += d.memory_bytes();
      free += d.free_memory_bytes();
      tenants += d.tenants();
    }
    std::cout << absl::StrFormat("%-20s %-24s %-7s %7d %12s %12s %8d  %s\n", n.name(), n.address(),
                                 n.backend(), n.devices_size(), FormatBytes(memory),
                                 FormatBytes(free), tenants, n.draining() ? "draining" : "serving");
  }
  return kExitOk;
}

void AddServerAndMps(CommandTree& tree) {
  CLI::App* server = tree.Group(tree.root(), "server", "The server", kAdminSection);
  tree.Command(server, "info", "Version, backend, MPS decision, devices and reservations",
               {.examples = {"tessera server info", "tessera server info --output=json"}},
               ServerInfo);
  CLI::App* node = tree.Group(tree.root(), "node", "The fleet's nodes", kAdminSection);
  tree.Command(node, "list", "The fleet's nodes, their devices and free memory",
               {.details = "Asks the server's fleet directory (etcd); a single server, not in a "
                           "fleet, answers FAILED_PRECONDITION.",
                .examples = {"tessera node list", "tessera node list --output=json"}},
               NodeList);
  auto* drain_name = tree.Make<std::string>();
  auto* undo = tree.Make<bool>();
  auto* move = tree.Make<bool>();
  CLI::App* drain = tree.Command(
      node, "drain", "Place no new tenant on a node (its tenants stay unless --move)",
      {.usage = "NAME [--move | --undo]",
       .details = "The node shows it at its next lease renewal (tessera node list: draining). "
                  "--move also moves its tenants to other nodes within seconds, with their ids, "
                  "quotas and keys; their tensors, jobs and defined kernels are lost. A stopped "
                  "node's tenants wait for it unless it is drained with --move.",
       .examples = {"tessera node drain gpu-node-7", "tessera node drain gpu-node-7 --move",
                    "tessera node drain gpu-node-7 --undo"}},
      [drain_name, undo, move](Session& s) {
        absl::Status done = s.client().DrainNode(*drain_name, *undo, *move);
        if (!done.ok()) return s.Failed(done);
        if (!s.json()) {
          std::cout << "node " << *drain_name
                    << (*undo   ? " takes new tenants again\n"
                        : *move ? " drains: no new tenants, its tenants move to other nodes\n"
                                : " drains: no new tenants\n");
        }
        return static_cast<int>(kExitOk);
      });
  drain->add_option("NAME", *drain_name, "The node's --node_name")->required();
  drain->add_flag("--undo", *undo, "Take new tenants again");
  drain->add_flag("--move", *move, "Also move the node's tenants to other nodes");
  CLI::App* mps = tree.Group(tree.root(), "mps", "NVIDIA MPS", kAdminSection);
  tree.Command(mps, "status", "MPS decision, control daemons, servers and clients",
               {.examples = {"tessera mps status"}}, MpsStatus);
  auto* id = tree.Make<std::string>();
  CLI::App* terminate = tree.Command(
      mps, "terminate", "Stop a tenant's queued and running GPU work",
      {.usage = "TENANT", .examples = {"tessera mps terminate alpha"}}, [id](Session& s) {
        auto done = s.client().TerminateTenantWork(*id);
        if (!done.ok()) return s.Failed(done.status());
        s.json() ? s.PrintJson(*done) : void(std::cout << done->detail() << "\n");
        return static_cast<int>(kExitOk);
      });
  terminate->add_option("TENANT", *id, "Tenant id")->required();
}

}  // namespace

void AddAdminCommands(CommandTree& tree) {
  CLI::App* tenant = tree.Group(tree.root(), "tenant", "Tenants", kAdminSection);
  AddRegister(tree, tenant);
  AddGet(tree, tenant);
  AddList(tree, tenant);
  AddUpdate(tree, tenant);
  AddDeregister(tree, tenant);
  AddRotateKey(tree, tenant);
  AddServerAndMps(tree);
}

}  // namespace tessera::cli
