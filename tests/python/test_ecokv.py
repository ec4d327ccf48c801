"""The Python module against the command line and a second, plain implementation (tests/python, run by ctest).
    PYTHONPATH=build/python /usr/bin/python3 tests/python/test_ecokv.py build/bin/ecokv"""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

import ecokv

ecokv_bin, work = sys.argv[1], tempfile.mkdtemp()
atexit.register(shutil.rmtree, work)
failures = 0


def check(cond, what):
    global failures
    print(("ok - " if cond else "not ok - ") + what)
    failures += not cond


# The registry and the option table are the CLI's.
listed = subprocess.run([ecokv_bin, "compress", "--list-methods"], capture_output=True, text=True, check=True).stdout
names = [m["name"] for m in ecokv.methods()]
check(all(any(line.startswith(n + " ") for line in listed.splitlines()) for n in names) and len(names) == len(set(names)) >= 17,
      f"methods() lists the registry's {len(names)} names, as --list-methods")
keys = {o["key"]: o for o in ecokv.options()}
check(keys["budget"]["default"] == "64" and keys["pool"]["choices"] == ["avg", "max"], "options(): the table's rows")
check(all(f"  {k} (default: " in ecokv.select.__doc__ for k in keys), "select's docstring lists every option row")

# select() on a capture file equals `ecokv compress` on it, for methods of every kind.
cap = f"{work}/cap.safetensors"
subprocess.run([ecokv_bin, "synth-capture", "-o", cap, "--layers", "3", "--kv-heads", "2", "--heads", "4",
                "--tokens", "200", "--head-dim", "16", "--seed", "7"], check=True, capture_output=True)
arrays = ecokv.load_capture(cap)
for method in ["snapkv", "snapkv+ecokv", "adakv+ecokv", "pyramidkv+mixkv", "madakv", "keydiff", "vnorm"]:
    out = f"{work}/{method}.json"
    subprocess.run([ecokv_bin, "compress", "-i", cap, "-o", out, "-m", method, "-b", "40"], check=True,
                   capture_output=True)
    want = [layer["heads"] for layer in json.load(open(out))["layers"]]
    got = ecokv.select(arrays["keys"], arrays["queries"], values=arrays["values"], method=method, budget=40)
    check([[h.tolist() for h in layer] for layer in got] == want, f"select(method={method!r}) equals ecokv compress")

# select() equals the independent fp64 reference of SPEC (scripts/reference/ecokv_ref.py, written from the SPEC only)
# on its golden captures: every case of tests/data/golden/cases.json, every registry method but random.
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(ecokv_bin))))
golden = f"{root}/tests/data/golden"
cases = json.load(open(f"{golden}/cases.json"))
captures = {}
agree = 0
for case in cases:
    c = captures.setdefault(case["capture"], ecokv.load_capture(f"{golden}/{case['capture']}"))
    options = dict(case["params"])
    if "head_scores" in options:
        options["head_scores"] = f"{golden}/{options['head_scores']}"
    got = ecokv.select(c["keys"], c["queries"], values=c["values"], modality=c.get("modality"),
                       full_queries=c.get("full_queries"), method=case["method"], **options)
    same = [[h.tolist() for h in layer] for layer in got] == case["expected"]["heads"]
    agree += same
    if not same:
        print(f"# {case['name']} differs")
check(agree == len(cases), f"select() equals the fp64 reference on {agree} of {len(cases)} golden cases "
      f"({len({c['method'] for c in cases})} methods)")

# A DLPack producer that is not a buffer: read through numpy.from_dlpack.
class Producer:
    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


d = ecokv.select(Producer(arrays["keys"]), Producer(arrays["queries"]), method="snapkv", budget=48)
e = ecokv.select(arrays["keys"], arrays["queries"], method="snapkv", budget=48)
check(all((x == y).all() for la, lb in zip(d, e) for x, y in zip(la, lb)), "a DLPack producer selects as its array")

# float16 and strided (non-contiguous) arrays are read in place and select alike.
k16, q16, v16 = (arrays[n].astype(np.float16) for n in ("keys", "queries", "values"))
a = ecokv.select(k16, q16, values=v16, method="snapkv", budget=48)
wide = np.zeros(k16.shape[:3] + (32,), np.float16)
wide[..., :16] = k16
b = ecokv.select(wide[..., :16], q16, values=v16, method="snapkv", budget=48)
check(all((x == y).all() for la, lb in zip(a, b) for x, y in zip(la, lb)), "a strided view selects as a packed array")

