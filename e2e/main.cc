// SPDX-License-Identifier: Apache-2.0
// The e2e tests' main: Catch2's, with SIGPIPE ignored as every daemon ignores
// it (common/daemon/daemon.h), so a test's relay or client writing to a socket its
// peer closed gets EPIPE and reports it instead of the process dying.
#define CATCH_CONFIG_RUNNER
#include <signal.h>

#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  return Catch::Session().run(argc, argv);
}
