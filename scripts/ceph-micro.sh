#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A single-node Ceph cluster for tests: one monitor and one OSD on memstore, bound to
# 127.0.0.1 only, cephx on, one pool initialised for RBD. No kernel module, no systemd,
# no root needed: every file lives under DIR, every daemon is started here and stopped here.
#
#   scripts/ceph-micro.sh start DIR   create and start the cluster in DIR (made if missing;
#                                     must hold no running cluster), then print its env
#   scripts/ceph-micro.sh stop DIR    stop every daemon start left running in DIR (TERM,
#                                     then KILL past the deadline); DIR itself is kept
#   scripts/ceph-micro.sh env DIR     print the cluster's settings as shell assignments:
#                                     CEPH_CONF, CEPH_KEYRING, CEPH_POOL, CEPH_CLIENT_ID,
#                                     CEPH_ADMIN_ID, CEPH_MON_HOST
#
# Environment (all optional):
#   CEPH_MICRO_POOL        the RBD pool (default rbd)
#   CEPH_MICRO_DEADLINE    seconds each wait may take before start fails (default 90)
#   CEPH_MICRO_OWNER_PID   stop the cluster by itself once this process has exited, so a
#                          test binary that crashes leaves no daemon behind
#   CEPH_MICRO_MISSING_OK  when 1, start without the Ceph packages prints why it skips and
#                          exits 0 instead of 3
#   CEPH_MICRO_MEM_BYTES   the capacity memstore reports (default 8 GiB; RAM is used only
#                          for what is written)
#
# Exit status: 0 ok; 1 failure (the logs in DIR/log say why); 2 usage; 3 the Ceph packages
# are not installed (scripts/install-deps.sh installs them).
#
# Users: client.admin (every cap) and client.opencdp (profile rbd on the pool only), both in
# DIR/keyring, which the conf names, so a client needs only CEPH_CONF and its id.
set -Eeuo pipefail

usage() {
  echo "usage: $0 start|stop|env DIR" >&2
  exit 2
}
[ $# -eq 2 ] || usage
cmd=$1
mkdir -p "$2" 2>/dev/null || true
DIR=$(cd "$2" 2>/dev/null && pwd) || { echo "ceph-micro: no directory $2" >&2; exit 1; }
POOL=${CEPH_MICRO_POOL:-rbd}
DEADLINE=${CEPH_MICRO_DEADLINE:-90}
MEM_BYTES=${CEPH_MICRO_MEM_BYTES:-8589934592}
CONF=$DIR/ceph.conf
KEYRING=$DIR/keyring
RUN=$DIR/run
LOG=$DIR/log
DAEMONS=(osd.0 mon.a)  # stop order: the OSD first, so it never waits on a gone monitor

log() { echo "ceph-micro: $*" >&2; }

# Runs the ceph CLI against this cluster with a bounded connect and a hard deadline.
ceph_cli() { timeout 30 ceph --conf "$CONF" --name client.admin --connect-timeout 10 "$@"; }

print_env() {
  [ -f "$CONF" ] || { log "no cluster in $DIR"; exit 1; }
  echo "CEPH_CONF=$CONF"
  echo "CEPH_KEYRING=$KEYRING"
  echo "CEPH_POOL=$(cat "$DIR/pool")"
  echo "CEPH_CLIENT_ID=opencdp"
  echo "CEPH_ADMIN_ID=admin"
  echo "CEPH_MON_HOST=$(cat "$DIR/mon_host")"
}

# True while PID is a live daemon of this cluster. A zombie has an empty command line, so
# it counts as gone (kill -0 would still succeed on it).
running() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q -- "--conf $CONF "; }

pid_of() {  # the pid of a running daemon of this cluster, or nothing
  local f=$RUN/$1.pid pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f" 2>/dev/null) || return 0
  # The pid file may outlive its daemon and the number be reused: check it is ours.
  if [ -n "$pid" ] && running "$pid"; then
    echo "$pid"
  fi
}

