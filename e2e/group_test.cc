// SPDX-License-Identifier: Apache-2.0
// Group points across two agents (docs/groups.md, issue #43): real daemons,
// TLS, two cdp-agent processes with their own client ids, volumes, backing
// files and taps, shipping through one process server, which coordinates
// the group.
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <atomic>

#include "common/env/env.h"
#include "common/nbd/nbd_client.h"
#include "e2e/fs_util.h"
#include "e2e/harness.h"

namespace {

using namespace cdp::e2e;
namespace json = boost::json;
using std::chrono::milliseconds;
using cdp::e2e::ClusterOptions;

// A second agent beside the cluster's (volume vol1): client id host-b, volume vol2 on its own file, tap, bitmap
// directory and control port; the same tenant, process server and site PKI.
class SecondAgent {
 public:
  // `lines`: config lines of its own, each replacing the cluster agent's line
  // that starts with the same key ("freeze_command = ...").
  bool Start(Cluster& c, std::string* why, const std::vector<std::string>& lines = {}) {
    dir_ = c.Path("agent-b");
    REQUIRE(cdp::DefaultEnv()->CreateDirs(dir_).ok());
    if (!MakeSparseFile(c.Path("source-b.img"), c.options().volume_size)) return *why = "source-b.img", false;
    std::ifstream in(c.Path("etc/agent.conf"));
    std::ostringstream conf;
    std::string line;
    control_ = FreePort();
    while (std::getline(in, line)) {
      if (line.rfind("volume = ", 0) == 0) line = "volume = vol2=" + c.Path("source-b.img");
      else if (line.rfind("nbd_unix = ", 0) == 0) line = "nbd_unix = " + dir_ + "/nbd.sock";
      else if (line.rfind("client_id = ", 0) == 0) first_ = line.substr(12), line = "client_id = host-b";
      else if (line.rfind("bitmap_dir = ", 0) == 0) line = "bitmap_dir = " + dir_;
      else if (line.rfind("control = ", 0) == 0) line = "control = 127.0.0.1:" + std::to_string(control_);
      for (const std::string& own : lines)
        if (line.rfind(own.substr(0, own.find('=') + 1), 0) == 0) line = own;
      conf << line << "\n";
    }
    std::ofstream(c.Path("etc/agent-b.conf")) << conf.str();
    if (!d_.Start({CDP_AGENT_BIN, "--config", c.Path("etc/agent-b.conf")}, c.Path("agent-b.log")))
      return *why = "cdp-agent did not start", false;
    if (!WaitFor([&] { return cdp::DefaultEnv()->Exists(dir_ + "/nbd.sock"); }, milliseconds(30000)))
      return *why = "agent-b's tap did not appear", false;
    return true;
  }
  std::string nbd_uri() const { return "nbd+unix:///vol2?socket=" + dir_ + "/nbd.sock"; }
  // The group's members: the cluster's agent's vol1 and this one's vol2.
  std::vector<std::string> Members() const { return {"--member", first_ + ":vol1", "--member", "host-b:vol2"}; }
  // --member-agent of both agents (cdpctl failback --group).
  std::vector<std::string> MemberAgents(Cluster& c) const {
    return {"--member-agent",
            first_ + "=127.0.0.1:" + std::to_string(c.agent_control()) + "@" + c.token_path(Which::kAgent),
            "--member-agent", "host-b=127.0.0.1:" + std::to_string(control_) + "@" + dir_ + "/control.token"};
  }
  std::string first() const { return first_; }
  Daemon& daemon() { return d_; }

