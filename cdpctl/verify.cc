// SPDX-License-Identifier: Apache-2.0
// cdpctl verify: source against replica at one sequence, and repair
// (commands.h).
#include "cdpctl/commands.h"


#include <boost/json.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "common/base/host_port.h"
#include "common/base/version.h"
#include "common/crypto/pki.h"
#include "common/crypto/seal.h"
#include "common/http/control_token.h"
#include "common/http/http_client.h"

namespace cdp::ctl {

// Online verify (docs/operations.md, "Verify"): the agent hashes each region in
// a window with no write to it and says which sequence S the hash describes;
// the master target hashes its replica as it was at S (through the undo
// journal). Equal sequences make every difference real. Regions that differ
// are descended into at 4 KiB, the same way, so the output names blocks.
//
//   page of regions --agent /v1/hashes--> (seq, hash) | busy
//        --group runs of one seq--> MT /v1/hashes?at_seq=seq (409: wait)
//        --differ--> 4 KiB leaves of the region (same scheme) --> extents
//        --repair--> agent /v1/repair, wait for the replica, verify the extents again

constexpr uint64_t kBlock = 4096;
constexpr auto kReplicaWait = std::chrono::seconds(60);
namespace {

// Units in one hashes request: the agent's and the master target's control
// routes take at most this many (proto::kMaxHashes, the wire's cap, which
// cdpctl does not link).
constexpr uint64_t kMaxUnitsPerRequest = 1u << 16;

constexpr auto kReplicaPoll = std::chrono::milliseconds(100);

struct VerifyArgs {
  std::string volume;
  uint64_t region_size = 1 << 20;
  bool repair = false;
  double max_rate_mb = 200;  // MB/s (10^6 bytes) of source reads
};

struct Extent {
  uint64_t offset = 0;
  uint64_t length = 0;
};

enum class Cmp { kEqual, kDiffer, kBusy };

class Verifier {
 public:
  Verifier(const Options& o, const VerifyArgs& a, std::ostream& err)
      : o_(o), a_(a), err_(err), start_(std::chrono::steady_clock::now()) {}

  // Compares units [first, first+count) of `unit` bytes; appends one Cmp per
  // unit to *out. False on an error (already reported).
  bool Compare(uint64_t unit, uint64_t first, uint64_t count, std::vector<Cmp>* out);
  // The exact 4 KiB blocks of [offset, offset+len) that differ, as extents
  // appended to *out (merged with a last extent they touch). *busy set when a
  // part could not be compared.
  bool Blocks(uint64_t offset, uint64_t len, std::vector<Extent>* out, bool* busy);
  // Whether the agent is still the process, with the same numbering, that
  // every difference found rests on; false on error. Differences found under
  // another one are not reported (their sequences changed meaning).
  bool NumberingStill(bool* same);
  // Waits until the replica has applied `seq`.
  bool WaitApplied(uint64_t seq);

  uint64_t size() const { return size_; }

 private:
  struct AgentUnit {
    bool busy = true;
    uint64_t seq = 0;
    uint64_t instance = 0;  // the agent process that answered
    uint64_t numbering = 0;
    std::string hash;
  };
  bool AgentUnits(uint64_t unit, uint64_t first, uint64_t count, std::vector<AgentUnit>* out);
  // 1: hashes, 0: the sequence is outside the replica's history (410), -1: error.
  int MtUnitsAt(uint64_t unit, uint64_t first, uint64_t count, uint64_t seq, std::vector<std::string>* out);
  void Pace(uint64_t bytes);

