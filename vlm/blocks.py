"""What tiny-vlm (model.py) and tiny-qwen2vl (qwen2vl.py) are both built from, computed as llama.cpp 0.5.0 computes
it: the character vocabulary, attention with GQA and key masks, RMSNorm, the pre-norm ViT block, the pre-norm
decoder layer (RMSNorm, GQA, SwiGLU), the ends of a vision tower (image normalisation, mlp projector), the weight
initialisation, and the text model around the layers (embedding, image tokens written over their slots, the glyph
readout, the causal stack, the KV cache). The two files hold what differs: positions (RoPE on adjacent pairs vs M-RoPE),
activations, patch layouts, prompts and training-only probes.

Module and parameter names are those of the checkpoints and exports (export*.py read them), and every module is
built in the order the training seeds' random draws reproduce.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

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


# --- attention -----------------------------------------------------------------------------------------------------
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


def causal_mask(t):
    return torch.full((t, t), float("-inf")).triu(1)


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")  # ggml_gelu


def quick_gelu(x):
    return x * torch.sigmoid(1.702 * x)  # clip.use_gelu false


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


# --- vision --------------------------------------------------------------------------------------------------------
class VitBlock(nn.Module):
    """Pre-LayerNorm block: biased multi-head attention, then an MLP with activation `act`."""

    def __init__(self, c, act):
        super().__init__()
        self.n_head = c.v_head
        self.act = act
        self.ln1 = nn.LayerNorm(c.v_embd, eps=c.v_eps)
        self.q = nn.Linear(c.v_embd, c.v_embd)
        self.k = nn.Linear(c.v_embd, c.v_embd)
        self.v = nn.Linear(c.v_embd, c.v_embd)
        self.o = nn.Linear(c.v_embd, c.v_embd)
        self.ln2 = nn.LayerNorm(c.v_embd, eps=c.v_eps)
        self.up = nn.Linear(c.v_embd, c.v_ff)
        self.down = nn.Linear(c.v_ff, c.v_embd)

    def forward(self, x, rotate=None):
        """rotate, when given, turns the queries and keys (B, heads, n, d) by their patches' positions."""
        b, n, e = x.shape
        h = self.ln1(x)
        split = lambda t: t.view(b, n, self.n_head, e // self.n_head).transpose(1, 2)  # noqa: E731
        q, k = split(self.q(h)), split(self.k(h))
        if rotate is not None:
            q, k = rotate(q), rotate(k)
        a = attention(q, k, split(self.v(h)))
        x = x + self.o(a.transpose(1, 2).reshape(b, n, e))
        return x + self.down(self.act(self.up(self.ln2(x))))


class VisionTower(nn.Module):
    """The ends of both vision towers: CLIP's pixel normalisation in, the mlp projector (mm0, GELU, mm2) out; the
    subclass makes mm0 and mm2."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.tensor(CLIP_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(CLIP_STD).view(1, 3, 1, 1), persistent=False)

    def pixels(self, images):
        """uint8 (B, H, W, 3) -> normalised float (B, 3, H, W)."""
        return (images.permute(0, 3, 1, 2).float() / 255.0 - self.mean) / self.std

    def project(self, x):
        return self.mm2(gelu_tanh(self.mm0(x)))


# --- text ----------------------------------------------------------------------------------------------------------
class Layer(nn.Module):
    """Pre-norm decoder layer: RMSNorm, GQA attention (Q/K/V biased with qkv_bias, as Qwen2), RMSNorm, SwiGLU.
    Its callers pass `rotate`, which applies the positions to (B, T, heads, d) queries or keys."""

    def __init__(self, c, qkv_bias):
        super().__init__()
        self.c = c
        hd = c.n_embd // c.n_head
        self.attn_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.wq = nn.Linear(c.n_embd, c.n_head * hd, bias=qkv_bias)
        self.wk = nn.Linear(c.n_embd, c.n_head_kv * hd, bias=qkv_bias)
        self.wv = nn.Linear(c.n_embd, c.n_head_kv * hd, bias=qkv_bias)
        self.wo = nn.Linear(c.n_head * hd, c.n_embd, bias=False)
        self.ffn_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.gate = nn.Linear(c.n_embd, c.n_ff, bias=False)
        self.up = nn.Linear(c.n_embd, c.n_ff, bias=False)
        self.down = nn.Linear(c.n_ff, c.n_embd, bias=False)

    def heads(self, x, n):
        return x.view(*x.shape[:2], n, self.c.n_embd // self.c.n_head)

    def kv(self, h, rotate):
        """Post-RoPE keys and values (B, H_kv, T, d) of the normed input h: what llama.cpp caches."""
        k = rotate(self.heads(self.wk(h), self.c.n_head_kv)).transpose(1, 2)
        return k, self.heads(self.wv(h), self.c.n_head_kv).transpose(1, 2)

    def forward(self, x, rotate, mask, keep_probs=False, key_mask=None):
        h = self.attn_norm(x)
        q = rotate(self.heads(self.wq(h), self.c.n_head)).transpose(1, 2)
        k, v = self.kv(h, rotate)
        a = attention(q, k, v, mask, keep_probs, key_mask)
        a, probs = a if keep_probs else (a, None)
        x = x + self.wo(a.transpose(1, 2).reshape(*x.shape[:2], -1))
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


class VLM(nn.Module):
    """A vision tower and the text model: token embedding, decoder layers, final norm, untied output."""

    def __init__(self, c, vision, qkv_bias):
        super().__init__()
        self.c = c
        self.vision = vision
        self.tok = nn.Embedding(c.n_vocab, c.n_embd)
        self.layers = nn.ModuleList(Layer(c, qkv_bias) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.n_embd, c.rms_eps)
        self.out = nn.Linear(c.n_embd, c.n_vocab, bias=False)

    def embed(self, tokens, feats, image_slots):
        """Token embeddings with each image's tokens (feats: one (n, n_embd) per image, as a list or a batch)
        written over its slot of placeholder tokens; image_slots: (batch row, first position) per image."""
        x = self.tok(tokens)
        if feats is not None and len(image_slots):
            x = x.clone()
            for f, (row, start) in zip(feats, image_slots):
                x[row, start: start + f.shape[0]] = f
        return x

    def glyph_logits(self, feats):
        """Training-only readout (not exported; llama.cpp never runs it): image tokens scored against the text
        embeddings of the characters, so that a patch showing "7" lands near the embedding of the token "7"."""
        return feats @ self.tok.weight.t()

    def decode(self, x, rotate, probe_layers=(), key_masks=None):
        """x (B, T, n_embd) through the causal stack -> logits (B, T, n_vocab) and {layer: attention probabilities
        (B, H, T, T)} for probe_layers; key_masks: {layer: (B, H, T) added to every query's scores}."""
        mask = causal_mask(x.shape[1])
        probs, key_masks = {}, key_masks or {}
        for il, layer in enumerate(self.layers):
            if il in probe_layers:
                x, probs[il] = layer(x, rotate, mask, True, key_masks.get(il))
            else:
                x = layer(x, rotate, mask, key_mask=key_masks.get(il))
        return self.out(self.norm(x)), probs

    @torch.no_grad()
    def kv_cache(self, x, rotate):
        """Per layer the post-RoPE keys and values (H_kv, T, d) that llama.cpp caches for one prompt's input
        embeddings x (1, T, n_embd)."""
        mask, out = causal_mask(x.shape[1]), []
        for layer in self.layers:
            k, v = layer.kv(layer.attn_norm(x), rotate)
            out.append((k[0].numpy(), v[0].numpy()))
            x = layer(x, rotate, mask)
        return out
