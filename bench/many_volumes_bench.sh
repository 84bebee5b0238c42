#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Many-volumes benchmark (issue 15, "100 volumes"): the aggregate change rate
# of N volumes through one agent, one process server and one master target
# against the rate of one volume, all daemons on this machine (loopback), and
# the threads and descriptors each daemon holds at 1 and at N volumes.
#
# Per scenario (1 volume, then N), in a fresh directory:
#   1. master target, process server, ONE agent protecting every volume
#      (sparse files of SIZE_MB each, exports v1..vN on the agent's NBD Unix
#      socket); the initial sync of every volume finishes and every volume is
#      open at the master target;
#   2. "idle": threads (/proc/PID/status Threads), open descriptors
#      (/proc/PID/fd) and RSS of each daemon;
#   3. one `cdp-loadgen churn` per volume, all at once, SECS seconds of 1 MiB
#      sequential writes at a rate far above what the pipeline takes (the NBD
#      clients are paced by the pipeline); threads and descriptors sampled
#      every second meanwhile ("peak");
#   4. catch-up: every volume's last captured record applied at the master
#      target; threads and descriptors again ("after": what idle volumes keep). The aggregate applied change rate is the growth of
#      cdp_mt_applied_bytes_total (summed over the volumes, the master
#      target's /metrics) over the time from the first write until the last
#      record is applied.
# Target (issue 15): N volumes' aggregate rate >= 0.9x one volume's, threads
# and descriptors not growing per volume.
#
#   bash bench/many_volumes_bench.sh BUILD_DIR [N=100] [SIZE_MB=256] [SECS=20] [TLS=on] [CODEC=zstd] [COMPRESSIBILITY=0.75]
#
# AGENT_ARGS adds agent options to both scenarios (e.g. "--budget 16MiB": the
# capture queue budget is per volume, so N x budget is the agent's bound);
# MT_ARGS and PS_ARGS do the same for the master target and the process
# server (e.g. "--max_open_files 128": descriptors bounded below what N
# volumes keep open).
# Two cores shared by every daemon and N loadgen processes: run it on a quiet
# machine. Prints Markdown tables; docs/benchmarks.md ("100 volumes") records runs.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
bench_init many_volumes_bench \
  "${1:?usage: many_volumes_bench.sh BUILD_DIR [N] [SIZE_MB] [SECS] [TLS] [CODEC] [COMPRESSIBILITY]}"
N=${2:-100}
SIZE_MB=${3:-256}
SECS=${4:-20}
TLS=${5:-on}
CODEC=${6:-zstd}
COMP=${7:-0.75}
[ "$N" -ge 1 ] || { echo "many_volumes_bench: N must be >= 1" >&2; exit 2; }
bench_need python3
bench_pki "$TLS"
now() { date +%s.%N; }
die() { bench_die "$@"; }

# "threads fds rss_MB" of a process.
proc_usage() {
  local t r
  t=$(awk '$1 == "Threads:" {print $2}' "/proc/$1/status")
  r=$(awk '$1 == "VmRSS:" {printf "%.0f", $2 / 1024}' "/proc/$1/status")
  echo "$t $(find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l) $r"
}
# "agent_threads agent_fds agent_rss ps_threads ... mt_rss"
usage_all() { echo "$(proc_usage "$AG_PID") $(proc_usage "$PS_PID") $(proc_usage "$MT_PID")"; }
# Element-wise maximum of two usage_all lines.
usage_max() { python3 -c 'import sys; a, b = sys.argv[1].split(), sys.argv[2].split(); print(" ".join(str(max(int(x), int(y))) for x, y in zip(a, b)))' "$1" "$2"; }

applied_bytes() { mt_get /metrics | awk '$1 ~ /^cdp_mt_applied_bytes_total[{]/ {s += $2} END {printf "%.0f", s}'; }

# Prints how many volumes are not yet where the check wants them:
#   synced: the agent's volumes connected with no resync left, and open at the MT
#   applied: the MT has applied every volume's last captured record, queues empty
lagging() {
  python3 - "$1" "$2" <(agent_get /status) <(mt_get /status) <<'PY'
import json, sys
want, n = sys.argv[1], int(sys.argv[2])
a = {v["name"]: v for v in json.load(open(sys.argv[3]))["volumes"]}
m = {v["volume"] if "volume" in v else v.get("name"): v for v in json.load(open(sys.argv[4]))["volumes"]}
bad = 0
for i in range(1, n + 1):
    v, name = a.get("v%d" % i), "v%d" % i
    if v is None:
        bad += 1
    elif want == "synced":
        bad += not (v["connected"] and v["resync_remaining"] == 0 and name in m)
    else:
        bad += not (name in m and m[name]["applied_seq"] == v["next_seq"] - 1 and v["queue_records"] == 0)
print(bad)
PY
}

