// SPDX-License-Identifier: Apache-2.0
// Block status end to end (issue #41; docs/formats/nbd.md, "Structured
// replies"): the agent's tap reports its backing store's holes, and the master
// target's point-in-time export (NBD over TLS with the tenant's certificate)
// reports the point's, so that `nbdinfo --map` and `nbdcopy` see the same
// data at both sites and a restore copies only the data.
#include <sys/stat.h>

#include <catch2/catch.hpp>

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

}  // namespace

TEST_CASE("block status: the tap and the point-in-time export over TLS map the same holes and data, and nbdcopy "
          "restores only the data",
          "[e2e][nbd][block-status]") {
  REQUIRE(cdp::testing::HaveProgram("nbdinfo"));
  REQUIRE(cdp::testing::HaveProgram("qemu-io"));
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  const uint64_t size = c.options().volume_size;
  // 1 MiB at 8 MiB and 64 KiB at 20 MiB through the tap; the rest of the
  // (sparse) volume file stays a hole.
  auto w = RunCommand({"qemu-io", "-f", "raw", "-c", "write -P 0x5a 8M 1M", "-c", "write -P 0x6b 20M 64k", "-c",
                       "flush", c.nbd_uri()},
                      30000);
  INFO(w.output);
  REQUIRE(w.exit_code == 0);
  const std::vector<MapEntry> want = {{0, 8 << 20, 3},
                                      {8 << 20, 1 << 20, 0},
                                      {9 << 20, 11 << 20, 3},
                                      {20 << 20, 64 << 10, 0},
                                      {(20 << 20) + (64 << 10), size - (20 << 20) - (64 << 10), 3}};
  CHECK(NbdMap(c.nbd_uri()) == want);

  auto t = c.Cdpctl({"tag", "bs"});
  INFO(t.output);
  REQUIRE(t.exit_code == 0);
  REQUIRE(c.WaitDrained());
  const int64_t id = c.TagPointId("bs");
  REQUIRE(id >= 0);
  auto e = c.CdpctlJson({"export", c.options().volume + "@" + std::to_string(id)});
  INFO(c.why());
  REQUIRE(e.has_value());
  const std::string uri = c.mt_export_uri(std::string(e->at("export").as_string()));
  CHECK(uri.rfind("nbds://", 0) == 0);
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
}
