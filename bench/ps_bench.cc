// SPDX-License-Identifier: Apache-2.0
// ps_bench: the process server's compress-and-ship stage, measured end to end
// in-process: records already durable in a real spool (POSIX env, real files)
// are read, framed, compressed by FrameChannel::Send with the volume's codec,
// throttled (unlimited here) and sent over loopback TCP by the real MtLink to
// a receiving endpoint that does what the master target's network side does
// (handshake, VolumeOpen reply, frame decode + CRC + decompression, Ack) but
// does not apply, so the figures are the process server's alone.
//
// For each compressibility level of loadgen/data.h's generator and each codec it
// prints: MB/s of record data shipped (wall), wire ratio (record data / frame
// bytes), CPU seconds per GB of the process server side (process CPU minus the
// receiver thread's CPU), and the zstd -1 / lz4 -1 command-line ratio on the
// same bytes.
//
//   ps_bench [--mib N] [--frame-kib K] [--dir DIR]
// (N MiB of data per run, default 256; frames of K KiB of records, default 1024)
#include <sys/resource.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "common/base/log.h"
#include "common/env/subprocess.h"
#include "common/wire/channel.h"
#include "loadgen/data.h"
#include "process-server/mt_link.h"
#include "process-server/process_server.h"
#include "process-server/spooled_volume.h"

namespace {

using namespace std::chrono_literals;
constexpr const char* kSecret = "bench-secret-bench-secret-bench";

double ProcessCpu() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

double ThreadCpu() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

// The receiving end: accepts one connection and acknowledges every batch.
class Receiver {
 public:
  Receiver() : acceptor_(io_, {boost::asio::ip::make_address("127.0.0.1"), 0}) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Receiver() {
    if (ch_) ch_->Close();
    thread_.join();
  }
  uint16_t port() const { return acceptor_.local_endpoint().port(); }
  double cpu() const { return cpu_.load(); }
  void Close() {
    std::shared_ptr<cdp::FrameChannel> c = ch_;
    if (c) c->Close();
  }

