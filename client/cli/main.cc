// tessera: command-line client for a Tessera server. `tessera --help` lists the commands;
// docs/cli.md is the reference. Exit statuses: client/cli/command_tree.h (ExitCode).
#include <malloc.h>

#include "client/cli/command_tree.h"
#include "client/cli/commands.h"
#include "client/cli/session.h"

int main(int argc, char** argv) {
  using tessera::cli::kExitOk;
  // Transfers send and receive 1 MiB messages; glibc serves those from fresh mmaps and frees
  // them at once, so each paid its page faults again (as in server/main.cc).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
  tessera::cli::CommandTree tree;
  tessera::cli::AddAdminCommands(tree);
  tessera::cli::AddComputeCommands(tree);
  tree.AddHelpCommands();
  const tessera::cli::CommandTree::Parsed parsed = tree.Parse(argc, argv);
  if (parsed.handler == nullptr) return parsed.exit_code;

  tessera::cli::Session session(tree.global(), parsed.command);
  if (parsed.needs_server) {
    if (int connected = session.Connect(); connected != kExitOk) return connected;
  }
  return (*parsed.handler)(session);
}
