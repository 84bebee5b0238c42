// SPDX-License-Identifier: Apache-2.0
// cdp-loadgen: the change-rate tool operators use to size WAN links.
// Subcommands: tree, churn, plan, record, profile (loadgen/device_profile.h), sweep, wanem (loadgen/wanem.cc), cluster
// (loadgen/cluster_cli.cc); docs/loadgen.md.
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <boost/json.hpp>

#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/base/version.h"
#include "common/daemon/config.h"
#include "common/env/env.h"
#include "common/http/control_token.h"
#include "loadgen/churn.h"
#include "loadgen/cli.h"
#include "loadgen/data.h"
#include "loadgen/local_cluster.h"
#include "loadgen/device_profile.h"
#include "loadgen/plan.h"
#include "loadgen/profile.h"
#include "loadgen/scrape.h"
#include "loadgen/sweep.h"
#include "loadgen/sweep_run.h"
#include "loadgen/tree.h"
#include "loadgen/wanem.h"

namespace po = boost::program_options;
using namespace cdp;
using namespace cdp::loadgen;

namespace cdp::loadgen {

int Load(int argc, char** argv, const po::options_description& desc, const std::string& summary, LoadedConfig* out) {
  ConfigOptions co;
  co.program = std::string("cdp-loadgen ") + argv[0];
  co.summary = summary;
  auto r = LoadConfig(argc, argv, desc, co);
  if (!r.ok()) {
    std::cerr << "cdp-loadgen " << argv[0] << ": " << r.status().message() << "\n";
    return 2;
  }
  if (const std::string* answer = r->Answer()) {
    std::cout << *answer;
    return 0;
  }
  *out = std::move(*r);
  return -1;
}

int Fail(const char* cmd, const Status& s) {
  std::cerr << "cdp-loadgen " << cmd << ": " << s.ToString() << "\n";
  return 1;
}

}  // namespace cdp::loadgen

namespace {

constexpr const char* kUsage =
    "usage: cdp-loadgen <command> [options]   (cdp-loadgen <command> --help for its options)\n"
    "  tree    write or verify a deterministic tree of files (the seed's GenerateTestTree)\n"
    "  churn   hold a change rate against an NBD export or a file\n"
    "  plan    WAN sizing report from a churn profile (CSV)\n"
    "  record  poll a daemon's /metrics counter into a churn profile CSV\n"
    "  profile profile block devices' churn from the kernel (tracefs) into a churn profile CSV\n"
    "  sweep   the seed's experiment against running daemons: tables (Markdown, CSV) and SVG charts\n"
    "  wanem   emulated WAN between two network namespaces (root): up, down\n"
    "  cluster the whole product on loopback (the local cluster of make demo) until SIGTERM\n";

// "30" -> 30 s; otherwise the Duration syntax ("30s", "2m").
Result<Duration> SecondsOrDuration(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("0123456789.") == std::string::npos) return ParseDuration(s + "s");
  return ParseDuration(s);
}

void Sleep(uint64_t micros) { std::this_thread::sleep_for(std::chrono::microseconds(micros)); }


TreeOptions TreeOpts(const po::variables_map& vm) {
  TreeOptions t;
  t.size_bytes = uint64_t(vm["size-mb"].as<double>() * 1024 * 1024);
  t.seed = vm["seed"].as<uint64_t>();
  t.compressibility = vm["compressibility"].as<double>();
  t.fanout = vm["fanout"].as<uint32_t>();
  t.depth = vm["depth"].as<uint32_t>();
  t.sync = vm["sync"].as<bool>();
  return t;
}

