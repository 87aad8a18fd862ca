# python stack_perf.py DTYPE WEIGHTS ROWS: 1000 calls of the fused stack captured at ROWS rows, for `perf record -p PID`
# (printed as LOOP PID) while they run; then the seconds they took (= ms per call)
import os, sys, time
src = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "stack_ab.py")).read().split("ts = {1: [], 8: []}")[0]
rows = int(sys.argv[3])
exec(src)
calls = cap[rows][-20:]
print("LOOP", os.getpid(), flush=True)
time.sleep(2)
t0 = time.perf_counter()
for i in range(1000):
    orig(*calls[i % 20])
print("ms per call", time.perf_counter() - t0, flush=True)