 private:
  Daemon d_;
  std::string dir_;
  uint16_t control_ = 0;
  std::string first_;  // the cluster's agent's client_id
};

// A second process server beside the cluster's, for the same tenant and
// master target: its own certificate (local-ps-b: the master target knows a
// process server by its certificate's name), client_id, ports and spool.
class SecondPs {
 public:
  bool Start(Cluster& c, std::string* why) {
    auto issued = cdp::testing::RunCommand({CDP_CTL_BIN, "pki", "issue", "--dir", c.pki_dir(), "--role", "ps",
                                            "--tenant", "acme", "--name", "local-ps-b", "--out", c.Path("ps-b"),
                                            "--hosts", "localhost,127.0.0.1"});
    if (issued.exit_code != 0) return *why = "pki issue: " + issued.output, false;
    REQUIRE(cdp::DefaultEnv()->CreateDirs(c.Path("ps-b/spool")).ok());
    std::ifstream in(c.Path("etc/process-server.conf"));
    std::ostringstream conf;
    std::string line;
    data_ = FreePort();
    while (std::getline(in, line)) {
      if (line.rfind("listen = ", 0) == 0) line = "listen = 127.0.0.1:" + std::to_string(data_);
      else if (line.rfind("control = ", 0) == 0) line = "control = 127.0.0.1:" + std::to_string(FreePort());
      else if (line.rfind("spool_dir = ", 0) == 0) line = "spool_dir = " + c.Path("ps-b/spool");
      else if (line.rfind("tls_cert = ", 0) == 0) line = "tls_cert = " + c.Path("ps-b.crt");
      else if (line.rfind("tls_key = ", 0) == 0) line = "tls_key = " + c.Path("ps-b.key");
      conf << line << "\n";
      if (line.rfind("tenant = ", 0) == 0) conf << "client_id = ps-b\n";
    }
    std::ofstream(c.Path("etc/process-server-b.conf")) << conf.str();
    if (::chmod(c.Path("etc/process-server-b.conf").c_str(), 0600) != 0) return *why = "chmod", false;
    if (!d_.Start({CDP_PS_BIN, "--config", c.Path("etc/process-server-b.conf")}, c.Path("ps-b.log")))
      return *why = "cdp-process-server did not start", false;
    return true;
  }
  // The agent's line that ships to it.
  std::string AgentLine() const { return "ps = 127.0.0.1:" + std::to_string(data_); }
  Daemon& daemon() { return d_; }

