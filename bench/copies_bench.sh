#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copies benchmark (issue 16): the process server's shipping rate to ONE
# master target (copies = 1) against its rate to TWO in parallel
# (copies = 2, two `mt` keys), all daemons on this machine (loopback).
#
# Per scenario, in a fresh directory:
#   1. master target(s), process server (--mt A [B] --copies N), agent; the
#      initial sync of the (sparse) volume finishes;
#   2. the master targets are paused (SIGSTOP): their connections stay up,
#      nothing is acknowledged; `cdp-loadgen churn` writes SECS seconds at
#      RATE MB/s through the agent's NBD export, and the PS spools it all;
#   3. the master targets resume (SIGCONT) at T0: the PS ships the whole
#      backlog to every copy at once, each from its own cursor. Each copy's
#      end T1_i is when its acked_seq (PS /v1/volumes "copies") reaches the
#      spool's durable seq.
# Reported: spooled MB (record bytes before compression: every copy ships
# all of them), per-MT rate (MB / (T1_i - T0)) of the slowest copy,
# aggregate rate (copies x MB / (max T1 - T0)), PS CPU s per GB shipped, and
# with copies = 2 the ratio of its per-MT rate to the one-copy rate (target:
# >= 0.9). The throttle is off (it caps the sum of the copies when on).
#
#   bash bench/copies_bench.sh BUILD_DIR [SECS=20] [RATE=100] [CODEC=zstd] [TLS=on] [COMPRESSIBILITY=0.75] [LINK_MBIT=0]
#
# LINK_MBIT > 0 gives each master target its own emulated WAN link: HTB classes
# of that rate on the loopback traffic to and from its data port
# (bench_link_on in bench/lib.sh, removed at exit), so the copies compete for their links as at two sites,
# not for this machine's two cores (which one PS and two MTs saturate).
#
# Two cores shared by every daemon (and both MTs) make the copies compete
# for CPU: run it on a quiet machine. Prints a Markdown table; record runs in
# docs/benchmarks.md ("Copies").
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
bench_init copies_bench "${1:?usage: copies_bench.sh BUILD_DIR [SECS] [RATE] [CODEC] [TLS] [COMPRESSIBILITY]}"
SECS=${2:-20}
RATE=${3:-100}
CODEC=${4:-zstd}
TLS=${5:-on}
COMP=${6:-0.75}
LINK=${7:-0}
# shape_on PORT...: a link of LINK Mbit/s to and from each port (bench_link_on).
shape_on() { [ "$LINK" = 0 ] || bench_link_on "$LINK" "$@"; }
shape_off() { bench_link_off; }
bench_need python3
bench_pki "$TLS"
SIZE=$((4 << 30))
now() { date +%s.%N; }
cpu() { bench_get "$1" "$2" /metrics | awk '$1 == "process_cpu_seconds_total" {print $2}'; }

# "DURABLE ACKED0:LAGBYTES0 ACKED1:LAGBYTES1 ..." of the volume at the PS.
ps_copies() {
  ps_get /v1/volumes | python3 -c '
import json, sys
v = json.load(sys.stdin)["volumes"][0]
print(v["spool_durable_seq"], " ".join("%d:%d" % (c["acked_seq"], c["lag_bytes"]) for c in v["copies"]))'
}

resume_mts() { kill -CONT $MT_PID $MTB_PID 2>/dev/null || true; }
die() { resume_mts; bench_die "$@"; }

