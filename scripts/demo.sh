#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# OpenCDP demo (`make demo`): the whole product on loopback in a temp dir.
#
#   bash scripts/demo.sh BUILD_DIR
#
# Makes a site CA and one certificate per daemon with `cdpctl pki`, then starts
# cdp-master-target, cdp-process-server and cdp-agent over TLS (through
# `cdp-loadgen cluster`, the local cluster the e2e tests use) protecting a 1 GiB
# sparse source volume; drives writes through the agent's NBD export with real
# clients (cdp-loadgen churn, qemu-io, nbdcopy); tags two recovery points with
# cdpctl, copying the source at each; shows `cdpctl status`; waits for catch-up;
# then checks
#   1. replica == source (cmp, byte for byte),
#   2. the export of each tag (cdpctl export VOL@POINT, copied with nbdcopy
#      over NBD TLS with the tenant's certificate) == the copy of the source
#      taken at that tag,
#   3. every daemon on TLS; every control call with the daemon's admin token
#      (made at its first start), a call without one refused (401), a tenant
#      token (cdpctl token issue) seeing its own volume.
# Prints a summary and exits non-zero if a check fails. Everything it starts
# is killed and the temp dir removed on exit.
set -euo pipefail

BUILD=${1:-build}
BUILD=$(cd "$BUILD" && pwd)
AGENT=$BUILD/agent/cdp-agent
PS=$BUILD/process-server/cdp-process-server
MT=$BUILD/master-target/cdp-master-target
CTL=$BUILD/cdpctl/cdpctl
LOADGEN=$BUILD/loadgen/cdp-loadgen
for b in "$AGENT" "$PS" "$MT" "$CTL" "$LOADGEN"; do
  [ -x "$b" ] || { echo "demo: $b not built (run make build)" >&2; exit 2; }
done
for p in qemu-io nbdcopy cmp curl; do
  command -v "$p" >/dev/null || { echo "demo: $p missing (scripts/install-deps.sh)" >&2; exit 2; }
done

