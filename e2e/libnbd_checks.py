#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# libnbd (python3-libnbd) checks of our NBD server, for e2e/block_status_test.cc.
# Run with Debian's /usr/bin/python3 (the module is Debian's). Prints one JSON
# object; the test asserts on it. Usage:
#   libnbd_checks.py extents URI            -> {"size", "extents": [[offset, length, flags], ...]} (merged)
#   libnbd_checks.py read URI OFFSET LENGTH -> {"chunks": [[status, offset, length]], "hole_bytes_zero",
#                                              "all_zero", "data_hex_prefix" (of the first data chunk)}
#   libnbd_checks.py multiconn URI OFFSET   -> {"can_multi_conn": [a, b], "seen_after_flush": bool}
import json
import sys

import nbd


def connect(uri, meta=False):
    h = nbd.NBD()
    if meta:
        h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.set_uri_allow_local_file(True)  # tls-certificates=DIR in the URI
    h.connect_uri(uri)
    return h


def extents(uri):
    h = connect(uri, meta=True)
    if not h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION):
        raise SystemExit("server did not agree to base:allocation")
    size = h.get_size()
    out = []
    offset = 0
    while offset < size:
        got = []

        def cb(metacontext, off, entries, err):
            if metacontext == nbd.CONTEXT_BASE_ALLOCATION:
                got.extend(entries)
            return 0

        h.block_status(min(size - offset, 1 << 30), offset, cb)
        if not got:
            raise SystemExit("empty block status reply at %d" % offset)
        for i in range(0, len(got), 2):
            length, flags = got[i], got[i + 1]
            length = min(length, size - offset)
            if out and out[-1][2] == flags and out[-1][0] + out[-1][1] == offset:
                out[-1][1] += length
            else:
                out.append([offset, length, flags])
            offset += length
            if offset >= size:
                break
    h.shutdown()
    return {"size": size, "extents": out}


def read(uri, offset, length):
    h = connect(uri)
    chunks = []
    hole_zero = [True]

    def cb(subbuf, off, status, err):
        chunks.append([status, off, len(subbuf)])
        if status == nbd.READ_HOLE and any(subbuf):
            hole_zero[0] = False
        return 0

    buf = h.pread_structured(length, offset, cb)
    h.shutdown()
    data = [c for c in chunks if c[0] == nbd.READ_DATA]
    first = data[0][1] - offset if data else 0
    return {"chunks": chunks, "hole_bytes_zero": hole_zero[0],
            "all_zero": not any(buf), "data_hex_prefix": bytes(buf[first:first + 8]).hex()}


def multiconn(uri, offset):
    a, b = connect(uri), connect(uri)
    flags = [a.can_multi_conn(), b.can_multi_conn()]
    pattern = bytes([0xC3, 0x3C]) * 2048
    b.pread(4096, offset)  # b has the old block, as a cache would
    a.pwrite(pattern, offset)
    a.flush()
    seen = b.pread(4096, offset) == pattern
    a.shutdown()
    b.shutdown()
    return {"can_multi_conn": flags, "seen_after_flush": seen}


def main():
    cmd, uri = sys.argv[1], sys.argv[2]
    if cmd == "extents":
        res = extents(uri)
    elif cmd == "read":
        res = read(uri, int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "multiconn":
        res = multiconn(uri, int(sys.argv[3]))
    else:
        raise SystemExit("unknown command " + cmd)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
