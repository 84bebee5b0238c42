// SPDX-License-Identifier: Apache-2.0
#include "common/daemon/config.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/base/log.h"
#include "common/daemon/daemon.h"
#include "common/env/env.h"

namespace cdp {
namespace {

po::options_description AgentOptions() {
  po::options_description d("Agent options");
  d.add_options()("port", po::value<int>()->default_value(9100), "control port")(
      "name", po::value<std::string>(), "agent name")("cache", po::value<ByteSize>()->default_value(ByteSize{1 << 20}),
                                                      "cache size")(
      "rpo", po::value<Duration>(), "RPO target")("log.level", po::value<std::string>(), "log level")(
      "verbose", po::bool_switch(), "verbose")("peer", po::value<std::vector<std::string>>()->composing(), "peers");
  return d;
}

// argv from a list; argv[0] is the program.
struct Argv {
  explicit Argv(std::vector<std::string> args) : strings(std::move(args)) {
    strings.insert(strings.begin(), "cdp-agent");
    for (auto& s : strings) ptrs.push_back(s.c_str());
  }
  int argc() const { return int(ptrs.size()); }
  const char* const* argv() const { return ptrs.data(); }
  std::vector<std::string> strings;
  std::vector<const char*> ptrs;
};

Result<LoadedConfig> LoadText(std::vector<std::string> args, std::string_view text) {
  Argv a(std::move(args));
  return LoadConfigText(a.argc(), a.argv(), AgentOptions(), text, "/etc/cdp/agent.conf");
}

TEST_CASE("file values, sections and defaults are loaded", "[config]") {
  auto r = LoadText({}, "# comment\n; other comment\nname = \"edge-1\"\n\n[log]\nlevel = debug\ncache = 64MiB\n");
  // "cache" is inside [log], so it is log.cache: unknown.
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kInvalidArgument);
  CHECK(r.status().message() == "unknown key 'log.cache' in /etc/cdp/agent.conf:7");

  auto ok = LoadText({}, "name = \"edge-1\"\ncache = 64MiB\nrpo=15m\nverbose = true\npeer = a\npeer = b\n[log]\nlevel = debug\n");
  REQUIRE(ok.ok());
  const auto& vm = ok->vars;
  CHECK(vm["name"].as<std::string>() == "edge-1");
  CHECK(vm["cache"].as<ByteSize>().bytes == 64ULL << 20);
  CHECK(vm["rpo"].as<Duration>().micros == 15ULL * 60 * 1000000);
  CHECK(vm["log.level"].as<std::string>() == "debug");
  CHECK(vm["verbose"].as<bool>());
  CHECK(vm["port"].as<int>() == 9100);  // default
  CHECK(vm["peer"].as<std::vector<std::string>>() == std::vector<std::string>{"a", "b"});
  CHECK(ok->config_path == "/etc/cdp/agent.conf");
  CHECK_FALSE(ok->help);
}

TEST_CASE("an unknown key in the file is an error naming key, file and line", "[config]") {
  auto r = LoadText({}, "port = 9100\nprot = 9101\n");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kInvalidArgument);
  CHECK(r.status().message() == "unknown key 'prot' in /etc/cdp/agent.conf:2");
  // "config" and "help" are flags only.
  auto c = LoadText({}, "config = /x\n");
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message() == "unknown key 'config' in /etc/cdp/agent.conf:1");
}

TEST_CASE("an unknown flag is an error naming the flag", "[config]") {
  auto r = LoadText({"--prot", "1"}, "");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kInvalidArgument);
  CHECK(r.status().message() == "unknown option '--prot'");
  auto p = LoadText({"extra"}, "");
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message() == "unexpected argument 'extra'");
}

TEST_CASE("flags override the file", "[config]") {
  auto r = LoadText({"--port", "9200", "--log.level=warn"}, "port = 9101\nname = a\n[log]\nlevel = debug\n");
  REQUIRE(r.ok());
  CHECK(r->vars["port"].as<int>() == 9200);
  CHECK(r->vars["log.level"].as<std::string>() == "warn");
  CHECK(r->vars["name"].as<std::string>() == "a");  // from the file
}

