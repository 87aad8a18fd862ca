#!/bin/bash
# perfrun.sh ROWS OUT
cd /work/main/benchmarks/results/2026-12-06-session36
python stack_perf.py bfloat16 w8a8 $1 > /tmp/sp_$1.log 2>&1 &
while ! grep -q LOOP /tmp/sp_$1.log; do sleep 0.5; done
pid=$(grep LOOP /tmp/sp_$1.log | awk '{print $2}')
sleep 1
perf record -e cpu-clock -F 4000 -p $pid -o $2 -- sleep 4 > /dev/null 2>&1
wait
grep "ms per" /tmp/sp_$1.log
