#!/usr/bin/env bash
# Resync benchmark (issue #13): the agent's block-granular resync and initial
# sync against rsync and nbdcopy on the same images in the same run, and
# `cdpctl verify` under load. All three daemons on this machine (loopback, TLS
# by `cdpctl pki`), one volume per scenario, each scenario in its own
# directory, removed when it ends.
#
#   bash bench/resync_bench.sh BUILD_DIR [SIZE_GIB=2] [SCENARIOS=1,2,3,4]
#
# SIZE_GIB is the image size of scenarios 1, 3 and 4 (a number of GiB, or a size
# such as 256M for a quick check of the script). Environment: SPARSE_SIZE=64G
# (scenario 2), CHANGE_PCT=1 (scenario 1), CHURN_MBS=20 (scenario 4),
# TIMEOUT=3600 (seconds, each wait), TLS=on, TMPDIR=/var/tmp (where the images go),
# KEEP=1 (keep the scratch directory: images, logs, status).
#
#   1 resync after a full-resync restart: a replicated image of random data;
#     agent stopped; CHANGE_PCT % of its 4 KiB blocks rewritten at random
#     (seed 42) in the backing file; the bitmap file deleted; agent started.
#     Time until nothing is left to resync and the master target applied every
#     record (replica == source, cmp), bytes shipped (resync_shipped_bytes;
#     bytes_sent, the record data the agent sent). Reference: rsync -I
#     --inplace --no-whole-file --block-size=4096 from the changed image onto a
#     copy of the old one (time, "Literal data"). Targets: time <= 1/3 of
#     rsync's, bytes <= 1.2x rsync's literal data.
#   2 initial sync of an empty sparse SPARSE_SIZE volume: time from agent start
#     until resync_remaining == 0 and the MT applied everything. Target < 5 s
#     (and resync_read_bytes 0: holes are not read).
#   3 initial sync of SIZE_GIB of random data: time from agent start until
#     replica == source; rate against `nbdcopy` between two `nbdkit file`
#     exports (Unix sockets) of the same images. Target >= 0.8x nbdcopy's rate.
#   4 `cdpctl verify VOLUME --json` of a synced SIZE_GIB volume while
#     `cdp-loadgen churn` writes CHURN_MBS MB/s (random 64 KiB writes) through
#     the agent's NBD tap: duration, source read rate (size / duration) and the
#     differences reported (target 0); then verify again at rest.
#
# Prints a Markdown table (stdout; progress on stderr); docs/benchmarks.md
# "Resync" records runs.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"

usage="usage: resync_bench.sh BUILD_DIR [SIZE_GIB=2] [SCENARIOS=1,2,3,4]"
bench_init resync_bench "${1:?$usage}"
SIZE_ARG=${2:-2}
SCENARIOS=${3:-1,2,3,4}
SPARSE_SIZE=${SPARSE_SIZE:-64G}
CHANGE_PCT=${CHANGE_PCT:-1}
CHURN_MBS=${CHURN_MBS:-20}
TIMEOUT=${TIMEOUT:-3600}
bench_need python3 cmp truncate numfmt df awk
case ,$SCENARIOS, in *,1,*) bench_need rsync ;; esac
case ,$SCENARIOS, in *,3,*) bench_need nbdkit nbdcopy ;; esac
for s in ${SCENARIOS//,/ }; do
  case $s in 1|2|3|4) ;; *) echo "resync_bench: unknown scenario '$s' (1..4)"; exit 2 ;; esac
done

case $SIZE_ARG in
  *[KkMmGgTt]) SIZE=$(numfmt --from=iec "${SIZE_ARG^^}") ;;
  *) SIZE=$(awk -v g="$SIZE_ARG" 'BEGIN {printf "%.0f", g * 1073741824}') ;;
esac
SPARSE=$(numfmt --from=iec "${SPARSE_SIZE^^}")
# Whole regions (1 MiB, the agent's default region_size).
SIZE=$(( SIZE / 1048576 * 1048576 ))
[ "$SIZE" -ge 1048576 ] || { echo "resync_bench: SIZE_GIB too small" >&2; exit 2; }

# Space: a scenario holds the source, a reference copy, the replica, and up to
# one image's worth each in the MT's undo journal and the PS spool.
need=$(( 6 * SIZE + (1 << 30) ))
free=$(df -B1 --output=avail "$BENCH_DIR" | tail -n1)
if [ "$free" -lt "$need" ]; then
  echo "resync_bench: $(numfmt --to=iec "$free") free under $BENCH_DIR, want $(numfmt --to=iec "$need") (6x the image + 1 GiB); set TMPDIR" >&2
  exit 2
