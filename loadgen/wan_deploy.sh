#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# wan_deploy.sh: sourced by the WAN benchmarks (loadgen/wan_bench.sh,
# bench/rpo_bench.sh). Starts a replicating deployment across `cdp-loadgen
# wanem` (root): the master target in netns wan-b (10.77.0.2), the process
# server and the agent in wan-a, all on fixed ports inside their namespaces.
#
# Deployed as the product ships: TLS 1.3 on both hops with a site CA and
# certificates made by `cdpctl pki` (tenant t), control tokens on (each
# daemon writes its admin token at first start; the metrics are read with it).
#
#   wan_up BUILD RATE_MBIT ONE_WAY_DELAY_MS CODEC CONNECTIONS
#     -> sets WAN_DIR (scratch dir), LG (cdp-loadgen), A / Bn (netns prefixes);
#        returns once every daemon answers /status (or fails after 30 s)
#   wan_down  stops the daemons, removes the emulator and WAN_DIR (EXIT trap)
#   ps_metric NAME   sum of a process-server metric   agent_metric NAME   the agent's
WAN_PIDS=()
wan_down() {
  for p in "${WAN_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${WAN_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  "$LG" wanem down --name wan >/dev/null 2>&1 || true
  [ -n "${WAN_DIR:-}" ] && rm -rf "$WAN_DIR"
}
wan_get() {  # NETNS_PREFIX PORT TOKEN_FILE PATH
  $1 curl -fsS --max-time 10 -H "Authorization: Bearer $(cat "$3" 2>/dev/null)" "http://127.0.0.1:$2$4"
}
wan_wait_status() {  # NETNS_PREFIX PORT TOKEN_FILE LOG
  for _ in $(seq 300); do wan_get "$1" "$2" "$3" /status >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "daemon on port $2 did not answer /status within 30 s; its log:" >&2
  tail -5 "$4" >&2
  return 1
}
wan_up() {
  local build=$1 rate=$2 delay=$3 codec=$4 conns=$5
  LG=$build/loadgen/cdp-loadgen
  WAN_DIR=$(mktemp -d /tmp/wanbench.XXXXXX)
  trap wan_down EXIT
  "$LG" wanem up --name wan --rate-mbit "$rate" --delay-ms "$delay" >/dev/null
  A="ip netns exec wan-a" Bn="ip netns exec wan-b"
  mkdir -p "$WAN_DIR/mt" "$WAN_DIR/spool" "$WAN_DIR/agent"
  truncate -s 4G "$WAN_DIR/source.img"
  echo secret0123456789 >"$WAN_DIR/secret"
  local ctl=$build/cdpctl/cdpctl pki=$WAN_DIR/pki
  "$ctl" pki init --dir "$pki" >/dev/null
  "$ctl" pki issue --dir "$pki" --role mt --name wan-mt --out "$pki/mt" >/dev/null
  "$ctl" --tenant t pki issue --dir "$pki" --role ps --name wan-ps --out "$pki/ps" >/dev/null
  "$ctl" --tenant t pki issue --dir "$pki" --role agent --name wan-agent --out "$pki/agent" >/dev/null
  tls() { echo --tls_ca "$pki/ca.crt" --tls_cert "$pki/$1.crt" --tls_key "$pki/$1.key"; }
  $Bn "$build/master-target/cdp-master-target" --listen 10.77.0.2:7500 --control 127.0.0.1:9102 \
    --nbd none --data_dir "$WAN_DIR/mt" --tenant t:secret0123456789 \
    --log.file "$WAN_DIR/mt.log" $(tls mt) >/dev/null 2>&1 &
  WAN_PIDS+=($!)
  $A "$build/process-server/cdp-process-server" --listen 127.0.0.1:7400 --control 127.0.0.1:9101 \
    --mt 10.77.0.2:7500 --tenant t:secret0123456789 --spool_dir "$WAN_DIR/spool" --codec "$codec" \
    --connections "$conns" --log.file "$WAN_DIR/ps.log" $(tls ps) >/dev/null 2>&1 &
  WAN_PIDS+=($!)
  $A "$build/agent/cdp-agent" --volume v="$WAN_DIR/source.img" --nbd_unix "$WAN_DIR/agent/nbd.sock" \
    --ps 127.0.0.1:7400 --tenant t --secret_file "$WAN_DIR/secret" --bitmap_dir "$WAN_DIR/agent" \
    --control 127.0.0.1:9100 --log.file "$WAN_DIR/agent.log" $(tls agent) >/dev/null 2>&1 &
  WAN_PIDS+=($!)
  AG_TOKEN=$WAN_DIR/agent/control.token PS_TOKEN=$WAN_DIR/spool/control.token MT_TOKEN=$WAN_DIR/mt/control.token
  wan_wait_status "$Bn" 9102 "$MT_TOKEN" "$WAN_DIR/mt.log" && wan_wait_status "$A" 9101 "$PS_TOKEN" "$WAN_DIR/ps.log" &&
    wan_wait_status "$A" 9100 "$AG_TOKEN" "$WAN_DIR/agent.log"
}
ps_metric() {
  wan_get "$A" 9101 "$PS_TOKEN" /metrics | awk -v n="$1" '$1 == n || index($1, n "{") == 1 {s += $2} END {printf "%.6f", s}'
}
agent_metric() {
  wan_get "$A" 9100 "$AG_TOKEN" /metrics | awk -v n="$1" '$1 == n || index($1, n "{") == 1 {s += $2} END {printf "%.6f", s}'
}