# torch tensors (Debian's python3-torch, installed by setup.sh --training only): read through numpy, no copy.
try:
    import torch
    t = ecokv.select(torch.from_numpy(arrays["keys"]), torch.from_numpy(arrays["queries"]), method="snapkv", budget=48)
    n = ecokv.select(arrays["keys"], arrays["queries"], method="snapkv", budget=48)
    check(all((x == y).all() for la, lb in zip(t, n) for x, y in zip(la, lb)), "torch tensors (DLPack) select as numpy arrays")
    check(np.shares_memory(np.from_dlpack(torch.from_numpy(arrays["keys"])), arrays["keys"]), "DLPack reads in place")
except ImportError:
    print("ok - torch tensors: skipped (no python3-torch; scripts/setup.sh --training installs it)")

# SnapKV by a second, plain implementation (SPEC §3.1: each window query's causal softmax attention over the prompt,
# mean over the window, then over the query group; avg pooling over the prefix, zero padding counted; top B - N of the
# prefix, ties to the lower index, plus the window).
def snapkv(k, q, budget, window, kernel=5):
    L, H, T, D = k.shape
    group = q.shape[1] // H
    out = []
    for l in range(L):
        heads = []
        for h in range(H):
            qs = q[l, h * group:(h + 1) * group, -window:].astype(np.float64)
            logits = qs @ k[l, h].astype(np.float64).T / np.sqrt(D)
            pos = np.arange(T - window, T)[None, :, None]
            logits = np.where(np.arange(T)[None, None, :] <= pos, logits, -np.inf)
            p = np.exp(logits - logits.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            a0 = p.mean(1).mean(0)[: T - window]
            pooled = np.convolve(np.pad(a0, kernel // 2), np.ones(kernel), "valid") / kernel
            top = np.sort(np.argsort(-pooled, kind="stable")[: budget - window])
            heads.append(np.concatenate([top, np.arange(T - window, T)]).tolist())
        out.append(heads)
    return out


mine = snapkv(arrays["keys"], arrays["queries"], 40, 8)
theirs = ecokv.select(arrays["keys"], arrays["queries"], method="snapkv", budget=40, window=8)
check([[h.tolist() for h in layer] for layer in theirs] == mine, "SnapKV equals a plain numpy implementation")

# Errors are Python exceptions with the library's messages.
def raises(kind, fn, text):
    try:
        fn()
    except kind as e:
        return text in str(e)
    return False


check(raises(ValueError, lambda: ecokv.select(arrays["keys"][0], arrays["queries"], method="snapkv"), "4 dimensions"),
      "a 3-d array is a ValueError")
check(raises(ValueError, lambda: ecokv.select(arrays["keys"], arrays["queries"], method="nosuch"), "nosuch"),
      "an unknown method is a ValueError naming it")
check(raises(ValueError, lambda: ecokv.select(arrays["keys"], arrays["queries"], budget=4, window=8), "--budget"),
      "a budget below the window is a ValueError")
nan = arrays["keys"].copy()
nan[1, 0, 3, 2] = np.nan
check(raises(ValueError, lambda: ecokv.select(nan, arrays["queries"], method="snapkv"), "NaN"), "NaN is a ValueError")
check(raises(ValueError, lambda: ecokv.select(arrays["keys"], arrays["queries"], method="ecokv"), "value rows"),
      "a method that reads values without them is a ValueError")
check(raises(FileNotFoundError, lambda: ecokv.load_capture(f"{work}/none.safetensors"), "none.safetensors"),
      "a missing capture is a FileNotFoundError")
open(f"{work}/bad.safetensors", "wb").write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
check(raises(OSError, lambda: ecokv.load_capture(f"{work}/bad.safetensors"), "bad.safetensors"),
      "a corrupt capture is an OSError naming the file")

# The llama.cpp session: compress once, ask many, as `ecokv run --question` answers (tiny-qwen2vl, the sample page).
if hasattr(ecokv, "Model"):
    models = f"{root}/models"
    image = f"{models}/tiny-qwen2vl-sample/images/qa-240014.png"
    questions = ["What is the TOTAL?", "What is the TAX?", "What is the BEEF?"]
    cli = subprocess.run([ecokv_bin, "run", "--model", f"{models}/tiny-qwen2vl.gguf", "--mmproj",
                          f"{models}/tiny-qwen2vl-mmproj.gguf", "--image", image, "-m", "adakv+ecokv", "-b", "100",
                          "-n", "12", "--json"] + [a for q in questions for a in ("--question", q)],
                         capture_output=True, text=True, check=True)
    want = [a["text"] for a in json.loads(cli.stdout)["answers"]]
    m = ecokv.Model(f"{models}/tiny-qwen2vl.gguf", mmproj=f"{models}/tiny-qwen2vl-mmproj.gguf", n_threads=2)
    full = m.prefill("", [image], max_tokens=12)
    compressed = full.compress(method="adakv+ecokv", budget=100)
    check(compressed.ask(questions, max_tokens=12) == want, f"Sequence.ask answers as ecokv run: {want}")
    pieces = list(compressed.ask(questions[0], max_tokens=12, stream=True))
    check("".join(pieces) == want[0] and len(pieces) >= 2, f"stream=True yields the greedy answer in pieces: {pieces}")
    hot = [compressed.ask(questions[0], max_tokens=12, temperature=1.5, seed=s) for s in (1, 1, 2)]
    check(hot[0] == hot[1] and all(isinstance(h, str) for h in hot), f"sampling is seeded: {hot}")
    direct = m.prefill("", [image], max_tokens=12, method="adakv+ecokv", budget=100)
    check(direct.ask(questions[0], max_tokens=12) == want[0], "a compressed prefill answers alike")
    kept = compressed.kept()
    entries = sum(len(h) for layer in kept for h in layer)
    # an entry is K and V of one head: 2 x 32 dims x 2 bytes (f16); AdaKV shares 8 x 100 among the heads
    check(full.kept() is None and len(kept) == 4 and all(len(layer) == 2 for layer in kept) and
          entries <= 800 and compressed.kv_bytes == entries * 128,
          f"kept(): [layer][head] cells, {entries} entries, {compressed.kv_bytes} bytes")
    check(compressed.kv_bytes < full.kv_bytes / 4, f"kv_bytes {compressed.kv_bytes} against {full.kv_bytes}")
    saved = compressed.save()
    check(m.resume(saved, max_tokens=12).ask(questions, max_tokens=12) == want,
          f"save() and Model.resume() answer alike ({len(saved)} bytes)")
    bad = bytearray(saved)
    bad[len(bad) // 2] ^= 1
    check(raises(ValueError, lambda: m.resume(bytes(bad)), "checksum"), "a corrupted entry is a ValueError")
    check(raises(ValueError, lambda: m.resume(saved[:100]), "checksum"), "a truncated entry is a ValueError")
    other = ecokv.Model(f"{models}/tiny-vlm.gguf", mmproj=f"{models}/tiny-vlm-mmproj.gguf")
    check(raises(ValueError, lambda: other.resume(saved), "another model"), "another model's entry is a ValueError")
    check(raises(ValueError, lambda: m.prefill("", [image], method="nosuch"), "nosuch"), "a bad method: ValueError")
    check(raises(ValueError, lambda: ecokv.Model(f"{work}/none.gguf"), "no such model file"), "a missing model: ValueError")

# No leak: 100 models and 300 sequences (prefill, compress, ask, save, resume) on the bundled text model leave the
# process's resident memory where it was after the first few (glibc keeps some freed memory: a bound, not zero).
if hasattr(ecokv, "Model"):
    def rss_mib():
        return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) / 1024

    story = f"{root}/models/stories260K.gguf"

    def cycle(model):
        s = model.prefill("Once upon a time there was a little girl who liked to play in the park with her dog and",
                          max_tokens=8)
        c = s.compress(method="snapkv", budget=12, window=4)
        c.ask("She", max_tokens=4)
        model.resume(c.save(), max_tokens=8).ask("He", max_tokens=4)

    for _ in range(5):
        cycle(ecokv.Model(story))
    before = rss_mib()
    for i in range(100):
        model = ecokv.Model(story)
        for _ in range(3):
            cycle(model)
    grown = rss_mib() - before
    check(grown < 16, f"100 models and 300 sequences grow the resident memory by {grown:.1f} MiB (< 16)")

sys.exit(1 if failures else 0)