  const Options& o_;
  const VerifyArgs& a_;
  std::ostream& err_;
  std::chrono::steady_clock::time_point start_;
  uint64_t paced_bytes_ = 0;
  uint64_t size_ = 0;
  std::set<std::pair<uint64_t, uint64_t>> numberings_;  // (instance, numbering) differences rest on
};

void Verifier::Pace(uint64_t bytes) {
  if (!(a_.max_rate_mb > 0)) return;
  paced_bytes_ += bytes;
  auto due = start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(double(paced_bytes_) / (a_.max_rate_mb * 1e6)));
  std::this_thread::sleep_until(due);
}

bool Verifier::AgentUnits(uint64_t unit, uint64_t first, uint64_t count, std::vector<AgentUnit>* out) {
  std::string target = "/v1/hashes?volume=" + Q(a_.volume) + "&region_size=" + std::to_string(unit) +
                       "&first=" + std::to_string(first) + "&count=" + std::to_string(count);
  Call c = Http(o_, o_.agent, "GET", target);
  if (!c.reached || c.status != 200) {
    Fail(err_, "source hashes of " + a_.volume, c);
    return false;
  }
  const json::object* b = c.body.if_object();
  const json::value* rs = b ? b->if_contains("regions") : nullptr;
  if (!rs || !rs->is_array() || rs->as_array().size() != count) {
    err_ << "cdpctl: the agent at " << Where(o_.agent) << " sent no region digests (an agent without online verify?)\n";
    return false;
  }
  size_ = uint64_t(Num(*b, "size"));
  const uint64_t instance = uint64_t(Num(*b, "instance"));
  for (const auto& v : rs->as_array()) {
    AgentUnit u;
    const json::object* r = v.if_object();
    if (r && !r->contains("busy") && r->contains("hash")) {
      u.busy = false;
      u.seq = uint64_t(Num(*r, "seq"));
      u.instance = instance;
      u.numbering = uint64_t(Num(*r, "numbering"));
      u.hash = Str(*r, "hash");
    }
    out->push_back(std::move(u));
  }
  Pace(count * unit);
  return true;
}

int Verifier::MtUnitsAt(uint64_t unit, uint64_t first, uint64_t count, uint64_t seq, std::vector<std::string>* out) {
  std::string target = "/v1/hashes?volume=" + Q(a_.volume) + TenantParam(o_) + "&region_size=" +
                       std::to_string(unit) + "&first=" + std::to_string(first) + "&count=" + std::to_string(count) +
                       "&at_seq=" + std::to_string(seq);
  const auto deadline = std::chrono::steady_clock::now() + kReplicaWait;
  for (;;) {
    Call c = Http(o_, o_.mt, "GET", target);
    if (c.reached && c.status == 409 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(kReplicaPoll);  // the replica has not applied `seq` yet
      continue;
    }
    if (c.reached && c.status == 410) {
      err_ << "cdpctl: the replica no longer holds sequence " << seq
           << " (outside its retained history): those regions were not compared\n";
      return 0;
    }
    if (!c.reached || c.status != 200) {
      Fail(err_, "replica hashes of " + a_.volume + " at sequence " + std::to_string(seq), c);
      return -1;
    }
    const json::object* b = c.body.if_object();
    const json::value* hs = b ? b->if_contains("hashes") : nullptr;
    if (b && seq == 0 && uint64_t(Num(*b, "seq")) != 0) {
      // at_seq 0 asks for the current image: the source has no write in its
      // numbering yet, the replica has applied some: not comparable.
      err_ << "cdpctl: the source has captured nothing yet but the replica has applied sequence "
           << uint64_t(Num(*b, "seq")) << ": not compared\n";
      return 0;
    }
    if (!b || uint64_t(Num(*b, "seq")) != seq || !hs || !hs->is_array() || hs->as_array().size() != count) {
      err_ << "cdpctl: the master target at " << Where(o_.mt) << " did not answer for sequence " << seq << "\n";
      return -1;
    }
    for (const auto& h : hs->as_array()) out->push_back(h.is_string() ? std::string(h.as_string()) : "");
    return 1;
  }
}

bool Verifier::Compare(uint64_t unit, uint64_t first, uint64_t count, std::vector<Cmp>* out) {
  // One agent request reads at most 64 MiB (the control server answers one
  // request at a time).
  const uint64_t page = std::clamp<uint64_t>((64ull << 20) / unit, 1, kMaxUnitsPerRequest);
  for (uint64_t p = first; p < first + count; p += page) {
    const uint64_t n = std::min(page, first + count - p);
    std::vector<AgentUnit> src;
    if (!AgentUnits(unit, p, n, &src)) return false;
    for (uint64_t i = 0; i < n;) {
      if (src[i].busy) {
        out->push_back(Cmp::kBusy);
        ++i;
        continue;
      }
      // A run of units described at one sequence: one replica request.
      uint64_t j = i + 1;
      while (j < n && !src[j].busy && src[j].seq == src[i].seq && src[j].numbering == src[i].numbering &&
             src[j].instance == src[i].instance) {
        ++j;
      }
      std::vector<std::string> rep;
      int got = MtUnitsAt(unit, p + i, j - i, src[i].seq, &rep);
      if (got < 0) return false;
      for (uint64_t k = i; k < j; ++k) {
        if (got == 0) {
          out->push_back(Cmp::kBusy);
        } else if (rep[k - i] == src[k].hash) {
          out->push_back(Cmp::kEqual);
        } else {
          out->push_back(Cmp::kDiffer);
          numberings_.insert({src[k].instance, src[k].numbering});
        }
      }
      i = j;
    }
  }
  return true;
}

bool Verifier::Blocks(uint64_t offset, uint64_t len, std::vector<Extent>* out, bool* busy) {
  std::vector<Cmp> leaves;
  if (!Compare(kBlock, offset / kBlock, (len + kBlock - 1) / kBlock, &leaves)) return false;
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (leaves[i] == Cmp::kBusy) *busy = true;
    if (leaves[i] != Cmp::kDiffer) continue;
    const uint64_t off = offset + i * kBlock;
    const uint64_t n = std::min(kBlock, size_ - off);
    if (!out->empty() && out->back().offset + out->back().length == off) {
      out->back().length += n;
    } else {
      out->push_back({off, n});
    }
  }
  return true;
}

