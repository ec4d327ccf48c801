"""ecokv.select from Python against the C++ call inside it (issue 47): on a 2048-token synthetic capture (the shape
of a 7B model's 8 KV heads over 4 layers, head_dim 128), the wall time of select() as Python sees it against the
core's compress() alone (ecokv.last_select_seconds), medians of REPS calls, per method; the ratio is the binding's
cost (views over the arrays, the result's arrays, the GIL).
    PYTHONPATH=build/python /usr/bin/python3 bench/bench-python-select.py build/bin/ecokv [REPS]"""
import json
import statistics
import subprocess
import sys
import tempfile
import time

import ecokv

ecokv_bin, reps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 15
with tempfile.TemporaryDirectory() as work:
    cap = f"{work}/cap.safetensors"
    subprocess.run([ecokv_bin, "synth-capture", "-o", cap, "--layers", "4", "--heads", "32", "--kv-heads", "8",
                    "--head-dim", "128", "--tokens", "2048", "--queries", "32", "--seed", "11"], check=True,
                   capture_output=True)
    a = ecokv.load_capture(cap)
rows = []
for method in ["snapkv", "snapkv+ecokv", "adakv+ecokv", "pyramidkv+mixkv"]:
    wall, core = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        ecokv.select(a["keys"], a["queries"], values=a["values"], method=method, budget=256)
        wall.append(time.perf_counter() - t0)
        core.append(ecokv.last_select_seconds())
    w, c = statistics.median(wall), statistics.median(core)
    rows.append({"method": method, "python_ms": 1e3 * w, "cpp_ms": 1e3 * c, "ratio": w / c})
print("| method | select() from Python, ms | the C++ call, ms | ratio |")
print("|---|---:|---:|---:|")
for r in rows:
    print(f"| {r['method']} | {r['python_ms']:.2f} | {r['cpp_ms']:.2f} | {r['ratio']:.3f} |")
print(json.dumps(rows))