int CmdTree(int argc, char** argv) {
  po::options_description d("tree options");
  d.add_options()("mode", po::value<std::string>()->required(), "write | verify (or the seed's 0 | 1)")(
      "size-mb", po::value<double>()->required(), "total size of the files, MiB (the seed's <size MB>)")(
      "seed", po::value<uint64_t>()->default_value(8), "random seed (layout and content)")(
      "dir", po::value<std::string>()->required(), "destination directory")(
      "compressibility", po::value<double>()->default_value(0.75), "share of non-random blocks, 0..1")(
      "fanout", po::value<uint32_t>()->default_value(8), "directories per level")(
      "depth", po::value<uint32_t>()->default_value(2), "directory levels")(
      "sync", po::value<bool>()->default_value(false)->implicit_value(true), "fsync every file after writing it");
  LoadedConfig cfg;
  if (int rc = Load(argc, argv, d, "Write or verify a deterministic tree of files (GenerateTestTree).", &cfg); rc >= 0)
    return rc;
  const auto& vm = cfg.vars;
  std::string mode = vm["mode"].as<std::string>();
  if (mode == "0") mode = "write";
  if (mode == "1") mode = "verify";
  TreeOptions t = TreeOpts(vm);
  std::string dir = vm["dir"].as<std::string>();
  Env* env = DefaultEnv();
  auto* clock = SystemClock::Get();
  uint64_t t0 = clock->NowMicros();
  if (mode == "write") {
    auto r = WriteTree(env, dir, t);
    if (!r.ok()) return Fail("tree", r.status());
    double s = double(clock->NowMicros() - t0) / 1e6;
    std::printf("wrote %llu files in %llu directories, %llu bytes, under %s in %.3f s (%.2f MB/s)\n",
                (unsigned long long)r->files, (unsigned long long)r->dirs, (unsigned long long)r->bytes, dir.c_str(),
                s, s > 0 ? double(r->bytes) / s / 1e6 : 0.0);
    return 0;
  }
  if (mode != "verify") return Fail("tree", Status::InvalidArgument("--mode must be write or verify"));
  auto r = VerifyTree(env, dir, t);
  if (!r.ok()) return Fail("tree", r.status());
  for (const auto& m : r->missing) std::printf("MISSING %s\n", m.c_str());
  for (const auto& m : r->mismatched) std::printf("MISMATCH %s\n", m.c_str());
  for (const auto& m : r->unexpected) std::printf("UNEXPECTED %s\n", m.c_str());
  std::printf("verified %llu files, %llu bytes: %s (%zu missing, %zu mismatched, %zu unexpected)\n",
              (unsigned long long)r->files_checked, (unsigned long long)r->bytes_checked, r->ok() ? "OK" : "FAILED",
              r->missing.size(), r->mismatched.size(), r->unexpected.size());
  return r->ok() ? 0 : 1;
}

int CmdChurn(int argc, char** argv) {
  po::options_description d("churn options");
  d.add_options()("target", po::value<std::string>()->required(), "nbd://HOST:PORT/EXPORT, nbd+unix:///EXPORT?socket=PATH or a file path")(
      "rate", po::value<double>()->required(), "change rate, MB/s (10^6 bytes)")(
      "duration", po::value<std::string>()->default_value("10"), "seconds, or a duration (\"2m\")")(
      "pattern", po::value<std::string>()->default_value("seq"), "seq | random | zipf:THETA")(
      "io-size", po::value<ByteSize>()->default_value(ByteSize{65536}), "bytes per write")(
      "compressibility", po::value<double>()->default_value(0.75), "share of non-random blocks, 0..1")(
      "seed", po::value<uint64_t>()->default_value(1), "random seed")(
      "size", po::value<ByteSize>()->default_value(ByteSize{0}), "file target: create/extend to this size")(
      "flush-every", po::value<ByteSize>()->default_value(ByteSize{64ull << 20}), "flush after this many bytes (0: at the end)")(
      "json", po::value<bool>()->default_value(false)->implicit_value(true), "print the result as JSON");
  LoadedConfig cfg;
  if (int rc = Load(argc, argv, d, "Hold a change rate against a volume and report the rate achieved.", &cfg); rc >= 0)
    return rc;
  const auto& vm = cfg.vars;
  ChurnOptions o;
  o.rate_bytes_per_sec = vm["rate"].as<double>() * 1e6;
  auto dur = SecondsOrDuration(vm["duration"].as<std::string>());
  if (!dur.ok()) return Fail("churn", dur.status());
  o.duration_us = dur->micros;
  auto pat = ParsePattern(vm["pattern"].as<std::string>());
  if (!pat.ok()) return Fail("churn", pat.status());
  o.pattern = *pat;
  uint64_t io = vm["io-size"].as<ByteSize>().bytes;
  if (io == 0 || io > (32u << 20)) return Fail("churn", Status::InvalidArgument("--io-size must be 1 B..32 MiB"));
  o.io_size = uint32_t(io);
  o.compressibility = vm["compressibility"].as<double>();
  o.seed = vm["seed"].as<uint64_t>();
  o.flush_every_bytes = vm["flush-every"].as<ByteSize>().bytes;
  const bool json = vm["json"].as<bool>();
  if (!json)
    o.progress = [](uint64_t us, uint64_t bytes) {
      std::fprintf(stderr, "  %6.1f s  %10.1f MB  %8.2f MB/s\n", double(us) / 1e6, double(bytes) / 1e6,
                   double(bytes) / double(us));
    };
  std::string spec = vm["target"].as<std::string>();
  auto target = OpenTarget(DefaultEnv(), spec, vm["size"].as<ByteSize>().bytes);
  if (!target.ok()) return Fail("churn", target.status());
  auto r = RunChurn(target->get(), o, SystemClock::Get(), Sleep);
  Status cs = (*target)->Close();
  if (!r.ok()) return Fail("churn", r.status());
  if (!cs.ok()) return Fail("churn", cs);
  double achieved = r->achieved_bytes_per_sec();
  if (json) {
    boost::json::object j{{"target", spec},
                          {"target_MBps", o.rate_bytes_per_sec / 1e6},
                          {"achieved_MBps", achieved / 1e6},
                          {"bytes", r->bytes},
                          {"ops", r->ops},
                          {"flushes", r->flushes},
                          {"seconds", double(r->elapsed_us) / 1e6}};
    std::cout << boost::json::serialize(j) << "\n";
  } else {
    std::printf("wrote %.1f MB in %llu ops to %s in %.3f s: achieved %.3f MB/s (target %.3f MB/s, %+.2f%%), %llu flushes\n",
                double(r->bytes) / 1e6, (unsigned long long)r->ops, spec.c_str(), double(r->elapsed_us) / 1e6,
                achieved / 1e6, o.rate_bytes_per_sec / 1e6, (achieved / o.rate_bytes_per_sec - 1) * 100,
                (unsigned long long)r->flushes);
  }
  return 0;
}

