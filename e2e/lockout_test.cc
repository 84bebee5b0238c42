// SPDX-License-Identifier: Apache-2.0
// No lock-outs and private files, against the real daemons (issue #40, tests
// 4 and 5):
//   4. 300 idle sockets from 9 addresses (127.0.0.2..10) on the MT's data port
//      and on its control port: a restarted process server is connected to
//      the MT within 2 s and replication flows; cdpctl still answers within
//      2 s; a tenant opening exports past max_exports_per_tenant gets a
//      refusal naming the cap;
//   5. with umask 022 the daemons create no file or directory open to group
//      or others; the placeholder secret and a 0644 tls_key are refused at
//      start, with the reason in the daemon's output.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/tests/test_util.h"
#include "e2e/harness.h"

namespace {

using namespace std::chrono_literals;
using cdp::e2e::Cluster;
using cdp::e2e::ClusterOptions;
using cdp::e2e::Which;

// `n` idle TCP connections to 127.0.0.1:port, spread over the source
// addresses 127.0.0.2..127.0.0.10. A connection the server refuses is still
// counted (it was an attempt); the descriptors are the caller's.
std::vector<int> Siege(uint16_t port, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    const std::string src = "127.0.0." + std::to_string(2 + i % 9);
    ::inet_pton(AF_INET, src.c_str(), &from.sin_addr);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) == 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0);
    fds.push_back(fd);
  }
  return fds;
}

// True when some object in `v` has "link": "connected".
bool AnyConnected(const boost::json::value& v) {
  if (v.is_object()) {
    for (const auto& [k, x] : v.as_object()) {
      if (k == "link" && x.is_string() && x.as_string() == "connected") return true;
      if (AnyConnected(x)) return true;
    }
  } else if (v.is_array()) {
    for (const auto& x : v.as_array())
      if (AnyConnected(x)) return true;
  }
  return false;
}

// Every file and directory under `root` (recursively) whose mode lets group
// or others in, as "path mode"; sockets are access points with a mode of
// their own (nbd_unix_mode) and are left out.
void OpenToOthers(const std::string& root, std::vector<std::string>* out) {
  DIR* d = ::opendir(root.c_str());
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string p = root + "/" + name;
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || S_ISSOCK(st.st_mode)) continue;
    if ((st.st_mode & 077) != 0) {
      std::ostringstream m;
      m << p << " " << std::oct << (st.st_mode & 07777);
      out->push_back(m.str());
    }
    if (S_ISDIR(st.st_mode)) OpenToOthers(p, out);
  }
  ::closedir(d);
}

std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Starts the master target by hand with `config` and waits for it to exit;
// returns its output ("" if it did not exit within 30 s).
std::string RefusedAtStart(const cdp::testing::ScratchDir& dir, const std::string& name, const std::string& config) {
  const std::string conf = dir.Join(name + ".conf");
  {
    std::ofstream f(conf);
    f << config;
  }
  cdp::e2e::Daemon d;
  REQUIRE(d.Start({CDP_MT_BIN, "--config", conf}, dir.Join(name + ".log")));
  if (!cdp::e2e::WaitFor([&] { return !d.Running(); }, 30s)) return "";
  return ReadText(dir.Join(name + ".log"));
}

}  // namespace

