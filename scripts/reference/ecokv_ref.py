"""Independent fp64 reference implementation of the ecokv method specification (SPEC.md §1-§7).

Written from SPEC.md only, to produce golden data for the C++ library. Plain numpy, one function per
formula, float64 throughout. Entry point: `compress(capture, method, budget, ...)`.

Readings of points the SPEC leaves open are marked "READING:" in the code and listed in README.md.
"""

import json
import math
import struct

import numpy as np

# ---------------------------------------------------------------------------------------------------------------
# Safetensors (SPEC §7): 8-byte little-endian header length, JSON header, raw little-endian data.
# ---------------------------------------------------------------------------------------------------------------

SAFETENSORS_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "U8": np.dtype("u1")}


def _dtype_name(array):
    for name, dtype in SAFETENSORS_DTYPES.items():
        if array.dtype == dtype:
            return name
    raise ValueError(f"unsupported dtype {array.dtype} (supported: F32, F16, U8)")


def write_safetensors(path, tensors, metadata=None):
    """Write `tensors` (name -> numpy array of dtype <f4, <f2 or u1) in sorted name order.

    The header is padded with spaces to a multiple of 8 bytes; `metadata` is a str -> str map."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        dtype = _dtype_name(array)
        data = array.astype(SAFETENSORS_DTYPES[dtype], copy=False).tobytes(order="C")
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


def read_safetensors(path):
    """Return (tensors: name -> numpy array in the file's dtype, metadata: dict)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: file too short for a safetensors header")
    (n_header,) = struct.unpack("<Q", raw[:8])
    if 8 + n_header > len(raw):
        raise ValueError(f"{path}: header length {n_header} exceeds the file")
    header = json.loads(raw[8:8 + n_header].decode("utf-8"))
    data = raw[8 + n_header:]
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        dtype = info["dtype"]
        if dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: tensor '{name}' has unsupported dtype {dtype}")
        begin, end = info["data_offsets"]
        shape = tuple(int(s) for s in info["shape"])
        nbytes = int(np.prod(shape, dtype=np.int64)) * SAFETENSORS_DTYPES[dtype].itemsize
        if not (0 <= begin <= end <= len(data)) or end - begin != nbytes:
            raise ValueError(f"{path}: tensor '{name}' has bad data_offsets {info['data_offsets']}")
        tensors[name] = np.frombuffer(data[begin:end], dtype=SAFETENSORS_DTYPES[dtype]).reshape(shape)
    return tensors, metadata


class Capture:
    """A capture file (SPEC §7) with every float tensor converted to float64."""

    def __init__(self, tensors, metadata, name=""):
        self.name = name
        self.metadata = dict(metadata)
        self.n_layers = int(metadata["n_layers"])
        self.n_heads = int(metadata["n_heads"])
        self.n_kv_heads = int(metadata["n_kv_heads"])
        self.head_dim = int(metadata["head_dim"])
        self.n_tokens = int(metadata["n_tokens"])
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError("n_heads must be a multiple of n_kv_heads")
        self.keys, self.values, self.queries, self.full_queries = [], [], [], []
        self.key_dtype = tensors["layers.0.keys"].dtype.name
        for il in range(self.n_layers):
            k = tensors[f"layers.{il}.keys"]
            v = tensors[f"layers.{il}.values"]
            q = tensors[f"layers.{il}.queries"]
            if k.shape != (self.n_kv_heads, self.n_tokens, self.head_dim):
                raise ValueError(f"layers.{il}.keys has shape {k.shape}")
            if v.shape[:2] != (self.n_kv_heads, self.n_tokens):
                raise ValueError(f"layers.{il}.values has shape {v.shape}")
            if q.shape[0] != self.n_heads or q.shape[2] != self.head_dim:
                raise ValueError(f"layers.{il}.queries has shape {q.shape}")
            self.keys.append(k.astype(np.float64))
            self.values.append(v.astype(np.float64))
            self.queries.append(q.astype(np.float64))
            fq = tensors.get(f"layers.{il}.full_queries")
            self.full_queries.append(None if fq is None else fq.astype(np.float64))
        self.value_dim = self.values[0].shape[2]
        self.n_queries = self.queries[0].shape[1]
        self.key_itemsize = tensors["layers.0.keys"].dtype.itemsize
        self.value_itemsize = tensors["layers.0.values"].dtype.itemsize
        mod = tensors.get("modality")
        self.modality = None if mod is None else mod.astype(np.int64)

    @property
    def group_size(self):
        return self.n_heads // self.n_kv_heads


def load_capture(path):
    tensors, metadata = read_safetensors(path)
    return Capture(tensors, metadata, name=str(path))


# ---------------------------------------------------------------------------------------------------------------
# Shared primitives (SPEC §1)
# ---------------------------------------------------------------------------------------------------------------

EPS = 1e-8


def minmax(x, eps=EPS):
    """(x - min x) / (max x - min x + eps)."""
    return (x - x.min()) / (x.max() - x.min() + eps)


def minmax0(x):
    """Min-max without eps; a constant vector maps to all zeros (SPEC §3.2)."""
    span = x.max() - x.min()
    if span == 0:
        return np.zeros_like(x)
    return (x - x.min()) / span


def rescale(x, a):
    """x * mean(a) / (mean(x) + 1e-8): gives x the mean of a."""
    return x * a.mean() / (x.mean() + EPS)


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def round_half_even(x):
    """`round`/`rint` of SPEC §1 (half to even), for a float."""
    return int(np.rint(x))


def rint_rational(num, den):
    """Round the exact rational num/den (integers, den > 0) half to even."""
    q, r = divmod(num, den)
    if 2 * r > den or (2 * r == den and q % 2 == 1):
        q += 1
    return q


def softmax_rows(logits):
    """Row softmax; -inf entries get probability 0."""
    m = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - m)
    return e / e.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------------------------------------
