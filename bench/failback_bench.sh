#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Failback benchmark (issue #14): `cdpctl failback` of a volume against
# `nbdcopy` of the whole promoted volume between the same endpoints (the
# master target's NBD export -> the original site's disk), in the same run.
# All three daemons on this machine (loopback, TLS by `cdpctl pki`).
#
#   bash bench/failback_bench.sh BUILD_DIR [SIZE_GIB=2] [LINK_MBIT=0]
#
# LINK_MBIT > 0 puts the provider behind an emulated WAN link for the two
# measured steps: LINK_MBIT Mbit/s each way on the loopback traffic to and
# from the master target's data and NBD ports (bench_link_on in lib.sh; root),
# as between a protected site and its provider. 0: plain loopback.
#
# Environment: PROVIDER_PCT=1, SITE_PCT=0.5, TIMEOUT=3600, TMPDIR=/var/tmp,
# KEEP=1 (keep the scratch directory).
#
#   1. SIZE_GIB of random data, protected (initial sync, not measured); tag t.
#   2. The process server is stopped; SITE_PCT % of the 4 KiB blocks are
#      written through the agent's tap (random data, seed 2): captured, never
#      shipped.
#   3. `cdpctl failover vol --to t`; PROVIDER_PCT % of the blocks are written
#      to the promoted export (random data, seed 3). The process server is
#      started again.
#   4. Measured: `cdpctl failback vol` — its time, and the bytes that crossed
#      to and from the agent (frames, compressed, digests included).
#      Reference: `nbdcopy --flush` of the whole promoted export to a file at
#      the original site (time, bytes = the volume). --flush: durable at the
#      end, as failback is (it syncs the branch and the source as it goes).
#   Differing blocks: the original volume before failback against the
#   promoted image, compared block by block. Targets: bytes <= 1.2x the
#   differing blocks' bytes; time <= 1/10 of nbdcopy's.
#
# Writes go through `nbdcopy --destination-is-zero` from a sparse file holding
# only the blocks to write (so only those are written, with random data that
# does not compress). Prints a Markdown table (stdout; progress on stderr).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"

usage="usage: failback_bench.sh BUILD_DIR [SIZE_GIB=2] [LINK_MBIT=0]"
bench_init failback_bench "${1:?$usage}"
SIZE_ARG=${2:-2}
LINK_MBIT=${3:-0}
PROVIDER_PCT=${PROVIDER_PCT:-1}
SITE_PCT=${SITE_PCT:-0.5}
TIMEOUT=${TIMEOUT:-3600}
bench_need python3 nbdcopy cmp numfmt awk
case $SIZE_ARG in
  *[KkMmGgTt]) SIZE=$(numfmt --from=iec "${SIZE_ARG^^}") ;;
  *) SIZE=$(awk -v g="$SIZE_ARG" 'BEGIN {printf "%.0f", g * 1073741824}') ;;
esac
SIZE=$(( SIZE / 1048576 * 1048576 ))
bench_pki on
say() { echo "failback_bench: $*" >&2; }
now() { date +%s.%N; }
VOL=vol
D=$BENCH_DIR/run
mkdir -p "$D"

random_image "$D/source.img" "$SIZE" 1
# patch_file PATH PERCENT SEED: a sparse file of the volume's size holding
# PERCENT % of the 4 KiB blocks (picked at random) with random bytes; prints
# how many.
patch_file() {
  python3 - "$1" "$SIZE" "$2" "$3" <<'PY'
import random, sys
path, size, pct, seed = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
r = random.Random(seed)
blocks = size // 4096
picked = sorted(r.sample(range(blocks), max(1, round(blocks * pct / 100))))
with open(path, "wb") as f:
    f.truncate(size)
    for b in picked:
        f.seek(b * 4096)
        f.write(r.randbytes(4096))
print(len(picked))
PY
}

