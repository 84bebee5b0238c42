// SPDX-License-Identifier: Apache-2.0
// export_bench: read throughput and single-read latency of one NBD export, as
// a remote reader of a recovery point feels them (issue 17; the tables of the
// IBP/LoRS seed, Tables 5/6, and the sequential-read figure of Ringer).
//
// The client is libnbd (the library behind nbdcopy and nbdinfo), one
// connection, one request in flight, simple replies (our server offers only
// those; asking nbdkit for the same keeps the comparison like with like).
// bench/seed_bench.sh runs it against a point-in-time export of the master
// target and against `nbdkit file` on the same image.
//
// Modes (each prints CSV rows to stdout, header first; --label names the
// server in column 1):
//   chunks   for each chunk size C: sequential reads of C bytes from offset 0,
//            wrapping at the end of the export; max(--reads, --bytes / C) reads.
//            label,chunk,reads,seconds,mb_per_s,mean_us,p50_us,p99_us
//   seq      for n = 1..--max_n: the time to read 2^n bytes from a fresh offset
//            (run r starts at r * 4 MiB, wrapping), in requests of at most
//            --request bytes, one after another; mean over --runs runs.
//            label,n,bytes,runs,mean_us,p50_us,p99_us
//   connect  --runs times: TCP connect + STARTTLS + handshake + NBD_OPT_GO,
//            then NBD_CMD_DISC. label,op,runs,mean_us,p50_us,p99_us
//   verify   reads the whole export in 1 MiB requests and compares it with
//            --file; exit status 1 on the first difference. No timing.
//
// TLS (--tls_dir DIR): DIR holds ca-cert.pem, client-cert.pem, client-key.pem
// (libnbd's layout). The server's certificate is checked against the CA; the
// host name is not (we connect the socket ourselves, so the bench can reach a
// server through an emulated WAN at an address its certificate does not name).
//
// Usage: export_bench --host H --port P [--export NAME] [--tls_dir DIR]
//                     [--label L] [--mode chunks|seq|connect|verify]
//                     [--chunks 512,1024,...] [--reads N] [--bytes B]
//                     [--max_n 21] [--runs R] [--request B] [--file F]
//                     [--no_header]
#include <arpa/inet.h>
#include <libnbd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string host = "127.0.0.1";
  int port = 10809;
  std::string export_name;
  std::string tls_dir;
  std::string label = "server";
  std::string mode = "chunks";
  std::vector<uint64_t> chunks;
  uint64_t reads = 1000;
  uint64_t bytes = 32u << 20;
  int max_n = 21;
  int runs = 50;
  uint64_t request = 128u << 10;
  std::string file;
  bool header = true;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "export_bench: %s\n", what.c_str());
  std::exit(2);
}

[[noreturn]] void DieNbd(const std::string& what) { Die(what + ": " + (nbd_get_error() ? nbd_get_error() : "?")); }

uint64_t ParseSize(const std::string& s) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  std::string unit(end ? end : "");
  if (unit.empty()) return v;
  if (unit == "K" || unit == "KiB") return v << 10;
  if (unit == "M" || unit == "MiB") return v << 20;
  if (unit == "G" || unit == "GiB") return v << 30;
  Die("bad size '" + s + "'");
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) Die(k + " needs a value");
      return argv[++i];
    };
    if (k == "--host") a.host = val();
    else if (k == "--port") a.port = std::atoi(val().c_str());
    else if (k == "--export") a.export_name = val();
    else if (k == "--tls_dir") a.tls_dir = val();
    else if (k == "--label") a.label = val();
    else if (k == "--mode") a.mode = val();
    else if (k == "--reads") a.reads = ParseSize(val());
    else if (k == "--bytes") a.bytes = ParseSize(val());
    else if (k == "--max_n") a.max_n = std::atoi(val().c_str());
    else if (k == "--runs") a.runs = std::atoi(val().c_str());
    else if (k == "--request") a.request = ParseSize(val());
    else if (k == "--file") a.file = val();
    else if (k == "--no_header") a.header = false;
    else if (k == "--chunks") {
      std::string s = val();
      for (size_t p = 0; p <= s.size();) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        if (q > p) a.chunks.push_back(ParseSize(s.substr(p, q - p)));
        p = q + 1;
      }
    } else if (k == "--help" || k == "-h") {
      std::printf("usage: see the comment at the top of bench/export_bench.cc\n");
      std::exit(0);
    } else {
      Die("unknown option " + k);
    }
  }
  if (a.chunks.empty()) {
    for (uint64_t c = 512; c <= (1u << 20); c *= 2) a.chunks.push_back(c);
  }
  if (a.runs < 1 || a.max_n < 1 || a.max_n > 40 || a.request == 0) Die("bad --runs, --max_n or --request");
  return a;
}

int Dial(const Args& a) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  const std::string port = std::to_string(a.port);
  if (int e = getaddrinfo(a.host.c_str(), port.c_str(), &hints, &res); e != 0) {
    Die(a.host + ": " + gai_strerror(e));
  }
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) Die("connect " + a.host + ":" + port + ": " + std::strerror(errno));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // as qemu and nbdcopy's TCP transport
  return fd;
}

nbd_handle* Open(const Args& a) {
  nbd_handle* h = nbd_create();
  if (h == nullptr) DieNbd("nbd_create");
  if (nbd_set_export_name(h, a.export_name.c_str()) == -1) DieNbd("export name");
  if (nbd_set_request_structured_replies(h, false) == -1) DieNbd("structured replies");
  if (!a.tls_dir.empty()) {
    if (nbd_set_tls(h, LIBNBD_TLS_REQUIRE) == -1) DieNbd("tls");
    if (nbd_set_tls_certificates(h, a.tls_dir.c_str()) == -1) DieNbd("tls certificates");
    if (nbd_set_tls_verify_peer(h, true) == -1) DieNbd("tls verify peer");
  }
  if (nbd_connect_socket(h, Dial(a)) == -1) DieNbd("connect to " + a.host + ":" + std::to_string(a.port));
  return h;
}