# §3.1 Window attention
# ---------------------------------------------------------------------------------------------------------------


def window_attention_probs(k, q_window, n_tokens):
    """A[i][j] for the N window queries (rows) of one query head over all T keys, causal inside the window.

    k: [T, D]; q_window: [N, D] (queries of positions T-N .. T-1)."""
    n_window, d = q_window.shape
    logits = q_window @ k.T / math.sqrt(d)  # [N][T]
    for r in range(n_window):
        i = n_tokens - n_window + r
        logits[r, i + 1:] = -np.inf
    return softmax_rows(logits)


def window_attention_a0(keys_l, queries_l, n_window, group_size):
    """a0[g][j], j in P: mean over the window queries, then mean over the group's query heads. [Hkv][|P|]."""
    n_kv_heads, n_tokens, _ = keys_l.shape
    if n_window > queries_l.shape[1]:
        raise ValueError(f"window {n_window} needs more queries than the capture's {queries_l.shape[1]}")
    n_prefix = n_tokens - n_window
    a0 = np.zeros((n_kv_heads, n_prefix))
    for g in range(n_kv_heads):
        per_head = []
        for h in range(g * group_size, (g + 1) * group_size):
            q_window = queries_l[h, queries_l.shape[1] - n_window:, :]
            A = window_attention_probs(keys_l[g], q_window, n_tokens)
            per_head.append(A[:, :n_prefix].mean(axis=0))
        a0[g] = np.mean(per_head, axis=0)
    return a0


def pool_avg(a0, kernel):
    """avg_pool1d over P, stride 1, zero padding counted in the divisor (count_include_pad=True)."""
    half = kernel // 2
    padded = np.concatenate([np.zeros(half), a0, np.zeros(half)])
    return np.array([padded[j:j + kernel].sum() / kernel for j in range(len(a0))])


def pool_max(a0, kernel):
    """max_pool1d over P, stride 1: max over the in-range neighbours."""
    half = kernel // 2
    n = len(a0)
    return np.array([a0[max(0, j - half):min(n, j + half + 1)].max() for j in range(n)])


def pool(a0, kernel, mode):
    if kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"kernel {kernel} must be odd and positive")
    if len(a0) == 0:
        return a0.copy()
    if mode == "avg":
        return pool_avg(a0, kernel)
    if mode == "max":
        return pool_max(a0, kernel)
    raise ValueError(f"unknown pool '{mode}'; known: avg, max")


# ---------------------------------------------------------------------------------------------------------------
# §3.2, §3.3 Value norm and key norm
# ---------------------------------------------------------------------------------------------------------------