 private:
  Daemon d_;
  uint16_t data_ = 0;
};

std::vector<std::string> Group(std::vector<std::string> args) {
  args.insert(args.begin(), {"--tenant", "acme"});
  return args;
}

std::unique_ptr<cdp::NbdClient> Open(const std::string& text) {
  auto uri = cdp::ParseNbdUri(text);
  REQUIRE(uri.ok());
  cdp::NbdClientOptions no;
  no.max_inflight = 1;  // each write completes before the next is sent
  auto client = cdp::NbdClient::Connect(*uri, no);
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  return std::move(*client);
}

// Writes `n` in every word of block 0 and waits for its completion.
void WriteCounter(cdp::NbdClient& c, uint64_t n) {
  cdp::Bytes b(4096);
  for (size_t w = 0; w < b.size(); w += 8) std::memcpy(b.data() + w, &n, 8);
  cdp::Status s = c.Write(0, cdp::ByteSpan(b.data(), b.size()));
  if (s.ok()) s = c.Drain();
  INFO(s.ToString());
  REQUIRE(s.ok());
}

// The counter in block 0 of `volume` at sequence `seq`, through a
// point-in-time export of the master target.
uint64_t CounterAt(Cluster& c, const std::string& volume, uint64_t seq) {
  auto e = c.CdpctlJson(Group({"export", volume + "@seq:" + std::to_string(seq)}));
  REQUIRE(e.has_value());
  const std::string name(e->at("export").as_string());
  auto client = Open(c.mt_export_uri(name));
  cdp::Bytes b(4096);
  REQUIRE(client->Read(0, 4096, b.data()).ok());
  (void)client->Close();
  REQUIRE(c.Cdpctl({"unexport", name}).exit_code == 0);
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  for (size_t w = 0; w < b.size(); w += 8) REQUIRE(std::memcmp(b.data() + w, &n, 8) == 0);  // not torn
  return n;
}

// Waits (60 s) for a round of group app to be made: until the members'
// initial syncs are done their volumes cannot promise a point.
bool FirstPoint(Cluster& c) {
  std::string last;
  const bool made = WaitFor(
      [&] {
        auto r = c.Cdpctl(Group({"group", "point", "app"}));
        last = r.output;
        return r.exit_code == 0;
      },
      milliseconds(60000), milliseconds(250));
  if (!made) UNSCOPED_INFO("last cdpctl group point: " << last << "\n" << c.Logs());
  return made;
}

// The group of every test: starts the second agent `b` beside the cluster's
// (its own config lines `b_config`), creates group app of both agents'
// volumes with `options` (after "group create app"), and waits for its
// first point.
void GroupUp(Cluster& c, SecondAgent& b, const std::vector<std::string>& options,
             const std::vector<std::string>& b_config = {}) {
  std::string why;
  const bool started = b.Start(c, &why, b_config);
  INFO(why);
  REQUIRE(started);
  std::vector<std::string> create = {"group", "create", "app"};
  create.insert(create.end(), options.begin(), options.end());
  for (const std::string& m : b.Members()) create.push_back(m);
  auto created = c.Cdpctl(Group(create));
  INFO(created.output);
  REQUIRE(created.exit_code == 0);
  REQUIRE(FirstPoint(c));
}

// The group's points held by both members, as cdpctl lists them.
json::array GroupPoints(Cluster& c) {
  auto p = c.CdpctlJson(Group({"group", "points", "app"}));
  REQUIRE(p.has_value());
  return p->at("points").as_array();
}

// Makes a point of group app now and waits (120 s) until the master target
// lists it (every member's marker applied there): its marker.
std::string PointAtTheMasterTarget(Cluster& c) {
  auto made = c.CdpctlJson(Group({"group", "point", "app"}));
  REQUIRE(made.has_value());
  const std::string marker(made->at("marker").as_string());
  REQUIRE(WaitFor(
      [&] {
        for (const auto& p : GroupPoints(c))
          if (p.at("marker").as_string() == marker) return true;
        return false;
      },
      milliseconds(120000), milliseconds(250)));
  return marker;
}

// The writer: A(n) on the cluster's agent, wait for it, then B(n) on host-b,
// for `how_long` while group app makes a point every 250 ms. Then a last
// point, and every point (at most 40, spread evenly, always the last) checked
// through exports of the master target: host-b at n implies vol1 at n or n + 1.
// Returns the last counter written.
uint64_t WriteAndCheckEveryPoint(Cluster& c, SecondAgent& b, milliseconds how_long) {
  auto a = Open(c.nbd_uri());
  auto bw = Open(b.nbd_uri());
  const auto start = std::chrono::steady_clock::now();
  uint64_t n = 0;
  while (std::chrono::steady_clock::now() - start < how_long) {
    ++n;
    WriteCounter(*a, n);
    WriteCounter(*bw, n);
  }
  // A last point after the writer, and every point's markers applied at the MT.
  (void)PointAtTheMasterTarget(c);

  const json::array pts = GroupPoints(c);
  INFO(json::serialize(pts));
  const size_t expected = size_t(how_long.count() / 250 * 5 / 12);  // of the scheduled rounds: a loaded machine abandons some
  REQUIRE(pts.size() >= expected);
  const size_t step = (pts.size() + 39) / 40;
  size_t checked = 0, between = 0;
  for (size_t i = 0; i < pts.size(); ++i) {
    if (i % step != 0 && i + 1 != pts.size()) continue;
    const json::object& seqs = pts[i].at("seqs").as_object();
    const uint64_t ca = CounterAt(c, "vol1", json::value_to<uint64_t>(seqs.at("vol1")));
    const uint64_t cb = CounterAt(c, "vol2", json::value_to<uint64_t>(seqs.at("vol2")));
    INFO("point " << json::serialize(pts[i]) << ": vol1 shows " << ca << ", host-b " << cb);
    // host-b at n means B(n) completed, so A(n) had completed before it: A
    // shows n, or n + 1 when the cut fell between A(n+1) and B(n+1).
    CHECK((ca == cb || ca == cb + 1));
    between += ca == cb + 1 ? 1 : 0;
    ++checked;
  }
  // The last point came after the writer: both show its last counter.
  const json::object& final_seqs = pts.back().at("seqs").as_object();
  CHECK(CounterAt(c, "vol1", json::value_to<uint64_t>(final_seqs.at("vol1"))) == n);
  CHECK(CounterAt(c, "vol2", json::value_to<uint64_t>(final_seqs.at("vol2"))) == n);
  WARN(checked << " of " << pts.size() << " group points checked over " << n << " write pairs, " << between
                 << " fell between A(n+1) and B(n+1)");
  CHECK(checked >= std::min<size_t>(expected, 20));
  return n;
}

// Observations of cdp_agent_group_hold_seconds above `le` at an agent.
uint64_t HeldLongerThan(uint16_t port, const std::string& token, const std::string& le) {
  Answer a = Call(port, "GET", "/metrics", token);
  REQUIRE(a.status == 200);
  uint64_t at_le = 0, all = 0;
  std::istringstream in(a.body);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("cdp_agent_group_hold_seconds_bucket{", 0) != 0) continue;
    const uint64_t v = std::stoull(line.substr(line.rfind(' ') + 1));
    if (line.find("le=\"" + le + "\"") != std::string::npos) at_le = v;
    if (line.find("le=\"+Inf\"") != std::string::npos) all = v;
  }
  return all - at_le;
}

// ext4 made on the tap at `uri` (nbdfuse + loop) and mounted at `dir`; the
// undo steps (umount, loop device, nbdfuse) go to `at`.
void MountNewExt4(Cluster& c, const std::string& vol, const std::string& uri, const std::string& dir,
                  cdp::e2e::Attachments* at) {
  std::string why;
  const std::string dev = cdp::e2e::Attach({uri}, c.Path("fuse-" + vol), false, c.options().volume_size,
                                           c.Path("nbdfuse-" + vol + ".log"), at, &why);
  INFO(why);
  REQUIRE(!dev.empty());
  auto mk = cdp::testing::RunCommand({"mkfs.ext4", "-q", "-F", "-E", "nodiscard", dev}, 120000);
  INFO(mk.output);
  REQUIRE(mk.exit_code == 0);
  cdp::testing::RunCommand({"mkdir", "-p", dir});
  auto m = cdp::testing::RunCommand({"mount", dev, dir}, 30000);
  INFO(m.output);
  REQUIRE(m.exit_code == 0);
  at->Push([dir] { cdp::testing::RunCommand({"umount", dir}, 60000); });
}

