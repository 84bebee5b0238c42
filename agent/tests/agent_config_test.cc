// SPDX-License-Identifier: Apache-2.0
// The agent's config keys and their translation (agent/agent_config.h).
#include "agent/agent_config.h"

#include <catch2/catch.hpp>

namespace {

// The key tests below are about other keys: they run with tls = off unless
// their text sets tls itself (the TLS keys have their own test case).
std::string ClearUnlessTls(std::string_view text) {
  std::string t(text);
  if (t.find("tls") == std::string::npos) t = "tls = off\n" + t;
  return t;
}

cdp::Result<cdp::agent::AgentOptions> Load(cdp::Env* env, std::string_view text, cdp::log::Options* log = nullptr) {
  const char* argv[] = {"cdp-agent"};
  auto loaded = cdp::LoadConfigText(1, argv, cdp::agent::AgentConfigDescription(), ClearUnlessTls(text), "agent.conf");
  if (!loaded.ok()) return loaded.status();
  return cdp::agent::AgentOptionsFromConfig(loaded->vars, env, log);
}

std::string Error(cdp::Env* env, std::string_view text) {
  auto o = Load(env, text);
  REQUIRE_FALSE(o.ok());
  CHECK(o.status().code() == cdp::Code::kInvalidArgument);
  return o.status().message();
}

TEST_CASE("agent config: keys, addresses, secret file, log", "[config]") {
  auto env = cdp::NewMemEnv();
  std::string secret = "s3cret-0123456789\n";
  REQUIRE(cdp::WriteFileAtomic(env.get(), "/secret", cdp::ByteSpan(reinterpret_cast<const uint8_t*>(secret.data()),
                                                                    secret.size())).ok());
  cdp::log::Options lo;
  auto o = Load(env.get(),
                "volume = db=/dev/vdb\nvolume = logs=/srv/logs.img\nexport_name = db=prod-db\n"
                "nbd_listen = none\nnbd_unix = /run/cdp.sock\nps = [fd00::7]:7401\ntenant = acme\n"
                "secret_file = /secret\nclient_id = host1\ncontrol = 127.0.0.1:0\nregion_size = 64KiB\n"
                "resync_fill_target = 4MiB\nresync_max_rate = 50MiB\nresync_requests = 4\nresync_plan_ahead = 250ms\n"
                "[log]\nlevel = debug\nfile = /var/log/a.log\n",
                &lo);
  REQUIRE(o.ok());
  REQUIRE(o->volumes.size() == 2);
  CHECK(o->volumes[0].name == "db");
  CHECK(o->volumes[0].backing_path == "/dev/vdb");
  CHECK(o->volumes[0].export_name == "prod-db");
  CHECK(o->volumes[1].export_name == "");
  CHECK(o->nbd.tcp.off());
  CHECK(o->nbd.unix_path == "/run/cdp.sock");
  CHECK(o->sender.link.peer.host == "fd00::7");
  CHECK(o->sender.link.peer.port == 7401);
  CHECK(o->sender.link.secret == "s3cret-0123456789");
  CHECK(o->sender.link.client_id == "host1");
  CHECK(o->control.host == "127.0.0.1");
  CHECK(o->control.port == 0);
  CHECK(o->region_size == 65536);
  CHECK(o->sender.resync.fill_target == 4u << 20);
  CHECK(o->sender.resync.fill_max == 32u << 20);  // half the default budget
  CHECK(o->sender.resync.plan_ahead_ms == 250);
  CHECK(o->sender.resync.max_rate == 50u << 20);
  CHECK(o->sender.resync.max_requests == 4);
  CHECK(lo.level == "debug");
  CHECK(lo.file == "/var/log/a.log");
}

TEST_CASE("agent config: every bad value names its key", "[config]") {
  auto env = cdp::NewMemEnv();
  const std::string base = "volume = db=/dev/vdb\ntenant = acme\nsecret = s-0123456789abcdef\n";
  CHECK(Error(env.get(), "tenant = acme\nsecret = s-0123456789abcdef\n") == "no volume configured (volume = NAME=PATH)");
  CHECK(Error(env.get(), base + "ps = 10.0.0.1\n") == "'ps': bad address '10.0.0.1': want host:port");
  CHECK(Error(env.get(), base + "ps = 10.0.0.1:0\n") == "'ps': bad port in '10.0.0.1:0'");
  CHECK(Error(env.get(), base + "nbd_listen = ::1:10809\n") ==
        "'nbd_listen': bad address '::1:10809': write an IPv6 address as [address]:port");
  CHECK(Error(env.get(), base + "control = h:70000\n") == "'control': bad port in 'h:70000'");
  CHECK(Error(env.get(), base + "region_size = 3000\n") == "region_size must be a power of two in 4KiB..1GiB");
  CHECK(Error(env.get(), base + "budget = 16MiB\nresync_fill_target = 9MiB\n") ==
        "resync_fill_target must be 64KiB..budget/2 (8388608 bytes)");
  CHECK(Error(env.get(), base + "resync_requests = 0\n") == "resync_requests must be 1..128");
  CHECK(Error(env.get(), base + "ps_connections = 0\n") == "'ps_connections' must be 1..64, not 0");
  CHECK(Error(env.get(), base + "ps_connections = 65\n") == "'ps_connections' must be 1..64, not 65");
  CHECK(Load(env.get(), base)->ps_connections == 4);
  CHECK(Load(env.get(), base + "ps_connections = 1\n")->ps_connections == 1);
  CHECK(Error(env.get(), "volume = db=/dev/vdb\n") ==
        "tenant and secret (or secret_file) are required unless capture_only = true");
  CHECK(Load(env.get(), base + "secret_file = /missing\n").status().code() == cdp::Code::kNotFound);
  CHECK(Error(env.get(), "volume = db=/dev/vdb\ntenant = acme\nsecret = change-me-to-a-long-random-secret\n")
            .find("tenant 'acme': the secret is the example's placeholder") == 0);
  CHECK(Error(env.get(), "volume = db=/dev/vdb\ntenant = acme\nsecret = s\n").find("under 128 bits") != std::string::npos);
}

TEST_CASE("agent config: the NBD tap is a 0660 Unix socket by default, TCP needs TLS", "[config][nbd]") {
  auto env = cdp::NewMemEnv();
  const std::string base = "volume = db=/dev/vdb\ntenant = acme\nsecret = s-0123456789abcdef\nbitmap_dir = /var/lib/a\n";
  auto o = Load(env.get(), base);
  REQUIRE(o.ok());
  CHECK(o->nbd.tcp.off());
  CHECK(o->nbd.unix_path == "/var/lib/a/nbd.sock");
  CHECK(o->nbd.unix_mode == 0660);
  CHECK(o->nbd.unix_group.empty());
  CHECK(o->nbd.idle_timeout_ms == 600000);
  CHECK(o->nbd.max_connections == 256);
  o = Load(env.get(), base + "nbd_unix = none\nnbd_unix_mode = 0600\nnbd_unix_group = disk\nnbd_idle_timeout = 30s\n");
  REQUIRE(o.ok());
  CHECK(o->nbd.unix_path.empty());
  CHECK(o->nbd.unix_mode == 0600);
  CHECK(o->nbd.unix_group == "disk");
  CHECK(o->nbd.idle_timeout_ms == 30000);
  CHECK(Error(env.get(), base + "nbd_listen = 127.0.0.1:10809\n").find("requires NBD TLS") != std::string::npos);
  CHECK(Error(env.get(), base + "nbd_unix_mode = 0999\n") ==
        "'nbd_unix_mode' must be an octal mode such as 0660, not '0999'");
  CHECK(Error(env.get(), base + "nbd_max_connections = 0\n") == "'nbd_max_connections' must be 1..65536");
}

}  // namespace

