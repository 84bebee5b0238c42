// SPDX-License-Identifier: Apache-2.0
#include "process-server/ps_config.h"

#include <catch2/catch.hpp>

namespace {

// The key tests below are about other keys: they run with tls = off unless
// their text sets tls itself (the TLS keys have their own test case).
std::string ClearUnlessTls(std::string_view text) {
  std::string t(text);
  if (t.find("tls") == std::string::npos) t = "tls = off\n" + t;
  return t;
}

cdp::Result<cdp::ps::ProcessServerOptions> Load(std::string_view text, std::vector<const char*> flags = {}) {
  std::vector<const char*> argv{"cdp-process-server"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto loaded = cdp::LoadConfigText(int(argv.size()), argv.data(), cdp::ps::ProcessServerConfigDescription(), ClearUnlessTls(text),
                                    "ps.conf");
  if (!loaded.ok()) return loaded.status();
  return cdp::ps::OptionsFromConfig(loaded->vars);
}

}  // namespace

TEST_CASE("process server config: every key, flags override the file", "[config]") {
  auto o = Load(
      "listen = 10.0.0.1:7401\n"
      "control = 127.0.0.1:9111\n"
      "mt = mt.example.net:7500\n"
      "tenant = acme:s3cret-acme-0123456789\n"
      "tenant = beta:s3cret-beta-0123456789\n"
      "spool_dir = /srv/spool\n"
      "quota = 10GiB\n"
      "segment_size = 32MiB\n"
      "codec = lz4\n"
      "volume_codec = acme/db1=zstd:6\n"
      "frame_size = 2MiB\n"
      "inflight = 16\n"
      "connections = 4\n"
      "compress_threads = 8\n"
      "throttle_mbps = 100\n"
      "throttle_schedule = 20@08:00-18:00\n"
      "throttle_utc_offset = 60\n"
      "max_connections = 1000\n"
      "max_connections_per_peer = 8\n",
      {"--inflight", "4"});
  REQUIRE(o.ok());
  CHECK(o->connection_caps.total == 1000);
  CHECK(o->connection_caps.per_peer == 8);
  CHECK(o->listen.host == "10.0.0.1");
  CHECK(o->listen.port == 7401);
  CHECK(o->control.port == 9111);
  CHECK(o->mt.host == "mt.example.net");
  CHECK(o->tenants.size() == 2);
  CHECK(o->tenants.at("beta") == "s3cret-beta-0123456789");
  CHECK(o->spool_dir == "/srv/spool");
  CHECK(o->quota_bytes == (10ull << 30));
  CHECK(o->segment_bytes == (32u << 20));
  CHECK(o->codec == cdp::proto::Codec::kLz4);
  CHECK(o->volume_codecs.at("acme/db1").first == cdp::proto::Codec::kZstd);
  CHECK(o->volume_codecs.at("acme/db1").second == 6);
  CHECK(o->mt_link.frame_bytes == (2u << 20));
  CHECK(o->mt_link.max_inflight == 4);
  CHECK(o->connections == 4);
  CHECK(o->compress_threads == 8);
  CHECK(o->throttle.default_mbps == 100);
  REQUIRE(o->throttle.schedule.size() == 1);
  CHECK(o->throttle.schedule[0].mbps == 20);
  CHECK(o->throttle.utc_offset_minutes == 60);
}

TEST_CASE("process server config: bad values name the key", "[config]") {
  auto msg = [](std::string_view text) {
    auto o = Load(text);
    REQUIRE(!o.ok());
    CHECK(o.status().code() == cdp::Code::kInvalidArgument);
    return o.status().message();
  };
  CHECK(msg("tenant = a:b-0123456789abcdef\nlisten = nohost\n").find("listen") != std::string::npos);
  CHECK(msg("tenant = a:b-0123456789abcdef\nmt = h:99999\n").find("mt") != std::string::npos);
  CHECK(msg("tenant = a:b-0123456789abcdef\ncodec = gzip\n").find("codec") != std::string::npos);
  CHECK(msg("tenant = a:b-0123456789abcdef\nvolume_codec = db1=zstd\n").find("volume_codec") != std::string::npos);
  CHECK(msg("tenant = a:b-0123456789abcdef\nthrottle_schedule = 20@8-18\n").find("schedule") != std::string::npos);
  CHECK(msg("tenant = ../x:b\n").find("tenant") != std::string::npos);
  CHECK(msg("tenant = a:b\n").find("tenant 'a': the secret is under 128 bits") == 0);
  CHECK(msg("tenant = a:change-me-to-a-long-random-secret\n").find("placeholder") != std::string::npos);
  CHECK(msg("listen = 0.0.0.0:7400\n").find("tenant") != std::string::npos);
  CHECK(msg("tenant = a:b-0123456789abcdef\nprot = 1\n").find("prot") != std::string::npos);
  CHECK(msg("tenant = a:b-0123456789abcdef\nmax_connections = 0\n") == "'max_connections' must be 1..65536");
  CHECK(msg("tenant = a:b-0123456789abcdef\nmax_connections_per_peer = 70000\n") == "'max_connections_per_peer' must be 1..65536");
  CHECK(msg("tenant = a:b-0123456789abcdef\ncontrol = none\nmt = h:0\n").find("mt") != std::string::npos);
  // A throttle under the floor would stall shipping: refused at start as at the control API.
  CHECK(msg("tenant = a:b-0123456789abcdef\nthrottle_mbps = 0.000001\n") ==
        "'throttle_mbps'/'throttle_schedule': throttle rate: 1e-06 Mbit/s is outside 0 (unlimited) or 0.5..1e+06");
  CHECK(msg("tenant = a:b-0123456789abcdef\nthrottle_schedule = 0.1@08:00-18:00\n") ==
        "'throttle_mbps'/'throttle_schedule': schedule window 08:00-18:00: 0.1 Mbit/s is outside 0 (unlimited) or "
        "0.5..1e+06");
  CHECK(msg("tenant = a:b-0123456789abcdef\ncontrol_auth = none\n") == "bad value 'none' for 'control_auth' (token | off)");
  CHECK(msg("tenant = a:b-0123456789abcdef\nvolume_inflight = a/db=0\n") == "'volume_inflight' in 'a/db=0' must be 1..1024");
  CHECK(msg("tenant = a:b-0123456789abcdef\nvolume_inflight = db=4\n") ==
        "bad volume 'db' for 'volume_inflight' (want TENANT/VOLUME)");
}

TEST_CASE("process server config: volume_inflight sets one volume's window (LoRS threads)", "[config]") {
  auto o = Load("tenant = a:b-0123456789abcdef\ninflight = 8\nvolume_inflight = a/db=32\nvolume_inflight = a/logs=2\n");
  REQUIRE(o.ok());
  CHECK(o->mt_link.max_inflight == 8);
  CHECK(o->volume_inflight.at("a/db") == 32);
  CHECK(o->volume_inflight.at("a/logs") == 2);
  CHECK(o->volume_inflight.size() == 2);
  // Default: 32 frames (of 1 MiB) per volume, enough to keep a master target
  // that acknowledges after an fdatasync busy on a fast link.
  auto d = Load("tenant = a:b-0123456789abcdef\n");
  REQUIRE(d.ok());
  CHECK(d->mt_link.max_inflight == 32);
  CHECK(d->mt_link.frame_bytes == (1u << 20));
}

TEST_CASE("process server config: TLS is on by default and needs its three files", "[config][tls]") {
  auto missing = Load("tls = on\ntenant = acme:s3cret-0123456789\n");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message() == "'tls_ca' is required with tls = on");
  auto o = Load("tenant = acme:s3cret-0123456789\ntls_ca = /etc/opencdp/ca.crt\ntls_cert = /etc/opencdp/ps.crt\ntls_key = /etc/opencdp/ps.key\n");
  REQUIRE(o.ok());
  CHECK(o->tls.enabled);
  CHECK(o->tls.key == "/etc/opencdp/ps.key");
}