fi
bench_pki "${TLS:-on}"
say() { echo "resync_bench: $*" >&2; }
now() { date +%s.%N; }
VOL=vol
replica() { echo "$CLUSTER_DIR/mt/tenants/bench/volumes/$VOL/replica.img"; }

# random_image PATH BYTES SEED: the same bytes for the same seed.
random_image() {
  python3 - "$@" <<'PY'
import random, sys
path, size, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(seed)
with open(path, "wb") as f:
    while size:
        n = min(size, 4 << 20)
        f.write(r.randbytes(n))
        size -= n
PY
}
# change_blocks PATH PERCENT SEED: rewrites PERCENT % of the 4 KiB blocks, picked
# at random, with random bytes, in place; prints how many.
change_blocks() {
  python3 - "$@" <<'PY'
import os, random, sys
path, pct, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
r = random.Random(seed)
blocks = os.path.getsize(path) // 4096
picked = sorted(r.sample(range(blocks), max(1, round(blocks * pct / 100))))
with open(path, "r+b") as f:
    for b in picked:
        f.seek(b * 4096)
        f.write(r.randbytes(4096))
    f.flush()
    os.fsync(f.fileno())
print(len(picked))
PY
}

# synced: the agent is connected, has nothing to resync or send, and the master
# target applied every record it captured. 1: not yet; 2: a /status went unanswered.
synced() {
  local a m next acked q rr applied
  a=$(agent_get /status 2>/dev/null) || return 2
  m=$(mt_get /status 2>/dev/null) || return 2
  echo "$a" | grep -q '"connected":true' || return 1
  next=$(echo "$a" | json_num next_seq); acked=$(echo "$a" | json_num acked_seq)
  q=$(echo "$a" | json_num queue_records); rr=$(echo "$a" | json_num resync_remaining)
  applied=$(echo "$m" | json_num applied_seq)
  [ -n "$next" ] && [ -n "$applied" ] && [ "$rr" = 0 ] && [ "$q" = 0 ] && [ "$acked" = $((next - 1)) ] &&
    [ "$applied" = "$acked" ]
}
# wait_synced WHAT: polls every 50 ms; gives up after TIMEOUT seconds.
wait_synced() {
  local deadline=$(( $(date +%s) + TIMEOUT )) last=0 r rc mute=0
  while :; do
    rc=0
    synced || rc=$?
    [ $rc = 0 ] && return 0
    kill -0 "$AG_PID" 2>/dev/null || bench_die "$1: the agent exited"
    if [ $rc = 2 ]; then
      mute=$((mute + 1))
      [ $mute -lt 3 ] || bench_die "$1: the agent's or the MT's /status did not answer 3 times in a row (10 s each): a hung daemon?"
    else
      mute=0
    fi
    [ "$(date +%s)" -lt $deadline ] || bench_die "$1: not synced within $TIMEOUT s: $(agent_get /status)"
    if [ $(( $(date +%s) - last )) -ge 10 ]; then
      last=$(date +%s)
      r=$(agent_get /status 2>/dev/null || true)
      say "  $1: resync_remaining $(echo "$r" | json_num resync_remaining) regions," \
        "$(echo "$r" | json_num resync_remaining_bytes) bytes; acked $(echo "$r" | json_num acked_seq)," \
        "MT applied $(mt_get /status 2>/dev/null | json_num applied_seq)"
    fi
    sleep 0.05
  done
}
# hash_retries: the agent's resync pauses after a hash request the replica did not answer.
hash_retries() { grep -c 'could not answer a hash request' "$CLUSTER_DIR/agent.log" || true; }
same() { cmp -s "$1" "$2" && echo identical || echo MISMATCH; }
field() { echo "$1" | json_num "$2"; }
mb() { awk -v b="$1" 'BEGIN {printf "%.1f MB", b / 1e6}'; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", b - a}'; }
HUMAN=$(numfmt --to=iec --suffix=B "$SIZE")
NOTES=()

echo "| scenario | size | time (s) | bytes shipped | reference | ref. time (s) | ref. bytes | ratio | target | result | notes |"
echo "|---|---:|---:|---:|---|---:|---:|---|---|---|---|"

scenario1() {
  local d=$BENCH_DIR/s1 a t0 t1 t2 t3 n shipped sent blocks read check literal rcheck tratio bratio res
  say "1: $HUMAN of random data, initial sync (not measured)"
  mkdir -p "$d"
  random_image "$d/source.img" "$SIZE" 1
  cluster_up "$d"
  agent_up "$VOL=$d/source.img"
  wait_synced "1: initial sync"
  [ "$(same "$d/source.img" "$(replica)")" = identical ] || bench_die "1: replica differs after the initial sync"
  agent_down
  cp --sparse=never "$d/source.img" "$d/old.img"
  n=$(change_blocks "$d/source.img" "$CHANGE_PCT" 42)
  rm -f "$d/agent/$VOL.bitmap"
  say "1: $n blocks of 4 KiB changed, bitmap deleted; agent restarted"
  t0=$(now)
  agent_up "$VOL=$d/source.img"
  wait_synced "1: resync"
  t1=$(now)
  a=$(agent_get /status)
  echo "$a" >"$d/agent-status.json"
  shipped=$(field "$a" resync_shipped_bytes); sent=$(field "$a" bytes_sent)
  blocks=$(field "$a" resync_shipped_blocks); read=$(field "$a" resync_read_bytes)
  check=$(same "$d/source.img" "$(replica)")
  cluster_down
  say "1: rsync (reference)"
  t2=$(now)
  rsync -I --inplace --no-whole-file --block-size=4096 --stats "$d/source.img" "$d/old.img" >"$d/rsync.out"
  t3=$(now)
  literal=$(grep 'Literal data' "$d/rsync.out" | tr -d , | grep -oE '[0-9]+' | head -n1)
  rcheck=$(same "$d/source.img" "$d/old.img")
  tratio=$(awk -v a="$(secs "$t0" "$t1")" -v b="$(secs "$t2" "$t3")" 'BEGIN {printf "%.3f", (b > 0 ? a / b : 0)}')
  bratio=$(awk -v a="$sent" -v b="$literal" 'BEGIN {printf "%.3f", (b > 0 ? a / b : 0)}')
  res=$(awk -v t="$tratio" -v b="$bratio" -v c="$check" 'BEGIN {
    if (c != "identical") {print "**replica differs**"; exit}
    m = ""; if (t > 1 / 3) m = m " time"; if (b > 1.2) m = m " bytes"
    print (m == "" ? "met" : "missed:" m) }')
  echo "| 1 resync, ${CHANGE_PCT}% of 4 KiB blocks changed, bitmap deleted | $HUMAN | $(secs "$t0" "$t1") | $(mb "$sent") | rsync --no-whole-file -B4096 | $(secs "$t2" "$t3") | $(mb "$literal") (literal) | time ${tratio}x, bytes ${bratio}x | time <= 0.33x, bytes <= 1.2x | $res | $n blocks changed ($(mb $((n * 4096)))); resync shipped $blocks blocks, $(mb "$shipped"); read $(mb "$read"); $(hash_retries) unanswered hash requests; replica $check; rsync result $rcheck |"
  bench_rm "$d"
}

scenario2() {
  local d=$BENCH_DIR/s2 a t0 t1 read shipped alloc res
  say "2: initial sync of an empty sparse $SPARSE_SIZE volume"
  mkdir -p "$d"
  truncate -s "$SPARSE" "$d/source.img"
  cluster_up "$d"
  t0=$(now)
  agent_up "$VOL=$d/source.img"
  wait_synced "2: initial sync"
  t1=$(now)
  a=$(agent_get /status)
  echo "$a" >"$d/agent-status.json"
  read=$(field "$a" resync_read_bytes); shipped=$(field "$a" bytes_sent)
  alloc=$(du -B1 "$(replica)" | cut -f1)
  cluster_down
  res=$(awk -v t="$(secs "$t0" "$t1")" -v r="$read" 'BEGIN {
    m = ""; if (t >= 5) m = m " time"; if (r > 0) m = m " read"; print (m == "" ? "met" : "missed:" m) }')
  echo "| 2 initial sync, empty sparse volume | $SPARSE_SIZE | $(secs "$t0" "$t1") | $(mb "$shipped") | - | - | - | - | < 5 s, 0 bytes read | $res | resync_read_bytes $read; replica allocated $(mb "$alloc"); $(hash_retries) unanswered hash requests |"
  bench_rm "$d"
}

scenario3() {
  local d=$BENCH_DIR/s3 a t0 t1 t2 t3 sent check ncheck ours ref r res
  say "3: initial sync of $HUMAN of random data"
  mkdir -p "$d"
  random_image "$d/source.img" "$SIZE" 3
  cluster_up "$d"
  t0=$(now)
  agent_up "$VOL=$d/source.img"
  wait_synced "3: initial sync"
  t1=$(now)
  a=$(agent_get /status)
  echo "$a" >"$d/agent-status.json"
  sent=$(field "$a" bytes_sent)
  check=$(same "$d/source.img" "$(replica)")
  cluster_down
  say "3: nbdcopy between two nbdkit file exports (reference)"
  truncate -s "$SIZE" "$d/copy.img"
  t2=$(now)
  nbdcopy -- [ nbdkit -r file "$d/source.img" ] [ nbdkit file "$d/copy.img" ]
  t3=$(now)
  ncheck=$(same "$d/source.img" "$d/copy.img")
  ours=$(awk -v s="$SIZE" -v t="$(secs "$t0" "$t1")" 'BEGIN {printf "%.1f", s / 1e6 / t}')
  ref=$(awk -v s="$SIZE" -v t="$(secs "$t2" "$t3")" 'BEGIN {printf "%.1f", s / 1e6 / t}')
  r=$(awk -v a="$ours" -v b="$ref" 'BEGIN {printf "%.3f", a / b}')
  res=$(awk -v r="$r" -v c="$check" 'BEGIN {
    if (c != "identical") print "**replica differs**"; else print (r >= 0.8 ? "met" : "missed") }')
  echo "| 3 initial sync, random data, over loopback (TLS ${TLS:-on}) | $HUMAN | $(secs "$t0" "$t1") | $(mb "$sent") | nbdcopy, nbdkit file -> nbdkit file | $(secs "$t2" "$t3") | $(mb "$SIZE") | rate ${r}x ($ours / $ref MB/s) | >= 0.8x | $res | replica $check; $(hash_retries) unanswered hash requests; read $(mb "$(field "$a" resync_read_bytes)"); nbdcopy result $ncheck |"
  bench_rm "$d"
}

# differences FILE: how many differences `cdpctl verify --json` reported ("?" when unknown).
differences() {
  python3 - "$1" <<'PY'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception:
    print("?"); sys.exit()
for k in ("differences", "differing_blocks", "differing_regions", "differing"):
    v = j.get(k)
    if isinstance(v, list): print(len(v)); break
    if isinstance(v, (int, float)) and not isinstance(v, bool): print(int(v)); break
else:
    print("?")
PY
}

scenario4() {
  local d=$BENCH_DIR/s4 c0 c1 tc t0 t1 rc rc2 n n2 dur rate churn_rate res pid
  say "4: verify of $HUMAN while churn writes $CHURN_MBS MB/s through the tap"
  mkdir -p "$d"
  random_image "$d/source.img" "$SIZE" 4
  cluster_up "$d"
  agent_up "$VOL=$d/source.img"
  wait_synced "4: initial sync"
  "$LOADGEN" churn --target "nbd+unix:///$VOL?socket=$d/agent/nbd.sock" --rate "$CHURN_MBS" --duration 24h \
    --pattern random --io-size 64KiB --compressibility 0.75 --seed 9 --flush-every 16MiB >"$d/churn.out" 2>&1 &
  pid=$!
  BENCH_EXTRA_PIDS+=("$pid")
  c0=$(agent_get /status | json_num captured_bytes)
  tc=$(now)
  sleep 3  # the churn is running at its rate
  kill -0 "$pid" 2>/dev/null || bench_die "4: cdp-loadgen churn exited: $(tail -n 3 "$d/churn.out")"
  t0=$(now)
  rc=0
  ctl --json verify "$VOL" >"$d/verify.json" 2>"$d/verify.err" || rc=$?
  t1=$(now)
  c1=$(agent_get /status | json_num captured_bytes)
  tc=$(secs "$tc" "$(now)")
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  n=$(differences "$d/verify.json")
  say "4: churn stopped; verify again at rest"
  wait_synced "4: catch-up"
  rc2=0
  ctl --json verify "$VOL" >"$d/verify2.json" 2>>"$d/verify.err" || rc2=$?
  n2=$(differences "$d/verify2.json")
  cluster_down
  dur=$(secs "$t0" "$t1")
  rate=$(awk -v s="$SIZE" -v t="$dur" 'BEGIN {printf "%.1f", s / 1e6 / t}')
  churn_rate=$(awk -v a="$c0" -v b="$c1" -v t="$tc" 'BEGIN {printf "%.1f", (b - a) / 1e6 / t}')
  res=$( [ "$n" = 0 ] && echo met || echo "missed: $n differences")
  echo "| 4 cdpctl verify under ${CHURN_MBS} MB/s churn | $HUMAN | $dur | - | - | - | - | - | 0 differences | $res | source read $rate MB/s; churn $churn_rate MB/s (captured, over its $tc s); exit $rc; at rest: $n2 differences, exit $rc2 |"
  NOTES+=("verify under churn (exit $rc): $(head -c 600 "$d/verify.json")")
  NOTES+=("verify at rest (exit $rc2): $(head -c 600 "$d/verify2.json")")
  [ -s "$d/verify.err" ] && NOTES+=("verify stderr: $(head -c 600 "$d/verify.err")")
  bench_rm "$d"
}

for s in ${SCENARIOS//,/ }; do "scenario$s"; done
if [ ${#NOTES[@]} -gt 0 ]; then
  echo
  for n in "${NOTES[@]}"; do echo "- $n"; done
fi