// The promoted export of `vol` at the master target (after a failover),
// through nbdkit's nbd plugin with the tenant's certificate: e2fsck -n -f
// must find it clean, then it is mounted read-only; returns the mount point.
std::string MountFailedOver(Cluster& c, const std::string& vol, cdp::e2e::Attachments* at) {
  const std::vector<std::string> source = {"--command", "nbdkit", "-s", "--exit-with-parent", "nbd",
                                           "hostname=127.0.0.1", "port=" + std::to_string(c.mt_nbd_port()),
                                           "export=acme/" + vol + "@failover", "tls=require",
                                           "tls-certificates=" + c.nbd_client_dir()};
  std::string why;
  const std::string dev = cdp::e2e::Attach(source, c.Path("fuse-fo-" + vol), true, c.options().volume_size,
                                           c.Path("nbdfuse-fo-" + vol + ".log"), at, &why);
  INFO(why);
  REQUIRE(!dev.empty());
  auto fsck = cdp::testing::RunCommand({"e2fsck", "-n", "-f", dev}, 120000);
  INFO(fsck.output);
  REQUIRE(fsck.exit_code == 0);
  const std::string mnt = c.Path("fs-fo-" + vol);
  cdp::testing::RunCommand({"mkdir", "-p", mnt});
  auto m = cdp::testing::RunCommand({"mount", "-o", "ro,noload", dev, mnt}, 30000);
  INFO(m.output);
  REQUIRE(m.exit_code == 0);
  at->Push([mnt] { cdp::testing::RunCommand({"umount", mnt}, 60000); });
  return mnt;
}

}  // namespace

TEST_CASE("group points across two agents are causally consistent: a write on host-b implies every write on "
          "the other agent that completed before it",
          "[e2e][groups]") {
  Cluster c;  // TLS, tokens
  INFO(c.why());
  REQUIRE(c.Start());
  SecondAgent b;
  // Until host-b's first sync is done its volume cannot promise a point: rounds are refused.
  GroupUp(c, b, {"--interval", "250"});

  const uint64_t n = WriteAndCheckEveryPoint(c, b, milliseconds(12000));

  // export --group at the latest point (made after the writer stopped, so
  // both members show the writer's last counter), by the point's cut.
  auto ex = c.CdpctlJson(Group({"export", "--group", "app", "--to", "latest"}));
  REQUIRE(ex.has_value());
  INFO(json::serialize(*ex));
  REQUIRE(ex->at("members").as_array().size() == 2);
  for (const auto& mv : ex->at("members").as_array()) {
    const std::string name(mv.at("result").at("export").as_string());
    auto client = Open(c.mt_export_uri(name));
    cdp::Bytes buf(4096);
    REQUIRE(client->Read(0, 4096, buf.data()).ok());
    uint64_t got = 0;
    std::memcpy(&got, buf.data(), 8);
    CHECK(got == n);
    (void)client->Close();
    CHECK(c.Cdpctl({"unexport", name}).exit_code == 0);
  }

  // cdpctl status shows the group and its last point.
  auto st = c.Cdpctl(Group({"status"}));
  INFO(st.output);
  CHECK(st.output.find("app") != std::string::npos);
  CHECK(st.output.find("LAST ROUND ABANDONED") == std::string::npos);
}

