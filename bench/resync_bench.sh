#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
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
# TIMEOUT=3600 (seconds, each wait), TLS=on, S3_DIRECT=1, TMPDIR=/var/tmp (where the images go),
# KEEP=1 (keep the scratch directory: images, logs, status), PERF=DIR (a
# system-wide `perf record -g` of the measured part of scenarios 1 and 3 into
# DIR/s1.data, DIR/s3.data, DIR/s3direct.data; PERF_ARGS="--call-graph dwarf,16384 -F 299"
# replaces -g for stacks through libraries built without frame pointers).
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
#     Each side starts settled: nothing dirty in the page cache, the source in it.
#     A second row (S3_DIRECT=0 skips it): the same sync with the agent shipping
#     straight to the master target (direct_agents: one hop, no spool). More
#     references in the notes: with TLS on, the same nbdcopy with both exports
#     requiring TLS (like for like: two encrypted hops each); `nbdcopy --flush`
#     and `dd oflag=direct conv=fsync` of the image, what a durable copy costs
#     on this disk (our replica is durable before it is acknowledged; plain
#     nbdcopy's destination is in the page cache). Each row opens its notes
#     with the disk's floor for its path: copies x dd's time (2 through the PS:
#     spool and replica on this one disk; 1 direct), the best rate ratio a path
#     bound only by that floor could reach, and our time against the floor.
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

