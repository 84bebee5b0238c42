#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/lib.sh: sourced by the benchmarks that run the three daemons on this
# machine (loopback): bench/e2e_bench.sh, bench/resync_bench.sh.
#
#   bench_init NAME BUILD_DIR   binaries (CTL AGENT PS MT LOADGEN), checked built;
#                               BENCH_DIR, a scratch directory removed at exit;
#                               an EXIT trap that stops every daemon started here
#   bench_need TOOL...          fails (exit 2) naming a missing command
#   bench_pki on|off            TLS 1.3 on every link with certificates made by
#                               `cdpctl pki` (tenant bench), or clear text
#   cluster_up DIR [PS_ARGS...] ports, then the master target (DIR/mt) and the
#                               process server (DIR/spool); returns once both answer.
#                               MT_NBD=HOST:PORT serves the MT's NBD exports (default none);
#                               the environment's MT_ARGS and PS_ARGS (e.g.
#                               "--max_open_files 128") come first
#   agent_up VOLUME=PATH [AGENT_ARGS...]   the agent (DIR/agent: bitmaps, nbd.sock); the
#                               environment's AGENT_ARGS (e.g. "--resync_requests 32") come first;
#                               it ships to the PS, or to the port AGENT_TO (a direct
#                               agent: AGENT_TO=$MT_DATA with the MT's --direct_agents bench)
#   agent_down / cluster_down   SIGTERM and wait (the agent saves its bitmap)
#   agent_get PATH / ps_get PATH / mt_get PATH   GET with the daemon's admin token
#   bench_rm DIR                removes DIR unless KEEP=1 (then the scratch directory
#                               stays too, logs and all)
#   json_num KEY                the first number KEY in the JSON on stdin
#   daemon_cpu                  "agent A s, PS P s, MT M s": CPU time (user + system)
#                               each running daemon used so far
#   ctl ARGS...                 cdpctl with the three control ports and tokens
#   random_image PATH BYTES SEED   a file of random bytes, the same for the same seed
#
# Ports: MT_DATA MT_CTL PS_DATA PS_CTL AG_CTL; token files: MT_TOKEN PS_TOKEN
# AG_TOKEN (each daemon makes its admin token at first start, mode 0600).
# One cluster at a time.

bench_init() {
  BENCH_NAME=$1
  BUILD=$(cd "$2" && pwd) || { echo "$BENCH_NAME: no build directory '$2'" >&2; exit 2; }
  CTL=$BUILD/cdpctl/cdpctl
  AGENT=$BUILD/agent/cdp-agent
  PS=$BUILD/process-server/cdp-process-server
  MT=$BUILD/master-target/cdp-master-target
  LOADGEN=$BUILD/loadgen/cdp-loadgen
  for b in "$AGENT" "$PS" "$MT" "$LOADGEN" "$CTL"; do
    [ -x "$b" ] || { echo "$BENCH_NAME: $b not built (make build)" >&2; exit 2; }
  done
  bench_need curl
  BENCH_DIR=$(mktemp -d "${TMPDIR:-/var/tmp}/opencdp-$BENCH_NAME.XXXXXX")
  BENCH_SECRET=bench-secret-$RANDOM$RANDOM
  MT_PID="" PS_PID="" AG_PID="" CLUSTER_DIR="" BENCH_EXTRA_PIDS=()
  trap bench_cleanup EXIT
  trap 'exit 130' INT TERM
  local lo
  lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  # Below the kernel's ephemeral range, so no outgoing connection holds one.
  BENCH_NEXT_PORT=$((10000 + RANDOM % (lo - 10100)))
  tls_args() { echo --tls off; }
}

