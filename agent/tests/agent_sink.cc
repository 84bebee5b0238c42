// SPDX-License-Identifier: Apache-2.0
// agent_sink: a BENCHMARK/TEST HARNESS, not shipped. Runs the test peer
// (agent/tests/test_peer.h) as a standalone process so that bench/agent_bench.sh
// can measure the agent with its sender active against a peer that
// acknowledges at once (tenant "bench", secret "bench-secret-of-the-agent-sink").
//
//   agent_sink VOLUME_SIZE_BYTES     prints "port N", runs until SIGINT/SIGTERM
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "agent/tests/test_peer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: agent_sink VOLUME_SIZE_BYTES\n");
    return 2;
  }
  uint64_t size = std::strtoull(argv[1], nullptr, 10);
  if (size == 0 || size > (64ull << 30)) {
    std::fprintf(stderr, "agent_sink: size must be 1..64 GiB\n");
    return 2;
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  cdp::agent::testing::TestPeer peer("bench", "bench-secret-of-the-agent-sink", size);
  std::printf("port %u\n", peer.port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  std::printf("durable %llu\n", static_cast<unsigned long long>(peer.durable("vol")));
  return 0;
}
