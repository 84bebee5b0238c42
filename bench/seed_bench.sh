#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# seed_bench.sh: the seeds' remote-user measurements (issue 17), in one command:
# bench/control_bench (control-operation latency, Ringer's table) and
# bench/export_bench (reads of a point-in-time export beside `nbdkit file`,
# LoRS Tables 5/6 and Ringer's 2^n sequential-read figure), on loopback and
# through `cdp-loadgen wanem` at 25 ms RTT. Root (wanem makes network namespaces).
#
# usage: seed_bench.sh BUILD_DIR [OUT_DIR=docs/seed-bench]
#   environment: WAN=0        loopback only (no wanem)
#                QUICK=1      smoke run: tiny sizes and run counts (figures worthless)
#                RUNS=1000    runs of each control operation (loopback; WAN cdpctl)
#                WAN_API_RUNS=200  runs of each raw-API operation at 25 ms RTT
#                CH_LO="--reads 1000 --bytes 32MiB"  export_bench chunk arguments on loopback
#                KEEP=1       keep the scratch directory and logs
#
# Deployment: the master target, the process server and the agent run in netns
# seedb-b with every listener on 10.77.0.2 (replication among them is local).
# "loopback" clients run in seedb-b too (local delivery to 10.77.0.2); "25 ms"
# clients run in seedb-a and cross the emulated link (1000 Mbit/s, 12.5 ms each
# way). With WAN=0 everything runs in this namespace on 127.0.0.1.
#
# Data: a VOLUME_MB volume of random bytes written through the agent's tap;
# tag p1; then ~1/8 of the 4 KiB blocks rewritten at random (4 KiB writes);
# tag p2. Exports: p1 (every read is reassembled from the replica and the undo
# journal) and p2 (the latest image: replica only). `nbdkit file` serves a copy
# of the p1 image; before timing, each server's bytes are compared with the
# source image at its point (export_bench --mode verify).
#
# Run time of a full run (estimated from the QUICK=1 smoke runs and the run
# counts): ~13 min. Control operations ~8 min (at 25 ms RTT each cdpctl run is
# 2 RTT per daemon it asks, 6 for status: ~0.39 s per round of the five
# operations x 1000, plus 200 API rounds), export reads at 25 ms RTT ~3.5 min
# (six server/transport pairs x ~35 s), loopback ~1 min, set-up ~20 s.
#
# Outputs in OUT_DIR: control.csv, chunks.csv, seq.csv, connect.csv, the SVG
# charts of bench/seed_report.py; the Markdown tables go to stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/lib.sh
source "$here/lib.sh"
bench_init seed "$1"
OUT=${2:-docs/seed-bench}
# MT_BINARY: another build of the master target (bench/export_profile.sh:
# before/after); MT_WRAP: a command prefix for it (e.g. valgrind
# --tool=callgrind). Both go to the harness (bench/lib.sh cluster_up).
WAN=${WAN:-1} QUICK=${QUICK:-0} RUNS=${RUNS:-1000} WAN_API_RUNS=${WAN_API_RUNS:-200}
CONTROL_BENCH=$BUILD/bench/control_bench EXPORT_BENCH=$BUILD/bench/export_bench
for b in "$CONTROL_BENCH" "$EXPORT_BENCH"; do
  [ -x "$b" ] || { echo "seed: $b not built (cmake --build $BUILD --target benchmarks; export_bench needs libnbd-dev)" >&2; exit 2; }
done
bench_need nbdkit nbdcopy python3 curl
VOLUME_MB=64
if [ "$QUICK" = 1 ]; then
  RUNS=5 WAN_API_RUNS=3 VOLUME_MB=16
  CH_LO="--reads 20 --bytes 1MiB" CH_WAN="--reads 2 --bytes 0" SEQ_LO="--runs 2" SEQ_WAN="--runs 1" CONN="--runs 2"
