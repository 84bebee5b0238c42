#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/lib.sh: sourced by the benchmarks that run the three daemons on this
# machine (loopback): bench/e2e_bench.sh, resync_bench.sh, failback_bench.sh,
# copies_bench.sh, many_volumes_bench.sh, seed_bench.sh. The daemons are
# started, configured and stopped by the one local-cluster harness,
# `cdp-loadgen cluster --commands` (loadgen/local_cluster.h,
# loadgen/cluster_commands.h): TLS with certificates it makes, control tokens
# as the product ships. The functions below are thin wrappers around it.
#
#   bench_init NAME BUILD_DIR   binaries (CTL AGENT PS MT LOADGEN), checked built;
#                               BENCH_DIR, a scratch directory removed at exit;
#                               an EXIT trap that stops every daemon started here
#   bench_need TOOL...          fails (exit 2) naming a missing command
#   bench_pki on|off            TLS 1.3 on every link with certificates the harness
#                               makes in BENCH_DIR/pki (ca, mt, ps, agent .crt/.key;
#                               tenant bench), or clear text
#   cluster_up DIR [PS_FLAGS...]  the master target (DIR/mt) and the process server
#                               (DIR/ps/spool) on free ports; returns once both answer.
#                               The MT serves NBD exports on MT_NBD_PORT. The
#                               environment's MT_ARGS and PS_ARGS (e.g.
#                               "--max_open_files 128") come first. MASTER_TARGETS=2:
#                               a second MT (DIR/mtb; MTB_DATA MTB_CTL MTB_PID), the
#                               PS ships a copy to each. DIRECT_AGENT=1: the agent
#                               ships straight to the MT (its direct_agents lists bench).
#                               BENCH_HOST (default 127.0.0.1): the listeners' address;
#                               BENCH_WRAP: a command prefix for the harness (ip netns exec NS)
#   agent_up VOLUME=PATH [AGENT_FLAGS...]   the agent (DIR/agent: bitmaps, nbd.sock)
#                               protecting PATH as VOLUME; the environment's AGENT_ARGS
#                               (e.g. "--resync_requests 32") come first
#   agent_down / cluster_down   SIGTERM and wait (the agent saves its bitmap)
#   cluster_cmd COMMAND...      any harness command (loadgen/cluster_commands.h), e.g.
#                               `cluster_cmd stop ps`, `cluster_cmd restart ps`
#   agent_get PATH / ps_get PATH / mt_get PATH   GET with the daemon's admin token
#   bench_rm DIR                removes DIR unless KEEP=1 (then the scratch directory
#                               stays too, logs and all)
#   json_num KEY                the first number KEY in the JSON on stdin
#   daemon_cpu                  "agent A s, PS P s, MT M s": CPU time (user + system)
#                               each running daemon used so far
#   ctl ARGS...                 cdpctl with the three control ports and tokens
#   random_image PATH BYTES SEED   a file of random bytes, the same for the same seed
#   bench_link_on MBIT PORT... / bench_link_off   an emulated WAN link on the
#                               loopback (`cdp-loadgen wanem ports`; root)
#   bench_wrong MESSAGE         a wrong result (a replica that differs; not a missed
#                               target): said on stderr, the figures still printed
#   bench_finish                at the end: exit 1 after a bench_wrong when STRICT=1
#                               (the smoke runs in `make test`)
#
# After every harness command: ports MT_DATA MT_CTL MT_NBD_PORT PS_DATA PS_CTL
# AG_CTL; token files MT_TOKEN PS_TOKEN AG_TOKEN (each daemon makes its admin
# token at first start, mode 0600); PIDs MT_PID PS_PID AG_PID ("" when not
# running); the daemons' logs DIR/{master-target,process-server,agent}.log.
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
  MT_PID="" PS_PID="" AG_PID="" MTB_PID="" CLUSTER_DIR="" BENCH_EXTRA_PIDS=() BENCH_CLUSTER_PID=""
  BENCH_TLS=off BENCH_WRONG=()
  trap bench_cleanup EXIT
  trap 'exit 130' INT TERM
  local lo
  lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  # Below the kernel's ephemeral range, so no outgoing connection holds one.
  BENCH_NEXT_PORT=$((10000 + RANDOM % (lo - 10100)))
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
  _cluster_close
  bench_stop "${BENCH_EXTRA_PIDS[@]}"
  [ -n "${BENCH_DIR:-}" ] || return 0
  if [ "${KEEP:-0}" = 1 ]; then echo "$BENCH_NAME: kept $BENCH_DIR (KEEP=1)" >&2; else rm -rf "$BENCH_DIR"; fi
}
bench_wrong() { echo "$BENCH_NAME: WRONG: $*" >&2; BENCH_WRONG+=("$*"); }
bench_finish() {
  if [ "${STRICT:-0}" = 1 ] && [ ${#BENCH_WRONG[@]} -gt 0 ]; then
    echo "$BENCH_NAME: STRICT=1: ${#BENCH_WRONG[@]} wrong result(s)" >&2
    exit 1
  fi
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
    on|off) BENCH_TLS=$1 ;;
    *) echo "$BENCH_NAME: TLS must be on or off" >&2; exit 2 ;;
  esac
}

