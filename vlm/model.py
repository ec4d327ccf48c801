"""The tiny VLM in PyTorch: LLaVA-1.5's architecture, computed exactly as llama.cpp 0.5.0 computes it.

- Vision: CLIP-style ViT (conv patch embedding with bias, learned positions, pre-LayerNorm, pre-norm blocks with
  biased attention and a GELU MLP). As in LLaVA-1.5 the features are the penultimate block's output, so the last
  block exists but is not run (mtmd's llava graph does the same). No class token: mtmd makes it optional and
  LLaVA drops its output anyway.
- Projector: mlp2x_gelu (Linear, GELU, Linear), mtmd projector type "mlp".
- Text: Llama (RMSNorm, RoPE on adjacent pairs as ggml's LLAMA_ROPE_TYPE_NORM, GQA, SwiGLU), char-level vocab.
GELU is the tanh approximation (ggml_gelu).
"""

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass
class Config:
    image_size: int = 96
    patch_size: int = 8
    v_embd: int = 128
    v_head: int = 2
    v_ff: int = 256
    v_block: int = 3  # the last one is unused (LLaVA's penultimate-layer features)
    v_eps: float = 1e-5
    n_embd: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 384
    n_layer: int = 4
    rms_eps: float = 1e-5
    rope_base: float = 10000.0
    n_ctx: int = 1024
    n_vocab: int = 0  # set from the vocabulary

    def to_dict(self):
        return asdict(self)


# --- vocabulary: SentencePiece-style, one piece per character, byte fallback -------------------------------------
SPACE = "\u2581"
BOS, EOS, UNK = 1, 2, 0
N_BYTES = 256
PIECES = [SPACE] + [chr(c) for c in range(33, 127)]


def vocab():
    """(tokens, types) in id order. Types as llama.cpp: 1 normal, 2 unknown, 3 control, 6 byte."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(N_BYTES)] + PIECES
    types = [2, 3, 3] + [6] * N_BYTES + [1] * len(PIECES)
    return tokens, types


_PIECE_ID = {p: 3 + N_BYTES + i for i, p in enumerate(PIECES)}


def encode(text):
    """Token ids of text as llama.cpp's SPM tokenizer gives them for this vocabulary (no space prefix)."""
    ids = []
    for ch in text.replace(" ", SPACE):
        if ch in _PIECE_ID:
            ids.append(_PIECE_ID[ch])
        else:
            ids.extend(3 + b for b in ch.encode())
    return ids


def decode(ids):
    out = bytearray()
    for t in ids:
        if 3 <= t < 3 + N_BYTES:
            out.append(t - 3)
        elif t >= 3 + N_BYTES:
            out += PIECES[t - 3 - N_BYTES].replace(SPACE, " ").encode()
    return out.decode(errors="replace")


def attention(q, k, v, mask=None, keep_probs=False, key_mask=None):
    """softmax(q k^T / sqrt(d) + mask + key_mask) v; q (B, H, T, d), k/v (B, H_kv, T, d) with H a multiple of H_kv
    (GQA); key_mask (B, H, T), when given, is added for every query (-inf hides a key from a head).
    One baddbmm does scale and mask (torch 1.13 has no fused attention; this is its fastest form here). With
    keep_probs, also returns the attention probabilities (B, H, T, T)."""
    b, h, t, d = q.shape
    rep = h // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    flat = lambda x: x.reshape(b * h, t, d)  # noqa: E731
    bias = mask if mask is not None else q.new_zeros(1, 1)
    scores = torch.baddbmm(bias, flat(q), flat(k).transpose(1, 2), alpha=d ** -0.5)
    if key_mask is not None:  # in place: baddbmm's backward does not need its output
        scores.add_(key_mask.reshape(b * h, 1, t))
    p = scores.softmax(-1)
    out = torch.bmm(p, flat(v)).view(b, h, t, d)
    return (out, p.view(b, h, t, t)) if keep_probs else out


# --- vision ----------------------------------------------------------------------------------------------------
class VitBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head = c.v_head
        self.ln1 = nn.LayerNorm(c.v_embd, eps=c.v_eps)
        self.q = nn.Linear(c.v_embd, c.v_embd)
        self.k = nn.Linear(c.v_embd, c.v_embd)
        self.v = nn.Linear(c.v_embd, c.v_embd)
        self.o = nn.Linear(c.v_embd, c.v_embd)
        self.ln2 = nn.LayerNorm(c.v_embd, eps=c.v_eps)
        self.up = nn.Linear(c.v_embd, c.v_ff)
        self.down = nn.Linear(c.v_ff, c.v_embd)

    def forward(self, x):
        b, n, e = x.shape
        h = self.ln1(x)
        split = lambda t: t.view(b, n, self.n_head, e // self.n_head).transpose(1, 2)  # noqa: E731
        a = attention(split(self.q(h)), split(self.k(h)), split(self.v(h)))
        x = x + self.o(a.transpose(1, 2).reshape(b, n, e))
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))