def value_norm_score(v_prefix, a):
    """sV = rescale(minmax0(||v||), a)."""
    return rescale(minmax0(np.linalg.norm(v_prefix, axis=1)), a)


def key_norm_score(k_prefix, a):
    """sK = rescale(minmax0(-||k||), a)."""
    return rescale(minmax0(-np.linalg.norm(k_prefix, axis=1)), a)


# ---------------------------------------------------------------------------------------------------------------
# §3.4 Accumulated attention (H2O)
# ---------------------------------------------------------------------------------------------------------------


def full_causal_attention(k, q_full):
    """A_full[i][j] for one query head, full causal T x T."""
    n_tokens, d = q_full.shape
    logits = q_full @ k.T / math.sqrt(d)
    logits[np.triu_indices(n_tokens, k=1)] = -np.inf
    return softmax_rows(logits)


def accumulated_attention(keys_l, full_queries_l, n_window, group_size):
    """s[g][j] = mean_{h in g} sum_i A_full[h][i][j], j in P. [Hkv][|P|]."""
    if full_queries_l is None:
        raise ValueError("h2o needs layers.{l}.full_queries in the capture")
    n_kv_heads, n_tokens, _ = keys_l.shape
    n_prefix = n_tokens - n_window
    s = np.zeros((n_kv_heads, n_prefix))
    for g in range(n_kv_heads):
        per_head = [full_causal_attention(keys_l[g], full_queries_l[h]).sum(axis=0)[:n_prefix]
                    for h in range(g * group_size, (g + 1) * group_size)]
        s[g] = np.mean(per_head, axis=0)
    return s


# ---------------------------------------------------------------------------------------------------------------
# §4 Diversity and redundancy (one KV head; k: [T, D], all tokens including the window)
# ---------------------------------------------------------------------------------------------------------------


def unit_keys(k):
    """kh[j] = k[j] / max(||k[j]||, 1e-12)."""
    return k / np.maximum(np.linalg.norm(k, axis=1), 1e-12)[:, None]


def mean_unit_key(k):
    """mu = (1/T) sum_j kh[j] (not re-normalised)."""
    return unit_keys(k).mean(axis=0)


def cosine_to_mean(k):
    """c[j] = kh[j] . mu for every token j in [0, T)."""
    return unit_keys(k) @ mean_unit_key(k)


def cosine_redundancy(k):
    """rC = (T ||mu||^2 - 1) / (T - 1)."""
    n_tokens = k.shape[0]
    mu = mean_unit_key(k)
    return (n_tokens * float(mu @ mu) - 1.0) / (n_tokens - 1)


def euclidean_distance(k):
    """dE[j] = ||k[j] - kbar||, kbar = mean key over all T tokens."""
    return np.linalg.norm(k - k.mean(axis=0), axis=1)


def euclidean_spread(k):
    """DE = (1/T) sum_j ||k[j] - kbar||."""
    return float(euclidean_distance(k).mean())


def euclidean_redundancy(k):
    """rE = 2 - 2 sigmoid(DE / tau), tau = sqrt(D)."""
    return 2.0 - 2.0 * sigmoid(euclidean_spread(k) / math.sqrt(k.shape[1]))


def mixkv_diversity(k, n_prefix, a):
    """sCmix = rescale(minmax(-c), a) over P."""
    return rescale(minmax(-cosine_to_mean(k)[:n_prefix]), a)


# ---------------------------------------------------------------------------------------------------------------
# §5 Scorers. Each returns S[g][j] over P for one layer.
# ---------------------------------------------------------------------------------------------------------------

SCORER_DEFAULT_WINDOW = {
    "snapkv": 32, "knorm": 32, "knorm-only": 32, "vnorm": 32, "keydiff": 32, "manifoldkv": 32,
    "mixkv": 32, "ecokv": 4, "h2o": 32, "streamingllm": None,
}
SCORERS_USING_ATTENTION = {"snapkv", "knorm", "vnorm", "mixkv", "ecokv"}
ALLOCATOR_DEFAULT_SCORER = {
    "uniform": "snapkv", "pyramidkv": "snapkv", "adakv": "snapkv", "sparsemm": "snapkv",
    "madakv": "snapkv", "lookm": "h2o",
}
N_SINK = 4


