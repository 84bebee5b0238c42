// SPDX-License-Identifier: Apache-2.0
// Block status end to end (issue #41; docs/formats/nbd.md, "Structured
// replies"): the agent's tap reports its backing store's holes, and the master
// target's point-in-time export (NBD over TLS with the tenant's certificate)
// reports the point's, so that `nbdinfo --map` and `nbdcopy` see the same
// data at both sites and a restore copies only the data.
#include <sys/stat.h>

#include <catch2/catch.hpp>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <string>
#include <vector>

#include "e2e/harness.h"

namespace {

using cdp::e2e::Cluster;
using cdp::testing::RunCommand;

using cdp::testing::MapEntry;

std::vector<MapEntry> NbdMap(const std::string& uri) {
  std::string out;
  std::vector<MapEntry> v = cdp::testing::NbdMap(uri, &out);
  INFO(uri << "\n" << out);
  REQUIRE(!v.empty());
  return v;
}

// One run of e2e/libnbd_checks.py (python3-libnbd, Debian's python): its JSON.
boost::json::value Libnbd(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/python3", std::string(CDP_SOURCE_DIR) + "/e2e/libnbd_checks.py"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = RunCommand(argv, 60000);
  INFO(args[0] << " " << args[1] << ":\n" << r.output);
  REQUIRE(r.exit_code == 0);
  const size_t nl = r.output.find_last_of('\n', r.output.size() >= 2 ? r.output.size() - 2 : 0);
  const std::string last = nl == std::string::npos ? r.output : r.output.substr(nl + 1);
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(last, ec);
  REQUIRE(!ec);
  return v;
}

// Writes through the tap 1 MiB of 0x5a at 8 MiB and 64 KiB of 0x6b at
// 20 MiB; the rest of the (sparse) volume file stays a hole.
void WriteLayout(Cluster& c) {
  auto w = RunCommand({"qemu-io", "-f", "raw", "-c", "write -P 0x5a 8M 1M", "-c", "write -P 0x6b 20M 64k", "-c",
                       "flush", c.nbd_uri()},
                      30000);
  INFO(w.output);
  REQUIRE(w.exit_code == 0);
}

// Tags `tag`, waits until the master target has it, and exports that point:
// the export's nbds:// URI (TLS, the tenant's certificate).
std::string ExportTag(Cluster& c, const std::string& tag) {
  auto t = c.Cdpctl({"tag", tag});
  INFO(t.output);
  REQUIRE(t.exit_code == 0);
  REQUIRE(c.WaitDrained());
  const int64_t id = c.TagPointId(tag);
  REQUIRE(id >= 0);
  auto e = c.CdpctlJson({"export", c.options().volume + "@" + std::to_string(id)});
  INFO(c.why());
  REQUIRE(e.has_value());
  const std::string uri = c.mt_export_uri(std::string(e->at("export").as_string()));
  REQUIRE(uri.rfind("nbds://", 0) == 0);
  return uri;
}

}  // namespace

TEST_CASE("block status: libnbd sees the tap's and a TLS point-in-time export's holes and data as the image has "
          "them, reads holes as zero hole chunks, and two connections to the tap see each other's flushed writes",
          "[e2e][nbd][block-status]") {
  REQUIRE(cdp::testing::HaveProgram("qemu-io"));
  auto py = RunCommand({"/usr/bin/python3", "-c", "import nbd"}, 30000);
  INFO("python3-libnbd (scripts/install-deps.sh): " << py.output);
  REQUIRE(py.exit_code == 0);
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  const uint64_t size = c.options().volume_size;
  WriteLayout(c);
  // NBD_STATE_HOLE | NBD_STATE_ZERO = 3, data = 0.
  const boost::json::value want = boost::json::parse(
      "[[0, 8388608, 3], [8388608, 1048576, 0], [9437184, 11534336, 3], [20971520, 65536, 0], [21037056, " +
      std::to_string(size - (20 << 20) - (64 << 10)) + ", 3]]");
  auto tap = Libnbd({"extents", c.nbd_uri()});
  CHECK(tap.at("size").to_number<uint64_t>() == size);
  CHECK(boost::json::serialize(tap.at("extents")) == boost::json::serialize(want));

  const std::string uri = ExportTag(c, "lib");
  auto pit = Libnbd({"extents", uri});
  CHECK(boost::json::serialize(pit.at("extents")) == boost::json::serialize(want));

  // A structured READ of [7 MiB, 10 MiB): hole, data, hole (LIBNBD_READ_HOLE
  // = 2, LIBNBD_READ_DATA = 1), the holes' bytes zero.
  for (const std::string& u : {c.nbd_uri(), uri}) {
    auto r = Libnbd({"read", u, std::to_string(7 << 20), std::to_string(3 << 20)});
    CHECK(boost::json::serialize(r.at("chunks")) == "[[2,7340032,1048576],[1,8388608,1048576],[2,9437184,1048576]]");
    CHECK(r.at("hole_bytes_zero").as_bool());
    CHECK(r.at("data_hex_prefix").as_string() == "5a5a5a5a5a5a5a5a");
  }
  // A read wholly in a hole is zeros.
  REQUIRE(size >= (21u << 20));
  auto z = Libnbd({"read", uri, std::to_string(20 << 20 | 128 << 10), "65536"});
  CHECK(boost::json::serialize(z.at("chunks")) == "[[2,21102592,65536]]");
  CHECK(z.at("all_zero").as_bool());

  // Multi-conn: the tap says so on both connections, and a write flushed on
  // one is read on the other.
  auto m = Libnbd({"multiconn", c.nbd_uri(), std::to_string(30 << 20)});
  CHECK(boost::json::serialize(m.at("can_multi_conn")) == "[true,true]");
  CHECK(m.at("seen_after_flush").as_bool());
}

