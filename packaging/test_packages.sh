#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Debian packages (cmake/packaging.cmake), as an operator meets them:
# built from the build tree with cpack, checked by lintian (no errors),
# installed with dpkg on this machine, their units checked with
# systemd-analyze verify, removed (configuration and data stay) and purged
# (both go). CTest runs it with the label `package`.
#
#   bash packaging/test_packages.sh BUILD_DIR
#
# Needs root (dpkg). Exits 77 (CTest: skipped, with the reason printed) when
# not root or when OpenCDP packages are already installed here: it will not
# touch an operator's installation.
set -euo pipefail

BUILD=$(cd "${1:?usage: test_packages.sh BUILD_DIR}" && pwd)
PKGS=(opencdp-agent opencdp-process-server opencdp-master-target opencdp-tools)
ROLES=(agent process-server master-target)

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: installing packages needs root"
  exit 77
fi
for p in "${PKGS[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q installed; then
    echo "SKIP: $p is installed on this machine; the test installs and purges the packages"
    exit 77
  fi
done

OUT=$(mktemp -d /tmp/opencdp-packages.XXXXXX)
cleanup() {
  dpkg -P "${PKGS[@]}" >/dev/null 2>&1 || true
  rm -rf "$OUT"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

echo "== cpack"
(cd "$BUILD" && cpack -G DEB -B "$OUT" >"$OUT/cpack.log" 2>&1) || { cat "$OUT/cpack.log"; fail "cpack"; }
debs=()
for p in "${PKGS[@]}"; do
  f=$(ls "$OUT/${p}_"*.deb 2>/dev/null | head -n1)
  [ -n "$f" ] || fail "no package $p"
  debs+=("$f")
done

echo "== lintian (errors fail)"
for f in "${debs[@]}"; do
  r=0
  lintian --fail-on error "$f" >"$OUT/lintian.log" 2>&1 || r=$?
  grep -v "running with root privileges" "$OUT/lintian.log" || true
  [ $r -eq 0 ] || fail "lintian errors in $(basename "$f")"
done

echo "== install"
dpkg -i "${debs[@]}" || fail "dpkg -i"
getent passwd opencdp >/dev/null || fail "no system user opencdp"
for r in "${ROLES[@]}"; do
  d=/var/lib/opencdp/$r
  [ "$(stat -c '%U %G %a' "$d")" = "opencdp opencdp 700" ] || fail "$d: $(stat -c '%U %G %a' "$d")"
done
for c in agent.conf process-server.conf master-target.conf mt-tenants; do
  [ "$(stat -c '%U %G %a' /etc/opencdp/$c)" = "root root 600" ] || fail "/etc/opencdp/$c: $(stat -c '%U %G %a' /etc/opencdp/$c)"
done
for b in cdp-agent cdp-process-server cdp-master-target cdpctl cdp-loadgen; do
  /usr/bin/$b --version | grep -q "^$b " || fail "/usr/bin/$b --version"
done
for m in man8/cdp-agent.8 man8/cdp-process-server.8 man8/cdp-master-target.8 man1/cdpctl.1 man1/cdp-loadgen.1; do
  zcat /usr/share/man/$m.gz | grep -q '^\.SH NAME' || fail "man page $m"
done
for p in "${PKGS[@]}"; do
  [ -s /usr/share/doc/$p/copyright ] && [ -s /usr/share/doc/$p/changelog.gz ] || fail "$p: copyright or changelog"
done
for u in cdp-agent cdp-process-server cdp-master-target; do
  grep -q "^ExecStart=/usr/bin/$u " /usr/lib/systemd/system/$u.service || fail "$u.service: ExecStart"
  for doc in $(sed -n 's|^Documentation=.*file://\([^ ]*\).*|\1|p' /usr/lib/systemd/system/$u.service); do
    [ -s "$doc" ] || fail "$u.service: Documentation $doc is not installed"
  done
done
echo "== systemd-analyze verify"
# The units name credentials under /etc/opencdp that an operator creates.
mkdir -p /etc/opencdp/tls
made=()
for f in /etc/opencdp/agent.secret /etc/opencdp/tls/agent.key /etc/opencdp/tls/ps.key /etc/opencdp/tls/mt.key; do
  [ -e "$f" ] || { : >"$f"; made+=("$f"); }
done
r=0
systemd-analyze verify /usr/lib/systemd/system/cdp-agent.service /usr/lib/systemd/system/cdp-process-server.service \
  /usr/lib/systemd/system/cdp-master-target.service >"$OUT/verify.log" 2>&1 || r=$?
rm -f "${made[@]}"
rmdir /etc/opencdp/tls 2>/dev/null || true
# Messages about units or the machine outside ours (this host may not run systemd) are not ours to fix.
if [ $r -ne 0 ] || grep -E '^/usr/lib/systemd/system/cdp-' "$OUT/verify.log"; then
  cat "$OUT/verify.log"
  fail "systemd-analyze verify"
fi

echo "== remove: configuration and data stay"
echo "kept" >/var/lib/opencdp/agent/marker
dpkg -r "${PKGS[@]}" || fail "dpkg -r"
[ ! -e /usr/bin/cdp-agent ] || fail "/usr/bin/cdp-agent still there after remove"
[ -f /etc/opencdp/agent.conf ] || fail "/etc/opencdp/agent.conf gone after remove"
[ "$(cat /var/lib/opencdp/agent/marker)" = kept ] || fail "/var/lib/opencdp/agent gone after remove"

echo "== purge: both go"
dpkg -P "${PKGS[@]}" || fail "dpkg -P"
[ ! -e /etc/opencdp ] || fail "/etc/opencdp still there after purge: $(ls -la /etc/opencdp)"
[ ! -e /var/lib/opencdp ] || fail "/var/lib/opencdp still there after purge: $(ls -la /var/lib/opencdp)"
echo "OK"
