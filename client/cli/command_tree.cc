#include "client/cli/command_tree.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <set>
#include <utility>

#include <CLI/CLI.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

#include "client/cli/parse.h"

namespace tessera::cli {
namespace {

constexpr char kProgram[] = "tessera";
constexpr int kLeftColumn = 24;

constexpr size_t kWidth = 96;

// `text` wrapped at kWidth columns, continuation lines indented by `indent`; the first line
// starts at column `indent` too (the caller has put something that wide before it).
std::string Wrap(absl::string_view text, size_t indent) {
  std::string out;
  size_t column = indent;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (column > indent && column + 1 + word.size() > kWidth) {
      absl::StrAppend(&out, "\n", std::string(indent, ' '));
      column = indent;
    } else if (column > indent) {
      out.push_back(' ');
      ++column;
    }
    absl::StrAppend(&out, word);
    column += word.size();
  }
  return out;
}

// "  left    right" with `right` aligned and wrapped; on the next line when `left` is too wide.
std::string Row(const std::string& left, const std::string& right) {
  const size_t indent = kLeftColumn + 2;
  if (left.size() + 2 > static_cast<size_t>(kLeftColumn)) {
    return absl::StrCat("  ", left, "\n", std::string(indent, ' '), Wrap(right, indent), "\n");
  }
  return absl::StrFormat("  %-*s%s\n", kLeftColumn, left, Wrap(right, indent));
}

// How a flag is written in help: "--memory=SIZE", "-o FILE", "--tls".
std::string FlagSyntax(const CLI::Option& option) {
  std::vector<std::string> names;
  for (const std::string& s : option.get_snames()) names.push_back(absl::StrCat("-", s));
  for (const std::string& l : option.get_lnames()) names.push_back(absl::StrCat("--", l));
  std::string syntax = absl::StrJoin(names, ", ");
  if (option.get_expected_max() == 0) return syntax;  // a flag without a value
  const std::string value = option.get_type_name();
  return option.get_lnames().empty() ? absl::StrCat(syntax, " ", value)
                                     : absl::StrCat(syntax, "=", value);
}

bool IsHelpOrVersion(const CLI::App& app, const CLI::Option* option) {
  return option == app.get_help_ptr() || option == app.get_help_all_ptr() ||
         option->check_lname("version");
}

std::vector<const CLI::App*> Children(const CLI::App* app) {
  return app->get_subcommands([](const CLI::App*) { return true; });
}

// The argument names and optional markers in a usage line: "ID --memory=SIZE [FLAGS]" ->
// "ID"; "[NAME] --file=FILE|-" -> "[NAME]".
std::string Synopsis(const std::string& usage) {
  std::vector<std::string> kept;
  bool value_follows = false;  // "-o FILE": FILE is the flag's
  for (absl::string_view word : absl::StrSplit(usage, ' ', absl::SkipEmpty())) {
    const bool flag = absl::StartsWith(word, "-") || absl::StartsWith(word, "[-");
    if (!flag && !value_follows && !absl::StartsWith(word, "[FLAGS")) kept.emplace_back(word);
    value_follows = flag && !absl::StrContains(word, "=");
  }
  return absl::StrJoin(kept, " ");
}

// A CLI11 validator from one of our parsers: "" when `text` parses, else the message.
template <typename Parser>
CLI::Validator ParsedBy(Parser parser, const std::string& name) {
  return CLI::Validator(
      [parser](std::string& text) -> std::string {
        auto parsed = parser(text);
        return parsed.ok() ? std::string() : std::string(parsed.status().message());
      },
      "", name);
}

}  // namespace

CLI::Validator Quiet(CLI::Validator validator) {
  validator.description("");
  return validator;
}

std::string VersionLine() {
  return absl::StrCat(kProgram, " ", TESSERA_VERSION, " (git ", TESSERA_GIT_REVISION, ", ",
                      TESSERA_BUILD_TYPE, " build)");
}