bool Verifier::NumberingStill(bool* same) {
  Call c = Http(o_, o_.agent, "GET",
                "/v1/hashes?volume=" + Q(a_.volume) + "&region_size=4096&first=0&count=1&max_retries=0");
  if (!c.reached || c.status != 200) {
    Fail(err_, "source hashes of " + a_.volume, c);
    return false;
  }
  const json::object* b = c.body.if_object();
  if (!b) {
    err_ << "cdpctl: the agent at " << Where(o_.agent) << " sent no JSON\n";
    return false;
  }
  const std::pair<uint64_t, uint64_t> now{uint64_t(Num(*b, "instance")), uint64_t(Num(*b, "numbering"))};
  *same = numberings_.empty() || (numberings_.size() == 1 && *numberings_.begin() == now);
  return true;
}

bool Verifier::WaitApplied(uint64_t seq) {
  std::vector<std::string> ignored;
  return MtUnitsAt(kBlock, 0, 1, seq, &ignored) > 0;
}

json::array ExtentsJson(const std::vector<Extent>& xs) {
  json::array a;
  for (const Extent& x : xs) a.push_back(json::object{{"offset", x.offset}, {"length", x.length}});
  return a;
}

int Verify(const Options& o, const VerifyArgs& a, std::ostream& out, std::ostream& err) {
  Verifier v(o, a, err);
  // The first page tells the volume's size.
  std::vector<Cmp> regions;
  if (!v.Compare(a.region_size, 0, 1, &regions)) return 1;
  const uint64_t count = (v.size() + a.region_size - 1) / a.region_size;
  if (count > 1 && !v.Compare(a.region_size, 1, count - 1, &regions)) return 1;
  uint64_t busy = 0, compared = 0, descended = 0;
  std::vector<Extent> diffs;
  for (uint64_t r = 0; r < regions.size(); ++r) {
    if (regions[r] == Cmp::kBusy) ++busy;
    if (regions[r] != Cmp::kDiffer) {
      compared += regions[r] == Cmp::kEqual;
      continue;
    }
    // Different at one sequence: which blocks? (Compared afresh: the region
    // may have been written since, then only what still differs counts.)
    ++descended;
    bool part_busy = false;
    const uint64_t off = r * a.region_size;
    if (!v.Blocks(off, std::min(a.region_size, v.size() - off), &diffs, &part_busy)) return 1;
    if (part_busy) ++busy;
    else ++compared;
  }
  bool same_numbering = true;
  if (!diffs.empty() && !v.NumberingStill(&same_numbering)) return 1;
  if (!same_numbering) {
    err << "cdpctl: the agent restarted or renumbered its sequences during the verify (a reconnect to a process "
           "server with another history): nothing is reported; verify again\n";
    return 1;
  }
  std::vector<Extent> repaired, unrepaired;
  if (a.repair && !diffs.empty()) {
    uint64_t last = 0;
    for (const Extent& x : diffs) {
      Options ro = o;
      ro.timeout_ms = std::max(o.timeout_ms, 30000);
      Call c = Http(ro, o.agent, "POST", "/v1/repair",
                    json::object{{"volume", a.volume}, {"offset", x.offset}, {"length", x.length}});
      if (!c.reached || c.status != 200) return Fail(err, "repair of " + a.volume, c);
      const json::object* b = c.body.if_object();
      const json::value* seqs = b ? b->if_contains("seqs") : nullptr;
      if (!seqs || !seqs->is_array()) {
        err << "cdpctl: the agent's repair answer has no seqs\n";
        return 1;
      }
      for (const auto& s : seqs->as_array()) {
        if (s.is_uint64() || s.is_int64()) last = std::max(last, json::value_to<uint64_t>(s));
      }
    }
    if (!v.WaitApplied(last)) return 1;
    for (const Extent& x : diffs) {
      std::vector<Extent> still;
      bool part_busy = false;
      if (!v.Blocks(x.offset, x.length, &still, &part_busy)) return 1;
      if (still.empty() && !part_busy) {
        repaired.push_back(x);
      } else {
        unrepaired.push_back(x);
      }
    }
  }
  uint64_t diff_bytes = 0;
  for (const Extent& x : diffs) diff_bytes += x.length;
  if (o.json) {
    json::object j{{"volume", a.volume},        {"region_size", a.region_size}, {"regions", count},
                   {"compared", compared},      {"busy", busy},                 {"descended", descended},
                   {"differences", ExtentsJson(diffs)}};
    if (a.repair) {
      j["repaired"] = ExtentsJson(repaired);
      j["unrepaired"] = ExtentsJson(unrepaired);
    }
    out << json::serialize(j) << "\n";
  } else {
    for (const Extent& x : diffs) out << a.volume << " " << x.offset << " " << x.length << "\n";
    for (const Extent& x : repaired) out << a.volume << " " << x.offset << " " << x.length << " repaired\n";
    for (const Extent& x : unrepaired) out << a.volume << " " << x.offset << " " << x.length << " NOT repaired\n";
    out << "verify " << a.volume << ": " << count << " regions of " << Bytes(double(a.region_size)) << ", "
        << compared << " compared, " << busy << " busy: ";
    if (diffs.empty()) out << "identical\n";
    else out << diffs.size() << " difference(s), " << Bytes(double(diff_bytes)) << "\n";
    if (busy > 0) out << "  " << busy << " region(s) could not be compared now (written throughout, or resync pending): verify again\n";
  }
  // 1: something differs (and was not repaired); 3: nothing differs, but not
  // everything could be compared (busy regions): not a clean bill of health.
  if (!diffs.empty() && !(a.repair && unrepaired.empty())) return 1;
  return busy > 0 ? 3 : 0;
}