TEST_CASE("block status: the tap and the point-in-time export over TLS map the same holes and data, and nbdcopy "
          "restores only the data",
          "[e2e][nbd][block-status]") {
  REQUIRE(cdp::testing::HaveProgram("nbdinfo"));
  REQUIRE(cdp::testing::HaveProgram("qemu-io"));
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  const uint64_t size = c.options().volume_size;
  WriteLayout(c);
  const std::vector<MapEntry> want = {{0, 8 << 20, 3},
                                      {8 << 20, 1 << 20, 0},
                                      {9 << 20, 11 << 20, 3},
                                      {20 << 20, 64 << 10, 0},
                                      {(20 << 20) + (64 << 10), size - (20 << 20) - (64 << 10), 3}};
  CHECK(NbdMap(c.nbd_uri()) == want);

  const std::string uri = ExportTag(c, "bs");
  CHECK(NbdMap(uri) == want);

  const std::string out = c.Path("restored.img");
  auto cp = RunCommand({"nbdcopy", uri, out}, 60000);
  INFO(cp.output);
  REQUIRE(cp.exit_code == 0);
  // (The agent's backing file is source.img: the tap is copied elsewhere.)
  auto same = RunCommand({"nbdcopy", c.nbd_uri(), c.Path("tap-copy.img")}, 60000);
  REQUIRE(same.exit_code == 0);
  auto cmp = RunCommand({"cmp", out, c.Path("tap-copy.img")});
  INFO(cmp.output);
  CHECK(cmp.exit_code == 0);
  struct stat st {};
  REQUIRE(::stat(out.c_str(), &st) == 0);
  INFO("allocated " << uint64_t(st.st_blocks) * 512);
  CHECK(uint64_t(st.st_blocks) * 512 <= (2u << 20));  // 1 MiB + 64 KiB of data, and rounding

  // qemu-img convert of the export over TLS (qemu takes the certificates as
  // an object, not in the URI): the same bytes, as sparse.
  const std::string q = c.Path("qemu-restored.img");
  const size_t host_at = uri.find("://") + 3, port_at = uri.find(':', host_at) + 1, name_at = uri.find('/', port_at),
               query_at = uri.find('?', name_at), dir_at = uri.find("tls-certificates=") + 17;
  REQUIRE(query_at != std::string::npos);
  auto conv = RunCommand({"qemu-img", "convert", "--object",
                          "tls-creds-x509,id=tls0,endpoint=client,dir=" + uri.substr(dir_at), "--image-opts",
                          "driver=nbd,server.type=inet,server.host=" + uri.substr(host_at, port_at - 1 - host_at) +
                              ",server.port=" + uri.substr(port_at, name_at - port_at) +
                              ",export=" + uri.substr(name_at + 1, query_at - name_at - 1) + ",tls-creds=tls0",
                          "-O", "raw", q},
                         60000);
  INFO(conv.output);
  REQUIRE(conv.exit_code == 0);
  auto cmp2 = RunCommand({"cmp", q, c.Path("tap-copy.img")});
  INFO(cmp2.output);
  CHECK(cmp2.exit_code == 0);
  struct stat qs {};
  REQUIRE(::stat(q.c_str(), &qs) == 0);
  INFO("qemu-img allocated " << uint64_t(qs.st_blocks) * 512);
  CHECK(uint64_t(qs.st_blocks) * 512 <= (2u << 20));
}
