// The `tessera` CLI's commands: each declares its flags, help and examples on the tree and
// runs with a Session.
#ifndef TESSERA_CLIENT_CLI_COMMANDS_H_
#define TESSERA_CLIENT_CLI_COMMANDS_H_

#include "client/cli/command_tree.h"

namespace tessera::cli {

/// tenant register|get|list|update|deregister|rotate-key, server info, mps status|terminate:
/// the TenantAdmin service, with the admin token.
void AddAdminCommands(CommandTree& tree);

/// tensor put|get|ls|rm, run, kernels, kernel define|ls|rm, usage: the Compute service, with
/// a tenant's API key.
void AddComputeCommands(CommandTree& tree);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_COMMANDS_H_