Result<std::vector<double>> ParseRpoList(const std::string& s) {
  std::vector<double> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t c = s.find(',', pos);
    std::string item = s.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
    CDP_ASSIGN_OR_RETURN(Duration d, ParseDuration(item));
    if (d.micros == 0) return Status::InvalidArgument("RPO must be > 0: '" + item + "'");
    out.push_back(double(d.micros) / 1e6);
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  return out;
}

int CmdPlan(int argc, char** argv) {
  po::options_description d("plan options");
  d.add_options()("profile", po::value<std::string>()->required(), "churn profile CSV (timestamp,bytes[,seconds])")(
      "compression", po::value<std::string>()->default_value("1"), "ratio (raw/shipped) or 'measured'")(
      "compressibility", po::value<double>()->default_value(0.75), "measured: data mix of the generated sample")(
      "sample", po::value<std::string>()->default_value(""), "measured: compress this file instead (first 64 MiB)")(
      "level", po::value<int>()->default_value(3), "measured: zstd level (the process server's)")(
      "rpo", po::value<std::string>()->default_value("15m,30m,60m"), "RPO targets")(
      "link", po::value<double>(), "link bandwidth, Mbit/s: report the achievable RPO")(
      "growth", po::value<double>()->default_value(0.0), "plan for this much more churn (0.3 = 30%)")(
      "percentile", po::value<double>()->default_value(95), "also size for the RPO met this % of the time")(
      "outage-hours", po::value<double>()->default_value(4), "process-server cache for an outage this long")(
      "retention", po::value<Duration>()->default_value(Duration{86400ull * 1000000}), "journal retention window")(
      "format", po::value<std::string>()->default_value("md"), "md | json");
  LoadedConfig cfg;
  if (int rc = Load(argc, argv, d, "WAN sizing report from a churn profile.", &cfg); rc >= 0) return rc;
  const auto& vm = cfg.vars;
  Env* env = DefaultEnv();
  auto text = ReadWholeFile(env, vm["profile"].as<std::string>());
  if (!text.ok()) return Fail("plan", text.status());
  auto prof = ParseProfileCsv(std::string_view(reinterpret_cast<const char*>(text->data()), text->size()));
  if (!prof.ok()) return Fail("plan", prof.status());
  PlanOptions o;
  std::string comp = vm["compression"].as<std::string>();
  if (comp == "measured") {
    Bytes data;
    std::string sample = vm["sample"].as<std::string>();
    char src[256];
    if (!sample.empty()) {
      OpenOptions oo;
      oo.read_only = true;
      auto f = env->Open(sample, oo);
      if (!f.ok()) return Fail("plan", f.status());
      data.resize(64u << 20);
      auto n = (*f)->ReadUpTo(0, data.size(), data.data());
      if (!n.ok()) return Fail("plan", n.status());
      data.resize(*n);
      std::snprintf(src, sizeof(src), "measured: zstd -%d on %zu bytes of %s", vm["level"].as<int>(), data.size(),
                    sample.c_str());
    } else {
      loadgen::DataMix mix;
      mix.compressibility = vm["compressibility"].as<double>();
      loadgen::DataGenerator gen(mix);
      data = gen.Generate(32u << 20);
      std::snprintf(src, sizeof(src), "measured: zstd -%d on 32 MiB of generated data, compressibility %g",
                    vm["level"].as<int>(), mix.compressibility);
    }
    auto ratio = MeasureCompressionRatio(data, vm["level"].as<int>());
    if (!ratio.ok()) return Fail("plan", ratio.status());
    o.compression = *ratio;
    o.compression_source = src;
  } else {
    char* end = nullptr;
    o.compression = std::strtod(comp.c_str(), &end);
    if (comp.empty() || *end != '\0') return Fail("plan", Status::InvalidArgument("--compression: a ratio or 'measured'"));
  }
  auto rpo = ParseRpoList(vm["rpo"].as<std::string>());
  if (!rpo.ok()) return Fail("plan", rpo.status());
  o.rpo_s = *rpo;
  if (vm.count("link")) o.link_bytes_per_s = vm["link"].as<double>() * 1e6 / 8;
  o.growth = vm["growth"].as<double>();
  o.percentile = vm["percentile"].as<double>();
  o.outage_hours = vm["outage-hours"].as<double>();
  o.retention_s = double(vm["retention"].as<Duration>().micros) / 1e6;
  auto rep = MakePlan(*prof, o);
  if (!rep.ok()) return Fail("plan", rep.status());
  std::string fmt = vm["format"].as<std::string>();
  if (fmt == "json") std::cout << boost::json::serialize(RenderPlanJson(*rep)) << "\n";
  else if (fmt == "md") std::cout << RenderPlanMarkdown(*rep);
  else return Fail("plan", Status::InvalidArgument("--format must be md or json"));
  return 0;
}

