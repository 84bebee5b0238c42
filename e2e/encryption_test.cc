// SPDX-License-Identifier: Apache-2.0
// Tenant-side encryption end to end (issue 16, tests 1-3; docs/encryption.md):
// real daemons over TLS, real NBD clients. A distinctive plaintext written
// through the agent appears nowhere at the process server or the master
// target; an export with the tenant's key equals the source, one without it
// does not contain the plaintext; a byte flipped in the replica fails the
// keyed read by name, verify finds it and --repair heals it.
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <string>

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

}  // namespace

TEST_CASE("encrypted volume: no plaintext at the provider, a keyed export equals the source, a tampered block fails "
          "by name",
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

  // 2. A keyed export equals the source; one without the key holds no plaintext.
  const int64_t point = c.TagPointId("sealed-1");
  REQUIRE(point > 0);
  const std::string spec = o.volume + "@" + std::to_string(point);
  auto keyed = c.CdpctlJson({"export", spec, "--key-file", key_file});
  REQUIRE(keyed.has_value());
  CHECK(keyed->at("serves") == "plaintext");
  const std::string keyed_name(keyed->at("export").as_string());
  auto copy = CopyOut(c, keyed_name, c.Path("keyed.img"));
  INFO(copy.output);
  REQUIRE(copy.exit_code == 0);
  CHECK(Sha256File(c.Path("keyed.img")) == Sha256File(image));
  auto plain = c.CdpctlJson({"export", spec});
  REQUIRE(plain.has_value());
  CHECK(plain->at("serves") == "ciphertext");
  const std::string plain_name(plain->at("export").as_string());
  copy = CopyOut(c, plain_name, c.Path("sealed.img"));
  REQUIRE(copy.exit_code == 0);
  CHECK(ReadFile(c.Path("sealed.img")).find(kMarker) == std::string::npos);
  CHECK(Sha256File(c.Path("sealed.img")) != Sha256File(image));
  REQUIRE(c.Cdpctl({"unexport", plain_name}).exit_code == 0);
  // The point by URI (cdp://TENANT/VOLUME@TAG) resolves to an NBD URI a script can use.
  auto resolved = c.Cdpctl({"resolve", "cdp://" + o.tenant + "/" + o.volume + "@sealed-1", "--key-file", key_file});
  INFO(resolved.output);
  REQUIRE(resolved.exit_code == 0);
  const std::string nbd_uri = resolved.output.substr(0, resolved.output.find('\n'));
  const std::string prefix = "nbds://127.0.0.1:" + std::to_string(c.mt_nbd_port()) + "/";
  REQUIRE(nbd_uri.rfind(prefix, 0) == 0);
  CHECK(resolved.output == nbd_uri + "\n");  // the URI alone
  copy = RunCommand({"nbdcopy", nbd_uri + "?tls-certificates=" + c.nbd_client_dir(), c.Path("resolved.img")}, 120000);
  INFO(copy.output);
  REQUIRE(copy.exit_code == 0);
  CHECK(Sha256File(c.Path("resolved.img")) == Sha256File(image));
  REQUIRE(c.Cdpctl({"unexport", nbd_uri.substr(prefix.size())}).exit_code == 0);
  // Another tenant key opens nothing.
  const std::string other = keys.Join("other.key");
  REQUIRE(c.Cdpctl({"keys", "init", "--out", other}).exit_code == 0);
  auto wrong = c.CdpctlJson({"export", spec, "--key-file", other});
  REQUIRE(wrong.has_value());
  copy = CopyOut(c, std::string(wrong->at("export").as_string()), c.Path("wrong.img"));
  CHECK(copy.exit_code != 0);
  REQUIRE(c.Cdpctl({"unexport", std::string(wrong->at("export").as_string())}).exit_code == 0);

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
  copy = CopyOut(c, keyed_name, c.Path("keyed2.img"));
  CHECK(copy.exit_code != 0);  // EIO on that block: never its wrong bytes
  const std::string mt_log = ReadFile(c.Path("master-target.log"));
  CHECK(mt_log.find("integrity check failed: block 1030 (offset 4218880)") != std::string::npos);
  REQUIRE(c.Cdpctl({"unexport", keyed_name}).exit_code == 0);
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
  auto again = c.CdpctlJson({"export", o.volume + "@seq:" + std::to_string(repaired), "--key-file", key_file});
  REQUIRE(again.has_value());
  copy = CopyOut(c, std::string(again->at("export").as_string()), c.Path("keyed3.img"));
  INFO(copy.output);
  REQUIRE(copy.exit_code == 0);
  CHECK(Sha256File(c.Path("keyed3.img")) == Sha256File(c.source_path()));
  REQUIRE(c.Cdpctl({"unexport", std::string(again->at("export").as_string())}).exit_code == 0);

  // The tampered byte sat in the replica before the repair, so the undo
  // record of the repair saved it: the points before the repair still show
  // the tampering (detected), the point after it reads clean.
  auto old = c.CdpctlJson({"export", spec, "--key-file", key_file});
  REQUIRE(old.has_value());
  copy = CopyOut(c, std::string(old->at("export").as_string()), c.Path("old.img"));
  CHECK(copy.exit_code != 0);
  REQUIRE(c.Cdpctl({"unexport", std::string(old->at("export").as_string())}).exit_code == 0);

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
  auto after = c.CdpctlJson({"export", o.volume + "@seq:" + std::to_string(repaired), "--key-file", key_file});
  REQUIRE(after.has_value());
  copy = CopyOut(c, std::string(after->at("export").as_string()), c.Path("rolled.img"));
  INFO(copy.output);
  REQUIRE(copy.exit_code == 0);
  CHECK(Sha256File(c.Path("rolled.img")) == Sha256File(image));
  CHECK(FilesHolding(c.Path("mt"), kMarker).empty());
}

