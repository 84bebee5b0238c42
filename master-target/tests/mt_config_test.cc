// SPDX-License-Identifier: Apache-2.0
// The master target's config keys and their translation (master-target/mt_config.h).
#include "master-target/mt_config.h"

#include <catch2/catch.hpp>

namespace {

// The key tests below are about other keys: they run with tls = off (and so
// nbd_tls = off) unless their text sets tls itself (the TLS keys have their own
// test case).
std::string ClearUnlessTls(std::string_view text) {
  std::string t(text);
  if (t.find("tls") == std::string::npos) t = "tls = off\nnbd_tls = off\n" + t;
  return t;
}

cdp::Result<cdp::mt::MasterTargetOptions> Load(cdp::Env* env, std::string_view text) {
  const char* argv[] = {"cdp-master-target"};
  auto loaded =
      cdp::LoadConfigText(1, argv, cdp::mt::MasterTargetConfigDescription(), ClearUnlessTls(text), "mt.conf");
  if (!loaded.ok()) return loaded.status();
  return cdp::mt::MasterTargetOptionsFromConfig(loaded->vars, env);
}

std::string Error(cdp::Env* env, std::string_view text) {
  auto o = Load(env, text);
  REQUIRE_FALSE(o.ok());
  CHECK(o.status().code() == cdp::Code::kInvalidArgument);
  return o.status().message();
}

void Write(cdp::Env* env, const std::string& path, const std::string& text) {
  REQUIRE(cdp::WriteFileAtomic(env, path, cdp::ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()))
              .ok());
}

