#ifndef TESSERA_SERVER_COMMON_SYSTEMD_H_
#define TESSERA_SERVER_COMMON_SYSTEMD_H_

#include <string_view>

namespace tessera {

/// Tells the service manager about the server's state (sd_notify(3)'s protocol: one datagram
/// of "KEY=value" lines to the AF_UNIX socket named by $NOTIFY_SOCKET; a leading '@' names an
/// abstract socket). Does nothing without $NOTIFY_SOCKET (not under systemd's Type=notify);
/// never fails the caller. `state` e.g. "READY=1\nSTATUS=serving on 0.0.0.0:50051".
void NotifyServiceManager(std::string_view state);

}  // namespace tessera

#endif  // TESSERA_SERVER_COMMON_SYSTEMD_H_