else
  # Loopback: max(1000 reads, 32 MiB) per chunk size. 25 ms RTT: 40 reads per
  # chunk size (a fixed count: at one read in flight a read costs >= 1 RTT).
  CH_LO=${CH_LO:-"--reads 1000 --bytes 32MiB"} CH_WAN="--reads 40 --bytes 0" SEQ_LO="--runs 50" SEQ_WAN="--runs 10" CONN="--runs 20"
fi
mkdir -p "$OUT"
T0=$(date +%s)
[ "$QUICK" = 1 ] || echo "seed: a full run takes about 13 minutes (WAN=0: about 2)" >&2
phase() { echo "seed: $(( $(date +%s) - T0 )) s: $*" >&2; }

# ---- Network: wanem, or this namespace --------------------------------------
if [ "$WAN" = 1 ]; then
  [ "$(id -u)" = 0 ] || { echo "seed: the 25 ms runs need root (wanem); WAN=0 runs loopback only" >&2; exit 2; }
  bench_need ip
  "$LOADGEN" wanem up --name seedb --rate-mbit 1000 --delay-ms 12.5 >/dev/null
  trap 'bench_cleanup; "$LOADGEN" wanem down --name seedb >/dev/null 2>&1 || true' EXIT
  H=10.77.0.2
  NB=(ip netns exec seedb-b) NW=(ip netns exec seedb-a)
  # The whole cluster (the harness and its daemons) in seedb-b, listening on $H.
  BENCH_WRAP="ip netns exec seedb-b" BENCH_HOST=$H
  LINKS="loopback wan"
else
  H=127.0.0.1 NB=() NW=()
  LINKS="loopback"
fi
client() {  # LINK CMD...: runs CMD where a client on LINK runs
  local l=$1
  shift
  if [ "$l" = wan ]; then "${NW[@]}" "$@"; else "${NB[@]}" "$@"; fi
}

# ---- The deployment (bench/lib.sh: `cdp-loadgen cluster`, TLS on every link
# with the certificates it makes in BENCH_DIR/pki, NBD exports over TLS) ------
bench_pki on
D=$BENCH_DIR/c
mkdir -p "$D"
for v in KIT_TLS KIT_PLAIN; do bench_pick_port $v; done
head -c $((VOLUME_MB << 20)) /dev/urandom >"$BENCH_DIR/random.img"
truncate -s $((VOLUME_MB << 20)) "$D/source.img"
sctl() {  # LINK cdpctl ARGS...
  local l=$1
  shift
  client "$l" "$CTL" ${CDP_TLS_CA:+--tls-ca "$CDP_TLS_CA"} --agent $H:$AG_CTL --ps $H:$PS_CTL --mt $H:$MT_CTL --tenant bench \
    --agent-token-file "$AG_TOKEN" --ps-token-file "$PS_TOKEN" --mt-token-file "$MT_TOKEN" "$@"
}

phase "starting the daemons (TLS on every link, NBD exports over TLS)"
cluster_up "$D"
agent_up v="$D/source.img"

# ---- Certificates of the NBD clients and of nbdkit -------------------------
P=$BENCH_DIR/pki
mkdir -p "$P/nbd-client" "$P/nbd-server"
cp "$P/ca.crt" "$P/nbd-client/ca-cert.pem"
cp "$P/agent.crt" "$P/nbd-client/client-cert.pem"  # tenant bench
install -m 0600 "$P/agent.key" "$P/nbd-client/client-key.pem"
cp "$P/ca.crt" "$P/nbd-server/ca-cert.pem"
cp "$P/mt.crt" "$P/nbd-server/server-cert.pem"     # nbdkit serves with the MT's own certificate
install -m 0600 "$P/mt.key" "$P/nbd-server/server-key.pem"

mt_nbd_plain() {  # the master target again (same ports and data), its NBD exports without TLS
  cluster_cmd stop mt
  cluster_cmd set mt nbd_tls=off
  cluster_cmd restart mt
}