CommandTree::CommandTree()
    : root_(std::make_unique<CLI::App>(
          "Command-line client for a Tessera server (multi-tenant GPU sharing).", kProgram)) {
  CLI::App& app = *root_;
  // Subcommands copy the help flag when they are created: set it first.
  app.set_help_flag("-h,--help", "Show help for the program or the command it follows");
  app.set_version_flag("--version", VersionLine(), "Print the version and exit");
  app.require_subcommand(1);
  app.add_option("--addr", global_.addr,
                 "Server address, or unix:PATH for its Unix socket on this node (default "
                 "$TESSERA_ADDR, else 127.0.0.1:50051)")
      ->type_name("HOST:PORT");
  app.add_option("--token", global_.token,
                 "Bearer token: the admin token or a tenant API key (visible in `ps`; prefer "
                 "--token_file or $TESSERA_TOKEN)")
      ->type_name("TOKEN");
  app.add_option("--token_file", global_.token_file,
                 "File whose first line is the token (- reads stdin)")
      ->type_name("FILE");
  app.add_flag("--tls", global_.tls, "Use TLS (implied by --tls_ca and --tls_cert)");
  app.add_option("--tls_ca", global_.tls_ca, "PEM CA bundle that verifies the server")
      ->type_name("FILE");
  app.add_option("--tls_cert", global_.tls_cert, "PEM client certificate (mutual TLS)")
      ->type_name("FILE");
  app.add_option("--tls_key", global_.tls_key, "PEM client key (mutual TLS)")->type_name("FILE");
  app.add_option("--timeout", timeout_text_,
                 "Deadline of each call, e.g. 500ms, 30s, 2m (default 30s)")
      ->type_name("DURATION")
      ->check(ParsedBy(ParseTimeout, "DURATION"));
  app.add_option("--output", global_.output,
                 "Output format: text (for people) or json (protobuf JSON, for programs)")
      ->type_name("text|json")
      ->check(Quiet(CLI::IsMember({"text", "json"})));
}

CommandTree::~CommandTree() = default;

void CommandTree::AddHelpCommands() {
  auto* help_path = Make<std::vector<std::string>>();
  help_app_ = Command(
      root(), "help", "Show help for a command",
      {.usage = "[COMMAND...]",
       .details = "The same page as `tessera COMMAND --help`.",
       .examples = {"tessera help", "tessera help tenant register"},
       .local = true},
      [this, help_path](Session&) {
        const std::string page = Help(*help_path);
        if (page.empty()) {
          return UsageError(
              help_app_, absl::StrCat("unknown command \"", absl::StrJoin(*help_path, " "), "\""));
        }
        std::cout << page;
        return static_cast<int>(kExitOk);
      },
      "Other");
  help_app_->add_option("COMMAND", *help_path, "The command (one or more words)");

  auto* shell = Make<std::string>();
  CLI::App* completion = Command(
      root(), "completion", "Print a shell completion script",
      {.usage = "bash",
       .details = "Completes commands and flags. Load it in the current shell, or install it "
                  "for every new one.",
       .examples = {"source <(tessera completion bash)",
                    "tessera completion bash > ~/.local/share/bash-completion/completions/"
                    "tessera"},
       .local = true},
      [this](Session&) {
        std::cout << BashCompletion();
        return static_cast<int>(kExitOk);
      },
      "Other");
  completion->add_option("SHELL", *shell, "The shell: bash")
      ->required()
      ->check(Quiet(CLI::IsMember({"bash"})));
}

CLI::App* CommandTree::Group(CLI::App* parent, const std::string& name, const std::string& summary,
                             const std::string& section) {
  CLI::App* group = parent->add_subcommand(name, summary);
  group->require_subcommand(1);
  group->fallthrough();
  PlaceInSection(group, section);
  return group;
}

CLI::App* CommandTree::Command(CLI::App* parent, const std::string& name,
                               const std::string& summary, CommandDoc doc, Handler handler,
                               const std::string& section) {
  CLI::App* command = parent->add_subcommand(name, summary);
  command->fallthrough();  // global flags may follow the command's name
  docs_[command] = std::move(doc);
  handlers_[command] = std::move(handler);
  PlaceInSection(command, section);
  return command;
}

void CommandTree::PlaceInSection(const CLI::App* app, const std::string& section) {
  if (section.empty()) return;
  sections_[app] = section;
  if (std::find(section_order_.begin(), section_order_.end(), section) == section_order_.end()) {
    section_order_.push_back(section);
  }
}