// Regression (fuzz.config): Boost's error message substitution looped forever
// on a value holding its own placeholder.
TEST_CASE("a bad value holding a Boost message placeholder is refused at once", "[config]") {
  for (const char* v : {"%value%", "1%value%x", "%canonical_option%", "%original_token%", "%prefix_option%"}) {
    INFO(v);
    auto r = LoadText({}, std::string("port = ") + v + "\n");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().rfind(std::string("bad value '") + v + "' for 'port' in /etc/cdp/agent.conf:1: ", 0) == 0);
    auto f = LoadText({"--port", v}, "");
    REQUIRE_FALSE(f.ok());
  }
}

// Found by fuzz/mt_tenants (issue 38): an ambiguous option whose token held
// a placeholder made Boost's what() loop forever, so a daemon started with
// such an argument hung, growing, instead of exiting 2.
TEST_CASE("a command line argument holding a Boost message placeholder is refused at once", "[config]") {
  for (const char* arg : {"--p=%original_token%", "--p%canonical_option%", "--p=%value%", "--pe%prefix_option%x"}) {
    INFO(arg);
    auto r = LoadText({arg}, "");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kInvalidArgument);
    const std::string& m = r.status().message();
    INFO(m);
    CHECK((m.rfind("command line: ", 0) == 0 || m.rfind("unknown option ", 0) == 0));
  }
}

TEST_CASE("bad values are named with key and file", "[config]") {
  auto r = LoadText({}, "name = x\nport = abc\n");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kInvalidArgument);
  CHECK(r.status().message().rfind("bad value 'abc' for 'port' in /etc/cdp/agent.conf:2: ", 0) == 0);

  auto s = LoadText({}, "cache = 12XB\n");
  REQUIRE_FALSE(s.ok());
  CHECK(s.status().message().rfind("bad value '12XB' for 'cache' in /etc/cdp/agent.conf:1: ", 0) == 0);
  CHECK(s.status().message().find("unknown unit 'XB'") != std::string::npos);

  auto d = LoadText({}, "rpo = 5\n");
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().message().rfind("bad value '5' for 'rpo' in /etc/cdp/agent.conf:1: ", 0) == 0);

  auto f = LoadText({"--port", "x9"}, "");
  REQUIRE_FALSE(f.ok());
  CHECK(f.status().message().rfind("bad value 'x9' for '--port': ", 0) == 0);
}

TEST_CASE("malformed lines and duplicate keys are rejected", "[config]") {
  auto r = LoadText({}, "port 9100\n");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "expected 'key = value' in /etc/cdp/agent.conf:1, got 'port 9100'");
  auto d = LoadText({}, "port = 1\n\nport = 2\n");
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().message() == "key 'port' set twice in /etc/cdp/agent.conf (lines 1 and 3)");
  auto s = LoadText({}, "[log\n");
  REQUIRE_FALSE(s.ok());
  CHECK(s.status().message() == "malformed section header in /etc/cdp/agent.conf:1");
}

TEST_CASE("the --config file is read through the Env, and a missing one is an error", "[config]") {
  auto env = NewMemEnv();
  std::string text = "port = 9300\n[log]\nlevel = error\n";
  REQUIRE(env->CreateDirs("/etc/cdp").ok());
  REQUIRE(WriteFileAtomic(env.get(), "/etc/cdp/ps.conf",
                          ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()))
              .ok());
  ConfigOptions opts;
  opts.env = env.get();
  {
    Argv a({"--config", "/etc/cdp/ps.conf", "--name", "ps1"});
    auto r = LoadConfig(a.argc(), a.argv(), AgentOptions(), opts);
    REQUIRE(r.ok());
    CHECK(r->vars["port"].as<int>() == 9300);
    CHECK(r->vars["log.level"].as<std::string>() == "error");
    CHECK(r->vars["name"].as<std::string>() == "ps1");
    CHECK(r->config_path == "/etc/cdp/ps.conf");
  }
  {
    Argv a({"--config", "/etc/cdp/missing.conf"});
    auto r = LoadConfig(a.argc(), a.argv(), AgentOptions(), opts);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("config file /etc/cdp/missing.conf") == 0);
  }
  {
    // A missing default file is fine; a present one is read.
    opts.default_config_path = "/etc/cdp/none.conf";
    Argv a({});
    auto r = LoadConfig(a.argc(), a.argv(), AgentOptions(), opts);
    REQUIRE(r.ok());
    CHECK(r->config_path.empty());
    opts.default_config_path = "/etc/cdp/ps.conf";
    auto r2 = LoadConfig(a.argc(), a.argv(), AgentOptions(), opts);
    REQUIRE(r2.ok());
    CHECK(r2->vars["port"].as<int>() == 9300);
  }
}