class LayerContext:
    """What the scorers of one layer see; `a` (pooled window attention) is computed lazily."""

    def __init__(self, capture, il, n_window, kernel, pool_mode):
        self.capture = capture
        self.il = il
        self.n_window = n_window
        self.kernel = kernel
        self.pool_mode = pool_mode
        self.n_prefix = capture.n_tokens - n_window
        self._a0 = None
        self._a = None

    @property
    def a0(self):
        if self._a0 is None:
            c = self.capture
            self._a0 = window_attention_a0(c.keys[self.il], c.queries[self.il], self.n_window, c.group_size)
        return self._a0

    @property
    def a(self):
        if self._a is None:
            self._a = np.array([pool(row, self.kernel, self.pool_mode) for row in self.a0])
        return self._a

    def k(self, g):
        return self.capture.keys[self.il][g]

    def v(self, g):
        return self.capture.values[self.il][g]


def score_snapkv(ctx, g, params):
    return ctx.a[g]


def score_knorm(ctx, g, params):
    return ctx.a[g] + key_norm_score(ctx.k(g)[:ctx.n_prefix], ctx.a[g])


def score_knorm_only(ctx, g, params):
    return -np.linalg.norm(ctx.k(g)[:ctx.n_prefix], axis=1)


def importance(ctx, g):
    """Simp = a + sV."""
    return ctx.a[g] + value_norm_score(ctx.v(g)[:ctx.n_prefix], ctx.a[g])


def score_vnorm(ctx, g, params):
    return importance(ctx, g)


def score_keydiff(ctx, g, params):
    return -cosine_to_mean(ctx.k(g))[:ctx.n_prefix]


def score_manifoldkv(ctx, g, params):
    return euclidean_distance(ctx.k(g))[:ctx.n_prefix]


def score_mixkv(ctx, g, params):
    k = ctx.k(g)
    r_c = cosine_redundancy(k)
    return r_c * mixkv_diversity(k, ctx.n_prefix, ctx.a[g]) + (1.0 - r_c) * importance(ctx, g)


def score_ecokv(ctx, g, params):
    """SPEC §5.1."""
    alpha, beta = params["alpha"], params["beta"]
    k = ctx.k(g)
    n_prefix = ctx.n_prefix
    s_imp = importance(ctx, g)
    s_c = (1.0 - cosine_to_mean(k)[:n_prefix]) / 2.0
    s_e = minmax(euclidean_distance(k)[:n_prefix])
    s_div = alpha * s_e + (1.0 - alpha) * s_c
    lam = beta * euclidean_redundancy(k) + (1.0 - beta) * cosine_redundancy(k)
    s_div_scaled = rescale(minmax(s_div), s_imp)
    return lam * s_div_scaled + (1.0 - lam) * s_imp


def score_h2o(ctx, g, params):
    if not hasattr(ctx, "_h2o"):
        c = ctx.capture
        ctx._h2o = accumulated_attention(c.keys[ctx.il], c.full_queries[ctx.il], ctx.n_window, c.group_size)
    return ctx._h2o[g]


SCORERS = {
    "snapkv": score_snapkv, "knorm": score_knorm, "knorm-only": score_knorm_only, "vnorm": score_vnorm,
    "keydiff": score_keydiff, "manifoldkv": score_manifoldkv, "mixkv": score_mixkv, "ecokv": score_ecokv,
    "h2o": score_h2o,
}


# ---------------------------------------------------------------------------------------------------------------
# §6 Method grammar
# ---------------------------------------------------------------------------------------------------------------


def parse_method(method):
    """Return (allocator, scorer) for `ALLOCATOR+SCORER`, a bare scorer or a bare allocator."""
    known_scorers = set(SCORER_DEFAULT_WINDOW)
    known = sorted(known_scorers | set(ALLOCATOR_DEFAULT_SCORER))
    if "+" in method:
        allocator, scorer = method.split("+", 1)
        if allocator == "snapkv":
            allocator = "uniform"
        if allocator not in ALLOCATOR_DEFAULT_SCORER or scorer not in known_scorers:
            raise ValueError(f"unknown method '{method}'; known: {', '.join(known)}")
    elif method in known_scorers:
        allocator, scorer = "uniform", method
    elif method in ALLOCATOR_DEFAULT_SCORER:
        allocator, scorer = method, ALLOCATOR_DEFAULT_SCORER[method]
    else:
        raise ValueError(f"unknown method '{method}'; known: {', '.join(known)}")
    if scorer == "streamingllm" and allocator != "uniform":
        raise ValueError("streamingllm is a position rule and takes no allocator")
    return allocator, scorer


