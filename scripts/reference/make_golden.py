#!/usr/bin/python3
"""Generate the golden test data of tests/data/golden/ with the fp64 reference (ecokv_ref.py).

Usage: /usr/bin/python3 scripts/reference/make_golden.py [--out DIR] [--self-check-only]

Deterministic: a fixed numpy default_rng seed, sorted safetensors headers and fixed JSON formatting, so two
runs write the same bytes. Prints one summary line per case.
"""

import argparse
import itertools
import json
import math
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ecokv_ref as ref  # noqa: E402

SEED = 20250611
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_OUT = os.path.join(ROOT, "tests", "data", "golden")

MIN_CUT_MARGIN = 1e-4      # relative top-C gap (and AdaKV global-cut gap) required for fp32 reproducibility
MIN_ROUND_MARGIN = 1e-3    # distance of a float round()/rint() argument from a half-point
MIN_COVERAGE_MARGIN = 1e-5  # MadaKV running-sum crossing distance from theta*w, relative to w
MIN_PIVOT_MARGIN = 1e-5    # LOOK-M merge: best minus second-best cosine

# ---------------------------------------------------------------------------------------------------------------
# Synthetic captures
# ---------------------------------------------------------------------------------------------------------------


def rope(x, positions, base=10000.0):
    """Rotary embedding on the last dimension (pairs (2i, 2i+1)), as an engine would apply it."""
    d = x.shape[-1]
    freqs = base ** (-np.arange(0, d, 2) / d)
    angles = positions[:, None] * freqs[None, :]
    cos, sin = np.cos(angles), np.sin(angles)
    out = x.copy()
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    out[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
    return out


def unit(x):
    return x / np.linalg.norm(x)


def make_capture_arrays(rng, n_layers, n_heads, n_kv_heads, head_dim, value_dim, n_tokens, n_queries, image):
    """Realistic-looking post-RoPE K/V/Q: anisotropic keys (shared mean direction + per-dimension scales), varied
    token norms, a sink and a few large keys, image tokens shifted along their own direction, queries built from
    a few heavy-hitter keys plus a local key so attention is peaked. The peak is kept moderate (top token about
    4-10x the uniform weight): much sharper attention makes avg pooling produce plateaus of near-equal scores,
    which no fp32 implementation could rank like the fp64 reference."""
    group = n_heads // n_kv_heads
    positions = np.arange(n_tokens, dtype=np.float64)
    modality = np.zeros(n_tokens, dtype=np.uint8)
    modality[image[0]:image[1]] = 1
    img = modality.astype(bool)
    layers = []
    for _ in range(n_layers):
        keys = np.zeros((n_kv_heads, n_tokens, head_dim))
        values = np.zeros((n_kv_heads, n_tokens, value_dim))
        full_q = np.zeros((n_heads, n_tokens, head_dim))
        for g in range(n_kv_heads):
            scales = np.exp(rng.uniform(np.log(0.3), np.log(2.0), head_dim))
            mean_dir = unit(rng.normal(size=head_dim))
            img_dir = unit(rng.normal(size=head_dim))
            k = rng.uniform(1.0, 2.5) * mean_dir + rng.normal(size=(n_tokens, head_dim)) * scales
            k[img] += rng.uniform(0.6, 1.2) * img_dir
            k *= np.exp(rng.normal(0.0, 0.3, n_tokens))[:, None]
            big = rng.choice(np.arange(1, n_tokens - 8), size=3, replace=False)
            k[big] *= rng.uniform(1.5, 2.5, size=3)[:, None]
            k[0] = 1.5 * (mean_dir * np.linalg.norm(k[0]) + 0.3 * k[0])  # attention sink
            k = rope(k, positions)
            keys[g] = k

            vscales = np.exp(rng.uniform(np.log(0.5), np.log(1.5), value_dim))
            v = rng.normal(size=(n_tokens, value_dim)) * vscales
            v *= np.exp(rng.normal(0.0, 0.4, n_tokens))[:, None]
            vbig = rng.choice(n_tokens, size=2, replace=False)
            v[vbig] *= 2.5
            values[g] = v

            ku = k / np.linalg.norm(k, axis=1)[:, None]
            for h in range(g * group, (g + 1) * group):
                heavy = np.sort(rng.choice(np.arange(1, n_tokens - n_queries), size=4, replace=False))
                strength = rng.uniform(0.3, 1.0)
                noise = rng.uniform(0.3, 0.8)
                for i in range(n_tokens):
                    q = 0.15 * mean_dir
                    visible = heavy[heavy <= i]
                    if len(visible):
                        weights = rng.uniform(0.5, 1.5, size=len(visible))
                        q = q + strength * (weights[:, None] * ku[visible]).sum(axis=0) / math.sqrt(len(visible))
                    local = rng.integers(max(0, i - 6), i + 1)
                    q = q + 0.6 * strength * ku[local]
                    q = q + noise * rng.normal(size=head_dim)
                    full_q[h, i] = q
        layers.append((keys, values, full_q))
    return layers, modality


def capture_tensors(layers, modality, n_queries, dtype):
    tensors = {}
    for il, (keys, values, full_q) in enumerate(layers):
        tensors[f"layers.{il}.keys"] = keys.astype(dtype)
        tensors[f"layers.{il}.values"] = values.astype(dtype)
        tensors[f"layers.{il}.queries"] = full_q[:, -n_queries:, :].astype(dtype)
        tensors[f"layers.{il}.full_queries"] = full_q.astype(dtype)
    tensors["modality"] = modality
    return tensors


GEOMETRIES = {
    "tiny": dict(n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, value_dim=8, n_tokens=56, n_queries=32,
                 image=(6, 30)),
    "gqa3": dict(n_layers=2, n_heads=6, n_kv_heads=2, head_dim=16, value_dim=12, n_tokens=80, n_queries=40,
                 image=(10, 60)),
}
CAPTURES = [  # file, geometry, dtype
    ("tiny-f32.safetensors", "tiny", np.float32),
    ("tiny-f16.safetensors", "tiny", np.float16),
    ("gqa3.safetensors", "gqa3", np.float32),
]
HEAD_SCORE_FILES = {"tiny": "head-scores-tiny.json", "gqa3": "head-scores-gqa3.json"}


def write_captures(out, rng):
    arrays = {}
    for geo_name in ("tiny", "gqa3"):
        geo = GEOMETRIES[geo_name]
        arrays[geo_name] = make_capture_arrays(rng, **geo)
    for file_name, geo_name, dtype in CAPTURES:
        geo = GEOMETRIES[geo_name]
        layers, modality = arrays[geo_name]
        meta = {
            "n_layers": geo["n_layers"], "n_heads": geo["n_heads"], "n_kv_heads": geo["n_kv_heads"],
            "head_dim": geo["head_dim"], "n_tokens": geo["n_tokens"],
            "model": f"synthetic-{geo_name}",
        }
        ref.write_safetensors(os.path.join(out, file_name), capture_tensors(layers, modality, geo["n_queries"], dtype),
                              meta)


def write_head_scores(out, rng):
    for geo_name, file_name in HEAD_SCORE_FILES.items():
        geo = GEOMETRIES[geo_name]
        scores = {}
        for il in range(geo["n_layers"]):
            for h in range(geo["n_heads"]):
                scores[f"{il}-{h}"] = [round(float(x), 6) for x in rng.gamma(2.0, 0.5, size=3) + 0.01]
        lines = [f"{json.dumps(key)}: {json.dumps(value)}" for key, value in scores.items()]
        with open(os.path.join(out, file_name), "w") as f:
            f.write("{\n " + ",\n ".join(lines) + "\n}\n")


# ---------------------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------------------

T32 = "tiny-f32.safetensors"
T16 = "tiny-f16.safetensors"
G3 = "gqa3.safetensors"


def case_specs():
    """(stem, capture, method, budget, params). The final budget may move by 1-2 to avoid near-ties."""
    specs = []
    w8 = {"window": 8}
    # every scorer, uniform allocation, three budgets on tiny-f32
    for scorer in ("snapkv", "knorm", "knorm-only", "vnorm", "keydiff", "manifoldkv", "mixkv", "h2o"):
        for b in (12, 20, 40):
            specs.append((f"{scorer}-w8", T32, scorer, b, dict(w8)))
    for b in (12, 20, 40):
        specs.append(("ecokv", T32, "ecokv", b, {}))
    for b in (12, 20, 40):
        specs.append(("streamingllm", T32, "streamingllm", b, {}))
    # default windows on gqa3 (T=80, |P|=48 for N=32)
    for scorer, budgets in (("snapkv", (40, 56)), ("knorm", (44,)), ("knorm-only", (44,)), ("vnorm", (44,)),
                            ("keydiff", (44,)), ("manifoldkv", (44,)), ("mixkv", (40, 56)), ("h2o", (44,)),
                            ("ecokv", (12, 24, 48))):
        for b in budgets:
            specs.append((scorer, G3, scorer, b, {}))
    specs.append(("streamingllm", G3, "streamingllm", 24, {}))
    # F16 capture
    for scorer, b, p in (("snapkv-w8", 20, dict(w8)), ("mixkv-w8", 20, dict(w8)), ("h2o-w8", 20, dict(w8)),
                         ("ecokv", 16, {})):
        specs.append((scorer, T16, scorer.replace("-w8", ""), b, p))
    # pooling variants
    specs.append(("snapkv-w8-k3", T32, "snapkv", 20, dict(window=8, kernel=3)))
    specs.append(("snapkv-w8-max", T32, "snapkv", 20, dict(window=8, pool="max")))
    specs.append(("snapkv-w8-k7-max", T32, "snapkv", 20, dict(window=8, kernel=7, pool="max")))
    specs.append(("snapkv-k7-max", G3, "snapkv", 44, dict(kernel=7, pool="max")))
    specs.append(("ecokv-k3", T32, "ecokv", 20, dict(kernel=3)))
    specs.append(("ecokv-max", G3, "ecokv", 20, dict(pool="max")))
    # alpha / beta variations and window override
    for a, bt in ((0.0, 0.6), (1.0, 0.6), (0.5, 0.6), (0.8, 0.0), (0.8, 1.0), (0.3, 0.9)):
        specs.append((f"ecokv-a{a:g}-beta{bt:g}", T32, "ecokv", 20, dict(alpha=a, beta=bt)))
    specs.append(("ecokv-a0.2-beta0.3", G3, "ecokv", 24, dict(alpha=0.2, beta=0.3)))
    specs.append(("ecokv-w8", T32, "ecokv", 24, dict(w8)))
    # method-grammar aliases
    specs.append(("snapkv+ecokv", T32, "snapkv+ecokv", 20, {}))
    specs.append(("uniform+knorm-w8", T32, "uniform+knorm", 20, dict(w8)))
    # allocators
    specs.append(("pyramidkv-w8", T32, "pyramidkv", 20, dict(w8)))
    specs.append(("pyramidkv-w8", T32, "pyramidkv", 40, dict(w8)))  # hi capped at |P|
    specs.append(("pyramidkv+snapkv-w8", T32, "pyramidkv+snapkv", 28, dict(w8)))
    specs.append(("pyramidkv+ecokv", T32, "pyramidkv+ecokv", 16, {}))
    specs.append(("pyramidkv+ecokv", G3, "pyramidkv+ecokv", 24, {}))
    specs.append(("pyramidkv", G3, "pyramidkv", 48, {}))
    specs.append(("adakv-w8", T32, "adakv", 20, dict(w8)))
    specs.append(("adakv+mixkv-w8", T32, "adakv+mixkv", 20, dict(w8)))
    specs.append(("adakv+ecokv", T32, "adakv+ecokv", 16, {}))
    specs.append(("adakv", G3, "adakv", 48, {}))
    specs.append(("adakv+ecokv", G3, "adakv+ecokv", 24, {}))
    specs.append(("sparsemm-w8", T32, "sparsemm", 20, dict(w8, head_scores=HEAD_SCORE_FILES["tiny"])))
    specs.append(("sparsemm+ecokv", T32, "sparsemm+ecokv", 16, dict(head_scores=HEAD_SCORE_FILES["tiny"])))
    specs.append(("sparsemm", G3, "sparsemm", 48, dict(head_scores=HEAD_SCORE_FILES["gqa3"])))
    specs.append(("sparsemm+ecokv", G3, "sparsemm+ecokv", 24, dict(head_scores=HEAD_SCORE_FILES["gqa3"])))
    specs.append(("madakv-w8", T32, "madakv", 20, dict(w8)))
    specs.append(("madakv+ecokv", T32, "madakv+ecokv", 16, {}))
    specs.append(("madakv", G3, "madakv", 48, {}))
    specs.append(("madakv+ecokv", G3, "madakv+ecokv", 24, {}))
    specs.append(("lookm-w8", T32, "lookm", 20, dict(w8)))
    specs.append(("lookm-w8", T32, "lookm", 40, dict(w8)))  # all text kept, image tokens fill the rest
    specs.append(("lookm+snapkv-w8", T32, "lookm+snapkv", 20, dict(w8)))
    specs.append(("lookm-w8-pivot", T32, "lookm", 20, dict(w8, merge="pivot")))
    specs.append(("lookm", G3, "lookm", 44, {}))
    specs.append(("lookm+snapkv-pivot", G3, "lookm+snapkv", 44, dict(merge="pivot")))
    # no compression: budget >= T
    specs.append(("snapkv-w8-full", T32, "snapkv", 56, dict(w8)))
    specs.append(("ecokv-full", T32, "ecokv", 64, {}))
    specs.append(("adakv-full", G3, "adakv", 100, {}))
    specs.append(("lookm-w8-pivot-full", T32, "lookm", 60, dict(w8, merge="pivot")))
    return specs


def run_case(captures, head_scores, capture_name, method, budget, params):
    p = dict(params)
    hs = head_scores[p["head_scores"]] if "head_scores" in p else None
    return ref.compress(captures[capture_name], method, budget, window=p.get("window"),
                        kernel=p.get("kernel", 5), pool_mode=p.get("pool", "avg"), alpha=p.get("alpha", 0.8),
                        beta=p.get("beta", 0.6), head_scores=hs, merge=p.get("merge"))


def check_result(result):
    """List of reasons why the case would not be reproducible by an fp32 implementation (empty: fine)."""
    problems = []
    if result["margin"] is not None and result["margin"] < MIN_CUT_MARGIN:
        problems.append(f"cut margin {result['margin']:.2e}")
    d = result["diagnostics"]
    if d.get("alloc_margin") is not None and d["alloc_margin"] < MIN_CUT_MARGIN:
        problems.append(f"adakv global cut margin {d['alloc_margin']:.2e}")
    if d.get("round_margin", math.inf) < MIN_ROUND_MARGIN:
        problems.append(f"round margin {d['round_margin']:.2e}")
    if d.get("split_margin", math.inf) < MIN_ROUND_MARGIN:
        problems.append(f"madakv split margin {d['split_margin']:.2e}")
    if d.get("coverage_margin", math.inf) < MIN_COVERAGE_MARGIN:
        problems.append(f"madakv coverage margin {d['coverage_margin']:.2e}")
    if d.get("rational_on_half"):
        problems.append("madakv budget on an exact half")
    if d.get("pivot_margin", math.inf) < MIN_PIVOT_MARGIN:
        problems.append(f"pivot margin {d['pivot_margin']:.2e}")
    return problems


def finite_or_none(x):
    return None if x is None or (isinstance(x, float) and math.isinf(x)) else x


def build_case(captures, head_scores, stem, capture_name, method, budget, params):
    tried = []
    for delta in (0, 1, -1, 2, -2):
        b = budget + delta
        result = run_case(captures, head_scores, capture_name, method, b, params)
        problems = check_result(result)
        if not problems:
            break
        tried.append(f"b{b}: {'; '.join(problems)}")
    else:
        raise SystemExit(f"case {stem} b{budget}: no budget within +-2 passes the checks ({' | '.join(tried)})")
    cap = captures[capture_name]
    full, kept = ref.kv_bytes(cap, result["heads"])
    expected = {
        "window": result["window"],
        "n_tokens": cap.n_tokens,
        "budgets": result["budgets"],
        "heads": result["heads"],
    }
    if result["scores"] is not None:
        expected["scores"] = result["scores"]
    expected["margin"] = result["margin"]
    d = result["diagnostics"]
    for key in ("alloc_margin", "round_margin", "split_margin", "coverage_margin", "pivot_margin"):
        if key in d:
            expected[key] = finite_or_none(d[key])
    if "demands" in d:
        expected["demands"] = d["demands"]
    if "splits" in d:
        expected["splits"] = d["splits"]
    if "merged_keys" in result:
        expected["merged_keys"] = result["merged_keys"]
        expected["merged_values"] = result["merged_values"]
    expected["kv_bytes_full"] = full
    expected["kv_bytes_kept"] = kept
    out_params = {"budget": b}
    for key in ("window", "kernel", "pool", "alpha", "beta", "head_scores", "merge"):
        if key in params:
            out_params[key] = params[key]
    name = f"{stem}-{capture_name.split('.')[0]}-b{b}"
    case = {"name": name, "capture": capture_name, "method": method, "params": out_params, "expected": expected}
    note = f" (moved from b{budget}: {' | '.join(tried)})" if tried else ""
    return case, note


def format_cases(cases):
    return "[\n" + ",\n".join(json.dumps(c, separators=(",", ":")) for c in cases) + "\n]\n"


# ---------------------------------------------------------------------------------------------------------------
# Self-check by brute force
# ---------------------------------------------------------------------------------------------------------------


def self_check(captures):
    cap = captures[G3]
    # rC = mean pairwise cosine of distinct keys
    for il, g in itertools.product(range(cap.n_layers), range(cap.n_kv_heads)):
        k = cap.keys[il][g]
        T = len(k)
        brute = np.mean([k[i] @ k[j] / (np.linalg.norm(k[i]) * np.linalg.norm(k[j]))
                         for i in range(T) for j in range(T) if i != j])
        assert abs(brute - ref.cosine_redundancy(k)) < 1e-12, (brute, ref.cosine_redundancy(k))
    # PyramidKV, B=128, N=8, L=32, T large
    c = ref.pyramidkv_layer_budgets(128 - 8, 8, 100000, 32)
    assert c[0] == 234 and c[31] == 17, (c[0], c[31])
    assert ref.pyramidkv_layer_budgets(10, 4, 1000, 1) == [10]
    # window attention by explicit loops
    il, N = 1, 8
    a0 = ref.window_attention_a0(cap.keys[il], cap.queries[il], N, cap.group_size)
    T, D = cap.n_tokens, cap.head_dim
    for g in range(cap.n_kv_heads):
        acc = np.zeros(T - N)
        for h in range(g * cap.group_size, (g + 1) * cap.group_size):
            for r in range(N):
                i = T - N + r
                q = cap.queries[il][h, cap.n_queries - N + r]
                logits = np.array([q @ cap.keys[il][g, j] / math.sqrt(D) for j in range(i + 1)])
                p = np.exp(logits - logits.max())
                p /= p.sum()
                acc += p[:T - N] / (N * cap.group_size)
        assert np.allclose(acc, a0[g], rtol=1e-12, atol=1e-15)
    # pooling by explicit definition
    x = np.arange(1.0, 8.0)
    assert np.allclose(ref.pool(x, 5, "avg"), [(1 + 2 + 3) / 5, (1 + 2 + 3 + 4) / 5, 3, 4, 5, (4 + 5 + 6 + 7) / 5,
                                               (5 + 6 + 7) / 5])
    assert np.allclose(ref.pool(np.array([3.0, 1, 0, 2, 0]), 3, "max"), [3, 3, 2, 2, 2])
    # h2o against the query rows of the window: full_queries' last Nq rows are the queries
    assert np.array_equal(cap.full_queries[0][:, -cap.n_queries:], cap.queries[0])
    # exact rational rounding
    assert [ref.rint_rational(n, 2) for n in (1, 3, 5, -1)] == [0, 2, 2, 0]
    assert ref.rint_rational(7, 3) == 2 and ref.rint_rational(8, 3) == 3
    # method grammar
    assert ref.parse_method("snapkv+ecokv") == ("uniform", "ecokv")
    assert ref.parse_method("lookm") == ("lookm", "h2o")
    assert ref.parse_method("keydiff") == ("uniform", "keydiff")
    for bad in ("snapk", "pyramidkv+streamingllm", "ecokv+snapkv"):
        try:
            ref.parse_method(bad)
        except ValueError:
            pass
        else:
            raise AssertionError(bad)
    # safetensors round trip: header padded to 8 bytes, metadata kept, data bit-exact
    path = os.path.join(tempfile.mkdtemp(prefix="ecokv-st-"), "t.safetensors")
    t = {"b": np.arange(6, dtype=np.float16).reshape(2, 3), "a": np.array([1.5, -2.0], dtype=np.float32),
         "m": np.array([0, 1, 2], dtype=np.uint8)}
    ref.write_safetensors(path, t, {"n_layers": 1})
    with open(path, "rb") as f:
        assert int.from_bytes(f.read(8), "little") % 8 == 0
    back, meta = ref.read_safetensors(path)
    assert meta == {"n_layers": "1"} and all(np.array_equal(back[k], t[k]) and back[k].dtype == t[k].dtype
                                              for k in t)
    # h2o by explicit loops (one layer, one KV head)
    il, g = 0, 1
    s = ref.accumulated_attention(cap.keys[il], cap.full_queries[il], 32, cap.group_size)[g]
    brute = np.zeros(T - 32)
    for h in range(g * cap.group_size, (g + 1) * cap.group_size):
        for i in range(T):
            logits = cap.full_queries[il][h, i] @ cap.keys[il][g, :i + 1].T / math.sqrt(D)
            p = np.exp(logits - logits.max())
            p /= p.sum()
            brute[:min(i + 1, T - 32)] += p[:T - 32] / cap.group_size
    assert np.allclose(brute, s, rtol=1e-12, atol=1e-14)
    # AdaKV: the winners of all heads add up to Hkv * C
    ctx = ref.LayerContext(cap, 0, 32, 5, "avg")
    budgets, _ = ref.adakv_head_budgets(ctx.a, 12)
    assert abs(sum(budgets) - cap.n_kv_heads * 12) <= cap.n_kv_heads
    # pivot merge on a toy head: token 2 is evicted into token 0 (cosine 0.995 vs 0.0995)
    k = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1]])
    v = np.array([[1.0], [2.0], [5.0]])
    nk, nv, _ = ref.pivot_merge(k, v, [0, 1], 3)
    assert np.allclose(nk, [[(1 + 1.0) / 2, (0 + 0.05) / 2], [0, 1]]) and np.allclose(nv, [[(1 + 3) / 2], [2]])
    # budget <= window is an error
    try:
        ref.compress(cap, "snapkv", 32)
    except ValueError:
        pass
    else:
        raise AssertionError("budget == window accepted")
    print("self-check: ok")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--self-check-only", action="store_true")
    args = parser.parse_args()
    if args.self_check_only and args.out == DEFAULT_OUT:
        args.out = tempfile.mkdtemp(prefix="ecokv-golden-")  # leave tests/data/golden alone
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(SEED)
    write_captures(args.out, rng)
    write_head_scores(args.out, rng)
    captures = {name: ref.load_capture(os.path.join(args.out, name)) for name, _, _ in CAPTURES}
    head_scores = {f: ref.load_head_scores(os.path.join(args.out, f)) for f in HEAD_SCORE_FILES.values()}
    self_check(captures)
    if args.self_check_only:
        return
    cases = []
    for stem, capture_name, method, budget, params in case_specs():
        case, note = build_case(captures, head_scores, stem, capture_name, method, budget, params)
        if any(c["name"] == case["name"] for c in cases):
            raise SystemExit(f"duplicate case name {case['name']}")
        cases.append(case)
        e = case["expected"]
        m = "-" if e["margin"] is None else f"{e['margin']:.2e}"
        budgets = sorted({c for row in e["budgets"] for c in row})
        print(f"{case['name']:40s} {method:18s} B={case['params']['budget']:<3d} N={e['window']:<2d} "
              f"C={budgets} margin={m}{note}")
    with open(os.path.join(args.out, "cases.json"), "w") as f:
        f.write(format_cases(cases))
    print(f"{len(cases)} cases written to {os.path.join(args.out, 'cases.json')}")


if __name__ == "__main__":
    main()