std::vector<std::string> CommandTree::CommandsWithFlag(const std::string& name) const {
  std::vector<std::string> owners;
  std::vector<const CLI::App*> pending = Children(root_.get());
  while (!pending.empty()) {
    const CLI::App* app = pending.back();
    pending.pop_back();
    for (const CLI::App* child : Children(app)) pending.push_back(child);
    for (const CLI::Option* option : app->get_options()) {
      if (!option->get_positional() && !IsHelpOrVersion(*app, option) &&
          (option->check_lname(name) || option->check_sname(name))) {
        owners.push_back(CommandPath(app));
      }
    }
  }
  std::sort(owners.begin(), owners.end());
  return owners;
}

std::string CommandTree::ExplainParseError(const CLI::ParseError& error, const CLI::App* at) const {
  // What no command on the way took, in order; CLI11's own message otherwise.
  const std::vector<std::string> left = root_->remaining();
  const bool is_group = handlers_.count(at) == 0;
  std::vector<std::string> commands;
  for (const CLI::App* child : Children(at)) commands.push_back(child->get_name());
  if (!left.empty() && absl::StartsWith(left.front(), "-") && left.front() != "-") {
    // A flag: unknown, or another command's.
    const std::string flag = left.front().substr(0, left.front().find('='));
    const size_t name_at = flag.find_first_not_of('-');
    const std::vector<std::string> owners =
        CommandsWithFlag(name_at == std::string::npos ? "" : flag.substr(name_at));
    if (owners.empty()) return absl::StrCat("unknown flag ", flag);
    return absl::StrCat(
        flag, " does not apply to ",
        at == root_.get() ? std::string("this command") : absl::StrCat("`", CommandPath(at), "`"),
        " (it is a flag of `", absl::StrJoin(owners, "`, `"), "`)");
  }
  if (is_group && !left.empty()) {
    return absl::StrCat("unknown command \"", left.front(), "\"; the commands",
                        at == root_.get() ? "" : absl::StrCat(" of ", CommandPath(at)),
                        " are: ", absl::StrJoin(commands, ", "));
  }
  if (is_group) {
    return absl::StrCat(at == root_.get() ? "no command given; " : "which command? ",
                        "the commands are: ", absl::StrJoin(commands, ", "));
  }
  if (!left.empty()) return absl::StrCat("unexpected argument \"", left.front(), "\"");
  return error.what();
}

std::string CommandTree::CommandPath(const CLI::App* app) const {
  std::vector<std::string> names;
  for (; app != nullptr && app != root_.get(); app = app->get_parent()) {
    names.insert(names.begin(), app->get_name());
  }
  return absl::StrJoin(names, " ");
}

const CLI::App* CommandTree::Deepest() const {
  const CLI::App* app = root_.get();
  for (bool descended = true; descended;) {
    descended = false;
    for (const CLI::App* child : Children(app)) {
      if (child->parsed()) {
        app = child;
        descended = true;
        break;
      }
    }
  }
  return app;
}

int CommandTree::UsageError(const CLI::App* app, const std::string& message) const {
  const std::string path = CommandPath(app);
  std::fprintf(stderr, "%s%s: %s\nrun `%s%s --help` for usage\n", kProgram,
               path.empty() ? "" : absl::StrCat(" ", path).c_str(), message.c_str(), kProgram,
               path.empty() ? "" : absl::StrCat(" ", path).c_str());
  return kExitUsage;
}

CommandTree::Parsed CommandTree::Parse(int argc, char** argv) {
  Parsed parsed;
  try {
    root_->parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << HelpFor(Deepest());
    return parsed;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << HelpFor(Deepest());
    return parsed;
  } catch (const CLI::CallForVersion& version) {
    std::cout << version.what() << "\n";
    return parsed;
  } catch (const CLI::ParseError& error) {
    const CLI::App* at = Deepest();
    const std::string message = ExplainParseError(error, at);
    parsed.exit_code = UsageError(at, message);
    return parsed;
  }
  const CLI::App* leaf = Deepest();
  auto it = handlers_.find(leaf);
  if (it == handlers_.end()) {  // CLI11 requires a subcommand of every group: not reached
    parsed.exit_code = UsageError(leaf, "which command?");
    return parsed;
  }
  global_.timeout = *ParseTimeout(timeout_text_);
  parsed.handler = &it->second;
  parsed.command = CommandPath(leaf);
  parsed.needs_server = !docs_.at(leaf).local;
  return parsed;
}

