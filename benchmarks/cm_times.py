#!/usr/bin/env python3
# IB CM handshake times in a capture: REQ->REP (the passive side), REP->RTU (the active side)
# and REQ->RTU (connect to established) for every connection, and their medians.
# Usage: cm_times.py CAPTURE.pcap   (needs tshark)
import subprocess, sys
# REQ->REP (server turnaround), REP->RTU (client turnaround), REQ->RTU (connect to established) per connection
out = subprocess.run(["tshark","-r",sys.argv[1],"-Y","infiniband.mad.attributeid","-T","fields","-e","frame.time_epoch","-e","ip.src","-e","infiniband.mad.attributeid"],capture_output=True,text=True).stdout
rows=[l.split("\t") for l in out.strip().splitlines()]
conns=[]; cur=None
for t,src,a in rows:
    t=float(t)
    if a=="0x0010":
        if cur is None or "rep" in cur: cur={"req":t}; conns.append(cur)
        # resend / retry after REJ: keep the last REQ before the REP
        else: cur["req"]=t
    elif a=="0x0013" and cur is not None and "rep" not in cur: cur["rep"]=t
    elif a=="0x0014" and cur is not None and "rep" in cur and "rtu" not in cur: cur["rtu"]=t
res=[c for c in conns if "rtu" in c]
for c in res:
    print("REQ->REP %.2f ms  REP->RTU %.2f ms  REQ->RTU %.2f ms"%((c["rep"]-c["req"])*1e3,(c["rtu"]-c["rep"])*1e3,(c["rtu"]-c["req"])*1e3))
import statistics
if res:
    m=lambda k1,k2: statistics.median([(c[k2]-c[k1])*1e3 for c in res])
    print("median REQ->REP %.2f  REP->RTU %.2f  REQ->RTU %.2f ms (n=%d)"%(m("req","rep"),m("rep","rtu"),m("req","rtu"),len(res)))