TEST_CASE("encrypted volume: failover with the tenant's key, provider writes sealed, restart without the key, failback "
          "pulls exactly the differing blocks",
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

  // Without the key the recovered machine would see ciphertext: refused.
  auto nokey = c.Cdpctl({"failover", vol, "--to", "t"});
  CHECK(nokey.exit_code != 0);
  CHECK(nokey.output.find("needs the tenant's keys (--key-file)") != std::string::npos);
  auto fo = c.Cdpctl({"failover", vol, "--to", "t", "--key-file", key_file});
  INFO(fo.output);
  REQUIRE(fo.exit_code == 0);
  const std::string uri = c.mt_export_uri("acme/" + vol + "@failover");
  // The provider writes 100 marked blocks through the keyed export.
  {
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
    auto cp = RunCommand({"nbdcopy", "--destination-is-zero", "--flush", patch, uri}, 120000);
    INFO(cp.output);
    REQUIRE(cp.exit_code == 0);
  }
  const std::string promoted = c.Path("promoted.img");
  REQUIRE(RunCommand({"nbdcopy", uri, promoted}, 120000).exit_code == 0);
  CHECK(ReadFile(promoted).find(kMarker) != std::string::npos);
  CHECK(FilesHolding(c.Path("mt"), kMarker).empty());  // the provider's writes are sealed too
  uint64_t differ = 0;
  {
    const std::string a = ReadFile(diverged), b = ReadFile(promoted);
    REQUIRE(a.size() == b.size());
    for (size_t off = 0; off < a.size(); off += 4096) differ += a.compare(off, 4096, b, off, 4096) != 0;
  }
  REQUIRE(differ > 100);

  // A restart of the master target forgets the keys: the export waits for
  // them, the failback needs none.
  REQUIRE(c.Kill9(Which::kMasterTarget));
  REQUIRE(c.Restart(Which::kMasterTarget));
  auto st = c.CdpctlJson({"status"});
  REQUIRE(st.has_value());
  CHECK(st->at("master_target").at("volumes").at(0).at("failover").at("served") == false);
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
  auto ex = c.CdpctlJson({"export", vol + "@seq:" + std::to_string(last), "--key-file", key_file});
  REQUIRE(ex.has_value());
  auto copy = CopyOut(c, std::string(ex->at("export").as_string()), c.Path("final.img"));
  INFO(copy.output);
  REQUIRE(copy.exit_code == 0);
  CHECK(Sha256File(c.Path("final.img")) == Sha256File(c.source_path()));
}
