// SPDX-License-Identifier: Apache-2.0
// The provider dashboard (master-target/dashboard.h) in headless Chromium,
// driven through chromedriver (e2e/webdriver.h), against the real daemons
// over TLS with two tenants (issue 17):
//   - /ui loads with a token and is refused without one (401, "unauthorized");
//   - tenant A's token shows only tenant A's volumes, B's only B's, the admin's both;
//   - the timeline shows exactly the points `cdpctl points` lists;
//   - an export created by clicking on the page is readable with nbdinfo, and
//     removed from the page (GET /v1/exports agrees);
//   - screenshots are saved in <build>/e2e-artifacts/ (paths printed).
#include <catch2/catch.hpp>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/x509.h>

#include <cstdio>

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include "common/base/clock.h"
#include "common/crypto/auth.h"
#include "common/crypto/pki.h"
#include "common/http/http_client.h"
#include "common/net/tls_stream.h"
#include "common/wire/channel.h"
#include "e2e/harness.h"
#include "e2e/webdriver.h"

namespace {

using cdp::e2e::Browser;
using cdp::e2e::Cluster;
using cdp::e2e::ClusterOptions;
using cdp::e2e::WaitFor;
using cdp::e2e::Which;
using cdp::testing::HaveProgram;
using cdp::testing::RunCommand;
namespace json = boost::json;
using namespace std::chrono_literals;

constexpr auto kPageTimeout = 30s;

int HttpStatus(uint16_t port, const std::string& target, const std::string& token) {
  cdp::http::ClientOptions co = cdp::e2e::ControlClient(token);
  auto r = cdp::http::HttpRequest("127.0.0.1", port, "GET", target, "", 10s, co);
  REQUIRE(r.ok());
  return r->status;
}

std::string IssueToken(Cluster& c, const std::string& tenant) {
  auto j = c.CdpctlJson({"--tenant", tenant, "token", "issue"});
  INFO(c.why());
  REQUIRE(j.has_value());
  return std::string(j->at("token").as_string());
}

// Tenant beta's volume "ledger" (4 MiB): a process server of beta, with a
// certificate of the cluster's site, opens it and applies a write, a flush,
// a tag and an anomaly (the agent's ransomware detector: the page shows a
// badge).
void MakeBetaVolume(Cluster& c) {
  const std::string dir = c.pki_dir();
  cdp::pki::IssueOptions io;
  io.identity = cdp::pki::Identity{cdp::pki::CertRole::kProcessServer, "beta", "beta-ps"};
  io.not_before_s = -300;
  io.not_after_s = 86400;
  cdp::Status s = cdp::pki::Issue(dir, io, dir + "/beta-ps.key", dir + "/beta-ps.crt");
  INFO(s.ToString());
  REQUIRE(s.ok());
  auto ctx = cdp::TlsContext::Load(cdp::TlsFiles{dir + "/ca.crt", dir + "/beta-ps.crt", dir + "/beta-ps.key", ""});
  REQUIRE(ctx.ok());
  std::shared_ptr<const cdp::TlsContext> tls = *ctx;
  cdp::StreamWrapper wrap = [tls](std::unique_ptr<cdp::ByteStream> st) {
    return cdp::StartTls(std::move(st), tls, cdp::TlsSide::kClient, 5000ms);
  };
  auto ch = cdp::Connect("127.0.0.1", c.mt_data_port(), 5000ms, {}, wrap);
  REQUIRE(ch.ok());
  s = cdp::ClientHandshake(**ch, cdp::proto::Role::kProcessServer, "beta", "beta-ps", "beta-secret-0123456789", 5000ms);
  INFO(s.ToString());
  REQUIRE(s.ok());
  cdp::proto::VolumeOpen open;
  open.name = "ledger";
  open.size = 4 << 20;
  open.block_size = 4096;
  open.uuid[0] = 42;
  open.generation = 1;
  REQUIRE((*ch)->Send(open).ok());
  auto m = (*ch)->Receive(10000ms);
  REQUIRE(m.ok());
  auto* reply = std::get_if<cdp::proto::VolumeOpenReply>(&*m);
  REQUIRE(reply != nullptr);
  cdp::proto::WriteBatch b;
  b.volume_id = reply->volume_id;
  const uint64_t now = cdp::SystemClock::Get()->WallMicros();
  cdp::proto::Record data;
  data.seq = 1;
  data.offset = 8192;
  data.length = 65536;
  data.kind = cdp::proto::RecordKind::kData;
  data.data.assign(65536, 0xa5);
  data.timestamp_us = now;
  cdp::proto::Record flush;
  flush.seq = 2;
  flush.kind = cdp::proto::RecordKind::kFlush;
  flush.timestamp_us = now;
  cdp::proto::Record tag;
  tag.seq = 3;
  tag.kind = cdp::proto::RecordKind::kTag;
  const std::string name = "beta-eod";
  tag.data.assign(name.begin(), name.end());
  tag.timestamp_us = now;
  cdp::proto::Record anomaly;
  anomaly.seq = 4;
  anomaly.kind = cdp::proto::RecordKind::kAnomaly;
  anomaly.data = cdp::proto::EncodeAnomaly(1, "change rate 40.0 MB/s (baseline 2.0 MB/s), 99% incompressible");
  anomaly.timestamp_us = now;
  b.records = {data, flush, tag, anomaly};
  REQUIRE((*ch)->Send(b).ok());
  m = (*ch)->Receive(10000ms);
  REQUIRE(m.ok());
  auto* ack = std::get_if<cdp::proto::Ack>(&*m);
  REQUIRE(ack != nullptr);
  REQUIRE(ack->durable_seq == 4);
  (*ch)->Close();
}

std::string Str(const json::value& v) { return v.is_string() ? std::string(v.as_string()) : json::serialize(v); }

std::vector<std::string> Strings(const json::value& v) {
  std::vector<std::string> out;
  if (v.is_array())
    for (const auto& x : v.as_array()) out.push_back(Str(x));
  return out;
}

json::value Eval(Browser& b, const std::string& script) {
  auto v = b.Eval(script);
  INFO(script << " -> " << v.status().ToString());
  REQUIRE(v.ok());
  return *v;
}

void Wait(Browser& b, const std::string& script) {
  cdp::Status s = b.WaitUntil(script, kPageTimeout);
  if (!s.ok()) {
    auto page = b.Eval("return location.href + ' [' + document.body.dataset.state + '] ' + "
                       "document.body.innerText.slice(0, 600);");
    INFO("page: " << (page.ok() ? Str(*page) : page.status().ToString()));
    INFO(s.ToString());
    REQUIRE(s.ok());
  }
}

// Clicks like a user; the page redraws every few seconds, so a click that
// found an element just replaced is tried again.
void Click(Browser& b, const std::string& css) {
  cdp::Status last;
  const bool ok = WaitFor(
      [&] {
        last = b.Click(css);
        return last.ok();
      },
      kPageTimeout, 100ms);
  INFO(css << ": " << last.ToString());
  REQUIRE(ok);
}

// Base64 of the SHA-256 of a certificate's SubjectPublicKeyInfo (what
// Chromium's --ignore-certificate-errors-spki-list takes); "" on error.
std::string SpkiSha256(const std::string& cert_path) {
  FILE* f = std::fopen(cert_path.c_str(), "r");
  if (f == nullptr) return "";
  X509* cert = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  if (cert == nullptr) return "";
  unsigned char* der = nullptr;
  const int n = i2d_X509_PUBKEY(X509_get_X509_PUBKEY(cert), &der);
  X509_free(cert);
  if (n <= 0) return "";
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(der, size_t(n), md);
  OPENSSL_free(der);
  unsigned char b64[64];
  const int len = EVP_EncodeBlock(b64, md, sizeof md);
  return std::string(reinterpret_cast<char*>(b64), size_t(len));
}

// Signs out (as the page's button does: the tab's token and the cookie go),
// then in with `token` through a link carrying it in the fragment.
void SignIn(Browser& b, const std::string& base, const std::string& token) {
  Eval(b, "sessionStorage.clear(); return fetch('/ui/logout', {method: 'POST'}).then(r => r.ok);");
  REQUIRE(b.Go(base + "/ui/login#token=" + token).ok());
  Wait(b, "return document.body.dataset.state === 'ready' && location.pathname === '/ui';");
}

std::set<std::string> ShownTenants(Browser& b) {
  auto v = Eval(b, "return [...document.querySelectorAll('section.tenant')].map(s => s.dataset.tenant);");
  auto s = Strings(v);
  return {s.begin(), s.end()};
}

std::set<std::string> ShownVolumes(Browser& b) {
  auto v = Eval(b, "return [...document.querySelectorAll('article.volume')].map(a => a.dataset.volume);");
  auto s = Strings(v);
  return {s.begin(), s.end()};
}

std::string Screenshot(Browser& b, const std::string& name) {
  const std::string dir = std::string(CDP_BINARY_DIR) + "/e2e-artifacts";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name;
  cdp::Status s = b.Screenshot(path);
  INFO(s.ToString());
  REQUIRE(s.ok());
  std::cout << "dashboard screenshot: " << path << std::endl;
  return path;
}

}  // namespace

