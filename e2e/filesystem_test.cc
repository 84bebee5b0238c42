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

#include "e2e/harness.h"

namespace {

using cdp::e2e::Cluster;
using cdp::e2e::ClusterOptions;
using cdp::e2e::Daemon;
using cdp::e2e::WaitFor;
using cdp::testing::CommandResult;
using cdp::testing::HaveProgram;
using cdp::testing::RunCommand;

// Why this machine cannot run the test, or "".
std::string MissingPrerequisite() {
  if (::geteuid() != 0) return "not root (mount, losetup need it)";
  if (::access("/dev/fuse", R_OK | W_OK) != 0) return "/dev/fuse missing (no FUSE in this kernel/container)";
  if (::access("/dev/loop-control", R_OK | W_OK) != 0) return "/dev/loop-control missing (no loop devices)";
  for (const char* p : {"nbdfuse", "nbdkit", "losetup", "mkfs.ext4", "e2fsck", "mount", "umount", "nbdcopy"}) {
    if (!HaveProgram(p)) return std::string(p) + " not installed";
  }
  return "";
}

// Undoes, in reverse order, every mount / loop device / nbdfuse started, even
// when a REQUIRE fails half-way. Declared after the Cluster, so it runs first.
class Attachments {
 public:
  ~Attachments() {
    for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) (*it)();
  }
  void Push(std::function<void()> f) { undo_.push_back(std::move(f)); }
  // Runs and forgets the last `n` undo steps (the orderly detach).
  void Pop(size_t n = 1) {
    while (n-- && !undo_.empty()) {
      undo_.back()();
      undo_.pop_back();
    }
  }

 private:
  std::vector<std::function<void()>> undo_;
};

// nbdfuse at `mnt`/disk of `source` (a URI, or nbdfuse's other modes such as
// --command ...), then a loop device over it. Returns the loop device path
// ("" + `why` on failure). Three undo steps are pushed.
std::string Attach(const std::vector<std::string>& source, const std::string& mnt, bool read_only, uint64_t size,
                   const std::string& log, Attachments* at, std::string* why) {
  RunCommand({"mkdir", "-p", mnt});
  auto fuse = std::make_shared<Daemon>();
  std::vector<std::string> argv = {"nbdfuse"};
  if (read_only) argv.push_back("-r");
  argv.push_back(mnt + "/disk");
  argv.insert(argv.end(), source.begin(), source.end());
  std::string nbdfuse = RunCommand({"sh", "-c", "command -v nbdfuse"}).output;
  while (!nbdfuse.empty() && nbdfuse.back() == '\n') nbdfuse.pop_back();
  argv[0] = nbdfuse;
  if (!fuse->Start(argv, log)) {
    *why = "cannot start nbdfuse";
    return "";
  }
  at->Push([fuse, mnt] {
    // nbdfuse exits once unmounted, after flushing and disconnecting.
    RunCommand({"umount", mnt}, 30000);
    if (!WaitFor([&] { return !fuse->Running(); }, std::chrono::seconds(20))) {
      RunCommand({"umount", "-l", mnt}, 30000);
      fuse->Stop(SIGTERM);
    }
  });
  const std::string file = mnt + "/disk";
  bool up = WaitFor(
      [&] {
        struct stat st;
        return !fuse->Running() || (::stat(file.c_str(), &st) == 0 && uint64_t(st.st_size) == size);
      },
      std::chrono::seconds(20));
  if (!up || !fuse->Running()) {
    *why = "nbdfuse did not expose " + file;
    return "";
  }
  std::vector<std::string> lo = {"losetup", "--direct-io=on", "-f", "--show"};
  if (read_only) lo.push_back("-r");
  lo.push_back(file);
  CommandResult r = RunCommand(lo, 30000);
  if (r.exit_code != 0) {
    // Some kernels refuse direct I/O on a FUSE file: fall back to buffered.
    lo.erase(lo.begin() + 1);
    r = RunCommand(lo, 30000);
  }
  if (r.exit_code != 0) {
    *why = "losetup failed: " + r.output;
    return "";
  }
  std::string dev = r.output.substr(0, r.output.find('\n'));
  at->Push([dev] { RunCommand({"losetup", "-d", dev}, 30000); });
  return dev;
}

struct TreeFile {
  std::string path;
  std::string data;
};

// A deterministic tree: nested directories, empty, small and multi-MiB files,
// some compressible, some random.
std::vector<TreeFile> MakeTree(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TreeFile> files;
  for (int d = 0; d < 6; ++d) {
    for (int f = 0; f < 25; ++f) {
      std::string path = "dir" + std::to_string(d) + (f % 3 == 0 ? "/sub" + std::to_string(f % 2) : "") + "/file" +
                         std::to_string(f) + ".bin";
      size_t len = f == 0 ? 0 : (f == 7 ? (2u << 20) + 123 : rng() % (96 << 10));
      std::string data(len, '\0');
      if (f % 2 == 0) {
        for (auto& c : data) c = char(rng());
      } else {
        for (size_t i = 0; i < len; ++i) data[i] = char('a' + (i / 64 + f) % 26);
      }
      files.push_back({path, std::move(data)});
    }
  }
  return files;
}

bool WriteTree(const std::string& root, const std::vector<TreeFile>& files, std::string* why) {
  for (const auto& f : files) {
    std::string full = root + "/" + f.path;
    RunCommand({"mkdir", "-p", full.substr(0, full.rfind('/'))});
    std::ofstream out(full, std::ios::binary);
    out.write(f.data.data(), std::streamsize(f.data.size()));
    if (!out) {
      *why = "cannot write " + full;
      return false;
    }
  }
  return true;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "<missing>";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("ext4 through nbdfuse and a loop device: the tag's export passes e2fsck and holds the files",
          "[e2e][filesystem]") {
  std::string missing = MissingPrerequisite();
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