T0=$(date +%s)
DIR=$(mktemp -d "${TMPDIR:-/tmp}/opencdp-demo.XXXXXX")
PIDS=()
cleanup() {
  local rc=$?
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ $rc -ne 0 ] && [ -d "$DIR" ]; then
    for l in "$DIR"/*.log; do echo "---- tail of $l"; tail -n 15 "$l"; done >&2
  fi
  rm -rf "$DIR"
  echo "demo: cleaned up after $(( $(date +%s) - T0 )) s" >&2
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '\n== [%3ds] %s\n' $(( $(date +%s) - T0 )) "$*"; }
die() { echo "demo: FAILED: $*" >&2; exit 1; }

VOL=demo
TENANT=acme
SIZE=$((1 << 30))
mkdir -p "$DIR/copies"
# A tag is refused (Busy) while the agent cannot promise a consistent point
# (metadata/bitmap mode after a burst past its memory budget, or a resync
# pending); like an operator, retry until it is accepted.
tag() {
  local deadline=$(( $(date +%s) + 90 )) out
  until out=$(ctl tag "$1" 2>&1); do
    echo "$out" | grep -q Busy || die "cdpctl tag $1: $out"
    [ "$(date +%s)" -lt $deadline ] || die "tag $1 still refused after 90 s: $out"
    echo "  (tag refused for now: $(echo "$out" | sed 's/.*Busy: //'); retrying)"
    sleep 1
  done
  echo "$out" | sed 's/^/  /'
}
ctl() {
  "$CTL" ${CDP_TLS_CA:+--tls-ca "$CDP_TLS_CA"} --agent "$CDP_AGENT_CONTROL" --ps "$CDP_PS_CONTROL" --mt "$CDP_MT_CONTROL" --tenant $TENANT \
    --agent-token-file "$CDP_AGENT_TOKEN_FILE" --ps-token-file "$CDP_PS_TOKEN_FILE" --mt-token-file "$CDP_MT_TOKEN_FILE" "$@"
}

say "site PKI: a CA and one certificate per daemon, made by cdpctl pki"
PKI=$DIR/pki
"$CTL" pki init --dir "$PKI" --name "OpenCDP demo CA" | sed 's/^/  /'
"$CTL" pki issue --dir "$PKI" --role mt --name demo-mt --out "$PKI/mt" | sed 's/^/  /'
"$CTL" --tenant $TENANT pki issue --dir "$PKI" --role ps --name demo-ps --out "$PKI/ps" --hosts localhost,127.0.0.1 |
  sed 's/^/  /'
"$CTL" --tenant $TENANT pki issue --dir "$PKI" --role agent --name demo-host --out "$PKI/agent" \
  --hosts localhost,127.0.0.1 | sed 's/^/  /'
"$CTL" pki show "$PKI/agent.crt" | sed 's/^/  agent certificate: /'
[ "$(stat -c %a "$PKI/agent.key")" = 600 ] || die "agent.key is not mode 0600"

say "starting the daemons in $DIR (1 GiB sparse source volume, TLS on every link): cdp-loadgen cluster"
# The one local-cluster harness (loadgen/local_cluster.h), as the e2e tests use it.
"$LOADGEN" cluster --build "$BUILD" --dir "$DIR" --volume $VOL --volume-size $SIZE --tenant $TENANT --codec zstd --level 1 \
  --point-interval 2s --tls on --pki-dir "$PKI" --env-file "$DIR/cluster.env" >"$DIR/cluster.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 600); do
  [ -s "$DIR/cluster.env" ] && break
  kill -0 "${PIDS[0]}" 2>/dev/null || die "cdp-loadgen cluster exited: $(tail -n 20 "$DIR/cluster.out")"
  sleep 0.1
done
[ -s "$DIR/cluster.env" ] || die "the daemons did not come up within 60 s"
# shellcheck disable=SC1091
. "$DIR/cluster.env"
URI=$CDP_NBD_URI
AG_CTL=${CDP_AGENT_CONTROL##*:}
MT_CTL=${CDP_MT_CONTROL##*:}
echo "  master target :${CDP_MT_CONTROL##*:}, process server :${CDP_PS_CONTROL##*:}, agent :$AG_CTL (control ports)"
echo "  protected volume exported at $URI"

# The control ports speak HTTPS with the site PKI: curl checks them against its CA.
CURL_TLS=(--cacert "$CDP_TLS_CA")
[ -n "$CDP_TLS_CA" ] || die "the control ports should speak HTTPS (no CDP_TLS_CA from the cluster)"
# GET on a control port with the daemon's admin token (made at its first start, mode 0600).
get() { curl -fsS "${CURL_TLS[@]}" -H "Authorization: Bearer $(cat "$2")" "https://127.0.0.1:$1$3"; }
echo "  control tokens: $CDP_AGENT_TOKEN_FILE, $CDP_PS_TOKEN_FILE, $CDP_MT_TOKEN_FILE (mode $(stat -c %a "$CDP_MT_TOKEN_FILE"))"

# Waits until every write the agent captured is applied at the master target.
json_num() { grep -o "\"$1\":[0-9]*" | head -n1 | cut -d: -f2; }
wait_caught_up() {
  local deadline=$(( $(date +%s) + ${1:-90} )) a m next acked applied q
  while :; do
    a=$(get "$AG_CTL" "$CDP_AGENT_TOKEN_FILE" /status || true)
    m=$(get "$MT_CTL" "$CDP_MT_TOKEN_FILE" /status || true)
    next=$(echo "$a" | json_num next_seq); acked=$(echo "$a" | json_num acked_seq)
    q=$(echo "$a" | json_num queue_records); applied=$(echo "$m" | json_num applied_seq)
    if [ -n "$next" ] && [ -n "$applied" ] && [ "$q" = 0 ] && [ "$acked" = $((next - 1)) ] && [ "$applied" = $((next - 1)) ]; then
      echo "  caught up: sequence $applied applied at the master target"
      return 0
    fi
    [ "$(date +%s)" -lt $deadline ] || die "no catch-up in ${1:-90} s (agent next_seq=$next acked=$acked queue=$q, MT applied=$applied)"
    sleep 0.2
  done
}

qemu_writes() {  # SEED COUNT: random pattern writes of 4 KiB..1 MiB, then a flush
  local seed=$1 n=$2 args=() i off len
  RANDOM=$seed
  for i in $(seq "$n"); do
    len=$(( (RANDOM % 256 + 1) * 4096 ))
    off=$(( ( (RANDOM * 32768 + RANDOM) % (SIZE / 4096) ) * 4096 ))
    [ $((off + len)) -le $SIZE ] || off=$((SIZE - len))
    args+=(-c "write -P $((RANDOM % 255 + 1)) $off $len")
  done
  qemu-io -f raw "${args[@]}" -c flush "$URI" >/dev/null
}

churn() {  # SECONDS PATTERN SEED
  if [ -x "$LOADGEN" ]; then
    "$LOADGEN" churn --target "$URI" --rate 20 --duration "$1" --pattern "$2" --io-size 64KiB \
      --compressibility 0.6 --seed "$3" --flush-every 16MiB 2>"$DIR/churn.err" | sed 's/^/  /' ||
      die "cdp-loadgen churn failed: $(tail -n 20 "$DIR/churn.err")"
  else
    echo "  (cdp-loadgen not built: qemu-io writes instead)"
    qemu_writes "$3" 200
  fi
}

say "workload 1: cdp-loadgen churn (random 64 KiB writes, 20 MB/s, 6 s), qemu-io, nbdcopy"
churn 6 random 1
qemu_writes 11 100
head -c $((8 << 20)) /dev/urandom > "$DIR/copies/blob.bin"
truncate -s $((16 << 20)) "$DIR/copies/blob.bin"   # 8 MiB of data then 8 MiB of zeroes
nbdcopy --flush "$DIR/copies/blob.bin" "$URI"
rm -f "$DIR/copies/blob.bin"

say "writer paused: copy the source, then tag 'before-upgrade'"
cp --sparse=always "$DIR/source.img" "$DIR/copies/before-upgrade.img"
tag before-upgrade

say "workload 2: churn with a zipf hot spot (6 s), qemu-io"
churn 6 zipf:0.9 2
qemu_writes 12 100

say "writer paused: copy the source, then tag 'after-upgrade'"
cp --sparse=always "$DIR/source.img" "$DIR/copies/after-upgrade.img"
tag after-upgrade

say "workload 3: writes after the last tag"
qemu_writes 13 100

say "cdpctl status"
ctl status

say "waiting for catch-up"
wait_caught_up 120
ctl status

say "cdpctl points $VOL"
ctl points $VOL

CHECKS=()
FAILED=0
check() {  # NAME EXPECTED ACTUAL
  if [ "$2" = "$3" ]; then CHECKS+=("PASS  $1"); else CHECKS+=("FAIL  $1 ($2 != $3)"); FAILED=1; fi
}

same() {  # FILE1 FILE2: byte-for-byte equal?
  cmp -s "$1" "$2" && echo same || echo differ
}

say "check 1: replica == source (cmp of the whole 1 GiB)"
r=$(same "$DIR/source.img" "$DIR/mt/tenants/$TENANT/volumes/$VOL/replica.img")
echo "  source vs replica: $r"
check "replica == source (1 GiB, byte for byte)" same "$r"

point_id() {  # TAG -> the id of its recovery point
  ctl --json points $VOL | grep -o "{[^{}]*\"name\":\"$1\"[^{}]*}" | json_num id
}
for tag in before-upgrade after-upgrade; do
  say "check: export of tag '$tag' == the source copied at that tag"
  id=$(point_id $tag)
  [ -n "$id" ] || die "no recovery point named $tag"
  ej=$(ctl --json export "$VOL@$id")
  name=$(echo "$ej" | grep -o '"export":"[^"]*"' | cut -d'"' -f4)
  url="nbd://127.0.0.1:$(echo "$ej" | json_num port)/$name"
  # The MT's exports need NBD TLS with the tenant's certificate (docs/operations.md).
  [ -n "${CDP_MT_NBD_TLS_DIR:-}" ] && url="nbds${url#nbd}?tls-certificates=$CDP_MT_NBD_TLS_DIR"
  echo "  cdpctl export $VOL@$id -> $url (sequence $(echo "$ej" | json_num seq), read-only)"
  # The export streamed through nbdcopy straight into cmp (no 1 GiB temp file).
  if nbdcopy "$url" - | cmp -s - "$DIR/copies/$tag.img"; then r=same; else r=differ; fi
  ctl unexport "$name" | sed 's/^/  /'
  echo "  source copied at the tag vs export: $r"
  check "export of point $id ('$tag') == source at the tag" same "$r"
done
say "check: every data link ran over TLS with the cdpctl pki certificates"
tls_links=0
grep -q "TLS on: certificate 'demo-mt'" "$DIR/master-target.log" && tls_links=$((tls_links + 1))
grep -q "TLS on: certificate 'demo-ps'" "$DIR/process-server.log" && tls_links=$((tls_links + 1))
grep -q "TLS on: certificate 'demo-host'" "$DIR/agent.log" && tls_links=$((tls_links + 1))
echo "  daemons on TLS with the demo certificates: $tls_links of 3"
check "agent, PS and MT on TLS 1.3 with certificates from cdpctl pki" 3 "$tls_links"
say "check: the control ports answer only their tokens"
code=$(curl -s "${CURL_TLS[@]}" -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
  -d "{\"volume\":\"$VOL\",\"seq\":1}" "https://127.0.0.1:$MT_CTL/v1/export")
echo "  POST /v1/export without a token: HTTP $code"
plain=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$MT_CTL/status" || true)
echo "  plain HTTP to the master target's control port (HTTPS only): HTTP ${plain:-none}"
check "control ports speak HTTPS only: plain HTTP gets no answer" "000" "$plain"
other=$(ctl --tenant other-tenant token issue 2>&1 || true)
echo "  cdpctl token issue for a tenant the MT does not serve: $other"
tt=$(ctl token issue 2>/dev/null)
seen=$(curl -fsS "${CURL_TLS[@]}" -H "Authorization: Bearer $tt" "https://127.0.0.1:$MT_CTL/v1/volumes" | grep -o "\"volume\":\"[^\"]*\"" | tr '\n' ' ')
echo "  tenant $TENANT's own token (cdpctl token issue) sees: $seen"
check "control API: 401 without a token, a tenant token sees its volume" "401 \"volume\":\"$VOL\" " "$code $seen"
if [ "$(same "$DIR/copies/before-upgrade.img" "$DIR/copies/after-upgrade.img")" = same ]; then
  CHECKS+=("FAIL  the two tags name different images"); FAILED=1
fi

say "summary ($(( $(date +%s) - T0 )) s)"
a=$(get "$AG_CTL" "$CDP_AGENT_TOKEN_FILE" /status)
echo "  captured: $(( $(echo "$a" | json_num captured_bytes) / 1048576 )) MiB in $(echo "$a" | json_num captured_ops) writes, $(( $(echo "$a" | json_num next_seq) - 1 )) sequence numbers"
for c in "${CHECKS[@]}"; do echo "  $c"; done
if [ $FAILED -ne 0 ]; then echo "demo: FAILED" >&2; exit 1; fi
echo "demo: all checks passed"
