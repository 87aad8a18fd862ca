#!/bin/bash
# perf_ab.sh new|OLD/invariant.cpp ROWS TAG: session 29's ratio_same.py replaying ROWS-row W8A8 forwards (OLD as
# there), perf attached after its PHASE line for 9 s -> /tmp/pab_TAG.txt: thread-ms per forward by symbol
# (share x 2 threads x the replay's median)
HERE=$(dirname "$(readlink -f "$0")")
V=$1; R=$2; TAG=$3
cd /tmp
python "$HERE"/../2026-12-06-session29/ratio_same.py $V 14 w8a8 $R > /tmp/rs_$TAG.out 2>&1 &
for i in $(seq 120); do grep -q PHASE /tmp/rs_$TAG.out && break; sleep 1; done
PID=$(pgrep -f "ratio_same.py $V 14" | head -1)
perf record -o /tmp/p_$TAG.data -F 4000 -g -p $PID -- sleep 9 >/dev/null 2>&1
wait
MED=$(tail -1 /tmp/rs_$TAG.out | grep -oE "$R rows? [0-9.]+" | awk '{print $3}')
perf report -i /tmp/p_$TAG.data --no-children --sort sym -g none --stdio 2>/dev/null | grep -v "^#" | grep -v "^$" | \
  awk -v m=$MED '{s=$1; sub("%","",s); $1=""; $2=""; printf "%8.3f %s\n", s/100*2*m, $0}' > /tmp/pab_$TAG.txt
echo "$TAG median $MED"; 