 private:
  void Run() {
    boost::asio::ip::tcp::socket s(io_);
    acceptor_.accept(s);
    double t0 = ThreadCpu();
    auto ch = cdp::FrameChannel::Adopt(std::move(s));
    if (!ch.ok()) return;
    ch_ = std::shared_ptr<cdp::FrameChannel>(std::move(*ch));
    auto t = cdp::ServerHandshake(
        *ch_, [](const std::string&) -> std::optional<std::string> { return std::string(kSecret); }, 10s);
    if (!t.ok()) return;
    for (;;) {
      auto m = ch_->Receive(1000ms);
      if (!m.ok()) {
        if (m.status().IsBusy()) continue;
        break;
      }
      if (std::holds_alternative<cdp::proto::VolumeOpen>(*m)) {
        cdp::proto::VolumeOpenReply r;
        r.volume_id = 1;
        (void)ch_->Send(r);
      } else if (auto* b = std::get_if<cdp::proto::WriteBatch>(&*m)) {
        cdp::proto::Ack a;
        a.volume_id = b->volume_id;
        a.durable_seq = b->records.back().seq;
        (void)ch_->Send(a);
      }
      cpu_.store(ThreadCpu() - t0);
    }
    cpu_.store(ThreadCpu() - t0);
  }
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::shared_ptr<cdp::FrameChannel> ch_;
  std::atomic<double> cpu_{0};
  std::thread thread_;
};

uint64_t CliSize(const std::string& cmd) {
  auto r = cdp::RunCommand({"sh", "-c", cmd}, std::chrono::minutes(2));
  if (!r.ok() || r->exit_code != 0) return 0;
  return std::strtoull(r->output.c_str(), nullptr, 10);
}

// Intake: an agent connection streams 1 MiB batches (codec none on the wire,
// `window` batches in flight) into a real ProcessServer whose spool is on the
// POSIX env; every batch is acknowledged only after its group commit. The
// master target is absent (its port refuses), so nothing is shipped.
void RunIntake(const std::string& dir, uint64_t mib, int window) {
  cdp::Env* env = cdp::DefaultEnv();
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor closed(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  uint16_t dead_port = closed.local_endpoint().port();
  closed.close();
  std::string sdir = dir + "/intake_spool";
  (void)cdp::RunCommand({"rm", "-rf", sdir}, std::chrono::minutes(2));
  cdp::ps::ProcessServerOptions o;
  o.env = env;
  o.clock = cdp::SystemClock::Get();
  o.listen = {"127.0.0.1", 0};
  o.control = {};  // off
  o.mt.port = dead_port;
  o.mt_open_wait_ms = 10;
  o.mt_link.backoff_min_ms = 1000;
  o.tenants = {{"bench", kSecret}};
  o.spool_dir = sdir;
  cdp::ps::ProcessServer ps(o);
  if (!ps.Start().ok()) return;
  auto ch = cdp::Connect("127.0.0.1", ps.agent_port(), 5s);
  if (!ch.ok() || !cdp::ClientHandshake(**ch, cdp::proto::Role::kAgent, "bench", "bench-agent", kSecret, 5s).ok()) return;
  cdp::proto::VolumeOpen open;
  open.name = "intake";
  open.size = (mib + 1) << 20;
  (void)(*ch)->Send(open);
  auto rep = (*ch)->Receive(10s);
  if (!rep.ok()) return;
  uint32_t id = std::get<cdp::proto::VolumeOpenReply>(*rep).volume_id;
  cdp::loadgen::DataMix mix;
  mix.seed = 7;
  cdp::loadgen::DataGenerator gen(mix);
  std::vector<cdp::proto::WriteBatch> batches;
  for (uint64_t i = 0; i < mib; ++i) batches.push_back(cdp::loadgen::MakeWriteBatch(gen, id, 1 + i * 256, i << 20, 256));
  double cpu0 = ProcessCpu(), tcpu0 = ThreadCpu();
  auto t0 = std::chrono::steady_clock::now();
  size_t sent = 0, acked = 0;
  while (acked < batches.size()) {
    while (sent < batches.size() && sent - acked < size_t(window)) (void)(*ch)->Send(batches[sent++]);
    auto m = (*ch)->Receive(30s);
    if (!m.ok() || !std::holds_alternative<cdp::proto::Ack>(*m)) {
      std::fprintf(stderr, "intake: unexpected reply\n");
      return;
    }
    acked++;
  }
  auto t1 = std::chrono::steady_clock::now();
  double ps_cpu = (ProcessCpu() - cpu0) - (ThreadCpu() - tcpu0);
  double secs = std::chrono::duration<double>(t1 - t0).count();
  auto vols = ps.VolumesJson();
  uint64_t syncs = vols.as_object()["volumes"].as_array()[0].as_object()["spool_syncs"].to_number<uint64_t>();
  double gb = double(mib << 20) / 1e9;
  std::printf("| intake, window %d | %.0f | %.0f | %.2f | %llu batches, %llu fdatasyncs |\n", window,
              double(mib << 20) / 1e6 / secs, gb * 1000 / ps_cpu, ps_cpu / gb, (unsigned long long)batches.size(),
              (unsigned long long)syncs);
  std::fflush(stdout);
  ps.Stop();
  (void)cdp::RunCommand({"rm", "-rf", sdir}, std::chrono::minutes(2));
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t mib = 256;
  uint64_t frame_kib = 1024;
  std::string dir = "/tmp/ps_bench";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--mib")) mib = std::stoull(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dir")) dir = argv[i + 1];
    else if (!std::strcmp(argv[i], "--frame-kib")) frame_kib = std::stoull(argv[i + 1]);
  }
  cdp::log::Options lo;
  lo.level = "error";
  (void)cdp::log::Init(lo);
  cdp::Env* env = cdp::DefaultEnv();
  (void)env->CreateDirs(dir);

  struct CodecCase {
    const char* name;
    cdp::proto::Codec codec;
    int level;
  };
  const CodecCase codecs[] = {{"none", cdp::proto::Codec::kNone, 0},
                              {"lz4", cdp::proto::Codec::kLz4, 0},
                              {"zstd-1", cdp::proto::Codec::kZstd, 1},
                              {"zstd-3", cdp::proto::Codec::kZstd, 3}};
  std::printf("| stage | MB/s (wall) | MB per PS CPU-s | PS CPU s/GB | notes |\n|---|---:|---:|---:|---|\n");
  for (int window : {1, 8}) RunIntake(dir, std::min<uint64_t>(mib, 128), window);
  std::printf("\n");
  const double levels[] = {0.25, 0.75, 0.95};
  const size_t kRecords = 256;  // 1 MiB batches of 4 KiB records

  std::printf("| compressibility | codec | ship MB/s (wall) | MB per PS CPU-s | PS CPU s/GB | ratio (ours) | CLI zstd -1 | CLI zstd -3 | CLI lz4 -1 |\n");
  std::printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (double c : levels) {
    cdp::loadgen::DataMix mix;
    mix.compressibility = c;
    mix.seed = 42;
    // The raw bytes, once, for the command-line compressors.
    std::string sample = dir + "/data_" + std::to_string(int(c * 100)) + ".bin";
    {
      cdp::loadgen::DataGenerator gen(mix);
      std::ofstream out(sample, std::ios::binary | std::ios::trunc);
      for (uint64_t i = 0; i < mib; ++i) {
        cdp::Bytes b = gen.Generate(1 << 20);
        out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
      }
    }
    uint64_t raw_total = mib << 20;
    uint64_t cli_zstd = CliSize("zstd -q -1 -c " + sample + " | wc -c");
    uint64_t cli_zstd3 = CliSize("zstd -q -3 -c " + sample + " | wc -c");
    uint64_t cli_lz4 = CliSize("lz4 -q -1 -c " + sample + " | wc -c");

    for (const CodecCase& cc : codecs) {
      std::string vdir = dir + "/spool_" + std::to_string(int(c * 100)) + "_" + cc.name;
      if (env->Exists(vdir)) {
        auto names = env->ListDir(vdir);
        if (names.ok())
          for (auto& n : *names) (void)env->Remove(cdp::JoinPath(vdir, n));
      }
      cdp::ps::SpoolOptions so;
      so.env = env;
      so.clock = cdp::SystemClock::Get();
      so.dir = vdir;
      so.segment_bytes = 64u << 20;
      cdp::proto::VolumeOpen open;
      open.name = "bench";
      open.size = (mib + 1) << 20;
      auto vol = cdp::ps::SpooledVolume::Open(so, "bench", &open, cc.codec, cc.level);
      if (!vol.ok()) {
        std::fprintf(stderr, "volume: %s\n", vol.status().ToString().c_str());
        return 1;
      }
      cdp::loadgen::DataGenerator gen(mix);
      uint64_t seq = 1;
      for (uint64_t i = 0; i < mib; ++i) {
        cdp::proto::WriteBatch b = cdp::loadgen::MakeWriteBatch(gen, 1, seq, (seq - 1) * 4096, kRecords);
        auto r = (*vol)->spool().Append(std::move(b.records));
        if (!r.status.ok()) {
          std::fprintf(stderr, "append: %s\n", r.status.ToString().c_str());
          return 1;
        }
        seq += kRecords;
      }
      uint64_t last = seq - 1;

      Receiver rx;
      cdp::ps::MtLinkOptions lo2;
      lo2.clock = cdp::SystemClock::Get();
      lo2.link.peer.host = "127.0.0.1";
      lo2.link.peer.port = rx.port();
      lo2.link.tenant = "bench";
      lo2.link.secret = kSecret;
      lo2.link.client_id = "bench-ps";  // LinkOptions has no default (f292754): the handshake refuses ""
      lo2.link.frame_bytes = frame_kib << 10;
      lo2.link.max_inflight = 8;
      cdp::ps::MtLink link(lo2);
      link.AddVolume(vol->get());
      double cpu0 = ProcessCpu();
      auto t0 = std::chrono::steady_clock::now();
      link.Start();
      while ((*vol)->counters().mt_acked.load() < last) std::this_thread::sleep_for(1ms);
      auto t1 = std::chrono::steady_clock::now();
      double cpu1 = ProcessCpu();
      link.Stop();
      rx.Close();
      double secs = std::chrono::duration<double>(t1 - t0).count();
      const cdp::ps::VolumeCounters& k = (*vol)->counters();
      double ratio = double(raw_total) / double(k.wire_out.load());
      double ps_cpu = (cpu1 - cpu0) - rx.cpu();
      auto ratio_of = [&](uint64_t n) { return n ? double(raw_total) / double(n) : 0.0; };
      double gb = double(raw_total) / 1e9;
      std::printf("| %.2f | %s | %.0f | %.0f | %.2f | %.3f | %.3f | %.3f | %.3f |\n", c, cc.name,
                  double(raw_total) / 1e6 / secs, gb * 1000 / ps_cpu, ps_cpu / gb, ratio, ratio_of(cli_zstd),
                  ratio_of(cli_zstd3), ratio_of(cli_lz4));
      std::fflush(stdout);
      auto names = env->ListDir(vdir);
      if (names.ok())
        for (auto& n : *names) (void)env->Remove(cdp::JoinPath(vdir, n));
    }
    (void)env->Remove(sample);
  }
  return 0;
}