# wait_for DESCRIPTION COMMAND...: polls COMMAND until it succeeds or DEADLINE seconds pass.
wait_for() {
  local what=$1
  shift
  local end=$((SECONDS + DEADLINE))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$end" ]; then
      log "gave up after ${DEADLINE}s waiting for $what (logs in $LOG)"
      return 1
    fi
    sleep 0.2
  done
}

stop_cluster() {
  local name pid end
  for name in "${DAEMONS[@]}"; do
    pid=$(pid_of "$name")
    [ -n "$pid" ] || continue
    kill -TERM "$pid" 2>/dev/null || true
    end=$((SECONDS + 20))
    while running "$pid" && [ "$SECONDS" -lt "$end" ]; do sleep 0.1; done
    if running "$pid"; then
      log "$name ($pid) ignored TERM for 20s: KILL"
      kill -KILL "$pid" 2>/dev/null || true
      end=$((SECONDS + 10))
      while running "$pid" && [ "$SECONDS" -lt "$end" ]; do sleep 0.1; done
      running "$pid" && log "$name ($pid) still there 10s after KILL"
    fi
    rm -f "$RUN/$name.pid"
  done
  if [ -f "$RUN/watchdog.pid" ]; then
    pid=$(cat "$RUN/watchdog.pid")
    rm -f "$RUN/watchdog.pid"
    # Only from outside the watchdog itself (it runs this same function when its owner exits).
    [ "$pid" = "${CEPH_MICRO_WATCHDOG_SELF:-}" ] || kill -TERM -- "-$pid" 2>/dev/null || true
  fi
}

free_port() {  # a loopback TCP port nobody listens on, from a range outside the ephemeral one
  local port used
  used=$(ss -Htan 2>/dev/null | awk '{print $4}' | sed 's/.*://' | sort -u)
  while :; do
    port=$((10000 + RANDOM % 20000))
    grep -qx "$port" <<<"$used" || { echo "$port"; return; }
  done
}

write_conf() {  # write_conf FSID PORT
  cat >"$CONF" <<EOF
# Written by scripts/ceph-micro.sh: a throw-away single-node test cluster.
[global]
fsid = $1
mon host = [v2:127.0.0.1:$2]
ms bind msgr1 = false
ms bind ipv6 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
keyring = $KEYRING
run dir = $RUN
log file = $LOG/\$name.log
osd pool default size = 1
osd pool default min size = 1
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail crit = 0
mon data avail warn = 1

[mon]
mon data = $DIR/mon
pid file = $RUN/\$name.pid

[osd]
osd data = $DIR/osd
osd objectstore = memstore
memstore device bytes = $MEM_BYTES
public addr = 127.0.0.1
cluster addr = 127.0.0.1
pid file = $RUN/\$name.pid

[client]
log file = $LOG/\$name.\$pid.log
EOF
}

make_keyring() {
  rm -f "$KEYRING"
  ceph-authtool --create-keyring "$KEYRING" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool "$KEYRING" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$KEYRING" --gen-key -n osd.0 \
    --cap mon 'allow profile osd' --cap osd 'allow *' --cap mgr 'allow profile osd' >/dev/null
  ceph-authtool "$KEYRING" --gen-key -n client.opencdp \
    --cap mon 'profile rbd' --cap osd "profile rbd pool=$POOL" --cap mgr "profile rbd pool=$POOL" >/dev/null
  chmod 600 "$KEYRING"
}

# Creates the monitor's store and starts it; fails if its port turned out to be taken.
start_mon() {
  local fsid=$1 port=$2
  rm -rf "$DIR/mon" && mkdir -p "$DIR/mon"
  write_conf "$fsid" "$port"
  echo "[v2:127.0.0.1:$port]" >"$DIR/mon_host"
  monmaptool --create --clobber --fsid "$fsid" --addv a "[v2:127.0.0.1:$port]" "$DIR/monmap" >/dev/null
  ceph-mon --conf "$CONF" -i a --mkfs --monmap "$DIR/monmap" --keyring "$KEYRING" >>"$LOG/setup.log" 2>&1
  # Daemonizes once its messenger is bound; a taken port makes it exit non-zero.
  ceph-mon --conf "$CONF" -i a >>"$LOG/setup.log" 2>&1
}