class Vision(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.patch = nn.Conv2d(3, c.v_embd, c.patch_size, c.patch_size)
        self.pos = nn.Parameter(torch.randn((c.image_size // c.patch_size) ** 2, c.v_embd) * 0.02)
        self.pre_ln = nn.LayerNorm(c.v_embd, eps=c.v_eps)
        self.blocks = nn.ModuleList(VitBlock(c) for _ in range(c.v_block))
        self.mm0 = nn.Linear(c.v_embd, c.n_embd)
        self.mm2 = nn.Linear(c.n_embd, c.n_embd)
        self.register_buffer("mean", torch.tensor(CLIP_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(CLIP_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, images):
        """images: uint8 (B, H, W, 3) -> (B, n_patches, n_embd) text-space embeddings, in raster order."""
        x = (images.permute(0, 3, 1, 2).float() / 255.0 - self.mean) / self.std
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        x = self.pre_ln(x)
        for blk in self.blocks[:-1]:
            x = blk(x)
        return self.mm2(F.gelu(self.mm0(x), approximate="tanh"))


# --- text ------------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(n_pos, d, base):
    """cos/sin (T, 1, d/2) for rotating adjacent pairs (x[2i], x[2i+1]) by pos * base^(-2i/d), as ggml's
    LLAMA_ROPE_TYPE_NORM."""
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.arange(n_pos, dtype=torch.float32)[:, None, None] * inv
    return ang.cos(), ang.sin()


def rope(x, cos, sin):
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).flatten(-2)


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        hd = c.n_embd // c.n_head
        self.attn_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.wq = nn.Linear(c.n_embd, c.n_head * hd, bias=False)
        self.wk = nn.Linear(c.n_embd, c.n_head_kv * hd, bias=False)
        self.wv = nn.Linear(c.n_embd, c.n_head_kv * hd, bias=False)
        self.wo = nn.Linear(c.n_head * hd, c.n_embd, bias=False)
        self.ffn_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.gate = nn.Linear(c.n_embd, c.n_ff, bias=False)
        self.up = nn.Linear(c.n_embd, c.n_ff, bias=False)
        self.down = nn.Linear(c.n_ff, c.n_embd, bias=False)

    def forward(self, x, cos, sin, mask, keep_probs=False):
        c = self.c
        b, t, _ = x.shape
        hd = c.n_embd // c.n_head
        h = self.attn_norm(x)
        q = rope(self.wq(h).view(b, t, c.n_head, hd), cos, sin).transpose(1, 2)
        k = rope(self.wk(h).view(b, t, c.n_head_kv, hd), cos, sin).transpose(1, 2)
        v = self.wv(h).view(b, t, c.n_head_kv, hd).transpose(1, 2)
        a, probs = attention(q, k, v, mask, keep_probs=True) if keep_probs else (attention(q, k, v, mask), None)
        x = x + self.wo(a.transpose(1, 2).reshape(b, t, -1))
        h = self.ffn_norm(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return (x, probs) if keep_probs else x


def init_weights(model, n_layer, types=(nn.Linear, nn.Embedding)):
    """N(0, 0.02) weights and zero biases for the modules of `types`, then GPT-2's scaling of the residual
    projections by depth (both models; the order of the draws is part of what a training seed reproduces)."""
    def init(m):
        if isinstance(m, types):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    model.apply(init)
    for name, p in model.named_parameters():
        if name.endswith(("wo.weight", "down.weight", ".o.weight")):
            nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))


class TinyVLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.vision = Vision(c)
        self.tok = nn.Embedding(c.n_vocab, c.n_embd)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.n_embd, c.rms_eps)
        self.out = nn.Linear(c.n_embd, c.n_vocab, bias=False)
        n_grid = c.image_size // c.patch_size
        self.where = nn.Linear(c.n_embd, 2 * n_grid)  # training-only probe: row and column of a patch
        init_weights(self, c.n_layer)

    def embed(self, tokens, feats, image_slots):
        """Token embeddings with each image's projected patches (feats: vision() output, one row per image)
        written over its slot of placeholder tokens; image_slots: (batch row, first position) per image."""
        x = self.tok(tokens)
        if feats is not None and len(image_slots):
            n = feats.shape[1]
            x = x.clone()
            for i, (row, start) in enumerate(image_slots):
                x[row, start: start + n] = feats[i]
        return x

    def glyph_logits(self, feats):
        """Training-only readout: each image token scored against the text embeddings of the characters, so that
        a patch showing "7" lands near the embedding of the token "7" (not exported; llama.cpp never runs it)."""
        return feats @ self.tok.weight.t()

    def where_logits(self, feats):
        """Training-only probe (not exported): row and column logits of each image token, so that the features
        the text model attends to say where a character is as well as what it is."""
        n = self.c.image_size // self.c.patch_size
        return self.where(feats).view(*feats.shape[:-1], 2, n)

    def forward(self, x, probe_layer=None):
        """x: input embeddings (B, T, n_embd) at positions 0..T-1 -> logits (B, T, n_vocab); with probe_layer,
        also that layer's attention probabilities (B, H, T, T)."""
        t = x.shape[1]
        cos, sin = rope_tables(t, self.c.n_embd // self.c.n_head, self.c.rope_base)
        mask = torch.full((t, t), float("-inf")).triu(1)
        probs = None
        for il, layer in enumerate(self.layers):
            if il == probe_layer:
                x, probs = layer(x, cos, sin, mask, keep_probs=True)
            else:
                x = layer(x, cos, sin, mask)
        logits = self.out(self.norm(x))
        return logits if probe_layer is None else (logits, probs)