std::string CommandTree::Help(const std::vector<std::string>& path) const {
  const CLI::App* app = root_.get();
  for (const std::string& name : path) {
    const CLI::App* next = nullptr;
    for (const CLI::App* child : Children(app)) {
      if (child->get_name() == name) next = child;
    }
    if (next == nullptr) return "";
    app = next;
  }
  return HelpFor(app);
}

std::string CommandTree::HelpFor(const CLI::App* app) const {
  if (app == root_.get()) return RootHelp();
  const std::string path = absl::StrCat(kProgram, " ", CommandPath(app));
  std::string out = absl::StrCat(app->get_description(), "\n");
  auto doc = docs_.find(app);
  if (doc == docs_.end()) {  // a group
    absl::StrAppend(&out, "\nUsage: ", path, " COMMAND [ARGS] [FLAGS]\n\nCommands:\n");
    for (const CLI::App* child : Children(app)) {
      auto child_doc = docs_.find(child);
      const std::string synopsis =
          child_doc == docs_.end() ? "" : Synopsis(child_doc->second.usage);
      absl::StrAppend(&out,
                      Row(absl::StrCat(child->get_name(), synopsis.empty() ? "" : " ", synopsis),
                          child->get_description()));
    }
    absl::StrAppend(&out, "\nRun `", path,
                    " COMMAND --help` for a command's flags and examples.\n");
    return out;
  }
  if (!doc->second.details.empty()) {
    absl::StrAppend(&out, "\n");
    for (absl::string_view line : absl::StrSplit(doc->second.details, '\n')) {
      absl::StrAppend(&out, Wrap(line, 0), "\n");
    }
  }
  absl::StrAppend(&out, "\nUsage: ", path, doc->second.usage.empty() ? "" : " ", doc->second.usage,
                  "\n");
  std::string arguments, flags;
  for (const CLI::Option* option : app->get_options()) {
    if (IsHelpOrVersion(*app, option)) continue;
    if (option->get_positional()) {
      absl::StrAppend(&arguments, Row(option->get_name(true), option->get_description()));
    } else {
      absl::StrAppend(&flags, Row(FlagSyntax(*option), option->get_description()));
    }
  }
  if (!arguments.empty()) absl::StrAppend(&out, "\nArguments:\n", arguments);
  if (!flags.empty()) absl::StrAppend(&out, "\nFlags:\n", flags);
  std::vector<std::string> global_names;
  for (const CLI::Option* option : root_->get_options()) {
    if (!IsHelpOrVersion(*root_, option)) global_names.push_back(FlagSyntax(*option));
  }
  absl::StrAppend(&out, "\nGlobal flags (see `tessera --help`):\n  ",
                  Wrap(absl::StrJoin(global_names, " "), 2), "\n");
  if (!doc->second.examples.empty()) {
    absl::StrAppend(&out, "\nExamples:\n");
    for (const std::string& example : doc->second.examples) {
      absl::StrAppend(&out, "  ", example, "\n");
    }
  }
  return out;
}