start_cluster() {
  local tool
  for tool in ceph-mon ceph-osd ceph ceph-authtool monmaptool rbd; do
    if ! command -v "$tool" >/dev/null; then
      if [ "${CEPH_MICRO_MISSING_OK:-}" = 1 ]; then
        echo "SKIPPED: no Ceph test cluster: $tool is missing (scripts/install-deps.sh installs it)"
        exit 0
      fi
      log "$tool is missing: run scripts/install-deps.sh"
      exit 3
    fi
  done
  if [ -n "$(pid_of mon.a)$(pid_of osd.0)" ]; then
    log "a cluster is already running in $DIR"
    exit 1
  fi
  # Nothing of an earlier cluster in DIR survives (a stale monmap would name an old port).
  rm -rf "$DIR/mon" "$DIR/osd" "$RUN" "$LOG" "$DIR/monmap" "$DIR/mon_host" "$CONF" "$KEYRING"
  mkdir -p "$RUN" "$LOG" "$DIR/osd"
  echo "$POOL" >"$DIR/pool"
  # If start fails half-way, leave nothing running.
  trap 'stop_cluster' ERR
  if [ -n "${CEPH_MICRO_OWNER_PID:-}" ]; then
    # Stops the cluster once the owner is gone, however it ended (even while this script
    # still runs, killed at a test runner's deadline). setsid: a signal to the
    # caller's process group (a test runner's timeout) must not take the watchdog with it.
    # shellcheck disable=SC2016  # $1..$3 and $$ are the watchdog's own
    setsid bash -c '
      tail --pid="$1" -f /dev/null
      CEPH_MICRO_WATCHDOG_SELF=$$ exec "$2" stop "$3"' watchdog "$CEPH_MICRO_OWNER_PID" \
      "$(cd "$(dirname "$0")" && pwd)/$(basename "$0")" "$DIR" </dev/null >>"$LOG/watchdog.log" 2>&1 &
    echo $! >"$RUN/watchdog.pid"
  fi

  make_keyring
  local fsid tries=0
  fsid=$(cat /proc/sys/kernel/random/uuid)
  until start_mon "$fsid" "$(free_port)"; do
    tries=$((tries + 1))
    if [ "$tries" -ge 3 ]; then
      log "the monitor did not start (see $LOG/setup.log and $LOG/mon.a.log)"
      stop_cluster
      exit 1
    fi
  done
  wait_for "the monitor to form a quorum" ceph_cli quorum_status

  local osd_uuid
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  ceph_cli osd new "$osd_uuid" 0 >/dev/null
  ceph-osd --conf "$CONF" -i 0 --mkfs --osd-uuid "$osd_uuid" >>"$LOG/setup.log" 2>&1
  ceph-osd --conf "$CONF" -i 0 >>"$LOG/setup.log" 2>&1
  wait_for "the OSD to be up" osd_up

  ceph_cli osd pool create "$POOL" 8 >/dev/null 2>&1
  wait_for "the pool's placement groups to be active" pool_writable
  timeout 60 rbd --conf "$CONF" --id admin pool init "$POOL"

  trap - ERR
  print_env
}

osd_up() { ceph_cli osd stat --format json | grep -q '"num_up_osds":1'; }

# A write to the pool returns once its placement group is active (there is no manager to
# report PG states), bounded by the client's op timeout.
pool_writable() {
  echo probe | timeout 20 rados --conf "$CONF" --id admin --rados-osd-op-timeout 10 \
    -p "$POOL" put ceph-micro-probe - && timeout 20 rados --conf "$CONF" --id admin -p "$POOL" rm ceph-micro-probe
}

case "$cmd" in
  start) start_cluster ;;
  stop) stop_cluster ;;
  env) print_env ;;
  *) usage ;;
esac
