#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Group points (issue #43, docs/groups.md): what they cost the application,
# and how long one takes as the group grows. The product as it ships: TLS and
# tokens through the one harness of bench/lib.sh; the process server
# coordinates; every member is its own cdp-agent process.
#
#   bash bench/group_bench.sh BUILD_DIR [RUN_S=20] [MAX_MEMBERS=16] [INTERVALS_MS="1000 5000 10000"] [IOPS=500]
#   AT=mt bash bench/group_bench.sh ...   the groups coordinated at the master
#                                         target, every round relayed by the process server
#
# 1. Added write latency. Two members, each a cdp-agent protecting its own
#    volume; fio writes 4 KiB at random offsets at QD1 and IOPS per second to
#    both taps at once, for RUN_S seconds per scenario: no group, then a group
#    of the two with a point every INTERVAL. Prints p50 / p99 / p99.9 / max of
#    the write completion latency at each member, what each scenario adds to
#    the no-group p99, and the rounds made and abandoned meanwhile.
# 2. Group size. 2, 4, 8, ... and MAX_MEMBERS agents (one volume each): 20 rounds
#    on demand (cdpctl group point) per size, each round's hold at the
#    coordinator (first hold sent to last member held: what writes can wait)
#    as median and max, and the cdpctl call's wall time.
# A made round whose marker never shows in `cdpctl group points` is a wrong
# result (STRICT=1: exit 1).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
bench_init group_bench "${1:?usage: group_bench.sh BUILD_DIR [RUN_S] [MAX_MEMBERS] [INTERVALS_MS] [IOPS]}"
RT=${2:-20}
MAXM=${3:-16}
INTERVALS=${4:-"1000 5000 10000"}
IOPS=${5:-500}
bench_need fio python3 truncate
bench_pki on
DIR=$BENCH_DIR
VOL_SIZE=64M

cluster_up "$DIR/c"
truncate -s $VOL_SIZE "$DIR/vol-1.img"
agent_up m1="$DIR/vol-1.img"
A1=$(sed -n 's/^client_id = //p' "$DIR/c/etc/agent.conf")
[ -n "$A1" ] || bench_die "no client_id in $DIR/c/etc/agent.conf"
SOCK_1=$(sed -n 's/^nbd_unix = //p' "$DIR/c/etc/agent.conf")

# start_member I: agent host-I protecting mI, from the harness agent's config.
start_member() {
  local i=$1 d=$DIR/a$1 port
  mkdir -p "$d"
  truncate -s $VOL_SIZE "$DIR/vol-$i.img"
  port=$BENCH_NEXT_PORT
  BENCH_NEXT_PORT=$((BENCH_NEXT_PORT + 1))
  sed -e "s|^volume = .*|volume = m$i=$DIR/vol-$i.img|" -e "s|^nbd_unix = .*|nbd_unix = $d/nbd.sock|" \
    -e "s|^client_id = .*|client_id = host-$i|" -e "s|^bitmap_dir = .*|bitmap_dir = $d|" \
    -e "s|^control = .*|control = 127.0.0.1:$port|" "$DIR/c/etc/agent.conf" >"$DIR/agent-$i.conf"
  "$AGENT" --config "$DIR/agent-$i.conf" >"$DIR/agent-$i.log" 2>&1 &
  BENCH_EXTRA_PIDS+=("$!")
}
member() { [ "$1" = 1 ] && echo "$A1:m1" || echo "host-$1:m$1"; }
# held I: "COUNT SUM" of member I's cdp_agent_group_hold_seconds (writes that waited for a hold, seconds waited).
held() {
  local m
  if [ "$1" = 1 ]; then m=$(agent_get /metrics); else
    m=$(bench_get "$(sed -n 's/^control = 127.0.0.1://p' "$DIR/agent-$1.conf")" "$DIR/a$1/control.token" /metrics)
  fi
  echo "$(echo "$m" | sed -n 's/^cdp_agent_group_hold_seconds_count{[^}]*} //p') $(echo "$m" | sed -n 's/^cdp_agent_group_hold_seconds_sum{[^}]*} //p')"
}
sock() { [ "$1" = 1 ] && echo "$SOCK_1" || echo "$DIR/a$1/nbd.sock"; }

