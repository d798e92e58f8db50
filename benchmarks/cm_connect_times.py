#!/usr/bin/env python3
# Connect to established, as the application sees it: from each rdma_connect call to the
# ESTABLISHED event that follows, in the output of a client run under benchmarks/cm_shim.c.
# Usage: cm_connect_times.py OUTPUT.txt
import sys

times, start = [], None
for line in open(sys.argv[1], errors="replace"):
    f = line.split()
    if len(f) < 3 or f[0] != "CMT":
        continue
    t = float(f[1])
    if f[2] == "connect":
        start = t
    elif f[2] == "event" and f[3:] == ["RDMA_CM_EVENT_ESTABLISHED"] and start is not None:
        times.append((t - start) * 1e3)
        start = None
if times:
    s = sorted(times)
    print("connect->ESTABLISHED " + " ".join("%.1f" % x for x in times)
          + " ms; median %.1f ms (n=%d)" % (s[len(s) // 2], len(s)))
