// SPDX-License-Identifier: Apache-2.0
// The pieces cdp-loadgen's subcommands share (loadgen/main.cc dispatches;
// `cluster` is in loadgen/cluster_cli.cc, `wanem` in loadgen/wanem.cc).
//
// Thread safety: called from main's thread.
#pragma once

#include <string>

#include <boost/program_options.hpp>

#include "common/base/status.h"
#include "common/daemon/config.h"

namespace cdp::loadgen {

// Parses the options of one subcommand (argv[0] is its name) into *out;
// returns -1 to continue, else the exit code (0 after --help or --version
// answered, 2 for bad options, with the message on stderr).
int Load(int argc, char** argv, const boost::program_options::options_description& desc, const std::string& summary,
         LoadedConfig* out);
// "cdp-loadgen CMD: <status>" on stderr; returns 1.
int Fail(const char* cmd, const Status& s);

// `cdp-loadgen cluster` (docs/loadgen.md).
int CmdCluster(int argc, char** argv);

}  // namespace cdp::loadgen