TEST_CASE("a member that stops answering or dies: its round is abandoned within group_hold_max and the other "
          "member's writes are never held past the hold timeout",
          "[e2e][groups]") {
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  SecondAgent b;
  GroupUp(c, b, {"--interval", "100", "--hold-max", "50", "--hold-timeout", "200"});
  auto a = Open(c.nbd_uri());
  uint64_t n = 0;
  auto write_for = [&](milliseconds how_long) {
    const auto until = std::chrono::steady_clock::now() + how_long;
    while (std::chrono::steady_clock::now() < until) WriteCounter(*a, ++n);
  };

  // host-b stops answering (SIGSTOP): its GroupHeld never comes.
  REQUIRE(::kill(b.daemon().pid(), SIGSTOP) == 0);
  write_for(milliseconds(1500));
  auto r = c.Cdpctl(Group({"group", "point", "app"}));
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("did not hold within 50 ms") != std::string::npos);
  // kill -9 of the stopped member: its session ends, rounds find it gone.
  REQUIRE(b.daemon().Stop(SIGKILL) != -1);
  REQUIRE(WaitFor(
      [&] {
        auto p = c.Cdpctl(Group({"group", "point", "app"}));
        return p.exit_code == 1 && p.output.find("agent host-b is not connected") != std::string::npos;
      },
      milliseconds(60000), milliseconds(200)));
  write_for(milliseconds(1000));
  auto st = c.Cdpctl(Group({"status"}));
  INFO(st.output);
  CHECK(st.output.find("MEMBER NOT CONNECTED: host-b:vol2") != std::string::npos);
  CHECK(st.output.find("LAST ROUND ABANDONED: agent host-b is not connected") != std::string::npos);

  // The coordinator dies (kill -9 of the PS) while rounds run every 100 ms:
  // whatever hold was on at the cluster's agent ends by itself.
  REQUIRE(c.Kill9(Which::kProcessServer));
  write_for(milliseconds(1000));
  // The group's points come from the master target alone: listed with the
  // protected site's process server gone, as at a disaster.
  auto gp = c.CdpctlJson(Group({"group", "points", "app"}));
  REQUIRE(gp.has_value());
  CHECK(gp->at("points").as_array().size() >= 1);

  // No write at the cluster's agent waited longer than the 200 ms timeout (plus
  // 50 ms for the wake-up on this loaded machine).
  CHECK(HeldLongerThan(c.agent_control(), c.token(Which::kAgent), "0.25") == 0);
  // And the abandoned rounds made no group point.
  REQUIRE(c.Restart(Which::kProcessServer));
}

TEST_CASE("failover --group: every member fails over at the same group point, and ext4 on each passes e2fsck "
          "with its files",
          "[e2e][groups][filesystem]") {
  if (std::string missing = MissingFsPrerequisite(); !missing.empty()) {
    WARN("skipped: " << missing);
    return;
  }
  ClusterOptions co;
  co.volume_size = 64ull << 20;
  Cluster c(co);
  INFO(c.why());
  REQUIRE(c.Start());
  SecondAgent b;
  GroupUp(c, b, {"--interval", "500"});

  // ext4 on each member's tap, a tree of files in each, unmounted again
  // (clean) while the group's points keep coming every 500 ms.
  const std::vector<std::pair<std::string, std::string>> taps = {{"vol1", c.nbd_uri()}, {"vol2", b.nbd_uri()}};
  std::map<std::string, std::vector<cdp::e2e::TreeFile>> trees;
  for (const auto& [vol, uri] : taps) {
    trees[vol] = cdp::e2e::MakeTree(vol == "vol1" ? 11 : 12);
    cdp::e2e::Attachments at;
    const std::string fs = c.Path("fs-" + vol);
    MountNewExt4(c, vol, uri, fs, &at);
    std::string why;
    const bool written = cdp::e2e::WriteTree(fs, trees[vol], &why);
    INFO(why);
    REQUIRE(written);
    at.Pop(3);  // umount, loop device, nbdfuse: the filesystem is clean on the tap
  }
  // A point after both filesystems are clean, and its markers at the MT.
  const std::string marker = PointAtTheMasterTarget(c);

  // By its marker: the schedule may have made newer points meanwhile.
  auto f = c.CdpctlJson(Group({"failover", "--group", "app", "--to", marker}));
  INFO(c.why());
  REQUIRE(f.has_value());
  INFO(json::serialize(*f));
  CHECK(f->at("point").at("marker").as_string() == marker);
  const json::object& seqs = f->at("point").at("seqs").as_object();
  REQUIRE(f->at("members").as_array().size() == 2);
  for (const auto& mv : f->at("members").as_array()) {
    const json::object& m = mv.as_object();
    CHECK(m.at("exit").as_int64() == 0);
    const std::string vol(m.at("volume").as_string());
    // Each member failed over at its own marker's sequence.
    CHECK(m.at("seq") == seqs.at(vol));
    CHECK(m.at("result").at("failover").at("history_seq") == seqs.at(vol));
  }
  for (const auto& [vol, uri] : taps) {
    INFO(vol);
    cdp::e2e::Attachments at;
    const std::string fs = MountFailedOver(c, vol, &at);
    size_t same = 0;
    for (const auto& file : trees[vol]) same += cdp::e2e::ReadAll(fs + "/" + file.path) == file.data ? 1 : 0;
    CHECK(same == trees[vol].size());
  }
}

