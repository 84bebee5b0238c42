// SPDX-License-Identifier: Apache-2.0
#include "loadgen/tree.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "loadgen/data.h"
#include "loadgen/rng.h"

namespace cdp::loadgen {
namespace {

constexpr uint64_t kMaxFileCap = 64ull << 20;

std::string DirName(const std::vector<uint32_t>& idx, size_t levels) {
  std::string s;
  for (size_t i = 0; i < levels; ++i) {
    if (!s.empty()) s += '/';
    s += "d" + std::to_string(idx[i]);
  }
  return s;
}

}  // namespace

Result<TreePlan> PlanTree(const TreeOptions& o) {
  if (o.fanout < 1 || o.fanout > 256) return Status::InvalidArgument("tree fanout must be 1..256");
  if (o.depth > 8) return Status::InvalidArgument("tree depth must be 0..8");
  if (o.min_file == 0 || o.max_file < o.min_file || o.max_file > kMaxFileCap)
    return Status::InvalidArgument("tree file sizes: need 0 < min_file <= max_file <= 64 MiB");
  if (!(o.compressibility >= 0.0 && o.compressibility <= 1.0))
    return Status::InvalidArgument("compressibility must be within 0..1");
  uint64_t leaves = 1;
  for (uint32_t i = 0; i < o.depth; ++i) leaves *= o.fanout;
  if (o.size_bytes / o.min_file > 50'000'000)
    return Status::InvalidArgument("tree too large: more than 50 million files");

  TreePlan plan;
  SplitMix64 rng(MixSeed(o.seed, 0x7472656500000000ull));  // "tree"
  std::set<std::string> dirs;
  const double lmin = std::log(double(o.min_file)), lmax = std::log(double(o.max_file));
  uint64_t left = o.size_bytes;
  for (uint64_t i = 0; left > 0; ++i) {
    uint64_t size = uint64_t(std::exp(lmin + (lmax - lmin) * rng.Unit()));
    size = std::clamp<uint64_t>(size, o.min_file, o.max_file);
    if (size > left) size = left;
    left -= size;
    uint64_t leaf = rng.Below(leaves);
    std::vector<uint32_t> idx(o.depth);
    for (uint32_t d = o.depth; d-- > 0;) {
      idx[d] = uint32_t(leaf % o.fanout);
      leaf /= o.fanout;
    }
    for (size_t l = 1; l <= o.depth; ++l) {
      std::string dn = DirName(idx, l);
      if (dirs.insert(dn).second) plan.dirs.push_back(dn);
    }
    char name[32];
    std::snprintf(name, sizeof(name), "f%06llu.dat", (unsigned long long)i);
    std::string dir = DirName(idx, o.depth);
    plan.files.push_back({dir.empty() ? name : dir + "/" + name, size, MixSeed(o.seed, i + 1)});
  }
  // Parents before children: shorter paths first, then by name.
  std::sort(plan.dirs.begin(), plan.dirs.end(), [](const std::string& a, const std::string& b) {
    size_t da = std::count(a.begin(), a.end(), '/'), db = std::count(b.begin(), b.end(), '/');
    return da != db ? da < db : a < b;
  });
  return plan;
}

Bytes TreeFileContent(const TreeOptions& o, const TreeFile& f) {
  loadgen::DataMix mix;
  mix.compressibility = o.compressibility;
  mix.seed = f.content_seed;
  loadgen::DataGenerator gen(mix);
  return gen.Generate(size_t(f.size));
}

Result<TreeWriteStats> WriteTree(Env* env, const std::string& root, const TreeOptions& o) {
  CDP_ASSIGN_OR_RETURN(TreePlan plan, PlanTree(o));
  TreeWriteStats st;
  CDP_RETURN_IF_ERROR(env->CreateDirs(root));
  for (const auto& d : plan.dirs) {
    CDP_RETURN_IF_ERROR(env->CreateDirs(JoinPath(root, d)));
    ++st.dirs;
  }
  for (const auto& f : plan.files) {
    std::string path = JoinPath(root, f.path);
    OpenOptions oo;
    oo.create = true;
    oo.truncate = true;
    CDP_ASSIGN_OR_RETURN(auto file, env->Open(path, oo));
    Bytes data = TreeFileContent(o, f);
    CDP_RETURN_IF_ERROR(file->Write(0, data));
    if (o.sync) CDP_RETURN_IF_ERROR(file->Sync());
    ++st.files;
    st.bytes += data.size();
  }
  return st;
}

namespace {

// Lists files under `rel` (relative to root) that the plan does not have.
Status FindUnexpected(Env* env, const std::string& root, const std::string& rel,
                      const std::set<std::string>& dirs, const std::set<std::string>& files,
                      std::vector<std::string>* out) {
  std::string abs = rel.empty() ? root : JoinPath(root, rel);
  auto names = env->ListDir(abs);
  if (!names.ok()) {
    if (names.status().IsNotFound()) return Status::OK();
    return names.status();
  }
  for (const auto& n : *names) {
    std::string child = rel.empty() ? n : rel + "/" + n;
    if (dirs.count(child)) {
      CDP_RETURN_IF_ERROR(FindUnexpected(env, root, child, dirs, files, out));
    } else if (!files.count(child)) {
      out->push_back(child);
    }
  }
  return Status::OK();
}

}  // namespace

Result<VerifyReport> VerifyTree(Env* env, const std::string& root, const TreeOptions& o) {
  CDP_ASSIGN_OR_RETURN(TreePlan plan, PlanTree(o));
  VerifyReport rep;
  Bytes disk;
  for (const auto& f : plan.files) {
    std::string path = JoinPath(root, f.path);
    OpenOptions oo;
    oo.read_only = true;
    auto file = env->Open(path, oo);
    if (!file.ok()) {
      if (file.status().IsNotFound()) {
        rep.missing.push_back(f.path);
        continue;
      }
      return file.status();
    }
    ++rep.files_checked;
    CDP_ASSIGN_OR_RETURN(uint64_t size, (*file)->Size());
    if (size != f.size) {
      rep.mismatched.push_back(f.path + ": size " + std::to_string(size) + ", expected " + std::to_string(f.size));
      continue;
    }
    disk.resize(size_t(size));
    CDP_RETURN_IF_ERROR((*file)->Read(0, disk.size(), disk.data()));
    rep.bytes_checked += size;
    Bytes want = TreeFileContent(o, f);
    auto [a, b] = std::mismatch(disk.begin(), disk.end(), want.begin());
    if (a != disk.end()) {
      uint64_t off = uint64_t(a - disk.begin());
      rep.mismatched.push_back(f.path + ": differs at byte " + std::to_string(off));
    }
  }
  std::set<std::string> dirs(plan.dirs.begin(), plan.dirs.end());
  std::set<std::string> files;
  for (const auto& f : plan.files) files.insert(f.path);
  CDP_RETURN_IF_ERROR(FindUnexpected(env, root, "", dirs, files, &rep.unexpected));
  return rep;
}

}  // namespace cdp::loadgen