# scenario N: sets RESULT to "N MB PER_MT_MBS AGG_MBS PS_CPU_S_PER_GB SHIP_SECONDS" (no
# subshell: the EXIT trap must know every daemon it started). N master targets
# (MASTER_TARGETS=2: the harness's second MT, and the PS's copies = 2).
scenario() {
  local n=$1 d=$BENCH_DIR/copies$1
  MASTER_TARGETS=$n cluster_up "$d" --codec "$CODEC" --level 1
  truncate -s $SIZE "$d/source.img"
  agent_up vol="$d/source.img"
  local _ ok=0
  for _ in $(seq 600); do
    [ "$(agent_get /status | json_num resync_remaining)" = 0 ] && { ok=1; break; }
    sleep 0.1
  done
  [ $ok = 1 ] || die "the initial sync did not finish in 60 s"
  # Every copy's link up and its stream open before the pause.
  ok=0
  for _ in $(seq 600); do
    [ "$(ps_get /v1/volumes | python3 -c '
import json, sys
v = json.load(sys.stdin)["volumes"]
print(int(bool(v) and all(c["link"] == "connected" and not c["stalled"] for c in v[0]["copies"])))')" = 1 ] && { ok=1; break; }
    sleep 0.1
  done
  [ $ok = 1 ] || die "the PS's links to the master target(s) did not come up"

  if [ "$n" = 2 ]; then shape_on "$MT_DATA" "$MTB_DATA"; else shape_on "$MT_DATA"; fi
  # 2. Fill the spool with the master targets paused.
  kill -STOP $MT_PID $MTB_PID
  "$LOADGEN" churn --target "nbd+unix:///vol?socket=$d/agent/nbd.sock" --rate "$RATE" --duration "$SECS" \
    --pattern seq --io-size 1MiB --compressibility "$COMP" --seed 11 --flush-every 256MiB --json > "$d/churn.json" \
    || die "churn failed"
  ok=0
  for _ in $(seq 1200); do
    local a next s
    a=$(agent_get /status); next=$(echo "$a" | json_num next_seq)
    s=$(ps_copies)
    [ -n "$next" ] && [ "${s%% *}" = $((next - 1)) ] && [ "$(echo "$a" | json_num queue_records)" = 0 ] && { ok=1; break; }
    sleep 0.1
  done
  [ $ok = 1 ] || die "the spool did not get every record in 120 s"
  local start durable lags=() c
  start=$(ps_copies)
  durable=${start%% *}
  for c in ${start#* }; do lags+=("${c#*:}"); done
  local p0 t0 t1=() done_n=0 i
  p0=$(cpu $PS_CTL "$PS_TOKEN")
  # 3. Ship: every copy at once.
  t0=$(now)
  resume_mts
  local deadline=$(( $(date +%s) + 1200 ))
  while [ $done_n -lt "$n" ]; do
    local cur acks=()
    cur=$(ps_copies)
    for c in ${cur#* }; do acks+=("${c%%:*}"); done
    local t
    t=$(now)
    for i in $(seq 0 $((n - 1))); do
      [ -z "${t1[$i]:-}" ] && [ "${acks[$i]}" = "$durable" ] && { t1[$i]=$t; done_n=$((done_n + 1)); }
    done
    [ "$(date +%s)" -lt $deadline ] || die "copies not shipped within 1200 s: $cur (durable $durable)"
    sleep 0.2
  done
  local p1
  p1=$(cpu $PS_CTL "$PS_TOKEN")
  RESULT=$(python3 - "$n" "$t0" "$p0" "$p1" "${lags[*]}" "${t1[*]}" <<'PY'
import sys
n, t0, p0, p1 = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
lags = [int(x) for x in sys.argv[5].split()]
t1 = [float(x) for x in sys.argv[6].split()]
per_mt = min(l / 1e6 / (t - t0) for l, t in zip(lags, t1))
agg = sum(lags) / 1e6 / (max(t1) - t0)
print(n, "%.0f" % (max(lags) / 1e6), "%.1f" % per_mt, "%.1f" % agg, "%.2f" % ((p1 - p0) / (sum(lags) / 1e9)),
      "%.1f" % (max(t1) - t0))
PY
)
  shape_off
  cluster_down
  bench_rm "$d"
}

scenario 1
ONE=$RESULT
scenario 2
TWO=$RESULT
echo "| copies | spooled MB (per copy) | ship time (s) | per-MT MB/s (slowest copy) | aggregate MB/s | PS CPU s/GB shipped | per-MT rate vs copies = 1 |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
python3 - "$ONE" "$TWO" "$CODEC" "$TLS" "$LINK" <<'PY'
import sys
rows = [sys.argv[1].split(), sys.argv[2].split()]
base = float(rows[0][2])
for n, mb, per_mt, agg, cpu, secs in rows:
    print("| %s | %s | %s | %s | %s | %s | %.2fx |" % (n, mb, secs, per_mt, agg, cpu, float(per_mt) / base))
print()
print("codec %s -1, TLS %s, link per MT %s; target: copies = 2 per-MT rate >= 0.9x the one-copy rate" %
      (sys.argv[3], sys.argv[4], sys.argv[5] + " Mbit/s" if sys.argv[5] != "0" else "none (loopback)"))
PY