# ---------------------------------------------------------------------------------------------------------------
# §6 Allocators. Each returns C[l][g] (selectable prefix budgets) and a dict of diagnostics.
# ---------------------------------------------------------------------------------------------------------------


def allocate_uniform(C, n_layers, n_kv_heads):
    return np.full((n_layers, n_kv_heads), C, dtype=np.int64)


def pyramidkv_layer_budgets(C, n_window, n_tokens, n_layers, beta_p=20):
    """PyramidKV with integer arithmetic (all quantities are non-negative, so // is the C++ `/`)."""
    if n_layers == 1:
        return [C]
    lo = C // beta_p
    hi = 2 * C - lo
    if hi >= n_tokens - n_window:
        hi = n_tokens - n_window
        lo = 2 * C - hi
    step = (hi - lo) // (n_layers - 1)
    return [hi - il * step for il in range(n_layers)]


def adakv_head_budgets(a_layer, C, floor_ratio=0.2, normalize=True):
    """AdaKV for one layer from the pooled attention a[g][j]. Returns (C_g list, cut margin)."""
    n_kv_heads, n_prefix = a_layer.shape
    entries = []  # (-score, head, sorted position)
    for g in range(n_kv_heads):
        s = np.sort(a_layer[g])[::-1]
        if normalize:
            s = s * (s[:C].sum() / a_layer[g].sum())
        entries.extend((-float(s[p]), g, p) for p in range(n_prefix))
    entries.sort()
    n_win = n_kv_heads * C
    counts = [0] * n_kv_heads
    for _, g, _ in entries[:n_win]:
        counts[g] += 1
    floor_part = math.floor(C * floor_ratio)
    budgets = [round_half_even(cnt * (1.0 - floor_ratio) + floor_part) for cnt in counts]
    values = -np.array([e[0] for e in entries])
    margin = None
    if 0 < n_win < len(entries):
        span = values.max() - values.min()
        margin = float((values[n_win - 1] - values[n_win]) / span) if span > 0 else 0.0
    return budgets, margin


def load_head_scores(path):
    with open(path) as f:
        return json.load(f)


def sparsemm_budgets(head_scores, C, n_layers, n_heads, n_kv_heads, rho=0.1):
    """SparseMM static budgets. Returns (C[l][g], round margin = min distance of the argument from .5)."""
    s = np.zeros((n_layers, n_heads))
    for il in range(n_layers):
        for h in range(n_heads):
            key = f"{il}-{h}"
            if key not in head_scores or len(head_scores[key]) == 0:
                raise ValueError(f"head-score file lacks entry '{key}'")
            s[il, h] = float(np.mean(head_scores[key]))
    s_hat = s / s.sum()
    group_size = n_heads // n_kv_heads
    m = math.floor(C * rho)
    budgets = np.zeros((n_layers, n_kv_heads), dtype=np.int64)
    round_margin = math.inf
    for il in range(n_layers):
        for g in range(n_kv_heads):
            S = s_hat[il, g * group_size:(g + 1) * group_size].sum()
            x = S * (C - m) * n_layers * n_kv_heads + m
            budgets[il, g] = round_half_even(x)
            round_margin = min(round_margin, abs((x - math.floor(x)) - 0.5))
    return budgets, round_margin


def modality_weights(psi, is_image):
    """(w_img, w_txt) = sums of psi over the image / text tokens of P."""
    return float(psi[is_image].sum()), float(psi[~is_image].sum())


def covering_count(values, target):
    """Fewest top values whose running sum reaches target; also the relative margin of that crossing."""
    if target <= 0:
        return 0, math.inf
    s = np.sort(values)[::-1]
    running = np.cumsum(s)
    idx = int(np.searchsorted(running >= target, True))  # first index with running >= target
    if idx >= len(running):  # cannot happen for theta < 1; keep the guard explicit
        return len(running), 0.0
    before = running[idx - 1] if idx > 0 else 0.0
    margin = min(target - before, running[idx] - target)
    return idx + 1, margin