# group_of NAME N INTERVAL: the group of members 1..N; waits (60 s) until a
# round is made (every member's initial sync done).
group_of() {
  local name=$1 n=$2 interval=$3 args=() i t
  for i in $(seq 1 "$n"); do args+=(--member "$(member "$i")"); done
  ctl group create "$name" "${args[@]}" --interval "$interval" --at "${AT:-ps}" >/dev/null
  for t in $(seq 1 240); do
    ctl group point "$name" >/dev/null 2>&1 && return 0
    sleep 0.25  # polling a condition (the members' initial syncs), not a synchronisation
  done
  bench_die "group $name: no round made in 60 s: $(ctl group list 2>&1 | tail -n 3)"
}
# rounds NAME: "MADE ABANDONED" of group NAME at its coordinator.
rounds() { if [ "${AT:-ps}" = mt ]; then mt_get /v1/groups; else ps_get /v1/groups; fi | python3 -c "
import json, sys
b = json.load(sys.stdin)
for g in b['coordinated' if '${AT:-ps}' == 'mt' else 'groups']:
    if g['name'] == '$1': print(g['points_made'], g['rounds_abandoned'])"; }

# fio_pair NAME: 4 KiB random writes at QD1, IOPS per second, RT seconds, on members 1 and 2 at once.
fio_pair() {
  local i pids=()
  for i in 1 2; do
    fio --name="$1-$i" --ioengine=nbd --uri="nbd+unix:///m$i?socket=$(sock "$i")" --rw=randwrite --bs=4k \
      --iodepth=1 --rate_iops="$IOPS" --size=$VOL_SIZE --time_based --runtime="$RT" --numjobs=1 \
      --percentile_list=50:99:99.9 --output-format=json --output="$DIR/$1-$i.json" >/dev/null &
    pids+=("$!")
  done
  wait "${pids[@]}"
}
lat() { python3 - "$1" <<'PY'
import json, sys
w = json.load(open(sys.argv[1]))["jobs"][0]["write"]
c = w["clat_ns"]; p = c["percentile"]
print("%.3f %.3f %.3f %.3f %d" % (p["50.000000"] / 1e6, p["99.000000"] / 1e6, p["99.900000"] / 1e6, c["max"] / 1e6, w["total_ios"]))
PY
}

start_member 2
echo "## group_bench: $(date -u +%FT%TZ), $(nproc) CPUs, TLS, fio 4 KiB randwrite QD1 at $IOPS IOPS per member, $RT s per scenario"
echo
group_of warm 2 3600000  # both initial syncs done before anything is measured
ctl group remove warm >/dev/null
echo "| scenario | member | writes | p50 ms | p99 ms | p99.9 ms | max ms | p99 added ms | rounds made / abandoned | writes held, mean wait ms |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---|---|"
declare -A BASE HELD
for sc in none $INTERVALS; do
  made="-"
  if [ "$sc" != none ]; then
    group_of "pair" 2 "$sc"
    read -r m0 a0 < <(rounds pair)
  fi
  read -r hc1 hs1 < <(held 1)
  read -r hc2 hs2 < <(held 2)
  fio_pair "$sc"
  if [ "$sc" != none ]; then
    read -r m1 a1 < <(rounds pair)
    made="$((m1 - m0)) / $((a1 - a0))"
    ctl group remove pair >/dev/null
  fi
  read -r hd1 hsd1 < <(held 1)
  read -r hd2 hsd2 < <(held 2)
  HELD[1]=$(python3 -c "c = $hd1 - $hc1; print('%d, %.3f' % (c, ($hsd1 - $hs1) / c * 1e3) if c else '0, -')")
  HELD[2]=$(python3 -c "c = $hd2 - $hc2; print('%d, %.3f' % (c, ($hsd2 - $hs2) / c * 1e3) if c else '0, -')")
  for i in 1 2; do
    read -r p50 p99 p999 max n < <(lat "$DIR/$sc-$i.json")
    [ "$sc" = none ] && BASE[$i]=$p99
    added=$(python3 -c "print('%.3f' % ($p99 - ${BASE[$i]}))")
    label=$([ "$sc" = none ] && echo "no group" || echo "a point every ${sc} ms")
    echo "| $label | $(member "$i") | $n | $p50 | $p99 | $p999 | $max | $added | $made | ${HELD[$i]} |"
  done
done
echo
echo "| members | rounds | hold median ms | hold max ms | cdpctl group point median ms | abandoned |"
echo "|---:|---:|---:|---:|---:|---:|"
have=2
SIZES=$(for n in 2 4 8 16 32 64; do [ "$n" -lt "$MAXM" ] && echo "$n"; done; echo "$MAXM")
for n in $SIZES; do
  while [ "$have" -lt "$n" ]; do have=$((have + 1)); start_member "$have"; done
  group_of "g$n" "$n" 3600000
  : >"$DIR/holds-$n"
  abandoned=0 last=""
  for r in $(seq 1 20); do
    t0=$(date +%s%N)
    if out=$(ctl --json group point "g$n" 2>&1); then
      t1=$(date +%s%N)
      echo "$(echo "$out" | json_num hold_us) $(((t1 - t0) / 1000))" >>"$DIR/holds-$n"
      last=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["marker"])')
    else
      abandoned=$((abandoned + 1))
    fi
  done
  python3 - "$DIR/holds-$n" "$n" "$abandoned" <<'PY'
import statistics, sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
h = [r[0] / 1000 for r in rows]; w = [r[1] / 1000 for r in rows]
print("| %s | %d | %.2f | %.2f | %.1f | %s |" % (sys.argv[2], len(rows), statistics.median(h) if h else 0,
      max(h) if h else 0, statistics.median(w) if w else 0, sys.argv[3]))
PY
  # The last made round is a group point at the master target once applied.
  if [ -n "$last" ]; then
    ok=0
    for t in $(seq 1 2400); do  # 600 s: after a run flat out the master target has gigabytes to apply first
      ctl --json group points "g$n" 2>/dev/null | grep -q "\"$last\"" && { ok=1; break; }
      sleep 0.25  # polling a condition (the markers applied at the MT)
    done
    [ "$ok" = 1 ] || bench_wrong "group g$n: made round $last is not a group point at the master target"
  fi
  ctl group remove "g$n" >/dev/null
done
bench_finish