cluster_up "$D"
agent_up "$VOL=$D/source.img"
say "initial sync of $(numfmt --to=iec "$SIZE") (not measured)"
for _ in $(seq $((TIMEOUT * 10))); do
  st=$(agent_get /status)
  if echo "$st" | grep -q '"resync_remaining":0' && echo "$st" | grep -q '"queue_records":0' &&
     [ "$(echo "$st" | json_num acked_seq)" = "$(mt_get /status | json_num applied_seq)" ]; then break; fi
  sleep 0.1
done
ctl tag t >/dev/null
sleep 1
NBDC=$CDP_MT_NBD_TLS_DIR  # the tenant's NBD client certificate, made by the harness

say "process server stopped; $SITE_PCT % of the blocks written at the original site"
cluster_cmd stop ps
site_blocks=$(patch_file "$D/site.patch" "$SITE_PCT" 2)
nbdcopy --destination-is-zero "$D/site.patch" "nbd+unix:///$VOL?socket=$D/agent/nbd.sock"
cp --sparse=never "$D/source.img" "$D/diverged.img"

say "failover; $PROVIDER_PCT % of the blocks written at the provider"
ctl failover $VOL --to t >/dev/null
URI="nbds://127.0.0.1:$MT_NBD_PORT/bench/$VOL@failover?tls-certificates=$NBDC"
prov_blocks=$(patch_file "$D/provider.patch" "$PROVIDER_PCT" 3)
nbdcopy --destination-is-zero --flush "$D/provider.patch" "$URI"
# The process server again (same ports and spool).
cluster_cmd restart ps

if [ "$LINK_MBIT" != 0 ]; then
  say "a WAN link of $LINK_MBIT Mbit/s each way between the site and the provider"
  bench_link_on "$LINK_MBIT" "$MT_DATA" "$MT_NBD_PORT"
fi
say "reference: nbdcopy of the whole promoted export"
sync
t0=$(now)
nbdcopy --flush "$URI" "$D/promoted.img"
t1=$(now)
ref_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
differ=$(python3 - "$D/diverged.img" "$D/promoted.img" <<'PY'
import sys
n = 0
with open(sys.argv[1], "rb") as a, open(sys.argv[2], "rb") as b:
    while True:
        x, y = a.read(4096), b.read(4096)
        if not x:
            break
        n += x != y
print(n)
PY
)

say "measured: cdpctl failback"
t0=$(now)
ctl --json failback $VOL >"$D/failback.json"
t1=$(now)
fb_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
bench_link_off
read -r in_b out_b pulled passes < <(python3 - "$D/failback.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
p = r["passes"]
print(sum(x["wire_bytes_in"] for x in p), sum(x["wire_bytes_out"] for x in p),
      sum(x["pulled_blocks"] for x in p), len(p))
PY
)
check=$(cmp -s "$D/source.img" "$D/promoted.img" && echo identical || echo MISMATCH)
[ "$check" = identical ] || bench_wrong "after failback the source differs from the promoted image"
diff_bytes=$((differ * 4096))
bytes=$((in_b + out_b))
bratio=$(awk -v a="$bytes" -v b="$diff_bytes" 'BEGIN {printf "%.3f", a / b}')
tratio=$(awk -v a="$fb_s" -v b="$ref_s" 'BEGIN {printf "%.3f", a / b}')
res_b=$(awk -v r="$bratio" 'BEGIN {print (r <= 1.2) ? "met" : "MISSED"}')
res_t=$(awk -v r="$tratio" 'BEGIN {print (r <= 0.1) ? "met" : "MISSED"}')
echo "| volume | link | site blocks | provider blocks | differing blocks | pulled | passes | failback (s) | bytes in + out | nbdcopy (s) | nbdcopy bytes | bytes / differing | time / nbdcopy | source = promoted |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"
link=$([ "$LINK_MBIT" = 0 ] && echo loopback || echo "$LINK_MBIT Mbit/s")
echo "| $(numfmt --to=iec "$SIZE") | $link | $site_blocks | $prov_blocks | $differ | $pulled | $passes | $fb_s | $in_b + $out_b | $ref_s | $SIZE | $bratio ($res_b, target <= 1.2) | $tratio ($res_t, target <= 0.1) | $check |"
say "daemon CPU: $(daemon_cpu)"
cluster_down
bench_finish
