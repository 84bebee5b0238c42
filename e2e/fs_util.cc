// SPDX-License-Identifier: Apache-2.0
#include "e2e/fs_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "e2e/harness.h"

namespace cdp::e2e {

using cdp::testing::CommandResult;
using cdp::testing::HaveProgram;
using cdp::testing::RunCommand;

// Why this machine cannot run the test, or "".
std::string MissingFsPrerequisite() {
  if (::geteuid() != 0) return "not root (mount, losetup need it)";
  if (::access("/dev/fuse", R_OK | W_OK) != 0) return "/dev/fuse missing (no FUSE in this kernel/container)";
  if (::access("/dev/loop-control", R_OK | W_OK) != 0) return "/dev/loop-control missing (no loop devices)";
  for (const char* p : {"nbdfuse", "nbdkit", "losetup", "mkfs.ext4", "e2fsck", "mount", "umount", "nbdcopy"}) {
    if (!HaveProgram(p)) return std::string(p) + " not installed";
  }
  return "";
}

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

}  // namespace cdp::e2e