# wait_synced WHAT: returns once the agent is connected, has nothing to resync
# or send, and the master target applied every record it captured. One Python
# process polls both /status every 20 ms: a poll costs about a millisecond of
# CPU, where curl and grep from bash cost a third of this 2-core machine and
# slowed the daemons being measured. Gives up after TIMEOUT seconds, when the
# agent exits, or when a /status goes unanswered 3 times in a row (10 s each).
wait_synced() {
  local rc=0
  CDP_TLS_CA=${CDP_TLS_CA:-} python3 - "$1" "$AG_CTL" "$AG_TOKEN" "$MT_CTL" "$MT_TOKEN" "$TIMEOUT" "$AG_PID" <<'PY' || rc=$?
import os, re, ssl, sys, time, urllib.request
what, ag_port, ag_token, mt_port, mt_token, timeout, pid = sys.argv[1:]
# HTTPS with the cluster's site CA (CDP_TLS_CA), plain HTTP with TLS off.
ca = os.environ.get("CDP_TLS_CA", "")
ctx = ssl.create_default_context(cafile=ca) if ca else None
scheme = "https" if ca else "http"
def get(port, token_file):
    with open(token_file) as f:
        token = f.read().strip()
    req = urllib.request.Request(f"{scheme}://127.0.0.1:{port}/status",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
        return r.read().decode()
def num(text, key):
    m = re.search(f'"{key}":([0-9.e+-]*)', text)
    return m.group(1) if m else None
deadline = time.monotonic() + float(timeout)
last_say = time.monotonic()
mute = 0
while True:
    try:
        a = get(ag_port, ag_token)
        m = get(mt_port, mt_token)
        mute = 0
        nxt, acked = num(a, "next_seq"), num(a, "acked_seq")
        applied = num(m, "applied_seq")
        if ('"connected":true' in a and nxt is not None and applied is not None
                and num(a, "resync_remaining") == "0" and num(a, "queue_records") == "0"
                and acked == str(int(nxt) - 1) and applied == acked):
            sys.exit(0)
    except OSError:
        mute += 1
        if mute >= 3:
            print(f"resync_bench: {what}: the agent's or the MT's /status did not answer "
                  "3 times in a row (10 s each): a hung daemon?", file=sys.stderr)
            sys.exit(1)
        a = m = ""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        print(f"resync_bench: {what}: the agent exited", file=sys.stderr)
        sys.exit(1)
    now = time.monotonic()
    if now > deadline:
        print(f"resync_bench: {what}: not synced within {timeout} s: {a}", file=sys.stderr)
        sys.exit(1)
    if now - last_say >= 10:
        last_say = now
        print(f"resync_bench:   {what}: resync_remaining {num(a, 'resync_remaining')} regions, "
              f"{num(a, 'resync_remaining_bytes')} bytes; acked {num(a, 'acked_seq')}, "
              f"MT applied {num(m, 'applied_seq')}", file=sys.stderr)
    time.sleep(0.02)
PY
  [ $rc = 0 ] || bench_die "$1: see above"
}
# hash_retries [LOG]: the agent's resync pauses after a hash request the replica
# did not answer (LOG: default the running cluster's agent log).
hash_retries() { grep -c 'could not answer a hash request' "${1:-$CLUSTER_DIR/agent.log}" || true; }
same() { cmp -s "$1" "$2" && echo identical || echo MISMATCH; }
# settle FILE: the same start for each side of a comparison: no dirty pages
# left by what ran before (their writeback would slow whatever runs next: the
# nbdcopy reference took 1.7 to 6.6 s depending on it), FILE in the page cache.
settle() { sync; cat "$1" >/dev/null; }
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
  bench_perf_start s1
  t0=$(now)
  agent_up "$VOL=$d/source.img"
  wait_synced "1: resync"
  t1=$(now)
  bench_perf_stop
  a=$(agent_get /status)
  echo "$a" >"$d/agent-status.json"
  shipped=$(field "$a" resync_shipped_bytes); sent=$(field "$a" bytes_sent)
  blocks=$(field "$a" resync_shipped_blocks); read=$(field "$a" resync_read_bytes)
  check=$(same "$d/source.img" "$(replica)")
  [ "$check" = identical ] || bench_wrong "1: the replica differs from the source after the resync"
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

# sync3 DIR NAME [direct]: the initial sync of DIR/source.img onto a fresh
# cluster in DIR (removed after), the agent shipping to the PS, or with
# `direct` straight to the MT (a direct agent: the tenant in the MT's
# direct_agents). Sets T0 T1 (agent start, then replica == source as
# wait_synced sees it), SENT, CPU, CHECK, READ (resync_read_bytes), SPOOL
# (what the PS's spool read back from files, of all it read); keeps the
# agent's log as DIR/NAME-agent.log; `perf record` into NAME.data.
sync3() {
  local d=$1 a p
  if [ "${3:-}" = direct ]; then DIRECT_AGENT=1 cluster_up "$d"; else cluster_up "$d"; fi
  settle "$d/source.img"
  bench_perf_start "$2"
  T0=$(now)
  agent_up "$VOL=$d/source.img"
  wait_synced "3: initial sync ($2)"
  T1=$(now)
  bench_perf_stop
  a=$(agent_get /status)
  echo "$a" >"$d/$2-agent-status.json"
  SENT=$(field "$a" bytes_sent) READ=$(field "$a" resync_read_bytes)
  CPU=$(daemon_cpu)
  p=$(ps_get /v1/volumes)
  SPOOL="$(mb "$(field "$p" spool_read_file_bytes)") of $(mb "$(field "$p" spool_read_bytes)")"
  CHECK=$(same "$d/source.img" "$(replica)")
  [ "$CHECK" = identical ] || bench_wrong "3 ($2): the replica differs from the source after the initial sync"
  cp "$CLUSTER_DIR/agent.log" "$d/$2-agent.log"
  cluster_down
  rm -rf "${d:?}/mt" "$d/ps" "$d/agent"
}

# fresh3 DIR: an empty DIR/copy.img, the source settled.
fresh3() { rm -f "$1/copy.img"; truncate -s "$SIZE" "$1/copy.img"; settle "$1/source.img"; }

# row3 LABEL T0 T1 SENT CHECK REF_T0 REF_T1 NOTES: one Markdown row, rate against the reference.
row3() {
  local r res
  r=$(awk -v s="$SIZE" -v a="$(secs "$2" "$3")" -v b="$(secs "$6" "$7")" 'BEGIN {
    printf "%.3fx (%.1f / %.1f MB/s)", b / a, s / 1e6 / a, s / 1e6 / b }')
  res=$(awk -v r="${r%%x*}" -v c="$5" 'BEGIN {
    if (c != "identical") print "**replica differs**"; else print (r >= 0.8 ? "met" : "missed") }')
  echo "| $1 | $HUMAN | $(secs "$2" "$3") | $(mb "$4") | nbdcopy, nbdkit file -> nbdkit file | $(secs "$6" "$7") | $(mb "$SIZE") | rate $r | >= 0.8x | $res | $8 |"
}

scenario3() {
  local d=$BENCH_DIR/s3 t2 t3 ncheck tref="" t6 t7 t8 t9 refs
  local p_t0 p_t1 p_sent p_check p_notes
  say "3: initial sync of $HUMAN of random data, agent -> PS -> MT"
  mkdir -p "$d"
  random_image "$d/source.img" "$SIZE" 3
  sync3 "$d" s3
  p_t0=$T0 p_t1=$T1 p_sent=$SENT p_check=$CHECK
  p_notes="replica $CHECK; $(hash_retries "$d/s3-agent.log") unanswered hash requests; read $(mb "$READ"); CPU: $CPU; PS spool read back from files $SPOOL"
  say "3: nbdcopy between two nbdkit file exports (reference)"
  fresh3 "$d"
  t2=$(now)
  nbdcopy -- [ nbdkit -r file "$d/source.img" ] [ nbdkit file "$d/copy.img" ]
  t3=$(now)
  ncheck=$(same "$d/source.img" "$d/copy.img")
  # The other topology the product has: a direct agent (one hop, no spool).
  if [ "${S3_DIRECT:-1}" = 1 ]; then
    say "3: the same initial sync, agent -> MT directly (direct_agents)"
    sync3 "$d" s3direct direct
  fi
  # Like for like when our links are encrypted: the same copy with both
  # exports requiring TLS (nbds+unix; nbdkit and libnbd use GnuTLS), two
  # encrypted hops as ours has. The client does not verify the server: the
  # cost measured is the encryption's.
  if [ "${TLS:-on}" = on ]; then
    say "3: nbdcopy over TLS between two nbdkit file exports (reference, like for like)"
    local td=$d/nbdtls t4 t5 uri
    mkdir -p "$td"
    cp "$BENCH_DIR/pki/ca.crt" "$td/ca-cert.pem"
    cp "$BENCH_DIR/pki/mt.crt" "$td/server-cert.pem"
    cp "$BENCH_DIR/pki/mt.key" "$td/server-key.pem"
    fresh3 "$d"
    nbdkit -U "$td/src.sock" -P "$td/src.pid" --tls=require --tls-certificates="$td" -r file "$d/source.img"
    nbdkit -U "$td/dst.sock" -P "$td/dst.pid" --tls=require --tls-certificates="$td" file "$d/copy.img"
    BENCH_EXTRA_PIDS+=("$(cat "$td/src.pid")" "$(cat "$td/dst.pid")")
    uri() { echo "nbds+unix:///?socket=$td/$1.sock&tls-certificates=$td&tls-verify-peer=false"; }
    t4=$(now)
    nbdcopy "$(uri src)" "$(uri dst)"
    t5=$(now)
    kill "$(cat "$td/src.pid")" "$(cat "$td/dst.pid")"
    tref="nbdcopy over TLS $(secs "$t4" "$t5") s ($(same "$d/source.img" "$d/copy.img")); "
  fi
  # What a durable copy costs on this disk: nbdcopy ending with a flush of
  # its destination, and one O_DIRECT write of the image (dd, then fsync).
  # The master target acknowledges only a durable replica (and the PS only a
  # durable spool): dd's time is a floor for any durable copy here (see
  # floor below).
  say "3: nbdcopy --flush, and dd oflag=direct (durable references)"
  fresh3 "$d"
  t6=$(now)
  nbdcopy --flush -- [ nbdkit -r file "$d/source.img" ] [ nbdkit file "$d/copy.img" ]
  t7=$(now)
  fresh3 "$d"
  t8=$(now)
  dd if="$d/source.img" of="$d/copy.img" bs=8M oflag=direct conv=fsync,notrunc status=none
  t9=$(now)
  refs="${tref}nbdcopy --flush $(secs "$t6" "$t7") s; dd oflag=direct $(secs "$t8" "$t9") s; nbdcopy result $ncheck"
  # The disk's floor for each path: the path through the PS writes every
  # byte durably twice on this one disk (spool, replica), a direct agent
  # once (replica). Floor = copies x dd's time; "at best" = the rate ratio
  # against plain nbdcopy that a path could reach if its only cost were that
  # floor; "ours" = our time / the floor.
  floor() {
    awk -v c="$1" -v dd="$(secs "$t8" "$t9")" -v n="$(secs "$t2" "$t3")" -v ours="$(secs "$2" "$3")" 'BEGIN {
      f = c * dd
      printf "disk floor %d x dd = %.2f s: at best %.2fx of nbdcopy'"'"'s rate; ours %.2fx the floor", c, f, n / f, ours / f }'
  }
  row3 "3 initial sync, random data, over loopback (TLS ${TLS:-on}), agent -> PS -> MT" "$p_t0" "$p_t1" "$p_sent" "$p_check" "$t2" "$t3" \
    "$(floor 2 "$p_t0" "$p_t1"); $refs; $p_notes"
  if [ "${S3_DIRECT:-1}" = 1 ]; then
    row3 "3 the same, agent -> MT directly (direct_agents)" "$T0" "$T1" "$SENT" "$CHECK" "$t2" "$t3" \
      "$(floor 1 "$T0" "$T1"); replica $CHECK; $(hash_retries "$d/s3direct-agent.log") unanswered hash requests; read $(mb "$READ"); CPU: $CPU"
  fi
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
  [ "$rc2" = 0 ] && [ "$n2" = 0 ] || bench_wrong "4: cdpctl verify at rest: exit $rc2, $n2 differences"
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
bench_finish