wait_point() {  # TAG: the master target lists it
  for _ in $(seq 1200); do
    sctl loopback --json points v 2>/dev/null | grep -q "\"name\":\"$1\"" && return 0
    sleep 0.1
  done
  bench_die "point $1 did not reach the master target within 120 s"
}

tag() {  # NAME: retried while the agent cannot promise a consistent point yet (initial sync)
  for _ in $(seq 600); do
    sctl loopback tag "$1" >/dev/null 2>"$D/tag.err" && return 0
    sleep 0.2
  done
  bench_die "tag $1: $(cat "$D/tag.err")"
}

phase "writing $VOLUME_MB MiB through the agent's tap; tag p1; rewriting ~1/8 of the 4 KiB blocks; tag p2"
nbdcopy "$BENCH_DIR/random.img" "nbd+unix:///v?socket=$D/agent/nbd.sock"
tag p1
cp "$D/source.img" "$BENCH_DIR/p1.img"  # nothing else writes the source
"$LOADGEN" churn --target "nbd+unix:///v?socket=$D/agent/nbd.sock" --rate $((VOLUME_MB * 1048576 / 8 / 1000000 + 1)) \
  --duration 1 --pattern random --io-size 4KiB --compressibility 0 --seed 17 >/dev/null
tag p2
cp "$D/source.img" "$BENCH_DIR/p2.img"
wait_point p1
wait_point p2

export_of() {  # POINT -> the export's name
  sctl loopback --json export "v@$1" | python3 -c 'import json, sys; print(json.load(sys.stdin)["export"])'
}
# KIT_WRAP: a command prefix for nbdkit (e.g. valgrind --tool=callgrind: bench/export_profile.sh).
read -r -a KIT_WRAP <<<"${KIT_WRAP:-}"
kit_start() {  # PORT [TLS ARGS...]
  local port=$1
  shift
  "${NB[@]}" "${KIT_WRAP[@]}" nbdkit -f -r -i $H -p "$port" "$@" file "$BENCH_DIR/p1.img" 2>>"$D/nbdkit.log" &
  BENCH_EXTRA_PIDS+=($!)
  for _ in $(seq 600); do bench_port_free_ns "$port" || return 0; sleep 0.1; done
  bench_die "nbdkit did not listen on $port"
}
bench_port_free_ns() { ! "${NB[@]}" bash -c "exec 3<>/dev/tcp/$H/$1" 2>/dev/null; }

: >"$OUT/chunks.csv.tmp" ; : >"$OUT/seq.csv.tmp" ; : >"$OUT/connect.csv.tmp"
# run_export SERVER,TRANSPORT PORT EXPORT TLS_DIR|"" VERIFY_FILE: verify, then every link
run_export() {
  local label=$1 port=$2 name=$3 tls=$4 file=$5 l
  local common=(--host $H --port "$port" --export "$name" --no_header)
  [ -n "$tls" ] && common+=(--tls_dir "$tls")
  client loopback "$EXPORT_BENCH" "${common[@]}" --label "$label" --mode verify --file "$file" 2>/dev/null ||
    bench_die "$label: the served bytes differ from the image at its point"
  for l in $LINKS; do
    phase "export_bench $label, $l"
    local ch=$CH_LO sq=$SEQ_LO
    [ "$l" = wan ] && ch=$CH_WAN sq=$SEQ_WAN
    # shellcheck disable=SC2086
    client "$l" "$EXPORT_BENCH" "${common[@]}" --label "$l,$label" --mode chunks $ch >>"$OUT/chunks.csv.tmp"
    # shellcheck disable=SC2086
    client "$l" "$EXPORT_BENCH" "${common[@]}" --label "$l,$label" --mode seq $sq >>"$OUT/seq.csv.tmp"
    # shellcheck disable=SC2086
    client "$l" "$EXPORT_BENCH" "${common[@]}" --label "$l,$label" --mode connect $CONN >>"$OUT/connect.csv.tmp"
  done
}