namespace {

// Generation i of the writer's files on filesystem `fs`: 4 KiB, the first 8
// bytes i, the rest derived from it; it goes to slot i % kSlots, written
// over the slot's file in place with one write() (never truncated).
constexpr uint64_t kSlots = 1000;
std::string WriterFile(int fs, uint64_t i) {
  std::string d(4096, '\0');
  std::memcpy(d.data(), &i, 8);
  for (size_t k = 8; k < d.size(); ++k) d[k] = char((i * 131 + k * 7 + uint64_t(fs) * 17) & 0xff);
  return d;
}

}  // namespace

TEST_CASE("tag --group: every member agent's freeze hook runs, and the tag's point of ext4 mounted and written on "
          "both hosts holds every file written before it, fscks clean, and is the failover target by its name",
          "[e2e][groups][filesystem]") {
  if (std::string missing = MissingFsPrerequisite(); !missing.empty()) {
    WARN("skipped: " << missing);
    return;
  }
  // The mount points, named in the agents' hooks before the cluster exists.
  char tmpl[] = "/tmp/cdp-group-tag-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string top = tmpl;
  cdp::e2e::Attachments scratch;
  scratch.Push([top] { cdp::testing::RunCommand({"rm", "-rf", top}); });
  const std::string fs[2] = {top + "/fs-vol1", top + "/fs-vol2"};
  auto hooks = [&](int k) {
    const std::string log = top + "/hooks-" + std::to_string(k + 1);
    return std::vector<std::string>{"freeze_command = fsfreeze -f " + fs[k] + " && echo froze >> " + log,
                                    "thaw_command = fsfreeze -u " + fs[k] + " && echo thawed >> " + log};
  };
  ClusterOptions co;
  co.volume_size = 64ull << 20;
  for (const std::string& l : hooks(0)) co.agent_extra_config += l + "\n";
  Cluster c(co);
  INFO(c.why());
  REQUIRE(c.Start());
  SecondAgent b;
  GroupUp(c, b, {"--interval", "1000"}, hooks(1));

  // ext4 on each member's tap, mounted, and a writer creating 4 KiB files
  // in both (never an fsync: only the freeze puts the last ones on disk).
  const std::string uris[2] = {c.nbd_uri(), b.nbd_uri()};
  cdp::e2e::Attachments at;
  for (int k = 0; k < 2; ++k) MountNewExt4(c, "vol" + std::to_string(k + 1), uris[k], fs[k], &at);
  // The writer: generation after generation over kSlots files in each
  // filesystem (never an fsync: only a freeze puts the last ones on disk).
  std::vector<std::atomic<uint64_t>> last_done(kSlots);  // per slot: the last generation written + 1
  std::atomic<uint64_t> done{0};
  std::atomic<bool> stop{false}, failed{false};
  std::thread writer([&] {
    for (uint64_t i = 0; !stop; ++i) {
      for (int k = 0; k < 2; ++k) {
        const std::string d = WriterFile(k, i);
        const int fd = ::open((fs[k] + "/f" + std::to_string(i % kSlots)).c_str(), O_CREAT | O_WRONLY, 0644);
        if (fd < 0 || ::pwrite(fd, d.data(), d.size(), 0) != ssize_t(d.size())) failed = true;
        if (fd >= 0) ::close(fd);
      }
      last_done[i % kSlots] = i + 1;
      done = i + 1;
    }
  });
  struct Join {
    std::thread& t;
    std::atomic<bool>& stop;
    ~Join() {
      stop = true;
      if (t.joinable()) t.join();
    }
  } join{writer, stop};
  REQUIRE(WaitFor([&] { return done >= 2 * kSlots; }, milliseconds(60000)));

  // The tag, with the writer going: what each slot held before it was asked.
  std::vector<uint64_t> before(kSlots);
  for (uint64_t j = 0; j < kSlots; ++j) before[j] = last_done[j];
  auto tag = c.Cdpctl(Group({"tag", "--group", "app", "nightly"}));
  INFO(tag.output);
  REQUIRE(tag.exit_code == 0);
  CHECK(tag.output.find(".tag.nightly") != std::string::npos);
  // Both applications were thawed: the writer goes on, and each agent ran
  // its hooks once.
  const uint64_t after = done;
  REQUIRE(WaitFor([&] { return done >= after + kSlots; }, milliseconds(60000)));
  stop = true;
  writer.join();
  REQUIRE_FALSE(failed);
  for (int k = 0; k < 2; ++k) {
    const std::string hooks_log = top + "/hooks-" + std::to_string(k + 1);
    INFO("agent " << k + 1 << "'s hooks: " << cdp::e2e::ReadAll(hooks_log));
    CHECK(WaitFor([&] { return cdp::e2e::ReadAll(hooks_log) == "froze\nthawed\n"; }, milliseconds(30000)));
  }

  // The point at the master target, by its name: application-consistent.
  json::object point;
  REQUIRE(WaitFor(
      [&] {
        for (const auto& p : GroupPoints(c))
          if (p.as_object().contains("tag") && p.at("tag") == "nightly") return point = p.as_object(), true;
        return false;
      },
      milliseconds(120000), milliseconds(250)));
  CHECK(point.at("consistency") == "application");
  auto f = c.CdpctlJson(Group({"failover", "--group", "app", "--to", "nightly"}));
  REQUIRE(f.has_value());
  INFO(json::serialize(*f));
  CHECK(f->at("point").at("marker") == point.at("marker"));
  for (const auto& mv : f->at("members").as_array()) CHECK(mv.at("exit").as_int64() == 0);

  for (int k = 0; k < 2; ++k) {
    const std::string vol = "vol" + std::to_string(k + 1);
    INFO(vol);
    cdp::e2e::Attachments fo;
    // The freeze left the journal empty: clean without a replay.
    const std::string mnt = MountFailedOver(c, vol, &fo);
    // Every slot holds a whole generation no older than the one it held
    // when the tag was asked (a freeze writes everything out; a crash point
    // would miss what sat in the page cache).
    uint64_t newer = 0, bad = 0;
    for (uint64_t j = 0; j < kSlots; ++j) {
      const std::string got = cdp::e2e::ReadAll(mnt + "/f" + std::to_string(j));
      uint64_t g = 0;
      if (got.size() == 4096) std::memcpy(&g, got.data(), 8);
      const bool ok = got.size() == 4096 && g % kSlots == j && got == WriterFile(k, g) && g + 1 >= before[j];
      newer += ok && g + 1 > before[j] ? 1 : 0;
      if (!ok && ++bad <= 3) UNSCOPED_INFO("f" << j << ": " << got.size() << " bytes, generation " << g << ", the slot had "
                                                 << before[j] << " before the tag");
    }
    CHECK(bad == 0);
    WARN(vol << ": every slot at or past its generation before the tag; " << newer << " of " << kSlots
              << " newer (written while the tag was asked)");
  }
}