# scenario N: sets RESULT to "N WRITTEN_BYTES APPLIED_BYTES SECONDS MODE_CHANGES" and
# IDLE / PEAK / AFTER to usage_all lines (no subshell: the EXIT trap must know every daemon).
scenario() {
  local n=$1 d=$BENCH_DIR/vols$1 i
  cluster_up "$d" --codec "$CODEC" --level 1
  local vols=()
  for i in $(seq "$n"); do
    truncate -s "${SIZE_MB}M" "$d/v$i.img"
    vols+=(--volume "v$i=$d/v$i.img")
  done
  # agent_up takes the first volume as its first argument.
  agent_up "${vols[1]}" "${vols[@]:2}"
  local _ ok=0 left
  for _ in $(seq 1800); do
    left=$(lagging synced "$n")
    [ "$left" = 0 ] && { ok=1; break; }
    sleep 0.1
  done
  [ $ok = 1 ] || die "$left of $n volumes not synced and open at the master target within 180 s"
  IDLE=$(usage_all)
  PEAK=$IDLE
  local a0 t0 t1 t2 pids=()
  a0=$(applied_bytes)
  t0=$(now)
  for i in $(seq "$n"); do
    "$LOADGEN" churn --target "nbd+unix:///v$i?socket=$d/agent/nbd.sock" --rate 10000 --duration "$SECS" \
      --pattern seq --io-size 1MiB --compressibility "$COMP" --seed "$i" --flush-every 64MiB --json \
      > "$d/churn$i.json" 2> "$d/churn$i.err" &
    pids+=($!)
    BENCH_EXTRA_PIDS+=($!)
  done
  local running=1
  while [ $running = 1 ]; do
    sleep 1
    PEAK=$(usage_max "$PEAK" "$(usage_all)")
    running=0
    for i in "${pids[@]}"; do kill -0 "$i" 2>/dev/null && { running=1; break; }; done
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || die "churn of v$((i + 1)) failed: $(cat "$d/churn$((i + 1)).err")"
  done
  t1=$(now)
  local deadline=$(( $(date +%s) + 900 ))
  while :; do
    PEAK=$(usage_max "$PEAK" "$(usage_all)")
    left=$(lagging applied "$n")
    [ "$left" = 0 ] && break
    [ "$(date +%s)" -lt $deadline ] || die "$left of $n volumes not applied within 900 s"
    sleep 0.2
  done
  t2=$(now)
  AFTER=$(usage_all)
  local a1 written=0 modes
  a1=$(applied_bytes)
  for i in $(seq "$n"); do written=$((written + $(json_num bytes < "$d/churn$i.json"))); done
  modes=$(agent_get /status | python3 -c '
import json, sys
print(sum(v["to_metadata"] + v["to_bitmap"] for v in json.load(sys.stdin)["volumes"]))')
  RESULT="$n $written $((a1 - a0)) $(python3 -c "print('%.1f %.1f' % ($t1 - $t0, $t2 - $t0))") $modes"
  cluster_down
  bench_rm "$d"
}

scenario 1
ONE=$RESULT ONE_IDLE=$IDLE ONE_PEAK=$PEAK ONE_AFTER=$AFTER
scenario "$N"
MANY=$RESULT MANY_IDLE=$IDLE MANY_PEAK=$PEAK MANY_AFTER=$AFTER
python3 - "$ONE" "$MANY" "$ONE_IDLE" "$ONE_PEAK" "$ONE_AFTER" "$MANY_IDLE" "$MANY_PEAK" "$MANY_AFTER" "$SIZE_MB" \
  "$SECS" "$TLS" "$CODEC" "$COMP" <<'PY'
import sys
one, many = sys.argv[1].split(), sys.argv[2].split()
usage = {}
for i, key in enumerate((("1", "idle"), ("1", "peak"), ("1", "after"), ("N", "idle"), ("N", "peak"), ("N", "after"))):
    usage[key] = sys.argv[3 + i]
size, secs, tls, codec, comp = sys.argv[9:14]
print("| volumes | written MB | applied MB | write phase (s) | until applied (s) | aggregate applied MB/s | vs 1 volume | agent mode changes |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
base = None
for n, written, applied, w, t, modes in (one, many):
    rate = int(applied) / 1e6 / float(t)
    base = base or rate
    print("| %s | %.0f | %.0f | %s | %s | %.1f | %.2fx | %s |" % (n, int(written) / 1e6, int(applied) / 1e6, w, t, rate,
                                                                rate / base, modes))
print()
print("| volumes | when | agent threads | agent fds | agent RSS MB | PS threads | PS fds | PS RSS MB | MT threads | MT fds | MT RSS MB |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for key, n in (("1", one[0]), ("N", many[0])):
    for when in ("idle", "peak", "after"):
        print("| %s | %s | %s |" % (n, when, " | ".join(usage[(key, when)].split())))
print()
print("volume %s MB sparse, %s s of 1 MiB sequential writes per volume, codec %s -1, TLS %s, compressibility %s;"
      % (size, secs, codec, tls, comp))
print("target: aggregate applied rate at N volumes >= 0.9x one volume's; threads and fds not growing per volume")
PY