def madakv_demand(psi, is_image, theta=0.9):
    """d = top-psi image tokens covering theta*w_img + top-psi text tokens covering theta*w_txt."""
    w_img, w_txt = modality_weights(psi, is_image)
    d_img, m_img = covering_count(psi[is_image], theta * w_img)
    d_txt, m_txt = covering_count(psi[~is_image], theta * w_txt)
    rel = min(m_img / w_img if w_img > 0 else math.inf, m_txt / w_txt if w_txt > 0 else math.inf)
    return d_img + d_txt, rel


def madakv_budgets(demands, C, n_prefix, rho=0.2):
    """Closed-form compensation. demands: int [L][Hkv]. Returns (C[l][g], exact-half hit flag)."""
    n_layers, n_kv_heads = demands.shape
    m = math.floor(rho * C)
    pool_size = n_layers * n_kv_heads * (C - m)
    total = int(demands.sum())
    budgets = np.full((n_layers, n_kv_heads), m, dtype=np.int64)
    on_half = False
    if total > 0:
        for il in range(n_layers):
            for g in range(n_kv_heads):
                num = pool_size * int(demands[il, g])
                if (2 * num) % (2 * total) == total:
                    on_half = True
                budgets[il, g] = m + rint_rational(num, total)
    return np.minimum(budgets, n_prefix), on_half


def madakv_split(b, w_img, w_txt, n_img, n_txt):
    """Split a head budget b into (b_img, b_txt) with overflow; also the distance of the rint argument from .5."""
    if w_img + w_txt == 0:
        b_img, margin = 0, math.inf
    else:
        x = b * w_img / (w_img + w_txt)
        b_img = round_half_even(x)
        margin = abs((x - math.floor(x)) - 0.5)
    b_txt = b - b_img
    if b_img > n_img:
        b_txt += b_img - n_img
        b_img = n_img
    if b_txt > n_txt:
        b_img += b_txt - n_txt
        b_txt = n_txt
    return b_img, b_txt, margin


# ---------------------------------------------------------------------------------------------------------------
# §2 Selection
# ---------------------------------------------------------------------------------------------------------------


def top_indices(S, candidates, count):
    """The `count` candidates with the highest S; ties to the lower token index."""
    candidates = np.asarray(candidates, dtype=np.int64)
    order = np.lexsort((candidates, -S[candidates]))
    return candidates[order[:count]]


def cut_margin(S, candidates, count):
    """(S of the count-th best - S of the next best) / (max S - min S over P); None when there is no cut.

    An exact tie across the cut (identical values, e.g. copies made by max pooling) is resolved by the token
    index and is reproducible; the margin is then the distance from the tied value to the nearest distinct
    values above and below it."""
    candidates = np.asarray(candidates, dtype=np.int64)
    if count <= 0 or count >= len(candidates):
        return None
    s = np.sort(S[candidates])[::-1]
    span = S.max() - S.min()
    if span <= 0:
        return 0.0
    v_in, v_out = s[count - 1], s[count]
    if v_in != v_out:
        return float((v_in - v_out) / span)
    above, below = s[s > v_in], s[s < v_in]
    gaps = ([above.min() - v_in] if len(above) else []) + ([v_in - below.max()] if len(below) else [])
    return float(min(gaps) / span) if gaps else 1.0


# ---------------------------------------------------------------------------------------------------------------
# LOOK-M pivot merge
# ---------------------------------------------------------------------------------------------------------------