namespace {

// The whole image behind an NBD URI.
cdp::Bytes ReadImage(const std::string& uri, uint64_t size) {
  auto client = Open(uri);
  cdp::Bytes img(size);
  for (uint64_t off = 0; off < size; off += 1u << 20) REQUIRE(client->Read(off, 1u << 20, img.data() + off).ok());
  (void)client->Close();
  return img;
}

}  // namespace

TEST_CASE("failback --group: the plan names every member with its provider-side writes, and each member's "
          "original volume ends equal to its promoted image, exactly those blocks pulled",
          "[e2e][groups][failback]") {
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  SecondAgent b;
  GroupUp(c, b, {"--interval", "500"});
  // Some data on both members, then a group point after the last write.
  const uint64_t size = c.options().volume_size;
  const std::string taps[2] = {c.nbd_uri(), b.nbd_uri()};
  std::mt19937_64 rng(43);
  for (const std::string& uri : taps) {
    auto w = Open(uri);
    for (int i = 0; i < 200; ++i) {
      cdp::Bytes blk(4096);
      for (auto& x : blk) x = uint8_t(rng());
      REQUIRE(w->Write((rng() % (size / 4096)) * 4096, cdp::ByteSpan(blk.data(), blk.size())).ok());
    }
    REQUIRE(w->Flush().ok());
    (void)w->Close();
  }
  const std::string marker = PointAtTheMasterTarget(c);
  auto f = c.CdpctlJson(Group({"failover", "--group", "app", "--to", marker}));
  REQUIRE(f.has_value());
  for (const auto& mv : f->at("members").as_array()) REQUIRE(mv.at("exit").as_int64() == 0);

  // The application runs at the provider: K distinct blocks written on each
  // member's promoted export.
  constexpr uint64_t kProviderBlocks = 37;
  cdp::Bytes promoted[2];
  for (int k = 0; k < 2; ++k) {
    const std::string vol = "vol" + std::to_string(k + 1);
    const std::string uri = c.mt_export_uri("acme/" + vol + "@failover");
    auto w = Open(uri);
    std::set<uint64_t> blocks;
    while (blocks.size() < kProviderBlocks) blocks.insert(rng() % (size / 4096));
    for (uint64_t blk : blocks) {
      cdp::Bytes d(4096);
      for (auto& x : d) x = uint8_t(rng() | 1);  // never the block it replaces
      REQUIRE(w->Write(blk * 4096, cdp::ByteSpan(d.data(), d.size())).ok());
    }
    REQUIRE(w->Flush().ok());
    (void)w->Close();
    promoted[k] = ReadImage(uri, size);
  }

  // Without an agent's address for every member: refused before anything runs.
  auto partial = c.Cdpctl(Group({"failback", "--group", "app", "--member-agent",
                                 "host-b=127.0.0.1:" + std::to_string(c.agent_control())}));
  CHECK(partial.exit_code == 2);
  CHECK(partial.output.find("give --member-agent AGENT=HOST:PORT[@TOKEN_FILE] for " + b.first()) !=
        std::string::npos);

  std::vector<std::string> fb = {"--json", "failback", "--group", "app"};
  for (const std::string& a : b.MemberAgents(c)) fb.push_back(a);
  auto r = c.CdpctlJson(Group(fb));
  INFO(c.why());
  REQUIRE(r.has_value());
  INFO(json::serialize(*r));
  // The plan: both members, each failed over at its marker's sequence, with
  // exactly the blocks the provider wrote.
  const json::array& plan = r->at("plan").as_array();
  REQUIRE(plan.size() == 2);
  for (const auto& pv : plan) {
    CHECK(pv.at("failover").at("history_seq") == f->at("point").at("seqs").at(pv.at("volume").as_string()));
    CHECK(pv.at("failover").at("provider_written_blocks") == kProviderBlocks);
  }
  const json::array& members = r->at("members").as_array();
  REQUIRE(members.size() == 2);
  for (const auto& mv : members) {
    CHECK(mv.at("exit").as_int64() == 0);
    uint64_t pulled = 0;
    for (const auto& p : mv.at("result").at("passes").as_array()) pulled += json::value_to<uint64_t>(p.at("pulled_blocks"));
    CHECK(pulled == kProviderBlocks);
  }
  // Each original volume now holds its promoted image, byte for byte.
  const std::string sources[2] = {c.source_path(), c.Path("source-b.img")};
  for (int k = 0; k < 2; ++k) {
    INFO("member " << k + 1);
    CHECK(cdp::e2e::ReadAll(sources[k]) == std::string(promoted[k].begin(), promoted[k].end()));
  }
  // Re-running it finishes nothing new and fails nothing: every step is idempotent.
  auto again = c.Cdpctl(Group(std::vector<std::string>(fb.begin() + 1, fb.end())));
  INFO(again.output);
  CHECK(again.exit_code == 0);
  CHECK(again.output.find("every member failed back") != std::string::npos);
}