TEST_CASE("agent config: TLS is on by default and needs its three files", "[config][tls]") {
  auto env = cdp::NewMemEnv();
  CHECK(Error(env.get(), "volume = v=/dev/sdb\ntenant = acme\nsecret = s-0123456789abcdef\ntls_ca = /ca.crt\n") ==
        "'tls_cert' is required with tls = on");
  auto o = Load(env.get(), "volume = v=/dev/sdb\ntenant = acme\nsecret = s-0123456789abcdef\ntls_ca = /ca.crt\ntls_cert = /a.crt\n"
                           "tls_key = /a.key\n");
  REQUIRE(o.ok());
  CHECK(o->tls.enabled);
  CHECK(o->tls.cert == "/a.crt");
}

TEST_CASE("agent config: control tokens are on by default, off or a file by choice", "[config][control]") {
  auto env = cdp::NewMemEnv();
  auto o = Load(env.get(), "volume = v=/dev/sdb\ntenant = acme\nsecret = s-0123456789abcdef\n");
  REQUIRE(o.ok());
  CHECK(o->control_auth.enabled);
  CHECK(o->control_auth.token_file.empty());  // <bitmap_dir>/control.token
  CHECK_FALSE(o->control_auth.metrics_public);
  auto off = Load(env.get(), "volume = v=/dev/sdb\ntenant = acme\nsecret = s-0123456789abcdef\ncontrol_auth = off\n"
                             "control_token_file = /etc/t\nmetrics_public = true\n");
  REQUIRE(off.ok());
  CHECK_FALSE(off->control_auth.enabled);
  CHECK(off->control_auth.token_file == "/etc/t");
  CHECK(off->control_auth.metrics_public);
  CHECK(Error(env.get(), "volume = v=/dev/sdb\ntenant = acme\nsecret = s-0123456789abcdef\ncontrol_auth = maybe\n") ==
        "bad value 'maybe' for 'control_auth' (token | off)");
}

