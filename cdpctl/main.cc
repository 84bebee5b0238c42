// SPDX-License-Identifier: Apache-2.0
// cdpctl: see cdpctl/cdpctl.h.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "cdpctl/cdpctl.h"

int main(int argc, char** argv) {
  cdp::ctl::Options opts;
  cdp::ctl::TokenFiles tokens;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto endpoint = [&](cdp::ctl::Endpoint* ep) {
      if (i + 1 >= argc || !cdp::ctl::ParseEndpoint(argv[i + 1], ep)) {
        std::cerr << "cdpctl: " << a << " wants HOST:PORT\n";
        std::exit(2);
      }
      ++i;
    };
    if (a == "--agent") endpoint(&opts.agent);
    else if (a == "--ps") endpoint(&opts.ps);
    else if (a == "--mt") endpoint(&opts.mt);
    else if (a == "--json") opts.json = true;
    else if (a == "--token-file" && i + 1 < argc) tokens.all = argv[++i];
    else if (a == "--agent-token-file" && i + 1 < argc) tokens.agent = argv[++i];
    else if (a == "--ps-token-file" && i + 1 < argc) tokens.ps = argv[++i];
    else if (a == "--mt-token-file" && i + 1 < argc) tokens.mt = argv[++i];
    else if (a == "--tenant" && i + 1 < argc) opts.tenant = argv[++i];
    else if (a == "--timeout-ms" && i + 1 < argc) opts.timeout_ms = std::atoi(argv[++i]);
    else if (a == "--tls-ca" && i + 1 < argc) opts.tls_ca = argv[++i];
    else if (a == "--tls-cert" && i + 1 < argc) opts.tls_cert = argv[++i];
    else if (a == "--tls-key" && i + 1 < argc) opts.tls_key = argv[++i];
    else if (a == "-h" || a == "--help" || a == "--version") return cdp::ctl::Run(opts, {a == "-h" ? "--help" : a}, std::cout, std::cerr);
    else args.push_back(a);
  }
  if (opts.tls_ca.empty()) {
    if (const char* ca = std::getenv("CDP_TLS_CA"); ca != nullptr) opts.tls_ca = ca;
  }
  if (opts.tls_cert.empty() != opts.tls_key.empty()) {
    std::cerr << "cdpctl: --tls-cert and --tls-key go together\n";
    return 2;
  }
  if (cdp::Status s = cdp::ctl::ResolveTokens(tokens, &opts); !s.ok()) {
    std::cerr << "cdpctl: control token: " << s.ToString() << "\n";
    return 2;
  }
  return cdp::ctl::Run(opts, args, std::cout, std::cerr);
}
