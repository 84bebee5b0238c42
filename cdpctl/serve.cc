// SPDX-License-Identifier: Apache-2.0
// cdpctl serve: a sealed volume's plaintext, made at the tenant's site
// (commands.h; docs/encryption.md, "Reading a sealed volume back").
//
//   MT export (stored blocks + MACs) --nbds, tenant certificate--> RemoteDevice
//     --> SealedDevice (keys derived here from --key-file; every block checked)
//     --> NbdServer on a Unix socket (mode 0600) --> nbdcopy, qemu, nbdfuse
//
// The master target never receives a key: it serves ciphertext, and a write
// through a failover's export arrives sealed with its MAC.
#include <signal.h>

#include <memory>
#include <string>

#include "cdpctl/commands.h"
#include "common/crypto/seal.h"
#include "common/env/env.h"
#include "common/nbd/nbd_client.h"
#include "common/nbd/nbd_server.h"
#include "common/nbd/remote_device.h"
#include "common/nbd/sealed_device.h"

namespace cdp::ctl {

namespace {

// What serve reads: the MT's export of the volume's stored space.
struct Source {
  std::string tenant, volume, export_name;
  uint64_t volume_size = 0;
  uint16_t port = 0;
  bool tls = false;
  bool made = false;  // an export serve started (and removes at the end)
};

// VOLUME@failover: the promoted export of a failed-over volume.
bool FindFailover(const Options& o, const std::string& volume, Source* s, std::ostream& err) {
  Call who = Http(o, o.mt, "GET", "/v1/whoami");
  if (!who.reached || who.status != 200) return Fail(err, "serve " + volume, who), false;
  Call vols = Http(o, o.mt, "GET", "/v1/volumes");
  if (!vols.reached || vols.status != 200) return Fail(err, "serve " + volume, vols), false;
  const json::array* list = Volumes(vols.body);
  for (const json::value& v : list ? *list : json::array{}) {
    const json::object& vo = v.as_object();
    if (Str(vo, "volume") != volume || (!o.tenant.empty() && Str(vo, "tenant") != o.tenant)) continue;
    const json::value* f = vo.if_contains("failover");
    if (f == nullptr || !f->is_object()) {
      err << "cdpctl: serve " << volume << "@failover: the volume is not failed over (cdpctl failover " << volume
          << " --to POINT)\n";
      return false;
    }
    s->tenant = Str(vo, "tenant");
    s->volume = volume;
    s->export_name = Str(f->as_object(), "export");
    s->volume_size = uint64_t(Num(vo, "size"));
    s->port = uint16_t(Num(who.body.as_object(), "nbd_port"));
    const json::value* tls = who.body.as_object().if_contains("nbd_tls");
    s->tls = tls != nullptr && tls->is_bool() && tls->as_bool();
    return true;
  }
  err << "cdpctl: serve: no volume " << volume << " at the master target\n";
  return false;
}

// VOLUME@POINT: a read-only export of the point, made now.
bool MakeExport(const Options& o, const std::string& volume, const std::string& point, Source* s, std::ostream& err) {
  json::object b = PointArg(volume, point, o);
  b["writable"] = false;
  Call c = Http(o, o.mt, "POST", "/v1/export", b);
  if (!c.reached || c.status != 200) return Fail(err, "serve " + volume + "@" + point, c), false;
  const json::object& r = c.body.as_object();
  s->volume = volume;
  s->export_name = Str(r, "export");
  s->volume_size = uint64_t(Num(r, "volume_size"));
  s->port = uint16_t(Num(r, "port"));
  const json::value* tls = r.if_contains("tls");
  s->tls = tls != nullptr && tls->is_bool() && tls->as_bool();
  s->made = true;
  return true;
}

}  // namespace

int Serve(const Options& opts, const std::string& spec_or_uri, const std::string& key_file,
          const std::string& tls_dir, const std::string& socket, std::ostream& out, std::ostream& err) {
  Options o = opts;
  std::string spec = spec_or_uri;
  if (spec_or_uri.rfind("cdp://", 0) == 0 && !ParsePointUri(spec_or_uri, &o.tenant, &spec)) {
    err << "cdpctl: a point URI is cdp://TENANT/VOLUME@POINT, not '" << spec_or_uri << "'\n";
    return 2;
  }
  const size_t at = spec.find('@');
  if (at == std::string::npos || at == 0 || at + 1 == spec.size() || key_file.empty() || socket.empty()) {
    err << "cdpctl: serve wants VOLUME@POINT (or VOLUME@failover) --key-file F --socket PATH "
           "[--tls-certificates DIR]\n";
    return 2;
  }
  const std::string volume = spec.substr(0, at), point = spec.substr(at + 1);
  // The keys first: nothing is asked of the master target without them.
  auto key = seal::LoadTenantKey(DefaultEnv(), key_file);
  if (!key.ok()) return err << "cdpctl: " << key.status().message() << "\n", 1;
  auto keys = seal::DeriveVolumeKeys(*key, volume);
  if (!keys.ok()) return err << "cdpctl: " << keys.status().message() << "\n", 1;
  auto sealer = seal::BlockSealer::Create(*keys);
  if (!sealer.ok()) return err << "cdpctl: " << sealer.status().message() << "\n", 1;

  Source src;
  if (point == "failover" ? !FindFailover(o, volume, &src, err) : !MakeExport(o, volume, point, &src, err)) return 1;
  auto unexport = [&] {
    if (src.made) (void)Http(o, o.mt, "POST", "/v1/unexport", json::object{{"export", src.export_name}});
  };
  if (src.tls && tls_dir.empty()) {
    unexport();
    err << "cdpctl: the master target's exports need NBD TLS: give --tls-certificates DIR (the tenant's "
           "ca-cert.pem, client-cert.pem, client-key.pem)\n";
    return 2;
  }
  NbdUri uri;
  uri.host = o.mt.host;
  uri.port = src.port;
  uri.export_name = src.export_name;
  uri.tls = src.tls;
  uri.tls_certificates = tls_dir;
  auto client = NbdClient::Connect(uri);
  if (!client.ok()) {
    unexport();
    return err << "cdpctl: serve " << spec << ": " << client.status().message() << "\n", 1;
  }
  auto remote = std::make_shared<RemoteDevice>(std::move(*client));
  auto plain = SealedDevice::Open(remote, src.volume_size, *sealer, volume);
  if (!plain.ok()) {
    unexport();
    return err << "cdpctl: serve " << spec << ": " << plain.status().message() << "\n", 1;
  }

  // Signals are waited for below, not handled: block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  NbdServerOptions so;
  so.unix_path = socket;
  so.unix_mode = 0600;  // the plaintext: this user only
  NbdServer server(so);
  const std::string what = volume + (point == "failover" ? " failed over (read-write)" : " at " + point + " (read-only)") +
                           ", decrypted at the tenant";
  ::cdp::Status s = server.AddExport(volume, *plain, what);
  if (s.ok()) s = server.Start();
  if (!s.ok()) {
    unexport();
    return err << "cdpctl: serve " << spec << ": " << s.message() << "\n", 1;
  }
  out << "serving " << spec << " decrypted, every block checked: nbd+unix:///" << volume << "?socket=" << socket
      << (plain->get()->read_only() ? " (read-only)" : " (read-write: writes are sealed here)") << "\n"
      << "  stop with Ctrl-C (SIGINT) or SIGTERM\n";
  out.flush();
  int sig = 0;
  sigwait(&sigs, &sig);
  server.Stop();
  ::cdp::Status fs = plain->get()->read_only() ? ::cdp::Status::OK() : plain->get()->Flush();
  unexport();
  const uint64_t bad = plain->get()->integrity_failures();
  out << "stopped (" << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ")"
      << (bad ? "; " + std::to_string(bad) + " block(s) failed their integrity check" : "") << "\n";
  if (!fs.ok()) return err << "cdpctl: serve " << spec << ": final flush: " << fs.message() << "\n", 1;
  return bad ? 1 : 0;
}

}  // namespace cdp::ctl