# bench_stop PID...: SIGTERM, then SIGKILL for any still running after 20 s (a
# daemon that hangs in shutdown must not keep the benchmark from ending).
bench_stop() {
  local p _
  [ $# -gt 0 ] || return 0
  for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "$@"; do
    for _ in $(seq 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then
      echo "$BENCH_NAME: pid $p still running 20 s after SIGTERM: SIGKILL" >&2
      kill -KILL "$p" 2>/dev/null || true
    fi
    wait "$p" 2>/dev/null || true
  done
}

bench_cleanup() {
  bench_link_off
  # shellcheck disable=SC2086
  bench_stop $AG_PID $PS_PID $MT_PID "${BENCH_EXTRA_PIDS[@]}"
  [ -n "${BENCH_DIR:-}" ] || return 0
  if [ "${KEEP:-0}" = 1 ]; then echo "$BENCH_NAME: kept $BENCH_DIR (KEEP=1)" >&2; else rm -rf "$BENCH_DIR"; fi
}
# bench_rm DIR: removes a scenario's directory unless KEEP=1.
bench_rm() { [ "${KEEP:-0}" = 1 ] || rm -rf "$1"; }

# bench_perf_start NAME / bench_perf_stop: with PERF=DIR set, a system-wide
# `perf record -g` of the measured part of a scenario goes to DIR/NAME.data
# (read it with `perf report -i DIR/NAME.data`); without PERF, nothing.
# PERF_ARGS replaces `-g` (e.g. "--call-graph dwarf,16384 -F 499" for stacks
# through code built without frame pointers).
BENCH_PERF_PID=""
bench_perf_start() {
  [ -n "${PERF:-}" ] || return 0
  mkdir -p "$PERF"
  # shellcheck disable=SC2086
  perf record -q -a ${PERF_ARGS:--g} -o "$PERF/$1.data" >/dev/null 2>&1 &
  BENCH_PERF_PID=$!
  BENCH_EXTRA_PIDS+=("$BENCH_PERF_PID")
}
bench_perf_stop() {
  [ -n "$BENCH_PERF_PID" ] || return 0
  kill -INT "$BENCH_PERF_PID" 2>/dev/null || true
  wait "$BENCH_PERF_PID" 2>/dev/null || true
  BENCH_PERF_PID=""
}

bench_need() {
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null || { echo "$BENCH_NAME: '$t' is missing (scripts/install-deps.sh lists its package)" >&2; exit 2; }
  done
}

bench_die() {
  local l
  echo "$BENCH_NAME: $*" >&2
  for l in "$CLUSTER_DIR"/*.log; do [ -e "$l" ] && { echo "--- $l" >&2; tail -n 8 "$l" >&2; }; done
  exit 1
}

bench_port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
bench_pick_port() {
  while ! bench_port_free $BENCH_NEXT_PORT; do BENCH_NEXT_PORT=$((BENCH_NEXT_PORT + 1)); done
  printf -v "$1" '%s' $BENCH_NEXT_PORT
  BENCH_NEXT_PORT=$((BENCH_NEXT_PORT + 1))
}

bench_pki() {
  case $1 in
    off) tls_args() { echo --tls off; } ;;
    on)
      local d=$BENCH_DIR/pki
      "$CTL" pki init --dir "$d" >/dev/null
      "$CTL" pki issue --dir "$d" --role mt --name bench-mt --out "$d/mt" >/dev/null
      "$CTL" --tenant bench pki issue --dir "$d" --role ps --name bench-ps --out "$d/ps" >/dev/null
      "$CTL" --tenant bench pki issue --dir "$d" --role agent --name bench-agent --out "$d/agent" >/dev/null
      tls_args() { echo --tls_ca "$BENCH_DIR/pki/ca.crt" --tls_cert "$BENCH_DIR/pki/$1.crt" --tls_key "$BENCH_DIR/pki/$1.key"; }
      ;;
    *) echo "$BENCH_NAME: TLS must be on or off" >&2; exit 2 ;;
  esac
}

json_num() { grep -o "\"$1\":[0-9.e+-]*" | head -n1 | cut -d: -f2; }
# A daemon that does not answer within 10 s is an error, not a hang of the benchmark.
bench_get() { curl -fsS --max-time 10 -H "Authorization: Bearer $(cat "$2" 2>/dev/null)" "http://127.0.0.1:$1$3"; }
agent_get() { bench_get "$AG_CTL" "$AG_TOKEN" "$1"; }
ps_get() { bench_get "$PS_CTL" "$PS_TOKEN" "$1"; }
mt_get() { bench_get "$MT_CTL" "$MT_TOKEN" "$1"; }
ctl() {
  "$CTL" --agent 127.0.0.1:$AG_CTL --ps 127.0.0.1:$PS_CTL --mt 127.0.0.1:$MT_CTL --tenant bench \
    --agent-token-file "$AG_TOKEN" --ps-token-file "$PS_TOKEN" --mt-token-file "$MT_TOKEN" "$@"
}

# bench_wait_up PORT TOKEN_FILE PID: the daemon answers /status with its token (30 s).
bench_wait_up() {
  local _
  for _ in $(seq 300); do
    bench_get "$1" "$2" /status >/dev/null 2>&1 && return 0
    kill -0 "$3" 2>/dev/null || bench_die "a daemon exited at start"
    sleep 0.1
  done
  bench_die "a daemon did not answer /status within 30 s"
}

cluster_up() {
  CLUSTER_DIR=$1
  shift
  mkdir -p "$CLUSTER_DIR/mt" "$CLUSTER_DIR/spool" "$CLUSTER_DIR/agent"
  local v
  for v in MT_DATA MT_CTL PS_DATA PS_CTL AG_CTL; do bench_pick_port $v; done
  MT_TOKEN=$CLUSTER_DIR/mt/control.token PS_TOKEN=$CLUSTER_DIR/spool/control.token
  AG_TOKEN=$CLUSTER_DIR/agent/control.token
  # shellcheck disable=SC2046
  "$MT" --listen 127.0.0.1:$MT_DATA --control 127.0.0.1:$MT_CTL --nbd "${MT_NBD:-none}" --data_dir "$CLUSTER_DIR/mt" \
    --tenant bench:$BENCH_SECRET --log.file "$CLUSTER_DIR/mt.log" $(tls_args mt) ${MT_ARGS:-} &
  MT_PID=$!
  # shellcheck disable=SC2046
  "$PS" --listen 127.0.0.1:$PS_DATA --control 127.0.0.1:$PS_CTL --mt 127.0.0.1:$MT_DATA --tenant bench:$BENCH_SECRET \
    --spool_dir "$CLUSTER_DIR/spool" --log.file "$CLUSTER_DIR/ps.log" $(tls_args ps) ${PS_ARGS:-} "$@" &
  PS_PID=$!
  bench_wait_up $MT_CTL "$MT_TOKEN" $MT_PID
  bench_wait_up $PS_CTL "$PS_TOKEN" $PS_PID
}

agent_up() {
  local vol=$1
  shift
  # shellcheck disable=SC2046
  "$AGENT" --volume "$vol" --nbd_unix "$CLUSTER_DIR/agent/nbd.sock" --ps 127.0.0.1:${AGENT_TO:-$PS_DATA} --tenant bench \
    --secret $BENCH_SECRET --bitmap_dir "$CLUSTER_DIR/agent" --control 127.0.0.1:$AG_CTL \
    --log.file "$CLUSTER_DIR/agent.log" $(tls_args agent) ${AGENT_ARGS:-} "$@" >/dev/null &
  AG_PID=$!
  bench_wait_up $AG_CTL "$AG_TOKEN" $AG_PID
}

agent_down() {
  # shellcheck disable=SC2086
  bench_stop $AG_PID
  AG_PID=""
}

daemon_cpu() {
  local tck name pid out=()
  tck=$(getconf CLK_TCK)
  for name in agent:$AG_PID PS:$PS_PID MT:$MT_PID; do
    pid=${name#*:}
    [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || continue
    # Fields 14 and 15 (utime, stime) counted after the ")" that ends the command name.
    out+=("${name%%:*} $(sed 's/.*) //' "/proc/$pid/stat" | awk -v t="$tck" '{printf "%.2f", ($12 + $13) / t}') s")
  done
  local IFS=,
  echo "${out[*]}"
}

cluster_down() {
  agent_down
  # shellcheck disable=SC2086
  bench_stop $PS_PID $MT_PID
  PS_PID="" MT_PID=""
}

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

# ---- An emulated WAN link on the loopback (tc htb + u32; this kernel has htb,
# tbf and u32, not prio or netem). bench_link_on MBIT PORT...: one HTB class of
# MBIT Mbit/s per port for the traffic to it, and one more per port for the
# traffic from it (a full-duplex link of that rate each way); the rest of lo
# unshaped. bench_link_off removes it (bench_cleanup does too). Needs root.
bench_link_on() {
  local mbit=$1 class=10 port
  shift
  bench_link_off
  tc qdisc add dev lo root handle 1: htb default 99 r2q 1000
  tc class add dev lo parent 1: classid 1:99 htb rate 100gbit
  for port in "$@"; do
    for dir in dport sport; do
      tc class add dev lo parent 1: classid 1:$class htb rate "${mbit}mbit" ceil "${mbit}mbit" burst 256kb
      tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip "$dir" "$port" 0xffff flowid 1:$class
      class=$((class + 1))
    done
  done
  BENCH_LINK_ON=1
}
bench_link_off() {
  if [ "${BENCH_LINK_ON:-0}" = 1 ]; then tc qdisc del dev lo root 2>/dev/null || true; fi
  BENCH_LINK_ON=0
}