void Close(nbd_handle* h) {
  nbd_shutdown(h, 0);
  nbd_close(h);
}

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct Summary {
  double mean = 0, p50 = 0, p99 = 0;
};

Summary Summarise(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) { return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))]; };
  s.p50 = pct(0.50);
  s.p99 = pct(0.99);
  return s;
}

void Pread(nbd_handle* h, uint8_t* buf, uint64_t len, uint64_t off) {
  if (nbd_pread(h, buf, len, off, 0) == -1) DieNbd("read " + std::to_string(len) + " at " + std::to_string(off));
}

int Chunks(const Args& a) {
  nbd_handle* h = Open(a);
  const int64_t size = nbd_get_size(h);
  if (size <= 0) DieNbd("size");
  if (a.header) std::printf("label,chunk,reads,seconds,mb_per_s,mean_us,p50_us,p99_us\n");
  std::vector<uint8_t> buf;
  for (uint64_t c : a.chunks) {
    if (c > uint64_t(size)) Die("chunk larger than the export");
    buf.resize(c);
    const uint64_t n = std::max<uint64_t>(a.reads, a.bytes / c);
    std::vector<double> lat;
    lat.reserve(n);
    uint64_t off = 0;
    const auto t0 = Clock::now();
    for (uint64_t i = 0; i < n; ++i) {
      if (off + c > uint64_t(size)) off = 0;
      const auto s = Clock::now();
      Pread(h, buf.data(), c, off);
      lat.push_back(Us(Clock::now() - s));
      off += c;
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    Summary s = Summarise(std::move(lat));
    std::printf("%s,%" PRIu64 ",%" PRIu64 ",%.6f,%.3f,%.1f,%.1f,%.1f\n", a.label.c_str(), c, n, secs,
                double(c) * double(n) / secs / 1e6, s.mean, s.p50, s.p99);
    std::fflush(stdout);
  }
  Close(h);
  return 0;
}

int Seq(const Args& a) {
  nbd_handle* h = Open(a);
  const int64_t size = nbd_get_size(h);
  if (size <= 0) DieNbd("size");
  if ((1ull << a.max_n) > uint64_t(size)) Die("2^max_n is larger than the export");
  if (a.header) std::printf("label,n,bytes,runs,mean_us,p50_us,p99_us\n");
  std::vector<uint8_t> buf(a.request);
  for (int n = 1; n <= a.max_n; ++n) {
    const uint64_t total = 1ull << n;
    std::vector<double> lat;
    for (int r = 0; r < a.runs; ++r) {
      uint64_t off = (uint64_t(r) << 22) % (uint64_t(size) - total + 1);
      const auto s = Clock::now();
      for (uint64_t done = 0; done < total;) {
        const uint64_t len = std::min(a.request, total - done);
        Pread(h, buf.data(), len, off + done);
        done += len;
      }
      lat.push_back(Us(Clock::now() - s));
    }
    Summary s = Summarise(std::move(lat));
    std::printf("%s,%d,%" PRIu64 ",%d,%.1f,%.1f,%.1f\n", a.label.c_str(), n, total, a.runs, s.mean, s.p50, s.p99);
    std::fflush(stdout);
  }
  Close(h);
  return 0;
}

int Connect(const Args& a) {
  if (a.header) std::printf("label,op,runs,mean_us,p50_us,p99_us\n");
  std::vector<double> lat;
  for (int r = 0; r < a.runs; ++r) {
    const auto s = Clock::now();
    nbd_handle* h = Open(a);
    lat.push_back(Us(Clock::now() - s));
    Close(h);
  }
  Summary s = Summarise(std::move(lat));
  std::printf("%s,connect,%d,%.1f,%.1f,%.1f\n", a.label.c_str(), a.runs, s.mean, s.p50, s.p99);
  return 0;
}

int Verify(const Args& a) {
  if (a.file.empty()) Die("verify needs --file");
  std::ifstream f(a.file, std::ios::binary);
  if (!f) Die("cannot open " + a.file);
  nbd_handle* h = Open(a);
  const int64_t size = nbd_get_size(h);
  if (size <= 0) DieNbd("size");
  std::vector<uint8_t> got(1u << 20), want(1u << 20);
  for (uint64_t off = 0; off < uint64_t(size); off += got.size()) {
    const uint64_t len = std::min<uint64_t>(got.size(), uint64_t(size) - off);
    Pread(h, got.data(), len, off);
    f.read(reinterpret_cast<char*>(want.data()), std::streamsize(len));
    if (uint64_t(f.gcount()) != len || std::memcmp(got.data(), want.data(), len) != 0) {
      std::fprintf(stderr, "export_bench: %s differs from %s in [%" PRIu64 ", %" PRIu64 ")\n", a.label.c_str(),
                   a.file.c_str(), off, off + len);
      Close(h);
      return 1;
    }
  }
  Close(h);
  std::fprintf(stderr, "export_bench: %s: %" PRId64 " bytes equal to %s\n", a.label.c_str(), size, a.file.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  if (a.mode == "chunks") return Chunks(a);
  if (a.mode == "seq") return Seq(a);
  if (a.mode == "connect") return Connect(a);
  if (a.mode == "verify") return Verify(a);
  Die("unknown --mode " + a.mode);
}