// pki init --dir DIR [--name NAME] [--days N]

}  // namespace

int VerifyCommand(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  VerifyArgs a;
  a.volume = args[1];
  for (size_t i = 2; i < args.size(); ++i) {
    const std::string& k = args[i];
    const bool has_value = i + 1 < args.size();
    if (k == "--repair") {
      a.repair = true;
    } else if (k == "--region-size" && has_value) {
      const std::string& t = args[++i];
      auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), a.region_size);
      if (ec != std::errc() || p != t.data() + t.size() || a.region_size < 4096 || a.region_size > (1ull << 30) ||
          (a.region_size & (a.region_size - 1))) {
        err << "cdpctl: --region-size must be a power of two in 4096..1073741824\n";
        return 2;
      }
    } else if (k == "--max-rate" && has_value) {
      const std::string& t = args[++i];
      char* end = nullptr;
      a.max_rate_mb = std::strtod(t.c_str(), &end);
      if (t.empty() || end != t.c_str() + t.size() || !(a.max_rate_mb > 0) || !std::isfinite(a.max_rate_mb)) {
        err << "cdpctl: --max-rate must be a positive number of MB/s\n";
        return 2;
      }
    } else {
      return Usage(args, err);
    }
  }
  return Verify(o, a, out, err);
}


}  // namespace cdp::ctl
