// SPDX-License-Identifier: Apache-2.0
// A real filesystem on the protected volume: nbdfuse exposes the agent's NBD
// export as a file, losetup makes it a block device, mkfs.ext4 + mount + a
// tree of files + unmount, then a tag. The export of that tag, attached the
// same way, must pass `e2fsck -n` and hold exactly the files written
// (invariants 2 and 4 with a real client stack, not only raw writes).
//
// Needs root, /dev/fuse, loop devices, nbdfuse, losetup, mkfs.ext4, e2fsck;
// where one is missing the test says which and passes without running (there
// is no way to try a kernel feature that is not there).
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "e2e/fs_util.h"
#include "e2e/harness.h"

namespace {

using cdp::e2e::Cluster;
using cdp::e2e::ClusterOptions;
using cdp::e2e::Daemon;
using cdp::e2e::WaitFor;
using cdp::testing::CommandResult;
using cdp::testing::HaveProgram;
using cdp::testing::RunCommand;
using cdp::e2e::Attach;
using cdp::e2e::Attachments;
using cdp::e2e::MakeTree;
using cdp::e2e::MissingFsPrerequisite;
using cdp::e2e::ReadAll;
using cdp::e2e::TreeFile;
using cdp::e2e::WriteTree;

}  // namespace

TEST_CASE("ext4 through nbdfuse and a loop device: the tag's export passes e2fsck and holds the files",
          "[e2e][filesystem]") {
  std::string missing = MissingFsPrerequisite();
  if (!missing.empty()) {
    WARN("skipped: " << missing);
    return;
  }
  ClusterOptions co;
  co.volume_size = 64ull << 20;
  Cluster c(co);
  INFO(c.why());
  REQUIRE(c.Start());
  std::string why;
  const auto tree = MakeTree(7);
  {
    Attachments at;
    std::string dev = Attach({c.nbd_uri()}, c.Path("fuse-src"), false, co.volume_size, c.Path("nbdfuse-src.log"), &at, &why);
    INFO(why);
    REQUIRE(!dev.empty());
    CommandResult mk = RunCommand({"mkfs.ext4", "-q", "-F", "-E", "nodiscard", dev}, 120000);
    INFO(mk.output);
    REQUIRE(mk.exit_code == 0);
    const std::string fs = c.Path("fs-src");
    RunCommand({"mkdir", "-p", fs});
    CommandResult m = RunCommand({"mount", dev, fs}, 30000);
    INFO(m.output);
    REQUIRE(m.exit_code == 0);
    at.Push([fs] { RunCommand({"umount", fs}, 60000); });
    REQUIRE(WriteTree(fs, tree, &why));
    // Orderly detach: unmount ext4 (writes everything back), free the loop
    // device, unmount nbdfuse (it flushes and disconnects). Only then is every
    // write acknowledged by the agent, so the tag follows all of them.
    at.Pop(3);
  }
  auto t = c.Cdpctl({"tag", "fs-ready"});
  INFO(t.output);
  REQUIRE(t.exit_code == 0);
  bool drained = c.WaitDrained();
  INFO(c.why());
  REQUIRE(drained);
  int64_t id = c.TagPointId("fs-ready");
  REQUIRE(id >= 0);

  auto e = c.CdpctlJson({"export", c.options().volume + "@" + std::to_string(id)});
  INFO(c.why());
  REQUIRE(e.has_value());
  const std::string name(e->at("export").as_string());
  // The export needs NBD TLS with the tenant's certificate; nbdfuse 1.14 reads
  // no local files from a URI, so nbdkit's nbd plugin does the TLS side.
  const std::vector<std::string> source = {"--command",
                                           "nbdkit",
                                           "-s",
                                           "--exit-with-parent",
                                           "nbd",
                                           "hostname=127.0.0.1",
                                           "port=" + std::to_string(c.mt_nbd_port()),
                                           "export=" + name,
                                           "tls=require",
                                           "tls-certificates=" + c.nbd_client_dir()};
  {
    Attachments at;
    at.Push([&] { c.Cdpctl({"unexport", name}); });
    std::string dev = Attach(source, c.Path("fuse-exp"), true, co.volume_size, c.Path("nbdfuse-exp.log"), &at, &why);
    INFO(why);
    REQUIRE(!dev.empty());
    CommandResult fsck = RunCommand({"e2fsck", "-n", "-f", dev}, 120000);
    INFO(fsck.output);
    REQUIRE(fsck.exit_code == 0);
    const std::string fs = c.Path("fs-exp");
    RunCommand({"mkdir", "-p", fs});
    CommandResult m = RunCommand({"mount", "-o", "ro,noload", dev, fs}, 30000);
    INFO(m.output);
    REQUIRE(m.exit_code == 0);
    at.Push([fs] { RunCommand({"umount", fs}, 60000); });
    size_t same = 0;
    for (const auto& f : tree) {
      INFO(f.path);
      std::string got = ReadAll(fs + "/" + f.path);
      CHECK(got.size() == f.data.size());
      if (got == f.data) ++same;
    }
    REQUIRE(same == tree.size());
    // And nothing else: the export holds exactly the tree (plus lost+found).
    CommandResult count = RunCommand({"sh", "-c", "find " + fs + " -type f | wc -l"});
    REQUIRE(std::stoul(count.output) == tree.size());
  }
}