TEST_CASE("dashboard: two tenants in headless Chromium over HTTPS, token-gated, a session cookie that is not the token, points as cdpctl lists them, exports from the page",
          "[e2e][dashboard]") {
  INFO("needs Debian chromium, chromium-driver and libnbd-bin (scripts/install-deps.sh)");
  REQUIRE(Browser::Available());
  REQUIRE(HaveProgram("nbdinfo"));
  ClusterOptions o;
  o.mt_extra_config = "tenant = beta:beta-secret-0123456789\nlink_mbit = 100\n";
  Cluster c(o);
  INFO(c.why());
  REQUIRE(c.Start());
  const std::string vol = c.options().volume;
  const std::string acme_key = "acme/" + vol;
  std::string w = cdp::e2e::RandomWrites(c.nbd_uri(), c.options().volume_size, 31, 1, 20, 1 << 20, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  REQUIRE(c.Cdpctl({"tag", "before-upgrade"}).exit_code == 0);
  w = cdp::e2e::RandomWrites(c.nbd_uri(), c.options().volume_size, 32, 1, 20, 0, c.dir());
  REQUIRE(w.empty());
  REQUIRE(c.Cdpctl({"tag", "after-upgrade"}).exit_code == 0);
  // A consistency group of the agent's volume (docs/groups.md) with one
  // point made on demand: the page lists it under its tenant.
  std::string agent_id;
  {
    std::ifstream conf(c.Path("etc/agent.conf"));
    for (std::string line; std::getline(conf, line);)
      if (line.rfind("client_id = ", 0) == 0) agent_id = line.substr(12);
  }
  REQUIRE(c.Cdpctl({"--tenant", "acme", "group", "create", "app", "--member", agent_id + ":" + vol, "--interval",
                    "3600000"})
              .exit_code == 0);
  auto gp = c.CdpctlJson({"--tenant", "acme", "group", "point", "app"});
  REQUIRE(gp.has_value());
  const std::string marker(gp->at("marker").as_string());
  // A group coordinated at the master target (its round relayed to the agent
  // by the process server), with one point made on demand.
  REQUIRE(c.Cdpctl({"--tenant", "acme", "group", "create", "across", "--at", "mt", "--member", agent_id + ":" + vol,
                    "--interval", "3600000"})
              .exit_code == 0);
  auto ap = c.CdpctlJson({"--tenant", "acme", "group", "point", "across"});
  REQUIRE(ap.has_value());
  const std::string across_marker(ap->at("marker").as_string());
  REQUIRE(c.WaitDrained());
  MakeBetaVolume(c);
  const std::string acme = IssueToken(c, "acme"), beta = IssueToken(c, "beta");
  const std::string admin = c.token(Which::kMasterTarget);
  const uint16_t port = c.mt_control();
  // The control port speaks HTTPS only (the site PKI; the MT's certificate
  // names 127.0.0.1).
  const std::string base = "https://127.0.0.1:" + std::to_string(port);

  // Without a browser: the page and its script need a token, the sign-in page does not.
  CHECK(HttpStatus(port, "/ui", "") == 401);
  CHECK(HttpStatus(port, "/ui", "not-a-token") == 401);
  CHECK(HttpStatus(port, "/ui/app.js", "") == 401);
  CHECK(HttpStatus(port, "/v1/volumes", "") == 401);
  CHECK(HttpStatus(port, "/ui", admin) == 200);
  CHECK(HttpStatus(port, "/ui/", acme) == 200);
  CHECK(HttpStatus(port, "/ui/app.js", beta) == 200);
  CHECK(HttpStatus(port, "/ui/login", "") == 200);
  auto session = [&](const std::string& token) {
    cdp::http::ClientOptions co = cdp::e2e::ControlClient(token);
    auto r = cdp::http::HttpRequest("127.0.0.1", port, "POST", "/ui/session", "", 10s, co);
    REQUIRE(r.ok());
    return r->status;
  };
  CHECK(session("") == 401);
  CHECK(session("not-a-token") == 401);
  CHECK(session(acme) == 200);
  CHECK(HttpStatus(port, "/ui/login.js", "") == 200);
  CHECK(HttpStatus(port, "/ui/app.css", "") == 200);
  CHECK(HttpStatus(port, "/ui/../status", "") != 200);
  CHECK(HttpStatus(port, "/ui/nothing-here", admin) == 404);

  Browser b;
  const std::string bdir = c.Path("browser");
  std::filesystem::create_directories(bdir);
  // Chromium trusts exactly the MT's key (the site CA is not in its store).
  const std::string spki = SpkiSha256(c.pki_dir() + "/mt.crt");
  REQUIRE(!spki.empty());
  cdp::Status started = b.Start(bdir, 1440, 2000, {"--ignore-certificate-errors-spki-list=" + spki});
  INFO(started.ToString());
  REQUIRE(started.ok());

  // Refused without a token: the 401 page, and a bad token is refused at sign-in.
  REQUIRE(b.Go(base + "/ui").ok());
  Wait(b, "return document.body.dataset.state === 'unauthorized';");
  CHECK(Str(Eval(b, "return document.querySelector('h1').textContent;")) == "Unauthorized");
  REQUIRE(b.Go(base + "/ui/login#token=0123456789abcdef").ok());
  Wait(b, "return document.body.dataset.state === 'unauthorized' && "
          "!document.getElementById('error').classList.contains('hidden');");
  CHECK(Str(Eval(b, "return location.hash;")).empty());  // the token left the address bar

  // Tenant A: only its volume.
  SignIn(b, base, acme);
  CHECK(*b.Url() == base + "/ui");
  // The session cookie is a random id, never the token: __Host-, Secure,
  // HttpOnly, SameSite=Strict, and it expires.
  {
    auto cookies = b.Cookies();
    REQUIRE(cookies.ok());
    INFO(json::serialize(*cookies));
    REQUIRE(cookies->is_array());
    REQUIRE(cookies->as_array().size() == 1);
    const json::object& k = cookies->as_array()[0].as_object();
    CHECK(k.at("name") == "__Host-cdp_session");
    const std::string value(k.at("value").as_string());
    CHECK(value.size() == 64);
    CHECK(value != acme);
    CHECK(value.find(acme) == std::string::npos);
    CHECK(k.at("secure") == true);
    CHECK(k.at("httpOnly") == true);
    CHECK(k.at("sameSite") == "Strict");
    CHECK(k.at("path") == "/");
    CHECK(k.contains("expiry"));
    // The id is no token: the API refuses it as a bearer.
    CHECK(HttpStatus(port, "/v1/volumes", value) == 401);
  }
  CHECK(ShownTenants(b) == std::set<std::string>{"acme"});
  CHECK(ShownVolumes(b) == std::set<std::string>{acme_key});
  CHECK(Str(Eval(b, "return document.body.textContent.includes('ledger') || "
                    "document.body.textContent.includes('beta');")) == "false");
  // The tenant's group: one recoverable point, its marker, nothing partial.
  Wait(b, "return document.querySelector('section.tenant[data-tenant=\"acme\"] tr.group[data-group=\"app\"]') !== null;");
  CHECK(Str(Eval(b, "return document.querySelector('tr.group[data-group=\"app\"]').dataset.points;")) == "1");
  CHECK(Str(Eval(b, "return document.querySelector('tr.group[data-group=\"app\"]').dataset.last;")) == marker);
  CHECK(Str(Eval(b, "return document.querySelector('tr.group[data-group=\"app\"]').dataset.partial;")) == "0");
  CHECK(Str(Eval(b, "return document.querySelector('tr.group[data-group=\"app\"]').dataset.coordinated;")) == "ps");
  Wait(b, "return document.querySelector('tr.group[data-group=\"across\"]') !== null;");
  CHECK(Str(Eval(b, "return document.querySelector('tr.group[data-group=\"across\"]').dataset.coordinated;")) == "mt");
  CHECK(Str(Eval(b, "return document.querySelector('tr.group[data-group=\"across\"]').dataset.points;")) == "1");
  CHECK(Str(Eval(b, "return document.querySelector('tr.group[data-group=\"across\"]').dataset.last;")) == across_marker);
  // State and failover state, as /v1/volumes has them.
  CHECK(Str(Eval(b, "return document.querySelector('article.volume[data-volume=\"" + acme_key +
                        "\"] .badge').dataset.state;")) == "protecting");
  CHECK(Str(Eval(b, "return document.querySelector('article.volume[data-volume=\"" + acme_key +
                        "\"] .failover-state').dataset.failover;")) == "none");
  // Every answer carries the strict CSP.
  const std::string csp = Str(Eval(b, "return fetch('/ui/app.css').then(r => r.headers.get('content-security-policy'));"));
  CHECK(csp.find("script-src 'self'") != std::string::npos);
  CHECK(csp.find("unsafe-inline") == std::string::npos);

  // The volume's use of the link: the bytes its stream put on the wire in the
  // last hour, as /v1/lag has them (drained: nothing more arrives), shown as a
  // share of the configured link.
  {
    const std::string chart = "article.volume[data-volume=\"" + acme_key + "\"] svg.link-use";
    const std::string lag_bytes = Str(Eval(b, "return fetch('/v1/lag?tenant=acme&volume=" + vol +
                                                  "', {headers: {Authorization: 'Bearer " + acme +
                                                  "'}}).then(r => r.json()).then(j => String(j.samples.reduce("
                                                  "(a, s) => a + s.wire_bytes, 0)));"));
    INFO("wire bytes in /v1/lag: " << lag_bytes);
    // Exactly the frame bytes the process server sent for the volume (a clean
    // run: nothing sent twice).
    cdp::http::ClientOptions co = cdp::e2e::ControlClient(c.token(Which::kProcessServer));
    auto m = cdp::http::HttpRequest("127.0.0.1", c.ps_control(), "GET", "/metrics", "", 10s, co);
    REQUIRE(m.ok());
    const std::string series = "\ncdp_ps_bytes_out_total{tenant=\"acme\",volume=\"" + vol + "\"} ";
    const size_t at = m->body.find(series);
    REQUIRE(at != std::string::npos);
    CHECK(std::stod(m->body.substr(at + series.size())) == double(std::stoull(lag_bytes)));
    CHECK(std::stoull(lag_bytes) > 0);
    CHECK(Str(Eval(b, "return document.querySelector('" + chart + "').dataset.wireBytes;")) == lag_bytes);
    CHECK(Str(Eval(b, "return document.querySelector('" + chart + "').dataset.linkMbit;")) == "100");
    CHECK(Str(Eval(b, "return document.querySelector('" + chart + " .link-peak').textContent;")).find("% of 100 Mbit/s") !=
          std::string::npos);
  }
  // The timeline shows exactly the points cdpctl lists (the page redraws
  // every few seconds: wait until they agree).
  std::set<std::string> listed, shown;
  const bool same = WaitFor(
      [&] {
        auto p = c.CdpctlJson({"points", vol});
        if (!p) return false;
        listed.clear();
        for (const auto& x : p->at("points").as_array()) listed.insert(json::serialize(x.at("id")));
        auto v = b.Eval("return [...document.querySelectorAll('article.volume[data-volume=\"" + acme_key +
                        "\"] svg.timeline .point')].map(e => e.dataset.id);");
        if (!v.ok()) return false;
        auto s = Strings(*v);
        shown = {s.begin(), s.end()};
        return !listed.empty() && listed == shown;
      },
      kPageTimeout, 200ms);
  INFO("cdpctl points: " << listed.size() << ", timeline: " << shown.size());
  REQUIRE(same);
  REQUIRE(listed.size() >= 3);  // two tags and the crash-consistent points around them
  const int64_t tag_point = c.TagPointId("before-upgrade");
  REQUIRE(tag_point > 0);
  CHECK(Str(Eval(b, "return document.querySelector('article.volume[data-volume=\"" + acme_key + "\"] .point[data-id=\"" +
                        std::to_string(tag_point) + "\"]').dataset.kind;")) == "tag");

  // Export the tag's point: click its marker on the timeline, then "Export point".
  Click(b, "article.volume[data-volume=\"" + acme_key + "\"] .point[data-id=\"" + std::to_string(tag_point) + "\"]");
  Wait(b, "return document.querySelector('select.point-select[data-volume=\"" + acme_key + "\"]').value === '" +
              std::to_string(tag_point) + "';");
  Click(b, "button.export-btn[data-volume=\"" + acme_key + "\"]");
  Wait(b, "return document.querySelectorAll('article.volume[data-volume=\"" + acme_key + "\"] tr[data-export]').length === 1;");
  const std::string export_name = Str(Eval(
      b, "return document.querySelector('article.volume[data-volume=\"" + acme_key + "\"] tr[data-export]').dataset.export;"));
  INFO("export " << export_name);
  auto exports = cdp::e2e::GetJson(port, "/v1/exports", admin);
  REQUIRE(exports.has_value());
  bool listed_export = false;
  for (const auto& x : exports->at("exports").as_array()) listed_export |= Str(x.at("export")) == export_name;
  CHECK(listed_export);  // cdpctl has no "exports" command: the API it would call
  auto info = RunCommand({"nbdinfo", c.mt_export_uri(export_name)}, 60000);
  INFO(info.output);
  REQUIRE(info.exit_code == 0);
  CHECK(info.output.find(std::to_string(c.options().volume_size)) != std::string::npos);
  Screenshot(b, "dashboard-tenant-acme.png");

  // Removed from the page: gone from the table and from cdpctl exports.
  Click(b, "button.unexport-btn[data-export=\"" + export_name + "\"]");
  Wait(b, "return document.querySelectorAll('tr[data-export]').length === 0;");
  exports = cdp::e2e::GetJson(port, "/v1/exports", admin);
  REQUIRE(exports.has_value());
  CHECK(exports->at("exports").as_array().empty());

  // Tenant B: only its volume.
  SignIn(b, base, beta);
  CHECK(ShownTenants(b) == std::set<std::string>{"beta"});
  CHECK(ShownVolumes(b) == std::set<std::string>{"beta/ledger"});
  CHECK(Str(Eval(b, "return document.querySelectorAll('tr.group').length;")) == "0");  // acme's group is not beta's
  // Its anomaly shows as a badge (and acme's volume has none).
  CHECK(Str(Eval(b, "return document.querySelector('article.volume[data-volume=\"beta/ledger\"] .badge.anomaly')"
                    ".dataset.anomalies;")) == "1");

  // The admin: both tenants; an export of B's volume made from the page.
  SignIn(b, base, admin);
  CHECK(ShownTenants(b) == std::set<std::string>{"acme", "beta"});
  CHECK(ShownVolumes(b) == std::set<std::string>{acme_key, "beta/ledger"});
  Click(b, "button.export-btn[data-volume=\"beta/ledger\"]");
  Wait(b, "return document.querySelectorAll('article.volume[data-volume=\"beta/ledger\"] tr[data-export]').length === 1;");
  Screenshot(b, "dashboard-admin.png");

  // Sign out: back to the sign-in page, and /ui is refused again.
  Click(b, "#signout");
  Wait(b, "return document.body.dataset.state === 'login';");
  REQUIRE(b.Go(base + "/ui").ok());
  Wait(b, "return document.body.dataset.state === 'unauthorized';");
}
