// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include "common/base/clock.h"
#include "common/env/env.h"
#include "common/nbd/nbd_server.h"
#include "loadgen/churn.h"
#include "loadgen/data.h"
#include "common/nbd/nbd_client.h"

using namespace cdp;
using namespace cdp::loadgen;

namespace {

struct Served {
  std::unique_ptr<Env> env = NewMemEnv();
  std::unique_ptr<NbdServer> server;
  std::string uri;

  explicit Served(uint64_t size, bool read_only = false) {
    FileBlockDevice::Options fo;
    fo.create_size = size;
    auto dev = FileBlockDevice::Open(env.get(), "/vol.img", fo);
    REQUIRE(dev.ok());
    NbdServerOptions o;
    o.tcp = {"127.0.0.1", 0};
    server = std::make_unique<NbdServer>(o);
    REQUIRE(server->AddExport("vol", *dev).ok());
    if (read_only) {
      FileBlockDevice::Options ro;
      ro.read_only = true;
      auto rod = FileBlockDevice::Open(env.get(), "/vol.img", ro);
      REQUIRE(rod.ok());
      REQUIRE(server->AddExport("ro", *rod).ok());
    }
    REQUIRE(server->Start().ok());
    uri = "nbd://127.0.0.1:" + std::to_string(server->port()) + "/vol";
  }
};

}  // namespace

TEST_CASE("NBD URI parsing", "[nbd]") {
  auto u = ParseNbdUri("nbd://host.example:10900/db1");
  REQUIRE(u.ok());
  CHECK(u->host == "host.example");
  CHECK(u->port == 10900);
  CHECK(u->export_name == "db1");
  u = ParseNbdUri("nbd://127.0.0.1/");
  REQUIRE(u.ok());
  CHECK(u->port == 10809);
  CHECK(u->export_name.empty());
  u = ParseNbdUri("nbd://[::1]:7/x");
  REQUIRE(u.ok());
  CHECK(u->host == "::1");
  CHECK(u->port == 7);
  CHECK(ParseNbdUri("http://x/y").status().code() == Code::kInvalidArgument);
  CHECK(ParseNbdUri("nbd://x:0/y").status().code() == Code::kInvalidArgument);
  CHECK(ParseNbdUri("nbd://x:99999/y").status().code() == Code::kInvalidArgument);
  CHECK(ParseNbdUri("nbd://:5/y").status().code() == Code::kInvalidArgument);
}

TEST_CASE("NbdClient writes pipelined requests that the server stores byte for byte", "[nbd]") {
  Served s(4 << 20);
  auto uri = ParseNbdUri(s.uri);
  REQUIRE(uri.ok());
  NbdClientOptions co;
  co.max_inflight = 8;
  auto c = NbdClient::Connect(*uri, co);
  REQUIRE(c.ok());
  CHECK((*c)->size() == (4u << 20));
  CHECK((*c)->can_flush());
  loadgen::DataGenerator gen;
  Bytes image(4 << 20, 0);
  for (int i = 0; i < 100; ++i) {
    uint64_t off = uint64_t(i * 37 % 60) * 65536 + uint64_t(i % 3) * 512;
    Bytes d = gen.Generate(4096 + 512 * size_t(i % 5));
    std::copy(d.begin(), d.end(), image.begin() + long(off));
    REQUIRE((*c)->Write(off, d, i % 10 == 0).ok());
  }
  REQUIRE((*c)->Flush().ok());
  REQUIRE((*c)->Close().ok());
  auto disk = ReadWholeFile(s.env.get(), "/vol.img");
  REQUIRE(disk.ok());
  CHECK(*disk == image);
  CHECK(s.server->ExportStats("vol")->writes == 100);
  CHECK(s.server->ExportStats("vol")->flushes >= 1);
}

TEST_CASE("NbdClient errors: unknown export, write past the end, read-only export, no server", "[nbd]") {
  Served s(1 << 20, true);
  auto base = "nbd://127.0.0.1:" + std::to_string(s.server->port()) + "/";
  auto bad = NbdClient::Connect(*ParseNbdUri(base + "nope"));
  CHECK(bad.status().IsNotFound());
  auto c = NbdClient::Connect(*ParseNbdUri(base + "vol"));
  REQUIRE(c.ok());
  Bytes d(4096, 1);
  CHECK((*c)->Write((1 << 20) - 2048, d).code() == Code::kOutOfRange);
  CHECK((*c)->Write(0, ByteSpan()).code() == Code::kInvalidArgument);
  CHECK((*c)->Close().ok());
  auto ro = NbdClient::Connect(*ParseNbdUri(base + "ro"));
  REQUIRE(ro.ok());
  CHECK((*ro)->Write(0, d).code() == Code::kPermissionDenied);
  uint16_t port = s.server->port();
  s.server->Stop();
  auto gone = NbdClient::Connect(*ParseNbdUri("nbd://127.0.0.1:" + std::to_string(port) + "/vol"));
  CHECK(gone.status().code() == Code::kUnavailable);
}

TEST_CASE("Churn over NBD holds its rate (manual clock) and the data arrives", "[nbd][churn]") {
  Served s(16 << 20);
  auto t = OpenTarget(s.env.get(), s.uri, 0);
  REQUIRE(t.ok());
  ManualClock clock;
  ChurnOptions o;
  o.rate_bytes_per_sec = 8e6;
  o.duration_us = 2'000'000;
  o.pattern = *ParsePattern("random");
  o.io_size = 16384;
  auto r = RunChurn(t->get(), o, &clock, [&](uint64_t us) { clock.Advance(us); });
  REQUIRE(r.ok());
  REQUIRE((*t)->Close().ok());
  CHECK(r->achieved_bytes_per_sec() == Approx(8e6).epsilon(0.05));
  auto st = s.server->ExportStats("vol");
  REQUIRE(st.ok());
  CHECK(st->writes == r->ops);
  CHECK(st->bytes_written == r->bytes);
  CHECK(st->errors == 0);
}