TEST_CASE("a group across two process servers, coordinated at the master target: every point is causally "
          "consistent, and a process server gone abandons the round",
          "[e2e][groups]") {
  Cluster c;  // TLS, tokens
  INFO(c.why());
  REQUIRE(c.Start());
  SecondPs ps_b;
  std::string why;
  const bool ps_started = ps_b.Start(c, &why);
  INFO(why);
  REQUIRE(ps_started);
  SecondAgent b;  // host-b ships through the second process server
  REQUIRE(b.Start(c, &why, {ps_b.AgentLine()}));
  std::vector<std::string> create = {"group", "create", "app", "--at", "mt", "--interval", "250"};
  for (const std::string& m : b.Members()) create.push_back(m);
  auto created = c.Cdpctl(Group(create));
  INFO(created.output);
  REQUIRE(created.exit_code == 0);
  REQUIRE(created.output.find("created at the master target") != std::string::npos);
  REQUIRE(FirstPoint(c));
  // The process server coordinates nothing: the rounds are the master target's.
  auto at_ps = c.CdpctlJson(Group({"group", "list"}));
  REQUIRE(at_ps.has_value());
  CHECK(at_ps->at("process_server").as_array().empty());
  REQUIRE(at_ps->at("master_target").as_array().size() == 1);

  const uint64_t n = WriteAndCheckEveryPoint(c, b, milliseconds(8000));
  CHECK(n > 0);
  for (const auto& p : GroupPoints(c))
    CHECK(json::value_to<uint64_t>(p.at("round")) >= (uint64_t(1) << 63));  // the master target's rounds

  // cdpctl status shows the group coordinated at the master target.
  auto st = c.Cdpctl(Group({"status"}));
  INFO(st.output);
  CHECK(st.output.find("app") != std::string::npos);

  // The second process server gone: a round is refused at once, nothing is marked.
  REQUIRE(ps_b.daemon().Stop(SIGKILL) != -1);
  std::string last;
  CHECK(WaitFor(
      [&] {
        auto r = c.Cdpctl(Group({"group", "point", "app"}));
        last = r.output;
        return r.exit_code != 0 && r.output.find("peer local-ps-b is not connected") != std::string::npos;
      },
      milliseconds(30000), milliseconds(250)));
  INFO(last);
}
