// SPDX-License-Identifier: Apache-2.0
// Helpers built on any Env, and the process-wide POSIX Env.
#include <sys/stat.h>

#include <cstdio>
#include <string>

#include "common/env/env.h"

namespace cdp {
namespace {

// ReadWholeFile is for metadata and configuration, never for volumes or spool
// segments; anything larger is refused before allocating.
constexpr uint64_t kMaxWholeFile = uint64_t(256) << 20;

}  // namespace

Env* DefaultEnv() {
  // Function-local: built on first use, intentionally never destroyed so that it
  // stays usable from other static destructors.
  static Env* const env = NewPosixEnv().release();
  return env;
}

Status WriteFileAtomic(Env* env, const std::string& path, ByteSpan data, uint32_t mode) {
  const std::string tmp = path + ".tmp";
  Status s;
  {
    OpenOptions o;
    o.create = true;
    o.exclusive = true;  // a stale tmp file would keep its old mode: start afresh
    o.mode = mode;
    auto f = env->Open(tmp, o);
    if (!f.ok() && f.status().code() == Code::kAlreadyExists) {
      (void)env->Remove(tmp);
      f = env->Open(tmp, o);
    }
    if (!f.ok()) return f.status();
    s = (*f)->Write(0, data);
    if (s.ok()) s = (*f)->Sync();
  }  // closed before the rename
  if (s.ok()) s = env->Rename(tmp, path);
  if (!s.ok()) {
    (void)env->Remove(tmp);  // best effort; the original error is what matters
    return s;
  }
  return env->SyncDir(DirName(path));
}

Result<Bytes> ReadWholeFile(Env* env, const std::string& path) {
  OpenOptions o;
  o.read_only = true;
  auto f = env->Open(path, o);
  if (!f.ok()) return f.status();
  auto size = (*f)->Size();
  if (!size.ok()) return size.status();
  if (*size > kMaxWholeFile) {
    return Status::InvalidArgument(path + ": " + std::to_string(*size) +
                                   " bytes is larger than ReadWholeFile's limit of " +
                                   std::to_string(kMaxWholeFile));
  }
  Bytes out(static_cast<size_t>(*size));
  auto n = (*f)->ReadUpTo(0, out.size(), out.data());
  if (!n.ok()) return n.status();
  out.resize(*n);  // the file may have shrunk since Size()
  return out;
}

std::string NormalizePath(const std::string& p) {
  if (p.empty()) return p;
  std::string out;
  const bool abs = p[0] == '/';
  size_t i = 0;
  while (i < p.size()) {
    size_t j = p.find('/', i);
    if (j == std::string::npos) j = p.size();
    std::string part = p.substr(i, j - i);
    if (!part.empty() && part != ".") {
      if (!out.empty() || abs) out += '/';
      out += part;
    }
    i = j + 1;
  }
  if (out.empty()) return abs ? "/" : ".";
  return out;
}

std::string DirName(const std::string& path) {
  size_t end = path.size();
  while (end > 1 && path[end - 1] == '/') --end;  // "a/b/" names "a/b"
  size_t slash = path.rfind('/', end == 0 ? 0 : end - 1);
  if (slash == std::string::npos) return ".";
  while (slash > 0 && path[slash - 1] == '/') --slash;  // "a//b"
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  size_t skip = 0;
  while (skip < b.size() && b[skip] == '/') ++skip;
  if (a.back() == '/') return a + b.substr(skip);
  return a + "/" + b.substr(skip);
}

Status CheckPrivateFile(Env* env, const std::string& path, std::string_view what) {
  if (env != DefaultEnv()) return Status::OK();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Status::OK();  // the Env reports what is wrong
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
    return Status::PermissionDenied(path + " has mode " + mode + ": " + std::string(what) +
                                    " must not be open to group or others (chmod 600 " + path + ")");
  }
  return Status::OK();
}

}  // namespace cdp