// Where record's and profile's CSV goes: a file (created or truncated) or,
// for "", standard output (flushed line by line, for a pipe).
class CsvOut {
 public:
  Status Open(const std::string& path) {
    if (path.empty()) return Status::OK();
    OpenOptions oo;
    oo.create = true;
    oo.truncate = true;
    CDP_ASSIGN_OR_RETURN(file_, DefaultEnv()->Open(path, oo));
    return Status::OK();
  }
  Status Emit(const std::string& text) {
    if (!file_) {
      std::cout << text << std::flush;
      return Status::OK();
    }
    return file_->Append(ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  }
  Status Sync() { return file_ ? file_->Sync() : Status::OK(); }

 private:
  std::unique_ptr<File> file_;
};

int CmdRecord(int argc, char** argv) {
  po::options_description d("record options");
  d.add_options()("url", po::value<std::string>()->required(), "metrics URL, e.g. https://127.0.0.1:9100/metrics (CDP_TLS_CA: the site CA)")(
      "metric", po::value<std::string>()->default_value("cdp_agent_captured_bytes_total"), "counter to record")(
      "interval", po::value<Duration>()->default_value(Duration{10'000'000}), "polling interval")(
      "samples", po::value<uint64_t>()->default_value(360), "number of intervals to record")(
      "out", po::value<std::string>()->default_value(""), "CSV file (default: standard output)");
  LoadedConfig cfg;
  if (int rc = Load(argc, argv, d, "Record a churn profile from a daemon's /metrics.", &cfg); rc >= 0) return rc;
  const auto& vm = cfg.vars;
  auto url = ParseHttpUrl(vm["url"].as<std::string>());
  if (!url.ok()) return Fail("record", url.status());
  // The daemon's control token, from CDP_TOKEN or CDP_TOKEN_FILE (common/http/control_token.h).
  auto token = ClientToken("");
  if (!token.ok()) return Fail("record", token.status());
  url->token = *token;
  if (const char* ca = std::getenv("CDP_TLS_CA"); ca != nullptr) url->tls_ca = ca;  // https: the site CA
  const std::string metric = vm["metric"].as<std::string>();
  const uint64_t interval = vm["interval"].as<Duration>().micros;
  if (interval == 0) return Fail("record", Status::InvalidArgument("--interval must be > 0"));
  const uint64_t samples = vm["samples"].as<uint64_t>();
  CsvOut csv;
  if (Status s = csv.Open(vm["out"].as<std::string>()); !s.ok()) return Fail("record", s);
  auto emit = [&](const std::string& line) { return csv.Emit(line); };
  if (Status s = emit("timestamp,bytes,seconds\n"); !s.ok()) return Fail("record", s);
  auto* clock = SystemClock::Get();
  std::vector<CounterReading> readings;
  uint64_t next = clock->NowMicros();
  while (readings.size() < samples + 1) {
    auto m = Scrape(*url);
    if (!m.ok()) return Fail("record", m.status());
    auto it = m->find(metric);
    if (it == m->end()) return Fail("record", Status::NotFound(metric + " not exported by " + vm["url"].as<std::string>()));
    readings.push_back({double(clock->WallMicros()) / 1e6, it->second});
    if (readings.size() >= 2) {
      Profile p = ProfileFromReadings({readings[readings.size() - 2], readings.back()});
      std::string csv = FormatProfileCsv(p);
      if (Status s = emit(csv.substr(csv.find('\n') + 1)); !s.ok()) return Fail("record", s);
    }
    next += interval;
    uint64_t now = clock->NowMicros();
    if (readings.size() < samples + 1 && next > now) Sleep(next - now);
  }
  if (Status s = csv.Sync(); !s.ok()) return Fail("record", s);
  return 0;
}


Result<std::vector<uint64_t>> ParseSizes(const std::string& s) {
  std::vector<uint64_t> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t c = s.find(',', pos);
    std::string item = s.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
    char* end = nullptr;
    unsigned long long v = std::strtoull(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v == 0 || v > 65536) return Status::InvalidArgument("bad size '" + item + "' in --sizes");
    out.push_back(v);
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  return out;
}

Status WriteOut(Env* env, const std::string& dir, const std::string& name, const std::string& text) {
  return WriteFileAtomic(env, JoinPath(dir, name), ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

// Renders every table and chart of the samples; writes them under `out` when set.
Result<std::string> RenderSweep(const std::vector<SweepSample>& samples, double mhz, const std::string& out, Env* env) {
  std::vector<SweepRow> off, on;
  for (const auto& s : samples) {
    CDP_ASSIGN_OR_RETURN(SweepRow r, ComputeRow(s, mhz));
    (r.compression ? on : off).push_back(r);
  }
  char head[160];
  std::snprintf(head, sizeof(head), "Core clock %.0f MHz (CPU MHz = CPU seconds per second x core clock).\n\n", mhz);
  std::string md = "# Sweep results\n\n" + std::string(head);
  if (!off.empty())
    md += "## Summary of results with compression disabled (Figure A-2)\n\n" + SeedTableMarkdown(off) +
          "\nCPU seconds per GB of change:\n\n" + CpuPerGbMarkdown(off) + "\n";
  if (!on.empty())
    md += "## Summary of results with compression enabled (Figure A-5)\n\n" + SeedTableMarkdown(on) +
          "\nCPU seconds per GB of change:\n\n" + CpuPerGbMarkdown(on) + "\n";
  if (!off.empty() && !on.empty())
    md += "## Table A-1: process server CPU cost of compression\n\n" + ComparisonMarkdown(off, on, false) +
          "\n## Table A-2: master target CPU cost of compression\n\n" + ComparisonMarkdown(off, on, true) + "\n";
  if (!out.empty()) {
    CDP_RETURN_IF_ERROR(env->CreateDirs(out));
    CDP_RETURN_IF_ERROR(WriteOut(env, out, "sweep.md", md));
    CDP_RETURN_IF_ERROR(WriteOut(env, out, "samples.json", boost::json::serialize(SamplesToJson(samples, mhz)) + "\n"));
    for (auto* rows : {&off, &on}) {
      if (rows->empty()) continue;
      std::string tag = rows == &off ? "off" : "on";
      std::string what = rows == &off ? "Compression Disabled" : "Compression Enabled";
      CDP_RETURN_IF_ERROR(WriteOut(env, out, "compression_" + tag + ".csv", SeedTableCsv(*rows)));
      CDP_RETURN_IF_ERROR(WriteOut(env, out, "cpu_" + tag + ".svg",
                                   CpuChartSvg(*rows, "CPU Utilization vs Primary VM Disk Write Rate (" + what + ")")));
      CDP_RETURN_IF_ERROR(WriteOut(env, out, "bandwidth_" + tag + ".svg",
                                   BandwidthChartSvg(*rows, "Bandwidth vs Primary VM Disk Write Rate (" + what + ")")));
    }
    if (!off.empty() && !on.empty()) {
      CDP_RETURN_IF_ERROR(WriteOut(env, out, "table_a1_ps.csv", ComparisonCsv(off, on, false)));
      CDP_RETURN_IF_ERROR(WriteOut(env, out, "table_a2_mt.csv", ComparisonCsv(off, on, true)));
    }
  }
  return md;
}

volatile std::sig_atomic_t g_profile_stop = 0;

int CmdProfile(int argc, char** argv) {
  po::options_description d("profile options");
  d.add_options()("device", po::value<std::vector<std::string>>()->required(), "block device to profile (repeatable)")(
      "interval", po::value<Duration>()->default_value(Duration{10'000'000}), "length of one row")(
      "duration", po::value<Duration>()->default_value(Duration{3600'000'000}), "how long to profile (24h for a day)")(
      "source", po::value<std::string>()->default_value("auto"), "auto | tracefs | diskstats")(
      "buffer-kb", po::value<uint32_t>()->default_value(4096), "tracing ring buffer per CPU, KiB")(
      "out", po::value<std::string>()->default_value(""), "CSV file (default: standard output)");
  LoadedConfig cfg;
  if (int rc = Load(argc, argv, d, "Profile the churn of block devices from the kernel (read-only).", &cfg); rc >= 0)
    return rc;
  const auto& vm = cfg.vars;
  DeviceProfileOptions o;
  o.devices = vm["device"].as<std::vector<std::string>>();
  const std::string src = vm["source"].as<std::string>();
  if (src == "tracefs") o.source = DeviceProfileOptions::Source::kTracefs;
  else if (src == "diskstats") o.source = DeviceProfileOptions::Source::kDiskstats;
  else if (src != "auto") return Fail("profile", Status::InvalidArgument("--source must be auto, tracefs or diskstats"));
  o.buffer_kb = vm["buffer-kb"].as<uint32_t>();
  // SIGINT/SIGTERM end the profile early: the last row and the summary are
  // written, and the tracing instance is removed.
  o.stop = &g_profile_stop;
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_profile_stop = 1; };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  if (o.buffer_kb == 0) return Fail("profile", Status::InvalidArgument("--buffer-kb must be > 0"));
  const uint64_t interval = vm["interval"].as<Duration>().micros;
  const uint64_t duration = vm["duration"].as<Duration>().micros;
  if (interval < 1000) return Fail("profile", Status::InvalidArgument("--interval must be at least 1ms"));
  const uint64_t rows = std::max<uint64_t>(1, duration / interval);
  auto prof = DeviceProfiler::Start(o);
  if (!prof.ok()) return Fail("profile", prof.status());
  DeviceProfiler& p = **prof;
  CsvOut csv;
  if (Status s = csv.Open(vm["out"].as<std::string>()); !s.ok()) return Fail("profile", s);
  auto emit = [&](const std::string& line) { return csv.Emit(line); };
  std::string head = "# cdp-loadgen profile: source " + p.source() + "; devices";
  for (size_t i = 0; i < o.devices.size(); ++i) head += " " + p.names()[i] + " (" + o.devices[i] + ")";
  head += "\ntimestamp,bytes,seconds,unique_bytes,lost_events";
  for (const std::string& n : p.names()) head += ",bytes:" + n + ",unique_bytes:" + n;
  if (Status s = emit(head + "\n"); !s.ok()) return Fail("profile", s);
  auto* clock = SystemClock::Get();
  uint64_t lost = 0;
  for (uint64_t r = 0; r < rows; ++r) {
    const double start = double(clock->WallMicros()) / 1e6;
    const uint64_t t0 = clock->NowMicros();
    auto iv = p.Collect(std::chrono::milliseconds(interval / 1000));
    if (!iv.ok()) return Fail("profile", iv.status());
    // A stop (SIGTERM) right at the start of an interval ends it at once:
    // its row lasts at least the 1 ms the CSV can say (never 0, which no
    // profile may hold), and keeps what was drained.
    const double secs = std::max(0.001, double(clock->NowMicros() - t0) / 1e6);
    uint64_t bytes = 0, unique = 0;
    for (const DeviceInterval& x : *iv) bytes += x.bytes, unique += x.unique_bytes;
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%.3f,%llu,%.3f,", start, static_cast<unsigned long long>(bytes), secs);
    std::string row = buf;
    if (p.has_unique()) row += std::to_string(unique);
    row += "," + std::to_string(p.lost_events() - lost);
    lost = p.lost_events();
    for (const DeviceInterval& x : *iv) {
      row += "," + std::to_string(x.bytes) + ",";
      if (p.has_unique()) row += std::to_string(x.unique_bytes);
    }
    if (Status s = emit(row + "\n"); !s.ok()) return Fail("profile", s);
    if (g_profile_stop != 0) break;
  }
  std::string tail = "# lost events: " + std::to_string(p.lost_events());
  if (p.lost_events() > 0) tail += " (the kernel dropped them: the rows under-count; use a larger --buffer-kb)";
  if (Status s = emit(tail + "\n"); !s.ok()) return Fail("profile", s);
  if (Status s = csv.Sync(); !s.ok()) return Fail("profile", s);
  return 0;
}

int CmdSweep(int argc, char** argv) {
  po::options_description d("sweep options");
  d.add_options()("local", po::value<std::string>()->default_value(""),
                  "start a local deployment from this build directory (its agent/, process-server/, master-target/)")(
      "agent-metrics", po::value<std::string>()->default_value(""), "running deployment: agent /metrics URL")(
      "ps-metrics", po::value<std::string>()->default_value(""), "running deployment: process server /metrics URL")(
      "mt-metrics", po::value<std::string>()->default_value(""), "running deployment: master target /metrics URL")(
      "target", po::value<std::string>()->default_value(""), "running deployment: the protected volume's nbd:// URI")(
      "dir", po::value<std::string>()->default_value(""), "running deployment: a directory on the protected volume")(
      "compression", po::value<std::string>()->default_value("off"), "running deployment: label of this phase, off | on")(
      "phases", po::value<std::string>()->default_value("off,on"), "--local: phases to run (PS codec none / zstd)")(
      "level", po::value<int>()->default_value(1), "--local: zstd level of the 'on' phase")(
      "volume-size", po::value<ByteSize>()->default_value(ByteSize{1ull << 30}), "--local: source volume size")(
      "sizes", po::value<std::string>()->default_value("1,10,50,100,150,200,250"), "tree sizes, MB")(
      "seed", po::value<uint64_t>()->default_value(8), "tree seed")(
      "compressibility", po::value<double>()->default_value(0.75), "tree data mix, 0..1")(
      "window", po::value<Duration>()->default_value(Duration{60'000'000}), "measurement window per size")(
      "pause", po::value<Duration>()->default_value(Duration{4'000'000}), "pause between write and delete")(
      "warmup", po::value<Duration>()->default_value(Duration{0}), "an unrecorded window of the first size first")(
      "drain-timeout", po::value<Duration>()->default_value(Duration{300'000'000}), "wait for an empty backlog first")(
      "core-mhz", po::value<double>()->default_value(0), "core clock, MHz (0 = from /proc/cpuinfo)")(
      "from", po::value<std::vector<std::string>>(), "render from recorded samples JSON (repeatable)")(
      "out", po::value<std::string>()->default_value(""), "write sweep.md, CSVs, SVGs and samples.json here");
  LoadedConfig cfg;
  if (int rc = Load(argc, argv, d, "The seed's sweep: tables (Markdown, CSV) and SVG charts from daemon metrics.", &cfg);
      rc >= 0)
    return rc;
  const auto& vm = cfg.vars;
  Env* env = DefaultEnv();
  auto* clock = SystemClock::Get();
  double mhz = vm["core-mhz"].as<double>();
  std::vector<SweepSample> samples;
  if (vm.count("from")) {
    for (const auto& f : vm["from"].as<std::vector<std::string>>()) {
      auto text = ReadWholeFile(env, f);
      if (!text.ok()) return Fail("sweep", text.status());
      boost::system::error_code ec;
      auto v = boost::json::parse(std::string_view(reinterpret_cast<const char*>(text->data()), text->size()), ec);
      if (ec) return Fail("sweep", Status::InvalidArgument(f + ": " + ec.message()));
      double file_mhz = 0;
      auto s = SamplesFromJson(v, &file_mhz);
      if (!s.ok()) return Fail("sweep", s.status().WithContext(f));
      if (mhz == 0) mhz = file_mhz;
      samples.insert(samples.end(), s->begin(), s->end());
    }
  } else {
    SweepRunOptions o;
    auto sizes = ParseSizes(vm["sizes"].as<std::string>());
    if (!sizes.ok()) return Fail("sweep", sizes.status());
    o.sizes_mb = *sizes;
    o.seed = vm["seed"].as<uint64_t>();
    o.compressibility = vm["compressibility"].as<double>();
    o.window_us = vm["window"].as<Duration>().micros;
    o.pause_us = vm["pause"].as<Duration>().micros;
    o.drain_timeout_us = vm["drain-timeout"].as<Duration>().micros;
    o.warmup_us = vm["warmup"].as<Duration>().micros;
    o.log = [](const std::string& line) { std::fprintf(stderr, "sweep: %s\n", line.c_str()); };
    if (mhz == 0) {
      auto m = CoreMhzFromCpuinfo(env);
      if (!m.ok()) return Fail("sweep", m.status());
      mhz = *m;
    }
    const std::string local = vm["local"].as<std::string>();
    if (!local.empty()) {
      for (const char* phase_name : {"off", "on"}) {
        const std::string phase = phase_name;
        if (vm["phases"].as<std::string>().find(phase) == std::string::npos) continue;
        char tmpl[] = "/tmp/cdp-sweep.XXXXXX";
        if (!::mkdtemp(tmpl)) return Fail("sweep", Status::FromErrno(errno, "mkdtemp"));
        LocalClusterOptions lo = LocalClusterOptionsFor(local, tmpl);
        lo.tenant = "sweep";
        lo.client_id = "sweep";
        lo.codec = phase == "on" ? "zstd" : "none";
        lo.level = vm["level"].as<int>();
        lo.volume_bytes = vm["volume-size"].as<ByteSize>().bytes;
        Result<std::vector<SweepSample>> r = Status::Aborted("not run");
        {
          LocalCluster cluster(lo);
          Status st = cluster.Start();
          if (st.ok()) r = RunSweepPhase(TargetsOf(cluster), phase == "on", o, env, clock);
          else r = st;
          cluster.StopAll();
        }
        if (r.ok()) {
          if (Status rs = RemoveAll(env, tmpl); !rs.ok()) std::fprintf(stderr, "sweep: %s\n", rs.ToString().c_str());
        } else {
          std::fprintf(stderr, "sweep: deployment kept in %s for inspection\n", tmpl);
        }
        if (!r.ok()) return Fail("sweep", r.status());
        samples.insert(samples.end(), r->begin(), r->end());
      }
    } else {
      SweepTargets t;
      t.agent_metrics = vm["agent-metrics"].as<std::string>();
      t.ps_metrics = vm["ps-metrics"].as<std::string>();
      t.mt_metrics = vm["mt-metrics"].as<std::string>();
      t.nbd_uri = vm["target"].as<std::string>();
      t.dir = vm["dir"].as<std::string>();
      auto token = ClientToken("");  // one token for the three, from CDP_TOKEN / CDP_TOKEN_FILE
      if (!token.ok()) return Fail("sweep", token.status());
      t.agent_token = t.ps_token = t.mt_token = *token;
      if (const char* ca = std::getenv("CDP_TLS_CA"); ca != nullptr) t.tls_ca = ca;  // https: the site CA
      if (t.agent_metrics.empty() || t.ps_metrics.empty() || t.mt_metrics.empty())
        return Fail("sweep", Status::InvalidArgument("give --local, or --from, or all three --*-metrics URLs"));
      std::string c = vm["compression"].as<std::string>();
      if (c != "off" && c != "on") return Fail("sweep", Status::InvalidArgument("--compression must be off or on"));
      auto r = RunSweepPhase(t, c == "on", o, env, clock);
      if (!r.ok()) return Fail("sweep", r.status());
      samples = std::move(*r);
    }
  }
  auto md = RenderSweep(samples, mhz, vm["out"].as<std::string>(), env);
  if (!md.ok()) return Fail("sweep", md.status());
  std::cout << *md;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  if (cmd == "--version") {
    std::cout << cdp::VersionText("cdp-loadgen");
    return 0;
  }
  try {
    if (cmd == "tree") return CmdTree(argc - 1, argv + 1);
    if (cmd == "churn") return CmdChurn(argc - 1, argv + 1);
    if (cmd == "plan") return CmdPlan(argc - 1, argv + 1);
    if (cmd == "record") return CmdRecord(argc - 1, argv + 1);
    if (cmd == "profile") return CmdProfile(argc - 1, argv + 1);
    if (cmd == "sweep") return CmdSweep(argc - 1, argv + 1);
    if (cmd == "wanem") return CmdWanem(argc - 1, argv + 1);
    if (cmd == "cluster") return CmdCluster(argc - 1, argv + 1);
  } catch (const std::exception& e) {
    std::cerr << "cdp-loadgen " << cmd << ": " << e.what() << "\n";
    return 2;
  }
  std::cerr << "cdp-loadgen: unknown command '" << cmd << "'\n" << kUsage;
  return 2;
}