TEST_CASE("agent config: encryption per volume or for all, and its key file", "[config][sealed]") {
  auto env = cdp::NewMemEnv();
  const std::string base = "volume = db=/dev/vdb\nvolume = logs=/srv/logs.img\nnbd_listen = none\ntenant = acme\n"
                           "secret = s-0123456789abcdef\n";
  auto o = Load(env.get(), base + "encryption = db=on\nkey_file = /etc/opencdp/tenant.key\n");
  REQUIRE(o.ok());
  CHECK(o->volumes[0].encrypted);
  CHECK_FALSE(o->volumes[1].encrypted);
  CHECK(o->key_file == "/etc/opencdp/tenant.key");
  o = Load(env.get(), base + "encryption = on\nencryption = logs=off\nkey_file = /k\n");
  REQUIRE(o.ok());
  CHECK(o->volumes[0].encrypted);
  CHECK_FALSE(o->volumes[1].encrypted);
  o = Load(env.get(), base);
  REQUIRE(o.ok());
  CHECK_FALSE(o->volumes[0].encrypted);
  CHECK(Error(env.get(), base + "encryption = on\n") ==
        "encrypted volumes need key_file (create one with cdpctl keys init)");
  CHECK(Error(env.get(), base + "encryption = db=yes\nkey_file = /k\n") ==
        "encryption must be on, off, NAME=on or NAME=off: 'db=yes'");
  CHECK(Error(env.get(), base + "encryption = web=on\nkey_file = /k\n") ==
        "encryption names volume 'web', which is not configured");
}

TEST_CASE("agent config: frame_size per volume (LoRS bs)", "[config]") {
  auto env = cdp::NewMemEnv();
  const std::string base = "volume = db=/dev/vdb\nvolume = logs=/srv/logs.img\nnbd_listen = none\ntenant = acme\n"
                           "secret = s-0123456789abcdef\n";
  auto o = Load(env.get(), base + "frame_size = db=8MiB\n");
  REQUIRE(o.ok());
  CHECK(o->volumes[0].frame_bytes == 8u << 20);
  CHECK(o->volumes[1].frame_bytes == 0);
  CHECK(Error(env.get(), base + "frame_size = db=1KiB\n") ==
        "frame_size must be NAME=SIZE with SIZE in 4KiB..32MiB: 'db=1KiB'");
  CHECK(Error(env.get(), base + "frame_size = db\n") == "frame_size must be NAME=SIZE with SIZE in 4KiB..32MiB: 'db'");
  CHECK(Error(env.get(), base + "frame_size = web=1MiB\n") == "frame_size names volume 'web', which is not configured");
}

TEST_CASE("agent config: the link.* keys set the link to the process server, batch_bytes and max_inflight too",
          "[config]") {
  auto env = cdp::NewMemEnv();
  const std::string base = "volume = db=/dev/vdb\nnbd_listen = none\ntenant = acme\nsecret = s-0123456789abcdef\n";
  auto o = Load(env.get(), base + "link.frame_size = 1MiB\nlink.inflight = 16\nlink.heartbeat = 2s\n");
  REQUIRE(o.ok());
  CHECK(o->sender.link.frame_bytes == 1u << 20);
  CHECK(o->sender.link.max_inflight == 16);
  CHECK(o->sender.link.heartbeat_ms == 2000);
  auto old = Load(env.get(), base + "batch_bytes = 8MiB\nmax_inflight = 2\n");
  REQUIRE(old.ok());
  CHECK(old->sender.link.frame_bytes == 8u << 20);
  CHECK(old->sender.link.max_inflight == 2);
  auto none = Load(env.get(), base);
  REQUIRE(none.ok());
  CHECK(none->sender.link.frame_bytes == cdp::agent::AgentLinkDefaults().frame_bytes);
  CHECK(none->sender.link.max_inflight == cdp::agent::AgentLinkDefaults().max_inflight);
  CHECK(Error(env.get(), base + "batch_bytes = 8MiB\nlink.frame_size = 1MiB\n") ==
        "'link.frame_size' and 'batch_bytes' are the same setting: give one");
  CHECK(Error(env.get(), base + "max_inflight = 0\n") == "'max_inflight' must be 1..1024");
}