TEST_CASE("lock-outs: 300 idle sockets from 9 addresses lock out neither a process server nor cdpctl",
          "[e2e][security][lockout]") {
  ClusterOptions o;
  o.mt_extra_config = "max_exports_per_tenant = 2\n";
  Cluster c(o);
  INFO(c.Logs());
  REQUIRE(c.Start());
  const std::string ps_token = c.token(Which::kProcessServer);

  // The process server goes; 300 idle sockets take the MT's data port
  // (256 in all, 32 per address) and 300 its control port.
  REQUIRE(c.Kill9(Which::kProcessServer));
  std::vector<int> data_siege = Siege(c.mt_data_port(), 300);
  std::vector<int> control_siege = Siege(c.mt_control(), 300);

  // A real PS connects within 2 s of its start: the oldest idle socket
  // gives way to it.
  REQUIRE(c.Restart(Which::kProcessServer));
  const auto ps_started = std::chrono::steady_clock::now();
  const bool connected = cdp::e2e::WaitFor(
      [&] {
        auto v = cdp::e2e::GetJson(c.ps_control(), "/v1/volumes", ps_token);
        return v && AnyConnected(*v);
      },
      2s);
  WARN("process server connected after "
       << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - ps_started).count()
       << " ms");
  CHECK(connected);

  // cdpctl answers on the besieged control port within 2 s.
  const auto ctl_start = std::chrono::steady_clock::now();
  auto st = c.Cdpctl({"status"}, 20000);
  const auto ctl_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - ctl_start).count();
  INFO(st.output);
  CHECK(st.exit_code == 0);
  CHECK(ctl_ms < 2000);

  // Replication flows through the restarted PS.
  std::string w = cdp::e2e::RandomWrites(c.nbd_uri(), c.options().volume_size, 40, 1, 20, 0, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  auto t = c.Cdpctl({"tag", "siege"});
  INFO(t.output);
  REQUIRE(t.exit_code == 0);
  const bool drained = c.WaitDrained();
  INFO(c.why());
  CHECK(drained);

  // The tenant's exports past max_exports_per_tenant: a refusal naming the cap.
  const int64_t id = c.TagPointId("siege");
  REQUIRE(id >= 0);
  const std::string point = c.options().volume + "@" + std::to_string(id);
  auto e1 = c.CdpctlJson({"export", point});
  auto e2 = c.CdpctlJson({"export", point});
  REQUIRE(e1.has_value());
  REQUIRE(e2.has_value());
  auto e3 = c.Cdpctl({"export", point});
  INFO(e3.output);
  CHECK(e3.exit_code != 0);
  CHECK(e3.output.find("max_exports_per_tenant") != std::string::npos);
  // One removed: the tenant may export again.
  auto un = c.Cdpctl({"unexport", std::string(e1->as_object().at("export").as_string())});
  INFO(un.output);
  CHECK(un.exit_code == 0);
  CHECK(c.Cdpctl({"export", point}).exit_code == 0);

  for (int fd : data_siege) ::close(fd);
  for (int fd : control_siege) ::close(fd);
}

TEST_CASE("files: with umask 022 the daemons create nothing open to others, and weak secrets and open keys are refused",
          "[e2e][security][files]") {
  const mode_t old_umask = ::umask(022);  // as a daemon started by hand from a shell
  {
    Cluster c;
    INFO(c.Logs());
    REQUIRE(c.Start());
    std::string w = cdp::e2e::RandomWrites(c.nbd_uri(), c.options().volume_size, 50, 1, 20, 1 << 20, c.dir());
    INFO(w);
    REQUIRE(w.empty());
    REQUIRE(c.Cdpctl({"tag", "files"}).exit_code == 0);
    REQUIRE(c.WaitDrained());
    std::vector<std::string> open;
    for (const char* sub : {"mt", "ps", "agent"}) {
      struct stat st {};
      REQUIRE(::stat(c.Path(sub).c_str(), &st) == 0);
      if ((st.st_mode & 077) != 0) open.push_back(c.Path(sub));
      OpenToOthers(c.Path(sub), &open);
    }
    INFO(open.size() << " open to others, first: " << (open.empty() ? "" : open.front()));
    CHECK(open.empty());

    // Refused at start, with the reason: the placeholder secret ...
    cdp::testing::ScratchDir dir;
    const std::string base = "listen = 127.0.0.1:0\ncontrol = none\nnbd = none\ndata_dir = " + dir.Join("data") + "\n";
    std::string out = RefusedAtStart(dir, "placeholder",
                                     base + "tls = off\nnbd_tls = off\ntenant = acme:change-me-to-a-long-random-secret\n");
    INFO(out);
    CHECK(out.find("tenant 'acme': the secret is the example's placeholder") != std::string::npos);
    // ... a secret under 128 bits ...
    out = RefusedAtStart(dir, "short", base + "tls = off\nnbd_tls = off\ntenant = acme:s3cret\n");
    INFO(out);
    CHECK(out.find("under 128 bits") != std::string::npos);
    // ... and a private key that others may read.
    const std::string key = dir.Join("mt.key");
    {
      std::ofstream f(key);
      f << ReadText(c.pki_dir() + "/mt.key");
    }
    REQUIRE(::chmod(key.c_str(), 0644) == 0);
    out = RefusedAtStart(dir, "open-key",
                         base + "tenant = acme:e2e-secret-0123456789\ntls_ca = " + c.pki_dir() + "/ca.crt\ntls_cert = " +
                             c.pki_dir() + "/mt.crt\ntls_key = " + key + "\n");
    INFO(out);
    CHECK(out.find(key + " has mode 0644: tls_key must not be open to group or others") != std::string::npos);
  }
  ::umask(old_umask);
}