def pivot_merge(k, v, kept, n_tokens):
    """Average each evicted token into its most cosine-similar kept key (ties to the lower index).

    Returns (merged K rows, merged V rows) for the kept tokens in ascending order, and the smallest gap between
    the best and the second-best cosine over the evicted tokens."""
    kept = np.asarray(kept, dtype=np.int64)
    evicted = np.setdiff1d(np.arange(n_tokens), kept)
    kh = unit_keys(k)
    sums_k = np.zeros((len(kept), k.shape[1]))
    sums_v = np.zeros((len(kept), v.shape[1]))
    counts = np.zeros(len(kept))
    gap = math.inf
    for e in evicted:
        cos = kh[kept] @ kh[e]
        p = int(np.argmax(cos))  # first maximum = lower kept index (kept is ascending)
        if len(kept) > 1:
            top2 = np.sort(cos)[::-1][:2]
            gap = min(gap, float(top2[0] - top2[1]))
        sums_k[p] += (k[e] + k[kept[p]]) / 2.0
        sums_v[p] += (v[e] + v[kept[p]]) / 2.0
        counts[p] += 1
    new_k = (k[kept] + sums_k) / (1.0 + counts)[:, None]
    new_v = (v[kept] + sums_v) / (1.0 + counts)[:, None]
    return new_k, new_v, gap


# ---------------------------------------------------------------------------------------------------------------
# Top level
# ---------------------------------------------------------------------------------------------------------------


def resolve_window(scorer, window):
    return SCORER_DEFAULT_WINDOW[scorer] if window is None else int(window)


def compress_streamingllm(capture, budget):
    """READING: window N = B - 4 (the recent part), selectable C = 4 sinks; kept = [0, 4) + last B - 4."""
    if budget <= N_SINK:
        raise ValueError(f"--budget {budget} must be larger than the {N_SINK} sink tokens for streamingllm")
    T = capture.n_tokens
    n_window = budget - N_SINK
    n_prefix = max(T - n_window, 0)
    if T <= budget:
        heads = [list(range(T))] * capture.n_kv_heads
        c = n_prefix
    else:
        heads = [list(range(N_SINK)) + list(range(T - n_window, T))] * capture.n_kv_heads
        c = N_SINK
    return {
        "window": n_window,
        "budgets": [[c] * capture.n_kv_heads for _ in range(capture.n_layers)],
        "heads": [[list(h) for h in heads] for _ in range(capture.n_layers)],
        "scores": None,
        "margin": None,
        "diagnostics": {},
    }