json_num() { grep -o "\"$1\":[0-9.e+-]*" | head -n1 | cut -d: -f2; }
# A daemon that does not answer within 10 s is an error, not a hang of the benchmark.
# The control ports speak HTTPS with the cluster's site CA (CDP_TLS_CA from
# its env file), plain HTTP only with TLS off.
bench_get() {
  if [ -n "${CDP_TLS_CA:-}" ]; then
    curl -fsS --max-time 10 --cacert "$CDP_TLS_CA" -H "Authorization: Bearer $(cat "$2" 2>/dev/null)" "https://127.0.0.1:$1$3"
  else
    curl -fsS --max-time 10 -H "Authorization: Bearer $(cat "$2" 2>/dev/null)" "http://127.0.0.1:$1$3"
  fi
}
agent_get() { bench_get "$AG_CTL" "$AG_TOKEN" "$1"; }
ps_get() { bench_get "$PS_CTL" "$PS_TOKEN" "$1"; }
mt_get() { bench_get "$MT_CTL" "$MT_TOKEN" "$1"; }
ctl() {
  "$CTL" ${CDP_TLS_CA:+--tls-ca "$CDP_TLS_CA"} --agent 127.0.0.1:$AG_CTL --ps 127.0.0.1:$PS_CTL --mt 127.0.0.1:$MT_CTL --tenant bench \
    --agent-token-file "$AG_TOKEN" --ps-token-file "$PS_TOKEN" --mt-token-file "$MT_TOKEN" "$@"
}

# ---- The cluster: `cdp-loadgen cluster --commands`, fed through two FIFOs
# (commands in, one reply line out each). The harness owns the daemons; when
# its stdin closes it stops them all (SIGTERM, agent first) and exits.
cluster_up() {
  CLUSTER_DIR=$1
  shift
  [ -z "$BENCH_CLUSTER_PID" ] || bench_die "cluster_up: a cluster is running already"
  mkdir -p "$CLUSTER_DIR"
  local cmd=$BENCH_DIR/cluster.cmd reply=$BENCH_DIR/cluster.reply ps_flags
  rm -f "$cmd" "$reply"
  mkfifo "$cmd" "$reply"
  ps_flags="${PS_ARGS:-} $*"
  local args=(cluster --build "$BUILD" --dir "$CLUSTER_DIR" --tenant bench --secret "$BENCH_SECRET" --start mt,ps
    --commands --env-file "$CLUSTER_DIR/cluster.env" --tls "$BENCH_TLS" --pki-dir "$BENCH_DIR/pki"
    --host "${BENCH_HOST:-127.0.0.1}" --master-targets "${MASTER_TARGETS:-1}" --direct-agent "${DIRECT_AGENT:-0}")
  [ -z "${MT_ARGS:-}" ] || args+=("--mt-args=$MT_ARGS")
  [ -z "${ps_flags// /}" ] || args+=("--ps-args=$ps_flags")
  [ -z "${MT_BINARY:-}" ] || args+=(--mt-bin "$MT_BINARY")
  [ -z "${MT_WRAP:-}" ] || args+=("--mt-wrapper=$MT_WRAP")
  local wrap=()
  [ -z "${BENCH_WRAP:-}" ] || read -r -a wrap <<<"$BENCH_WRAP"
  "${wrap[@]}" "$LOADGEN" "${args[@]}" <"$cmd" >"$reply" 2>>"$CLUSTER_DIR/cluster.log" &
  BENCH_CLUSTER_PID=$!
  exec {BENCH_CIN}>"$cmd" {BENCH_COUT}<"$reply"
  _cluster_reply "cluster_up"
}