TEST_CASE("master target config: addresses, tenants from flags and a file, quotas", "[config]") {
  auto env = cdp::NewMemEnv();
  Write(env.get(), "/tenants", "# provider tenants\n\nbeta = s3cret-beta-0123456789\n  gamma:s3cret-gamma-0123456789  \n");
  auto o = Load(env.get(),
                "listen = [::]:7501\ncontrol = 127.0.0.1:0\nnbd = 0.0.0.0:10811\ntenant = acme:s3cret-acme-0123456789\n"
                "tenants_file = /tenants\ntenant_quota = beta:1GiB\nmax_connections_per_peer = 4\n");
  REQUIRE(o.ok());
  CHECK(o->connection_caps.total == 256);
  CHECK(o->connection_caps.per_peer == 4);
  CHECK(o->listen.host == "::");
  CHECK(o->listen.port == 7501);
  CHECK(o->control.port == 0);
  CHECK(o->nbd.port == 10811);
  CHECK(o->tenants.size() == 3);
  CHECK(o->tenants.at("acme") == "s3cret-acme-0123456789");
  CHECK(o->tenants.at("beta") == "s3cret-beta-0123456789");
  CHECK(o->tenants.at("gamma") == "s3cret-gamma-0123456789");
  CHECK(o->tenant_quota_bytes.at("beta") == (1ull << 30));
  CHECK(o->max_batch_work == (256ull << 20));
  CHECK(o->max_journal_bytes_per_tenant == 0);
  auto caps = Load(env.get(), "max_batch_work = 64MiB\nmax_journal_bytes_per_tenant = 10GiB\n");
  REQUIRE(caps.ok());
  CHECK(caps->max_batch_work == (64ull << 20));
  CHECK(caps->max_journal_bytes_per_tenant == (10ull << 30));
  CHECK(o->journal_zstd_level == 1);
  CHECK(o->tenant_journal_zstd_level.empty());
  CHECK(o->replica_direct_io);
  auto buffered = Load(env.get(), "replica_io = buffered\n");
  REQUIRE(buffered.ok());
  CHECK_FALSE(buffered->replica_direct_io);
  auto z = Load(env.get(), "tenant = acme:a-0123456789abcdef\ntenant = beta:b-0123456789abcdef\njournal_compression = 3\n"
                           "tenant_journal_compression = beta:0\n");
  REQUIRE(z.ok());
  CHECK(z->journal_zstd_level == 3);
  CHECK(z->tenant_journal_zstd_level.at("beta") == 0);
  CHECK(z->tenant_journal_zstd_level.count("acme") == 0);
  auto r = Load(env.get(), "tenant = acme:a-0123456789abcdef\nvolume_retention = acme/db=30d\nvolume_retention = acme/logs=2h\n"
                           "[retention]\nmax_age = 1d\n");
  REQUIRE(r.ok());
  CHECK(r->retention.max_age_us == 86'400'000'000ull);
  CHECK(r->volume_max_age_us.at("acme/db") == 30 * 86'400'000'000ull);
  CHECK(r->volume_max_age_us.at("acme/logs") == 7'200'000'000ull);
  // The history lock: 24 h unless configured; per tenant and per volume.
  CHECK(r->retention.lock_us == 24 * 3'600'000'000ull);
  auto lk = Load(env.get(), "tenant = acme:a-0123456789abcdef\ntenant = beta:b-0123456789abcdef\ntenant_retention_lock = beta=7d\n"
                            "volume_retention_lock = acme/db=0s\n[retention]\nlock = 2h\n");
  REQUIRE(lk.ok());
  CHECK(lk->retention.lock_us == 7'200'000'000ull);
  CHECK(lk->tenant_lock_us.at("beta") == 7 * 86'400'000'000ull);
  CHECK(lk->volume_lock_us.at("acme/db") == 0);
  // The WAN link's capacity for the dashboard: not known unless given.
  CHECK(o->link_mbit == 0);
  auto link = Load(env.get(), "link_mbit = 100\n");
  REQUIRE(link.ok());
  CHECK(link->link_mbit == 100);
}

TEST_CASE("master target config: every bad value names its key or line", "[config]") {
  auto env = cdp::NewMemEnv();
  Write(env.get(), "/tenants", "beta = s3cret-beta-0123456789\n../x = s\n");
  CHECK(Error(env.get(), "listen = nohost\n") == "'listen': bad address 'nohost': want host:port");
  CHECK(Error(env.get(), "nbd = h:65536\n") == "'nbd': bad port in 'h:65536'");
  CHECK(Error(env.get(), "tenant = acme:a-0123456789abcdef\ntenant = acme:b\n") == "'tenant': tenant 'acme' given twice");
  CHECK(Error(env.get(), "tenant = acme:\n") == "'tenant': bad tenant entry for 'acme' (want NAME:SECRET)");
  CHECK(Error(env.get(), "tenant = acme:change-me-to-a-long-random-secret\n").find(
            "tenant 'acme': the secret is the example's placeholder") == 0);
  CHECK(Error(env.get(), "tenant = acme:s3cret\n").find("tenant 'acme': the secret is under 128 bits") == 0);
  CHECK(Error(env.get(), "tenants_file = /tenants\n") == "/tenants:2: bad tenant entry for '../x' (want NAME:SECRET)");
  CHECK(Error(env.get(), "tenant = acme:a-0123456789abcdef\ntenant_quota = other:1G\n") ==
        "bad tenant_quota 'other:1G' (NAME:SIZE of a configured tenant)");
  CHECK(Error(env.get(), "max_connections = 0\n") == "'max_connections' must be 1..65536");
  CHECK(Error(env.get(), "journal_compression = 20\n") == "journal_compression must be 0..19");
  CHECK(Error(env.get(), "replica_io = mmap\n") == "'replica_io' must be direct or buffered, not 'mmap'");
  CHECK(Error(env.get(), "tenant = acme:a-0123456789abcdef\ntenant_journal_compression = acme:x\n") ==
        "bad tenant_journal_compression 'acme:x' (NAME:LEVEL of a configured tenant, level 0..19)");
  CHECK(Error(env.get(), "tenant = acme:a-0123456789abcdef\ntenant_journal_compression = other:3\n") ==
        "bad tenant_journal_compression 'other:3' (NAME:LEVEL of a configured tenant, level 0..19)");
  CHECK(Error(env.get(), "max_volumes_per_tenant = 0\n") == "'max_volumes_per_tenant' must be 1..100000");
  CHECK(Error(env.get(), "tenant = acme:a-0123456789abcdef\nvolume_retention = other/db=1d\n") ==
        "bad volume_retention 'other/db=1d': no tenant other");
  CHECK(Error(env.get(), "tenant = acme:a-0123456789abcdef\nvolume_retention = acme/db\n") ==
        "bad volume_retention 'acme/db': want TENANT/VOLUME=DURATION");
  CHECK(Error(env.get(), "tenant = acme:a-0123456789abcdef\nvolume_retention = acme/../x=1d\n") ==
        "bad volume_retention 'acme/../x=1d': invalid volume name");
  CHECK(Error(env.get(), "tenant = acme:a-0123456789abcdef\ntenant_retention_lock = other=1d\n") ==
        "bad tenant_retention_lock 'other=1d': no tenant other");
  CHECK(Error(env.get(), "tenant = acme:a-0123456789abcdef\ntenant_retention_lock = acme\n") ==
        "bad tenant_retention_lock 'acme': want TENANT=DURATION");
  CHECK(Error(env.get(), "tenant = acme:a-0123456789abcdef\nvolume_retention_lock = acme/db\n") ==
        "bad volume_retention_lock 'acme/db': want TENANT/VOLUME=DURATION");
  CHECK(Error(env.get(), "max_batch_work = 1MiB\n") == "'max_batch_work' must be 32MiB..64GiB");
  CHECK(Error(env.get(), "control = none\nnbd = none\nmax_connections_per_peer = 0\n") ==
        "'max_connections_per_peer' must be 1..65536");
  CHECK(Error(env.get(), "storage = nfs\n") == "'storage' must be local or ceph, not 'nfs'");
  CHECK(Error(env.get(), "link_mbit = -1\n") == "'link_mbit' must be 0..10000000");
}

TEST_CASE("master target config: storage = ceph without a reachable cluster fails at start, naming it", "[config]") {
  auto env = cdp::NewMemEnv();
  auto o = Load(env.get(), "storage = ceph\nceph.conf = /nonexistent/ceph.conf\n");
  REQUIRE_FALSE(o.ok());
  INFO(o.status().ToString());
  CHECK(o.status().message().find("storage = ceph") != std::string::npos);
  CHECK(o.status().message().find("/nonexistent/ceph.conf") != std::string::npos);
  // Local storage (the default) needs no cluster and no store.
  auto local = Load(env.get(), "data_dir = /mt\n");
  REQUIRE(local.ok());
  CHECK(local->store == nullptr);
}

}  // namespace

TEST_CASE("master target config: TLS is on by default and needs its three files, direct agents", "[config][tls]") {
  auto env = cdp::NewMemEnv();
  CHECK(Error(env.get(), "tls = on\n") == "'tls_ca' is required with tls = on");
  CHECK(Error(env.get(), "tls_ca = /ca.crt\ntls_cert = /mt.crt\n") == "'tls_key' is required with tls = on");
  CHECK(Error(env.get(), "tls = maybe\n") == "'tls' must be on or off, not 'maybe'");
  auto o = Load(env.get(), "tls_ca = /ca.crt\ntls_cert = /mt.crt\ntls_key = /mt.key\ndirect_agents = acme\n");
  REQUIRE(o.ok());
  CHECK(o->tls.enabled);
  CHECK(o->tls.ca == "/ca.crt");
  CHECK(o->tls.cert == "/mt.crt");
  CHECK(o->tls.key == "/mt.key");
  CHECK(o->direct_agent_tenants == std::set<std::string>{"acme"});
  CHECK(o->nbd_tls);  // NBD exports require TLS by default
  CHECK(o->nbd_idle_timeout_ms == 600000);
  CHECK(o->nbd_max_connections == 256);
  CHECK(o->nbd_read_threads == 4);
  // tls = off leaves nothing to secure the exports with: say so, or switch them off.
  CHECK(Error(env.get(), "tls = off\n").find("'nbd_tls' = require needs tls = on") == 0);
  auto off = Load(env.get(), "tls = off\nnbd_tls = off\n");
  REQUIRE(off.ok());
  CHECK_FALSE(off->tls.enabled);
  CHECK_FALSE(off->nbd_tls);
  CHECK(off->direct_agent_tenants.empty());
  CHECK(Load(env.get(), "tls = off\nnbd = none\n").ok());
  CHECK(Error(env.get(), "tls = off\nnbd_tls = maybe\n") == "'nbd_tls' must be require or off, not 'maybe'");
  auto idle = Load(env.get(), "tls = off\nnbd_tls = off\nnbd_idle_timeout = 0s\nnbd_max_connections = 9\n");
  REQUIRE(idle.ok());
  CHECK(idle->nbd_idle_timeout_ms == 0);
  CHECK(idle->nbd_max_connections == 9);
  auto reads = Load(env.get(), "tls = off\nnbd_tls = off\nnbd_read_threads = 0\n");
  REQUIRE(reads.ok());
  CHECK(reads->nbd_read_threads == 0);
  CHECK(Error(env.get(), "tls = off\nnbd_tls = off\nnbd_read_threads = 65\n") == "'nbd_read_threads' must be 0..64");
}