TEST_CASE("--help returns the option list", "[config]") {
  ConfigOptions opts;
  opts.program = "cdp-agent";
  opts.summary = "OpenCDP agent";
  Argv a({"--help"});
  auto r = LoadConfigText(a.argc(), a.argv(), AgentOptions(), "", "x.conf", opts);
  REQUIRE(r.ok());
  CHECK(r->help);
  CHECK(r->help_text.rfind("Usage: cdp-agent [options]\nOpenCDP agent\n", 0) == 0);
  for (const char* opt : {"--port", "--cache", "--rpo", "--log.level", "--config", "--help"}) {
    CHECK(r->help_text.find(opt) != std::string::npos);
  }
}

TEST_CASE("missing required option is named", "[config]") {
  po::options_description d;
  d.add_options()("volume", po::value<std::string>()->required(), "volume");
  Argv a({});
  auto r = LoadConfigText(a.argc(), a.argv(), d, "", "x.conf");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("volume") != std::string::npos);
}

TEST_CASE("sizes parse", "[config]") {
  struct Case {
    const char* text;
    uint64_t bytes;
  };
  for (const Case& c : {Case{"0", 0}, Case{"512", 512}, Case{"512B", 512}, Case{"4K", 4096}, Case{"4k", 4096},
                        Case{"4KiB", 4096}, Case{"4KB", 4000}, Case{"64MiB", 64ULL << 20}, Case{"64 MiB", 64ULL << 20},
                        Case{"10MB", 10000000}, Case{"1G", 1ULL << 30}, Case{"1.5G", 3ULL << 29},
                        Case{"2T", 2ULL << 40}, Case{"1P", 1ULL << 50}, Case{"0.5K", 512},
                        Case{"16383P", 16383ULL << 50}}) {
    INFO(c.text);
    auto r = ParseByteSize(c.text);
    REQUIRE(r.ok());
    CHECK(r->bytes == c.bytes);
  }
  for (const char* bad : {"", "K", "-1", "1X", "1 GiBs", "16384P", "99999999999999999999", "1..5M", "1e3"}) {
    INFO(bad);
    auto r = ParseByteSize(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kInvalidArgument);
  }
  CHECK(FormatByteSize(ByteSize{64ULL << 20}) == "64MiB");
  CHECK(FormatByteSize(ByteSize{1000}) == "1000B");
  CHECK(FormatByteSize(ByteSize{0}) == "0B");
  for (uint64_t v : {0ULL, 1ULL, 1000ULL, 4096ULL, 3ULL << 29, 12345678901ULL}) {
    CHECK(ParseByteSize(FormatByteSize(ByteSize{v}))->bytes == v);
  }
}

TEST_CASE("durations parse", "[config]") {
  struct Case {
    const char* text;
    uint64_t micros;
  };
  for (const Case& c : {Case{"5s", 5000000}, Case{"15m", 900000000}, Case{"250ms", 250000}, Case{"10us", 10},
                        Case{"2h", 7200000000ULL}, Case{"1d", 86400000000ULL}, Case{"1h30m", 5400000000ULL},
                        Case{"1.5s", 1500000}, Case{"0s", 0}, Case{" 3s ", 3000000}}) {
    INFO(c.text);
    auto r = ParseDuration(c.text);
    REQUIRE(r.ok());
    CHECK(r->micros == c.micros);
  }
  for (const char* bad : {"", "5", "s", "5x", "5 s", "1h30", "-5s", "999999999999999d"}) {
    INFO(bad);
    auto r = ParseDuration(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kInvalidArgument);
  }
  CHECK(FormatDuration(Duration{5400000000ULL}) == "1h30m");
  CHECK(FormatDuration(Duration{1500000}) == "1s500ms");
  CHECK(FormatDuration(Duration{0}) == "0s");
  for (uint64_t v : {0ULL, 1ULL, 1500000ULL, 5400000000ULL, 86400000000ULL + 7}) {
    CHECK(ParseDuration(FormatDuration(Duration{v}))->micros == v);
  }
}

