#!/usr/bin/env python3
"""One TCP stream for benchmarks/network.sh's incast: `server ADDR PORT SECS` accepts one
connection and prints the MiB/s it received; `client ADDR PORT SECS` sends for SECS seconds."""
import socket
import sys
import time

mode, addr, port, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
buf = bytearray(1 << 20)
if mode == "server":
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(1)
    conn, _ = ls.accept()
    got, start = 0, time.monotonic()
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        got += n
    print(f"{got / (time.monotonic() - start) / 2**20:.1f}")
else:
    conn = socket.create_connection((addr, port))
    start = time.monotonic()
    while time.monotonic() - start < secs:
        conn.send(buf)
    conn.close()