std::string CommandTree::RootHelp() const {
  std::string out = absl::StrCat(root_->get_description(), "\n\nUsage: ", kProgram,
                                 " [GLOBAL FLAGS] COMMAND [ARGS] [FLAGS]\n");
  // Commands by section, groups expanded to their commands.
  std::map<std::string, std::string> rows;
  std::vector<std::pair<const CLI::App*, std::string>> pending;
  for (const CLI::App* child : Children(root_.get())) {
    auto section = sections_.find(child);
    pending.emplace_back(child, section == sections_.end() ? "Other" : section->second);
  }
  for (size_t i = 0; i < pending.size(); ++i) {
    const auto [app, section] = pending[i];
    auto doc = docs_.find(app);
    if (doc == docs_.end()) {
      std::vector<std::pair<const CLI::App*, std::string>> children;
      for (const CLI::App* child : Children(app)) children.emplace_back(child, section);
      pending.insert(pending.begin() + static_cast<std::ptrdiff_t>(i) + 1, children.begin(),
                     children.end());
      continue;
    }
    const std::string synopsis = Synopsis(doc->second.usage);
    absl::StrAppend(&rows[section],
                    Row(absl::StrCat(CommandPath(app), synopsis.empty() ? "" : " ", synopsis),
                        app->get_description()));
  }
  std::vector<std::string> order = section_order_;
  std::stable_partition(order.begin(), order.end(),
                        [](const std::string& section) { return section != "Other"; });
  for (const std::string& section : order) {
    if (rows.count(section)) absl::StrAppend(&out, "\n", section, ":\n", rows[section]);
  }
  absl::StrAppend(&out, "\nGlobal flags (before or after the command):\n");
  for (const CLI::Option* option : root_->get_options()) {
    absl::StrAppend(&out, Row(FlagSyntax(*option), option->get_description()));
  }
  absl::StrAppend(
      &out, "\n",
      Wrap(absl::StrCat("Sizes (--memory, --max_region_bytes, --chunk): ", kSizeSyntax, "."), 0),
      "\n",
      Wrap("Files: - means stdin or stdout (tensor put -, tensor get H -o -, kernel define "
           "--file -, --token_file=-).",
           0),
      "\n",
      Wrap("The token comes from --token, --token_file or $TESSERA_TOKEN; the address from "
           "--addr or $TESSERA_ADDR.",
           0),
      "\n"
      "\nExit status:\n"
      "  0  success\n"
      "  1  the server refused the request, a job failed, or the output could not be written\n"
      "  2  usage error: unknown command or flag, a flag the command does not take, a bad\n"
      "     value, a missing argument or required flag, an unreadable input (nothing was sent)\n"
      "  3  could not reach the server: connection refused, unknown host, TLS handshake\n"
      "     failure, or no connection before the deadline\n"
      "\nRun `tessera COMMAND --help` (or `tessera help COMMAND`) for a command's flags and "
      "examples.\n");
  return out;
}

std::string CommandTree::BashCompletion() const {
  // One case per command path: its subcommands, or its flags plus the global flags.
  std::vector<std::string> globals;
  for (const CLI::Option* option : root_->get_options()) {
    if (IsHelpOrVersion(*root_, option)) continue;
    for (const std::string& l : option->get_lnames()) globals.push_back(absl::StrCat("--", l));
  }
  std::string cases;
  std::vector<const CLI::App*> pending = {root_.get()};
  while (!pending.empty()) {
    const CLI::App* app = pending.front();
    pending.erase(pending.begin());
    std::vector<std::string> words;
    const std::string path = CommandPath(app);
    const bool leaf = docs_.count(app) != 0;
    for (const CLI::App* child : Children(app)) {
      words.push_back(child->get_name());
      pending.push_back(child);
    }
    if (leaf) {
      for (const CLI::Option* option : app->get_options()) {
        if (option->get_positional()) continue;
        for (const std::string& l : option->get_lnames()) words.push_back(absl::StrCat("--", l));
        for (const std::string& s : option->get_snames()) words.push_back(absl::StrCat("-", s));
      }
      words.insert(words.end(), globals.begin(), globals.end());
      absl::StrAppend(&cases, "    \"", path, "\"|\"", path, " \"*) words=\"",
                      absl::StrJoin(words, " "), "\" ;;\n");
    } else {
      if (app == root_.get()) {
        words.insert(words.end(), globals.begin(), globals.end());
        words.push_back("--help");
        words.push_back("--version");
      }
      absl::StrAppend(&cases, "    \"", path, "\") words=\"", absl::StrJoin(words, " "), "\" ;;\n");
    }
  }
  return absl::StrCat(
      "# bash completion for tessera (`source <(tessera completion bash)`)\n"
      "_tessera() {\n"
      "  local cur=${COMP_WORDS[COMP_CWORD]} path=\"\" words=\"\" i w\n"
      "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
      "    w=${COMP_WORDS[i]}\n"
      "    [[ $w == -* ]] || path=\"${path:+$path }$w\"\n"
      "  done\n"
      "  case \"$path\" in\n",
      cases,
      "    *) words=\"\" ;;\n"
      "  esac\n"
      "  COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n"
      "}\n"
      "complete -o default -F _tessera tessera\n");
}

}  // namespace tessera::cli