TEST_CASE("log levels parse and Where formats volume, peer and sequence", "[log]") {
  CHECK(*log::ParseLevel("debug") == spdlog::level::debug);
  CHECK(*log::ParseLevel("warning") == spdlog::level::warn);
  CHECK_FALSE(log::ParseLevel("loud").ok());
  CHECK(log::ToString(log::Where{"db1", "10.0.0.2:7400", 42}) == "vol=db1 peer=10.0.0.2:7400 seq=42");
  CHECK(log::ToString(log::Where{"db1", "", 0}) == "vol=db1");
  CHECK(fmt::format("{} acked", log::Where{"", "p:1", 7}) == "peer=p:1 seq=7 acked");
  auto a = log::Get("config-test");
  CHECK(a == log::Get("config-test"));
  CHECK(a->name() == "config-test");
  log::Options o;
  o.level = "error";
  REQUIRE(log::Init(o).ok());
  CHECK(a->level() == spdlog::level::err);
  CHECK(log::Get("config-test-2")->level() == spdlog::level::err);
  o.level = "loud";
  CHECK(log::Init(o).code() == Code::kInvalidArgument);
  o.level = "info";
  REQUIRE(log::Init(o).ok());
}

}  // namespace
}  // namespace cdp

// Found by fuzz/mt_tenants (issue 38): a CR between the name and the
// separator made the separator part of the secret ("acme \r= s" gave the
// secret "= s"); a CR is white space there as at the ends.
TEST_CASE("tenant entries: every spelling gives the same name and secret, a CR included", "[config][tenants]") {
  for (const char* line : {"acme:s3cret", "acme = s3cret", "acme s3cret", "acme \r= s3cret", "acme\r:s3cret\r",
                           " acme\t=\ts3cret "}) {
    INFO(line);
    auto e = cdp::ParseTenantEntry(line);
    REQUIRE(e.ok());
    CHECK(e->first == "acme");
    CHECK(e->second == "s3cret");
  }
  for (const char* bad : {"acme", "acme =", "acme \r=\r", "bad/name:s", ":s3cret"}) {
    INFO(bad);
    auto e = cdp::ParseTenantEntry(bad);
    REQUIRE_FALSE(e.ok());
    CHECK(e.status().code() == cdp::Code::kInvalidArgument);
    CHECK(e.status().message().find("s3cret") == std::string::npos);  // the secret is never echoed
  }
}

// Issue 40 ("Files"): the shipped placeholder, or a secret under 128 bits,
// is refused at start with the reason, never echoing the secret.
TEST_CASE("secrets: the placeholder and anything under 128 bits are refused", "[config][tenants]") {
  CHECK(cdp::CheckSecretStrength("9f0c2a51e7d84b36a1c05e9d7f3b2864", "tenant 'acme'").ok());  // 32 hex digits
  CHECK(cdp::CheckSecretStrength("correct horse battery", "tenant 'acme'").ok());            // 21 bytes
  auto placeholder = cdp::CheckSecretStrength("change-me-to-a-long-random-secret", "tenant 'acme'");
  CHECK(placeholder.code() == cdp::Code::kInvalidArgument);
  CHECK(placeholder.message().find("tenant 'acme': the secret is the example's placeholder") == 0);
  auto short_text = cdp::CheckSecretStrength("s3cret-acme", "tenant 'acme'");
  CHECK(short_text.code() == cdp::Code::kInvalidArgument);
  CHECK(short_text.message().find("under 128 bits (11 bytes; 16 at least)") != std::string::npos);
  CHECK(short_text.message().find("s3cret") == std::string::npos);
  auto short_hex = cdp::CheckSecretStrength("0123456789abcdef0123", "tenant 'acme'");  // 80 bits in hex
  CHECK(short_hex.code() == cdp::Code::kInvalidArgument);
  CHECK(short_hex.message().find("(20 hex digits; 32 at least)") != std::string::npos);
}