TEST_CASE("process server config: the link.* keys set the MT link, the older frame_size and inflight too, never both",
          "[config]") {
  auto o = Load("tenant = a:b-0123456789abcdef\nlink.frame_size = 2MiB\nlink.inflight = 8\nlink.heartbeat = 3s\nlink.dead_peer = 20s\n"
                "link.connect_timeout = 1500ms\nlink.backoff_max = 5s\n");
  REQUIRE(o.ok());
  CHECK(o->mt_link.frame_bytes == 2u << 20);
  CHECK(o->mt_link.max_inflight == 8);
  CHECK(o->mt_link.heartbeat_ms == 3000);
  CHECK(o->mt_link.dead_peer_ms == 20000);
  CHECK(o->mt_link.connect_timeout_ms == 1500);
  CHECK(o->mt_link.backoff_max_ms == 5000);
  auto old = Load("tenant = a:b-0123456789abcdef\nframe_size = 512KiB\ninflight = 3\n");
  REQUIRE(old.ok());
  CHECK(old->mt_link.frame_bytes == 512u << 10);
  CHECK(old->mt_link.max_inflight == 3);
  // Not given: the defaults (PsLinkDefaults).
  auto none = Load("tenant = a:b-0123456789abcdef\n");
  REQUIRE(none.ok());
  CHECK(none->mt_link.frame_bytes == cdp::ps::PsLinkDefaults().frame_bytes);
  CHECK(none->mt_link.dead_peer_ms == cdp::ps::PsLinkDefaults().dead_peer_ms);
  auto msg = [](std::string_view text) { return Load(text).status().message(); };
  CHECK(msg("tenant = a:b-0123456789abcdef\ninflight = 4\nlink.inflight = 8\n") ==
        "'link.inflight' and 'inflight' are the same setting: give one");
  CHECK(msg("tenant = a:b-0123456789abcdef\nframe_size = 2KiB\n") == "'frame_size' must be 4KiB..32MiB");
  CHECK(msg("tenant = a:b-0123456789abcdef\nlink.frame_size = 64MiB\n") == "'link.frame_size' must be 4KiB..32MiB");
  CHECK(msg("tenant = a:b-0123456789abcdef\nlink.inflight = 0\n") == "'link.inflight' must be 1..1024");
  CHECK(msg("tenant = a:b-0123456789abcdef\nlink.heartbeat = 30s\nlink.dead_peer = 20s\n") ==
        "'link.dead_peer' must be longer than 'link.heartbeat'");
}
