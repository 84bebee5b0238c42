// SPDX-License-Identifier: Apache-2.0
// The one main of every test binary: Catch2's, with SIGPIPE ignored as every
// daemon ignores it (common/daemon/daemon.h). A test's client, relay or TLS
// session writing to a socket its peer closed then gets EPIPE and reports it,
// instead of the whole binary dying (a TLS client's SSL_write has no
// MSG_NOSIGNAL).
#define CATCH_CONFIG_RUNNER
#include <signal.h>

#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  return Catch::Session().run(argc, argv);
}
