#ifndef TESSERA_TESTS_BENCH_ECHO_SERVER_H_
#define TESSERA_TESTS_BENCH_ECHO_SERVER_H_

namespace tessera::bench {

/// Runs the transport baseline (tests/bench/echo.proto) on an ephemeral 127.0.0.1 port with
/// gRPC's default settings, like tessera-server; prints "echo server listening on
/// 127.0.0.1:PORT" and serves until SIGTERM or SIGINT. Returns the exit code.
int EchoServerMain();

}  // namespace tessera::bench

#endif  // TESSERA_TESTS_BENCH_ECHO_SERVER_H_
