// SPDX-License-Identifier: Apache-2.0
// Filesystem helpers of the e2e tests: a volume's NBD export as a block
// device (nbdfuse + losetup), undone in reverse order even when a REQUIRE
// fails half-way, and a deterministic tree of files to write and check.
// Needs root, /dev/fuse, loop devices, nbdfuse, losetup, mkfs.ext4, e2fsck.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace cdp::e2e {

// Why this machine cannot run a filesystem test, or "".
std::string MissingFsPrerequisite();

// Undoes, in reverse order, every mount / loop device / nbdfuse started.
// Declare it after the Cluster, so that it runs first.
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
// ("" + `why` on failure). Two undo steps are pushed.
std::string Attach(const std::vector<std::string>& source, const std::string& mnt, bool read_only, uint64_t size,
                   const std::string& log, Attachments* at, std::string* why);

struct TreeFile {
  std::string path;
  std::string data;
};

// A deterministic tree: nested directories, empty, small and multi-MiB files,
// some compressible, some random.
std::vector<TreeFile> MakeTree(uint32_t seed);
bool WriteTree(const std::string& root, const std::vector<TreeFile>& files, std::string* why);
// The file's bytes, or "<missing>".
std::string ReadAll(const std::string& path);

}  // namespace cdp::e2e
