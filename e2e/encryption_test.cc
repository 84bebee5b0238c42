// SPDX-License-Identifier: Apache-2.0
// Tenant-side encryption end to end (issue 16, tests 1-3; issue 40, test 1;
// docs/encryption.md): real daemons over TLS, real NBD clients. A distinctive
// plaintext written through the agent appears nowhere at the process server
// or the master target; no key ever reaches the MT (its routes refuse one,
// its memory and data directory hold none); the tenant's `cdpctl serve`
// decrypts the MT's export at the tenant and equals the source, while the
// export itself, read with the tenant's or the provider's certificate, is
// exactly the stored ciphertext; a byte flipped in the replica fails the read
// at the tenant by name, verify finds it and --repair heals it; a failover is
// served, written and failed back with no key at the provider.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/crypto/pki.h"
#include "common/crypto/seal.h"
#include "common/http/http_client.h"
#include "e2e/harness.h"

namespace {

using cdp::e2e::Cluster;
using cdp::e2e::ClusterOptions;
using cdp::e2e::Sha256File;
using cdp::e2e::Which;
using cdp::testing::HaveProgram;
using cdp::testing::RunCommand;
namespace json = boost::json;

constexpr std::string_view kMarker = "OPENCDP-PLAINTEXT-MARKER";

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Files under `dir` (recursively) that hold `needle`.
std::vector<std::string> FilesHolding(const std::string& dir, std::string_view needle) {
  std::vector<std::string> hits;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    if (ReadFile(e.path()).find(needle) != std::string::npos) hits.push_back(e.path());
  }
  return hits;
}

uint64_t Bytes(const std::string& path) { return std::filesystem::file_size(path); }

// nbdcopy of an export to `dest`: its exit code and output.
cdp::testing::CommandResult CopyOut(Cluster& c, const std::string& export_name, const std::string& dest) {
  return RunCommand({"nbdcopy", c.mt_export_uri(export_name), dest}, 120000);
}

// cdpctl serve SPEC, nbdcopy of its plaintext to `dest`, serve stopped:
// nbdcopy's exit code (-1 when serve did not start).
int ServedCopy(Cluster& c, const std::string& spec, const std::string& key_file, const std::string& dest) {
  auto served = c.Serve(spec, key_file);
  if (!served) return -1;
  auto copy = RunCommand({"nbdcopy", served->uri, dest}, 120000);
  served->Stop();
  return copy.exit_code;
}

std::string Hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string h;
  for (size_t i = 0; i < n; ++i) h += {d[p[i] >> 4], d[p[i] & 15]};
  return h;
}

// Every readable mapping of process `pid` (/proc/PID/maps and mem; the test
// runs as root), concatenated.
std::string ProcessMemory(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  const int fd = ::open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDONLY | O_CLOEXEC);
  std::string all, line;
  while (fd >= 0 && std::getline(maps, line)) {
    unsigned long lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) != 3 || perms[0] != 'r') continue;
    if (hi - lo > (1ul << 30)) continue;  // a reservation, not data
    if (line.find("[vvar]") != std::string::npos || line.find("[vsyscall]") != std::string::npos) continue;
    std::string buf(hi - lo, '\0');
    const ssize_t n = ::pread(fd, buf.data(), buf.size(), off_t(lo));
    if (n > 0) all.append(buf.data(), size_t(n));
  }
  if (fd >= 0) ::close(fd);
  return all;
}

}  // namespace