E1=$(export_of p1) E2=$(export_of p2)
kit_start $KIT_TLS --tls=require --tls-certificates="$P/nbd-server" --tls-verify-peer
kit_start $KIT_PLAIN
# Sourced by bench/export_profile.sh with SEED_SETUP_ONLY=1: the deployment,
# the exports E1 (p1) and E2 (p2) and both nbdkit servers are up.
if [ "${SEED_SETUP_ONLY:-0}" = 1 ]; then return 0; fi

# ---- export_bench: TLS (as the product serves it) ---------------------------
run_export "nbdkit file,tls" $KIT_TLS "" "$P/nbd-client" "$BENCH_DIR/p1.img"
run_export "export p2 (latest),tls" $MT_NBD_PORT "$E2" "$P/nbd-client" "$BENCH_DIR/p2.img"
run_export "export p1 (1/8 rewritten),tls" $MT_NBD_PORT "$E1" "$P/nbd-client" "$BENCH_DIR/p1.img"
run_export "nbdkit file,plain" $KIT_PLAIN "" "" "$BENCH_DIR/p1.img"
# ---- export_bench: plain TCP (the master target restarted with nbd_tls = off)
phase "restarting the master target with nbd_tls = off"
mt_nbd_plain
E1=$(export_of p1) E2=$(export_of p2)
run_export "export p2 (latest),plain" $MT_NBD_PORT "$E2" "" "$BENCH_DIR/p2.img"
run_export "export p1 (1/8 rewritten),plain" $MT_NBD_PORT "$E1" "" "$BENCH_DIR/p1.img"

# ---- control_bench ---------------------------------------------------------
echo "link,method,op,runs,mean_us,p50_us,p99_us,max_us" >"$OUT/control.csv.tmp"
cb() {  # LINK RUNS OPS [--cdpctl PATH]
  local l=$1 runs=$2 ops=$3
  shift 3
  phase "control_bench $l ${1:+cdpctl }$ops x $runs"
  client "$l" "$CONTROL_BENCH" --agent $H:$AG_CTL --ps $H:$PS_CTL --mt $H:$MT_CTL --agent_token "$AG_TOKEN" \
    --ps_token "$PS_TOKEN" --mt_token "$MT_TOKEN" --tenant bench --volume v --point p1 --runs "$runs" --ops "$ops" \
    --label "$l" --no_header ${CDP_TLS_CA:+--tls_ca "$CDP_TLS_CA"} "$@" >>"$OUT/control.csv.tmp"
}
# Tags last: each adds a recovery point, and `points` answers with all of them.
for ops in status,points,export tag; do
  for l in $LINKS; do
    api_runs=$RUNS
    [ "$l" = wan ] && api_runs=$WAN_API_RUNS
    cb "$l" "$api_runs" $ops
    cb "$l" "$RUNS" $ops --cdpctl "$CTL"
  done
done
POINTS=$(sctl loopback --json points v | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["points"]))')

{ echo "link,server,transport,chunk,reads,seconds,mb_per_s,mean_us,p50_us,p99_us"; cat "$OUT/chunks.csv.tmp"; } >"$OUT/chunks.csv"
{ echo "link,server,transport,n,bytes,runs,mean_us,p50_us,p99_us"; cat "$OUT/seq.csv.tmp"; } >"$OUT/seq.csv"
{ echo "link,server,transport,op,runs,mean_us,p50_us,p99_us"; cat "$OUT/connect.csv.tmp"; } >"$OUT/connect.csv"
mv "$OUT/control.csv.tmp" "$OUT/control.csv"
rm -f "$OUT"/*.csv.tmp
phase "done"
python3 "$here/seed_report.py" "$OUT" --volume-mb $VOLUME_MB --points "$POINTS" --quick "$QUICK" \
  --elapsed $(( $(date +%s) - T0 )) --runs "$RUNS" --wan-api-runs "$WAN_API_RUNS"
