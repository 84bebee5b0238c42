#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# wan_deploy.sh: sourced by the WAN benchmarks (loadgen/wan_bench.sh,
# bench/rpo_bench.sh). Starts a replicating deployment across `cdp-loadgen
# wanem` (root): the master target in netns wan-b (10.77.0.2), the process
# server and the agent in wan-a (127.0.0.1), on free ports inside their
# namespaces, through the one local-cluster harness (`cdp-loadgen cluster`,
# loadgen/local_cluster.h) run in wan-a with the MT behind
# `--mt-wrapper "ip netns exec wan-b" --mt-host 10.77.0.2`.
#
# Deployed as the product ships: TLS 1.3 on both hops with a site CA and
# certificates the harness makes (tenant t), control tokens on (each daemon
# writes its admin token at first start; the metrics are read with it).
#
#   wan_up BUILD RATE_MBIT ONE_WAY_DELAY_MS CODEC CONNECTIONS
#     -> sets WAN_DIR (scratch dir), LG (cdp-loadgen), A / Bn (netns prefixes)
#        and the harness's CDP_* endpoints (CDP_AGENT_NBD_SOCKET, ...);
#        returns once every daemon answers /status (or fails after 120 s)
#   wan_down  stops the daemons, removes the emulator and WAN_DIR (EXIT trap)
#   ps_metric NAME   sum of a process-server metric   agent_metric NAME   the agent's
#   wan_snap PREFIX  the PS's, MT's and agent's /metrics into PREFIX.ps, .mt, .agent
#   prom_sum FILE NAME [LABEL]  sum of NAME's series in FILE whose labels hold
#                    LABEL (e.g. 'stage="read"')
#   wan_lag          the RPO lag now: the age of the oldest write not yet durable
#                    at the master target, max(oldest record in the PS spool,
#                    oldest record the agent has not had acknowledged)
#   wan_drain        waits until the PS's backlog and the agent's lag are zero
#                    (fails after 120 s)
#
# WAN_VOLUME_IMAGE (environment): the protected volume's image or block device
# (default: a sparse 4 GiB file in WAN_DIR).
WAN_PIDS=()
wan_down() {
  for p in "${WAN_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${WAN_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  "$LG" wanem down --name wan >/dev/null 2>&1 || true
  [ -n "${WAN_DIR:-}" ] && rm -rf "$WAN_DIR"
}
wan_get() {  # NETNS_PREFIX HOST:PORT TOKEN_FILE PATH
  if [ -n "${CDP_TLS_CA:-}" ]; then
    $1 curl -fsS --max-time 10 --cacert "$CDP_TLS_CA" -H "Authorization: Bearer $(cat "$3" 2>/dev/null)" "https://$2$4"
  else
    $1 curl -fsS --max-time 10 -H "Authorization: Bearer $(cat "$3" 2>/dev/null)" "http://$2$4"
  fi
}
wan_up() {
  local build=$1 rate=$2 delay=$3 codec=$4 conns=$5 _
  LG=$build/loadgen/cdp-loadgen
  WAN_DIR=$(mktemp -d /tmp/wanbench.XXXXXX)
  trap wan_down EXIT
  "$LG" wanem up --name wan --rate-mbit "$rate" --delay-ms "$delay" >/dev/null
  A="ip netns exec wan-a" Bn="ip netns exec wan-b"
  local image=${WAN_VOLUME_IMAGE:-$WAN_DIR/source.img}
  [ -n "${WAN_VOLUME_IMAGE:-}" ] || truncate -s 4G "$image"
  $A "$LG" cluster --build "$build" --dir "$WAN_DIR" --volume v --volume-image "$image" --tenant t --codec "$codec" --level 1 \
    --mt-host 10.77.0.2 --mt-wrapper="$Bn" --ps-args="--connections $conns" --env-file "$WAN_DIR/cluster.env" \
    >/dev/null 2>"$WAN_DIR/cluster.log" &
  WAN_PIDS+=($!)
  for _ in $(seq 1200); do
    [ -s "$WAN_DIR/cluster.env" ] && break
    kill -0 "${WAN_PIDS[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  if [ ! -s "$WAN_DIR/cluster.env" ]; then
    echo "the deployment did not come up; cdp-loadgen cluster said:" >&2
    tail -n 20 "$WAN_DIR/cluster.log" >&2
    return 1
  fi
  # shellcheck disable=SC1091
  source "$WAN_DIR/cluster.env"
}
ps_metric() {
  wan_get "$A" "$CDP_PS_CONTROL" "$CDP_PS_TOKEN_FILE" /metrics | awk -v n="$1" '$1 == n || index($1, n "{") == 1 {s += $2} END {printf "%.6f", s}'
}
agent_metric() {
  wan_get "$A" "$CDP_AGENT_CONTROL" "$CDP_AGENT_TOKEN_FILE" /metrics | awk -v n="$1" '$1 == n || index($1, n "{") == 1 {s += $2} END {printf "%.6f", s}'
}
wan_snap() {
  wan_get "$A" "$CDP_PS_CONTROL" "$CDP_PS_TOKEN_FILE" /metrics >"$1.ps"
  wan_get "$Bn" "$CDP_MT_CONTROL" "$CDP_MT_TOKEN_FILE" /metrics >"$1.mt"
  wan_get "$A" "$CDP_AGENT_CONTROL" "$CDP_AGENT_TOKEN_FILE" /metrics >"$1.agent"
}
prom_sum() {
  awk -v n="$2" -v l="${3:-}" '($1 == n || index($1, n "{") == 1) && (l == "" || index($1, l) > 0) {s += $2}
    END {printf "%.6f", s}' "$1"
}
wan_lag() {
  awk -v a="$(ps_metric cdp_ps_oldest_record_age_seconds)" -v b="$(agent_metric cdp_agent_rpo_lag_seconds)" \
    'BEGIN {printf "%.3f", (a > b ? a : b)}'
}
wan_drain() {
  for _ in $(seq 1200); do
    [ "$(ps_metric cdp_ps_backlog_bytes)" = "0.000000" ] && [ "$(agent_metric cdp_agent_rpo_lag_seconds)" = "0.000000" ] && return 0
    sleep 0.1
  done
  echo "backlog did not drain within 120 s" >&2
  return 1
}