TEST_CASE("encrypted volume: no plaintext and no key at the provider, the tenant's cdpctl serve equals the source, a "
          "tampered block fails by name",
          "[e2e][encryption]") {
  for (const char* p : {"nbdcopy", "sha256sum"}) {
    INFO("missing program " << p << " (scripts/install-deps.sh installs it)");
    REQUIRE(HaveProgram(p));
  }
  ClusterOptions o;
  o.codec = "none";  // the spool and the wire hold the records as they come: nothing hides in compression
  o.volume_size = 16ull << 20;
  cdp::testing::ScratchDir keys;
  const std::string key_file = keys.Join("tenant.key");
  o.agent_extra_config = "encryption = on\nkey_file = " + key_file + "\n";
  Cluster c(o);
  auto init = RunCommand({CDP_CTL_BIN, "keys", "init", "--out", key_file});
  INFO(init.output);
  REQUIRE(init.exit_code == 0);
  REQUIRE(init.output.find("written to " + key_file + " (mode 0600)") != std::string::npos);
  INFO(c.why());
  REQUIRE(c.Start());

  // The plaintext: 1 MiB of marked blocks at 4 MiB, and random data at 9 MiB,
  // written through the agent's tap.
  const std::string image = c.Path("plain.img");
  {
    std::string content(o.volume_size, '\0');
    for (uint64_t b = 0; b < 256; ++b) {
      std::string block;
      while (block.size() < 4096) block += std::string(kMarker) + "-" + std::to_string(b) + "-";
      content.replace((4 << 20) + b * 4096, 4096, block.substr(0, 4096));
    }
    for (size_t i = 0; i < (1u << 20); ++i) content[(9u << 20) + i] = char((i * 2654435761u) >> 13);
    std::ofstream(image, std::ios::binary) << content;
  }
  auto w = RunCommand({"nbdcopy", image, c.nbd_uri()}, 120000);
  INFO(w.output);
  REQUIRE(w.exit_code == 0);
  auto tag = c.Cdpctl({"tag", "sealed-1"});
  INFO(tag.output);
  REQUIRE(tag.exit_code == 0);
  bool drained = c.WaitDrained();
  INFO(c.why());
  REQUIRE(drained);
  REQUIRE(Sha256File(c.source_path()) == Sha256File(image));

  // 1. The scanner finds the marker where it is (the source), and nowhere at
  // the process server or the master target: replica, journal, index, spool.
  REQUIRE(FilesHolding(c.dir(), kMarker) == std::vector<std::string>{c.source_path(), image});
  CHECK(FilesHolding(c.Path("mt"), kMarker).empty());
  CHECK(FilesHolding(c.Path("ps"), kMarker).empty());
  CHECK(Bytes(c.replica_path()) == o.volume_size + o.volume_size / 4096 * 16);  // the volume, then its MACs
  auto vols = c.CdpctlJson({"status"});
  REQUIRE(vols.has_value());
  CHECK(vols->at("master_target").at("volumes").at(0).at("sealed") == true);
  CHECK(vols->at("agent").at("volumes").at(0).at("encrypted") == true);

  // 2. Decrypted only at the tenant: `cdpctl serve` (keys derived at the
  // tenant, never sent) equals the source; the MT's export is the stored
  // blocks and MACs, with no plaintext, whichever certificate reads it.
  const int64_t point = c.TagPointId("sealed-1");
  REQUIRE(point > 0);
  const std::string spec = o.volume + "@" + std::to_string(point);
  // No route of the MT takes key material.
  for (const char* route : {"/v1/export", "/v1/failover"}) {
    auto r = cdp::http::HttpRequest("127.0.0.1", c.mt_control(), "POST", route,
                                    R"({"volume":")" + o.volume + R"(","point":)" + std::to_string(point) +
                                        R"(,"keys":"00"})",
                                    std::chrono::seconds(10), cdp::e2e::ControlClient(c.token(Which::kMasterTarget)));
    REQUIRE(r.ok());
    CHECK(r->status == 400);
    CHECK(r->body == R"({"error":"unknown parameter 'keys'"})");
  }
  auto refused = c.Cdpctl({"export", spec, "--key-file", key_file});
  CHECK(refused.exit_code == 2);
  CHECK(refused.output.find("takes no key: the master target never receives one") != std::string::npos);
  std::string serve_log;
  {
    auto served = c.Serve(spec, key_file);
    INFO(c.why());
    REQUIRE(served.has_value());
    auto copy = RunCommand({"nbdcopy", served->uri, c.Path("keyed.img")}, 120000);
    INFO(copy.output);
    REQUIRE(copy.exit_code == 0);
    CHECK(Sha256File(c.Path("keyed.img")) == Sha256File(image));
    // While the tenant reads its plaintext: no copy of the keys in the MT's
    // memory or its data directory.
    const cdp::seal::TenantKey tenant_key = *cdp::seal::LoadTenantKey(cdp::DefaultEnv(), key_file);
    const cdp::seal::VolumeKeys vk = *cdp::seal::DeriveVolumeKeys(tenant_key, o.volume);
    std::vector<std::string> secrets;
    for (auto [p, n] : {std::pair{vk.data.data(), size_t(32)}, std::pair{vk.data.data() + 32, size_t(32)},
                        std::pair{vk.integrity.data(), size_t(32)}, std::pair{tenant_key.bytes.data(), size_t(32)}}) {
      secrets.emplace_back(reinterpret_cast<const char*>(p), n);
      secrets.push_back(Hex(p, n));
    }
    const std::string mem = ProcessMemory(c.pid(Which::kMasterTarget));
    REQUIRE(mem.size() > (1u << 20));
    // The scan sees the MT's heap: the name of the export serve reads is there.
    CHECK(mem.find(o.tenant + "/" + o.volume + "@") != std::string::npos);
    for (size_t i = 0; i < secrets.size(); ++i) {
      INFO("secret " << i);
      CHECK(mem.find(secrets[i]) == std::string::npos);
      for (const auto& f : std::filesystem::recursive_directory_iterator(c.Path("mt"))) {
        if (f.is_regular_file()) CHECK(ReadFile(f.path()).find(secrets[i]) == std::string::npos);
      }
    }
    // The serving process holds the keys (the scanner would find them there).
    CHECK(ProcessMemory(served->process.pid()).find(secrets[4]) != std::string::npos);
    CHECK(served->Stop() == 0);
    serve_log = ReadFile(served->log);
  }
  CHECK(serve_log.find("serving " + spec + " decrypted, every block checked") != std::string::npos);
  auto plain = c.CdpctlJson({"export", spec});
  REQUIRE(plain.has_value());
  CHECK(plain->at("serves") == "ciphertext");
  CHECK(plain->at("size") == o.volume_size + o.volume_size / 4096 * 16);  // the stored blocks, then their MACs
  const std::string plain_name(plain->at("export").as_string());
  auto copy = CopyOut(c, plain_name, c.Path("sealed.img"));
  REQUIRE(copy.exit_code == 0);
  CHECK(ReadFile(c.Path("sealed.img")).find(kMarker) == std::string::npos);
  CHECK(Sha256File(c.Path("sealed.img")) == Sha256File(c.replica_path()));  // exactly what the MT stores
  // The provider's own certificate (role mt, which sees every tenant's
  // exports) reads the same ciphertext, nothing more.
  REQUIRE(cdp::loadgen::MakeNbdClientCertificates(
              c.pki_dir(), {cdp::pki::CertRole::kMasterTarget, "", "provider-operator"}, c.Path("nbd-mt"))
              .ok());
  copy = RunCommand({"nbdcopy",
                     "nbds://127.0.0.1:" + std::to_string(c.mt_nbd_port()) + "/" + plain_name +
                         "?tls-certificates=" + c.Path("nbd-mt"),
                     c.Path("provider.img")},
                    120000);
  INFO(copy.output);
  REQUIRE(copy.exit_code == 0);
  CHECK(Sha256File(c.Path("provider.img")) == Sha256File(c.Path("sealed.img")));
  REQUIRE(c.Cdpctl({"unexport", plain_name}).exit_code == 0);
  // The point by URI (cdp://TENANT/VOLUME@TAG) resolves to an NBD URI a
  // script can use: the sealed export, which serve decrypts.
  auto resolved = c.Cdpctl({"resolve", "cdp://" + o.tenant + "/" + o.volume + "@sealed-1"});
  INFO(resolved.output);
  REQUIRE(resolved.exit_code == 0);
  const std::string nbd_uri = resolved.output.substr(0, resolved.output.find('\n'));
  const std::string prefix = "nbds://127.0.0.1:" + std::to_string(c.mt_nbd_port()) + "/";
  REQUIRE(nbd_uri.rfind(prefix, 0) == 0);
  CHECK(resolved.output == nbd_uri + "\n");  // the URI alone
  REQUIRE(c.Cdpctl({"unexport", nbd_uri.substr(prefix.size())}).exit_code == 0);
  {
    auto by_uri = c.Serve("cdp://" + o.tenant + "/" + o.volume + "@sealed-1", key_file);
    INFO(c.why());
    REQUIRE(by_uri.has_value());
    by_uri->uri = "nbd+unix:///" + o.volume + by_uri->uri.substr(by_uri->uri.find('?'));
    copy = RunCommand({"nbdcopy", by_uri->uri, c.Path("resolved.img")}, 120000);
    INFO(copy.output);
    REQUIRE(copy.exit_code == 0);
    CHECK(Sha256File(c.Path("resolved.img")) == Sha256File(image));
    CHECK(by_uri->Stop() == 0);
  }
  // Another tenant key opens nothing: every block fails its check.
  const std::string other = keys.Join("other.key");
  REQUIRE(c.Cdpctl({"keys", "init", "--out", other}).exit_code == 0);
  {
    auto wrong = c.Serve(spec, other);
    INFO(c.why());
    REQUIRE(wrong.has_value());
    copy = RunCommand({"nbdcopy", wrong->uri, c.Path("wrong.img")}, 120000);
    CHECK(copy.exit_code != 0);
    CHECK(wrong->Stop() == 1);  // blocks failed their check
  }

  // Verify compares the sealed images: identical.
  auto same = c.Cdpctl({"verify", o.volume});
  INFO(same.output);
  REQUIRE(same.exit_code == 0);
  REQUIRE(same.output.find("identical") != std::string::npos);

  // 3. The provider flips one byte of block 1030 (in the marked megabyte).
  const uint64_t tampered = 1030 * 4096;
  {
    std::fstream replica(c.replica_path(), std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(replica.good());
    replica.seekg(std::streamoff(tampered + 77));
    char b = 0;
    replica.read(&b, 1);
    b = char(b ^ 0x10);
    replica.seekp(std::streamoff(tampered + 77));
    replica.write(&b, 1);
    REQUIRE(replica.good());
  }
  {
    auto served = c.Serve(spec, key_file);
    INFO(c.why());
    REQUIRE(served.has_value());
    copy = RunCommand({"nbdcopy", served->uri, c.Path("keyed2.img")}, 120000);
    CHECK(copy.exit_code != 0);  // EIO on that block: never its wrong bytes
    CHECK(served->Stop() == 1);
    // Found at the tenant, by name.
    CHECK(ReadFile(served->log).find("integrity check failed: block 1030 (offset 4218880)") != std::string::npos);
  }
  // Verify names exactly that block, and --repair sends it again.
  auto differ = c.Cdpctl({"verify", o.volume});
  INFO(differ.output);
  REQUIRE(differ.exit_code == 1);
  CHECK(differ.output.find(o.volume + " 4218880 4096\n") != std::string::npos);
  auto repair = c.Cdpctl({"verify", o.volume, "--repair"});
  INFO(repair.output);
  if (repair.exit_code != 0) FAIL_CHECK(c.Logs(30000));
  REQUIRE(repair.exit_code == 0);
  REQUIRE(c.WaitDrained());
  const uint64_t repaired = json::value_to<uint64_t>(
      c.CdpctlJson({"status"})->at("master_target").at("volumes").at(0).at("history_seq"));
  CHECK(ServedCopy(c, o.volume + "@seq:" + std::to_string(repaired), key_file, c.Path("keyed3.img")) == 0);
  CHECK(Sha256File(c.Path("keyed3.img")) == Sha256File(c.source_path()));

  // The tampered byte sat in the replica before the repair, so the undo
  // record of the repair saved it: the points before the repair still show
  // the tampering (detected), the point after it reads clean.
  CHECK(ServedCopy(c, spec, key_file, c.Path("old.img")) != 0);

  // Overwrite the marked megabyte, then roll back to the repaired point: the
  // replica's blocks and MACs are that point's again, and it opens to the image.
  const std::string other_mb = c.Path("other.img");
  {
    std::string content(o.volume_size, '\0');
    std::ifstream(image, std::ios::binary).read(content.data(), std::streamsize(content.size()));
    for (size_t i = 0; i < (1u << 20); ++i) content[(4u << 20) + i] = char(i * 7 + 1);
    std::ofstream(other_mb, std::ios::binary) << content;
  }
  w = RunCommand({"nbdcopy", other_mb, c.nbd_uri()}, 120000);
  REQUIRE(w.exit_code == 0);
  {
    bool drained = c.WaitDrained();
    INFO(c.why() << "\n" << c.Logs(8000));
    REQUIRE(drained);
  }
  auto rb = c.Cdpctl({"rollback", o.volume, "--to", "seq:" + std::to_string(repaired)});
  INFO(rb.output);
  REQUIRE(rb.exit_code == 0);
  CHECK(ServedCopy(c, o.volume + "@seq:" + std::to_string(repaired), key_file, c.Path("rolled.img")) == 0);
  CHECK(Sha256File(c.Path("rolled.img")) == Sha256File(image));
  CHECK(FilesHolding(c.Path("mt"), kMarker).empty());
}

TEST_CASE("encrypted volume: failover with no key at the provider, the tenant's serve writes sealed, a restart serves "
          "it again, failback pulls exactly the differing blocks",
          "[e2e][encryption][failback]") {
  for (const char* p : {"nbdcopy", "qemu-io", "sha256sum"}) {
    INFO("missing program " << p << " (scripts/install-deps.sh installs it)");
    REQUIRE(HaveProgram(p));
  }
  ClusterOptions o;
  o.codec = "none";
  o.volume_size = 16ull << 20;
  cdp::testing::ScratchDir keys;
  const std::string key_file = keys.Join("tenant.key");
  REQUIRE(RunCommand({CDP_CTL_BIN, "keys", "init", "--out", key_file}).exit_code == 0);
  o.agent_extra_config = "encryption = on\nkey_file = " + key_file + "\n";
  Cluster c(o);
  INFO(c.why());
  REQUIRE(c.Start());
  const std::string vol = o.volume;
  // qemu-io writes 512-byte-aligned ranges: partial blocks, captured whole.
  std::string w = cdp::e2e::RandomWrites(c.nbd_uri(), o.volume_size, 31, 2, 40, 1 << 20, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  REQUIRE(c.Cdpctl({"tag", "t"}).exit_code == 0);
  REQUIRE(c.WaitDrained());
  REQUIRE(c.Kill9(Which::kProcessServer));
  w = cdp::e2e::RandomWrites(c.nbd_uri(), o.volume_size, 32, 1, 30, 0, c.dir());
  REQUIRE(w.empty());
  const std::string diverged = c.Path("diverged.img");
  REQUIRE(cdp::e2e::CopyFile(c.source_path(), diverged));

  // The failover takes no key: the MT serves the overlay of the stored
  // blocks and MACs, and the tenant's cdpctl serve decrypts it for the
  // recovered machine and writes sealed blocks into it.
  auto fo = c.Cdpctl({"failover", vol, "--to", "t"});
  INFO(fo.output);
  REQUIRE(fo.exit_code == 0);
  CHECK(fo.output.find("cdpctl serve " + vol + "@failover --key-file F") != std::string::npos);
  const std::string promoted = c.Path("promoted.img");
  {
    auto served = c.Serve(vol + "@failover", key_file);
    INFO(c.why());
    REQUIRE(served.has_value());
    // The recovered machine writes 100 marked blocks through it.
    const std::string patch = c.Path("provider.patch");
    REQUIRE(cdp::e2e::MakeSparseFile(patch, o.volume_size));
    std::fstream pf(patch, std::ios::in | std::ios::out | std::ios::binary);
    for (uint64_t i = 0; i < 100; ++i) {
      std::string b;
      while (b.size() < 4096) b += std::string(kMarker) + "-provider-" + std::to_string(i) + "-";
      pf.seekp(std::streamoff(((i * 37) % (o.volume_size / 4096)) * 4096));
      pf.write(b.data(), 4096);
    }
    pf.close();
    auto cp = RunCommand({"nbdcopy", "--destination-is-zero", "--flush", patch, served->uri}, 120000);
    INFO(cp.output);
    REQUIRE(cp.exit_code == 0);
    REQUIRE(RunCommand({"nbdcopy", served->uri, promoted}, 120000).exit_code == 0);
    CHECK(served->Stop() == 0);
  }
  CHECK(ReadFile(promoted).find(kMarker) != std::string::npos);
  CHECK(FilesHolding(c.Path("mt"), kMarker).empty());  // the recovered machine's writes arrive sealed
  uint64_t differ = 0;
  {
    const std::string a = ReadFile(diverged), b = ReadFile(promoted);
    REQUIRE(a.size() == b.size());
    for (size_t off = 0; off < a.size(); off += 4096) differ += a.compare(off, 4096, b, off, 4096) != 0;
  }
  REQUIRE(differ > 100);

  // A restart of the master target: the export is served again at once (it
  // never needed a key), and reads the same through serve.
  REQUIRE(c.Kill9(Which::kMasterTarget));
  REQUIRE(c.Restart(Which::kMasterTarget));
  auto st = c.CdpctlJson({"status"});
  REQUIRE(st.has_value());
  CHECK(st->at("master_target").at("volumes").at(0).at("failover").at("served") == true);
  CHECK(ServedCopy(c, vol + "@failover", key_file, c.Path("promoted2.img")) == 0);
  CHECK(Sha256File(c.Path("promoted2.img")) == Sha256File(promoted));
  REQUIRE(c.Restart(Which::kProcessServer));
  auto fb = c.Cdpctl({"--json", "failback", vol});
  INFO(fb.output << c.Logs());
  REQUIRE(fb.exit_code == 0);
  const json::value report = json::parse(fb.output);
  uint64_t pulled = 0;
  for (const auto& p : report.at("passes").as_array()) pulled += json::value_to<uint64_t>(p.at("pulled_blocks"));
  CHECK(pulled == differ);
  CHECK(Sha256File(c.source_path()) == Sha256File(promoted));
  const std::string branch = c.Path("branch.img");
  auto cp = RunCommand({"nbdcopy", "nbd+unix:///" + vol + "@branch-g1?socket=" + c.agent_nbd_socket(), branch}, 120000);
  INFO(cp.output);
  REQUIRE(cp.exit_code == 0);
  CHECK(Sha256File(branch) == Sha256File(diverged));
  CHECK(FilesHolding(c.Path("mt"), kMarker).empty());

  // Re-protect: new writes replicate sealed, and the latest point opens to the source.
  REQUIRE(c.Cdpctl({"reprotect", vol}).exit_code == 0);
  w = cdp::e2e::RandomWrites(c.nbd_uri(), o.volume_size, 33, 1, 20, 0, c.dir());
  REQUIRE(w.empty());
  REQUIRE(c.WaitDrained());
  st = c.CdpctlJson({"status"});
  const uint64_t last = json::value_to<uint64_t>(st->at("master_target").at("volumes").at(0).at("history_seq"));
  CHECK(ServedCopy(c, vol + "@seq:" + std::to_string(last), key_file, c.Path("final.img")) == 0);
  CHECK(Sha256File(c.Path("final.img")) == Sha256File(c.source_path()));
}