def compress(capture, method, budget, window=None, kernel=5, pool_mode="avg", alpha=0.8, beta=0.6,
             head_scores=None, merge=None, floor_ratio=0.2, sparsemm_rho=0.1, theta=0.9, madakv_rho=0.2):
    """Apply `method` to every layer of `capture`.

    Returns a dict: window, budgets [L][Hkv] (prefix tokens kept), heads [L][Hkv][kept ascending],
    scores [L][Hkv][|P|] (None for streamingllm), margin (smallest relative top-C cut gap, None if no cut),
    merged_keys / merged_values (merge only), diagnostics (allocator checks)."""
    allocator, scorer = parse_method(method)
    budget = int(budget)
    if scorer == "streamingllm":
        return compress_streamingllm(capture, budget)
    n_window = resolve_window(scorer, window)
    if n_window < 1:
        raise ValueError(f"--window {n_window} must be positive")
    if budget <= n_window:
        raise ValueError(f"--budget {budget} must be larger than --window {n_window}")
    if merge not in (None, "pivot"):
        raise ValueError(f"unknown merge '{merge}'; known: pivot")
    params = {"alpha": float(alpha), "beta": float(beta)}
    L, Hkv, T = capture.n_layers, capture.n_kv_heads, capture.n_tokens
    n_prefix = max(T - n_window, 0)
    is_image = None
    if allocator in ("madakv", "lookm"):
        if capture.modality is None:
            raise ValueError(f"{allocator} needs the modality tensor in the capture")
        is_image = capture.modality[:n_prefix] != 0  # audio counts as non-text

    contexts = [LayerContext(capture, il, n_window, kernel, pool_mode) for il in range(L)]
    scores = np.zeros((L, Hkv, n_prefix))
    if n_prefix > 0:
        for il in range(L):
            for g in range(Hkv):
                scores[il, g] = SCORERS[scorer](contexts[il], g, params)

    diagnostics = {}
    C = budget - n_window
    if T <= budget:
        budgets = np.full((L, Hkv), n_prefix, dtype=np.int64)
    else:
        if allocator in ("uniform", "lookm"):
            budgets = allocate_uniform(C, L, Hkv)
        elif allocator == "pyramidkv":
            per_layer = pyramidkv_layer_budgets(C, n_window, T, L)
            budgets = np.array([[c] * Hkv for c in per_layer], dtype=np.int64)
        elif allocator == "adakv":
            rows, margins = [], []
            for il in range(L):
                b, mg = adakv_head_budgets(contexts[il].a, C, floor_ratio)
                rows.append(b)
                if mg is not None:
                    margins.append(mg)
            budgets = np.array(rows, dtype=np.int64)
            diagnostics["alloc_margin"] = min(margins) if margins else None
        elif allocator == "sparsemm":
            if head_scores is None:
                raise ValueError("sparsemm needs a head-score file (--head-scores)")
            budgets, rm = sparsemm_budgets(head_scores, C, L, capture.n_heads, Hkv, sparsemm_rho)
            diagnostics["round_margin"] = rm
        elif allocator == "madakv":
            demands = np.zeros((L, Hkv), dtype=np.int64)
            coverage = math.inf
            for il in range(L):
                for g in range(Hkv):
                    d, cm = madakv_demand(contexts[il].a0[g], is_image, theta)
                    demands[il, g] = d
                    coverage = min(coverage, cm)
            budgets, on_half = madakv_budgets(demands, C, n_prefix, madakv_rho)
            diagnostics["demands"] = demands.tolist()
            diagnostics["coverage_margin"] = coverage
            diagnostics["rational_on_half"] = on_half
        else:
            raise AssertionError(allocator)
        budgets = np.clip(budgets, 0, n_prefix)

    heads, margins = [], []
    split_margin = math.inf
    madakv_splits = []
    for il in range(L):
        layer_heads, layer_splits = [], []
        for g in range(Hkv):
            c = int(budgets[il, g])
            S = scores[il, g]
            if T <= budget or c >= n_prefix:
                kept_prefix = np.arange(n_prefix)
                groups = []
            elif allocator == "lookm":
                text = np.flatnonzero(~is_image)
                image = np.flatnonzero(is_image)
                c_txt = min(c, len(text))
                groups = [(text, c_txt), (image, c - c_txt)]
            elif allocator == "madakv":
                psi = contexts[il].a0[g]
                w_img, w_txt = modality_weights(psi, is_image)
                image = np.flatnonzero(is_image)
                text = np.flatnonzero(~is_image)
                b_img, b_txt, sm = madakv_split(c, w_img, w_txt, len(image), len(text))
                split_margin = min(split_margin, sm)
                layer_splits.append([b_img, b_txt])
                groups = [(image, b_img), (text, b_txt)]
            else:
                groups = [(np.arange(n_prefix), c)]
            if groups:
                kept_prefix = np.concatenate([top_indices(S, cand, cnt) for cand, cnt in groups])
                for cand, cnt in groups:
                    mg = cut_margin(S, cand, cnt)
                    if mg is not None:
                        margins.append(mg)
            kept = np.sort(np.concatenate([kept_prefix, np.arange(n_prefix, T)]))
            layer_heads.append([int(t) for t in kept])
        heads.append(layer_heads)
        madakv_splits.append(layer_splits)
    if allocator == "madakv" and T > budget:
        diagnostics["split_margin"] = split_margin
        diagnostics["splits"] = madakv_splits

    result = {
        "window": n_window,
        "budgets": budgets.tolist(),
        "heads": heads,
        "scores": scores.tolist(),
        "margin": min(margins) if margins else None,
        "diagnostics": diagnostics,
    }
    if merge == "pivot":
        mk, mv, gap = [], [], math.inf
        for il in range(L):
            lk, lv = [], []
            for g in range(Hkv):
                nk, nv, gp = pivot_merge(capture.keys[il][g], capture.values[il][g], heads[il][g], T)
                lk.append(nk.tolist())
                lv.append(nv.tolist())
                gap = min(gap, gp)
            mk.append(lk)
            mv.append(lv)
        result["merged_keys"] = mk
        result["merged_values"] = mv
        diagnostics["pivot_margin"] = gap
    return result


def kv_bytes(capture, heads):
    """(kv_bytes_full, kv_bytes_kept) of SPEC §8."""
    per_token = capture.head_dim * capture.key_itemsize + capture.value_dim * capture.value_itemsize
    full = capture.n_layers * capture.n_kv_heads * capture.n_tokens * per_token
    kept = sum(len(h) for layer in heads for h in layer) * per_token
    return full, kept