# cluster_cmd COMMAND...: one harness command; dies on its error. The ports,
# tokens and PIDs are read again after it.
cluster_cmd() {
  [ -n "$BENCH_CLUSTER_PID" ] && kill -0 "$BENCH_CLUSTER_PID" 2>/dev/null || bench_die "$*: the cluster harness is not running"
  _cluster_send "$*" || bench_die "$*: the cluster harness is gone"
  _cluster_reply "$*"
}

# A subshell that ignores SIGPIPE: a harness gone is an error here, not the end of the script.
_cluster_send() { ( trap '' PIPE; echo "$1" >&"$BENCH_CIN" ) 2>/dev/null; }

_cluster_reply() {
  local line=""
  IFS= read -r -t 600 -u "$BENCH_COUT" line || true
  [ "$line" = ok ] || bench_die "$1: ${line:-the cluster harness did not answer}"
  _cluster_env
}

_cluster_env() {
  # shellcheck disable=SC1091
  source "$CLUSTER_DIR/cluster.env"
  MT_DATA=${CDP_MT_DATA##*:} MT_CTL=${CDP_MT_CONTROL##*:} MT_NBD_PORT=${CDP_MT_NBD##*:}
  PS_DATA=${CDP_PS_DATA##*:} PS_CTL=${CDP_PS_CONTROL##*:} AG_CTL=${CDP_AGENT_CONTROL##*:}
  MTB_DATA=${CDP_MTB_DATA##*:} MTB_CTL=${CDP_MTB_CONTROL##*:}
  MT_TOKEN=$CDP_MT_TOKEN_FILE PS_TOKEN=$CDP_PS_TOKEN_FILE AG_TOKEN=$CDP_AGENT_TOKEN_FILE MTB_TOKEN=$CDP_MTB_TOKEN_FILE
  MT_PID=$CDP_MT_PID PS_PID=$CDP_PS_PID AG_PID=$CDP_AGENT_PID MTB_PID=$CDP_MTB_PID
}

# Tells the harness to quit (it stops every daemon, agent first, and exits; a
# background process of the script may hold the FIFO open, so closing it is not
# enough) and waits; SIGKILL after 90 s (its daemons die with it). Safe to call
# when no cluster runs.
_cluster_close() {
  [ -n "${BENCH_CLUSTER_PID:-}" ] || return 0
  _cluster_send quit || true
  exec {BENCH_CIN}>&- 2>/dev/null || true
  local _
  for _ in $(seq 900); do kill -0 "$BENCH_CLUSTER_PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$BENCH_CLUSTER_PID" 2>/dev/null; then
    echo "$BENCH_NAME: the cluster harness did not stop within 90 s: SIGKILL" >&2
    kill -KILL "$BENCH_CLUSTER_PID" 2>/dev/null || true
  fi
  wait "$BENCH_CLUSTER_PID" 2>/dev/null || true
  exec {BENCH_COUT}<&- 2>/dev/null || true
  BENCH_CLUSTER_PID="" MT_PID="" PS_PID="" AG_PID="" MTB_PID=""
}

agent_up() {
  local vol=$1
  shift
  cluster_cmd volume "$vol"
  # shellcheck disable=SC2086
  cluster_cmd start agent ${AGENT_ARGS:-} "$@"
}

agent_down() { cluster_cmd stop agent; }

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
  _cluster_close
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

# ---- An emulated WAN link on the loopback: `cdp-loadgen wanem ports`
# (loadgen/wanem.h; tc htb + u32). bench_link_on MBIT PORT...: one HTB class of
# MBIT Mbit/s per port for the traffic to it, and one more per port for the
# traffic from it (a full-duplex link of that rate each way); the rest of lo
# unshaped. bench_link_off removes it (bench_cleanup does too). Needs root.
bench_link_on() {
  local mbit=$1 port args=()
  shift
  bench_link_off
  for port in "$@"; do args+=(--port "$port"); done
  "$LOADGEN" wanem ports up --rate-mbit "$mbit" "${args[@]}" >/dev/null
  BENCH_LINK_ON=1
}
bench_link_off() {
  if [ "${BENCH_LINK_ON:-0}" = 1 ]; then "$LOADGEN" wanem ports down >/dev/null 2>&1 || true; fi
  BENCH_LINK_ON=0
}
