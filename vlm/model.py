"""The tiny VLM in PyTorch: LLaVA-1.5's architecture, computed exactly as llama.cpp 0.5.0 computes it.

- Vision: CLIP-style ViT (conv patch embedding with bias, learned positions, pre-LayerNorm, pre-norm blocks with
  biased attention and a GELU MLP). As in LLaVA-1.5 the features are the penultimate block's output, so the last
  block exists but is not run (mtmd's llava graph does the same). No class token: mtmd makes it optional and
  LLaVA drops its output anyway.
- Projector: mlp2x_gelu (Linear, GELU, Linear), mtmd projector type "mlp".
- Text: Llama (RMSNorm, RoPE on adjacent pairs as ggml's LLAMA_ROPE_TYPE_NORM, GQA, SwiGLU), char-level vocab.
GELU is the tanh approximation (ggml_gelu).
The blocks, the vocabulary and the text model around the layers are blocks.py's (tiny-qwen2vl shares them); here
are the configuration, RoPE, the vision tower, the prompt and the training-only position probe.
"""

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn

from blocks import BOS, VLM, VisionTower, VitBlock, encode, gelu_tanh, init_weights


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


def prompt_tokens(n_images, n_patches, context, question):
    """Ids of the prompt as `ecokv eval`/`ecokv run` build it: BOS, then per image its slot and "\n", then the
    context, "\n", the question. Returns (ids, image slot starts)."""
    ids, slots = [BOS], []
    for _ in range(n_images):
        slots.append(len(ids))
        ids += [0] * n_patches + encode("\n")
    ids += encode(context + "\n" + question)
    return ids, slots


class Vision(VisionTower):
    def __init__(self, c):
        super().__init__()
        self.patch = nn.Conv2d(3, c.v_embd, c.patch_size, c.patch_size)
        self.pos = nn.Parameter(torch.randn((c.image_size // c.patch_size) ** 2, c.v_embd) * 0.02)
        self.pre_ln = nn.LayerNorm(c.v_embd, eps=c.v_eps)
        self.blocks = nn.ModuleList(VitBlock(c, gelu_tanh) for _ in range(c.v_block))
        self.mm0 = nn.Linear(c.v_embd, c.n_embd)
        self.mm2 = nn.Linear(c.n_embd, c.n_embd)

    def forward(self, images):
        """images: uint8 (B, H, W, 3) -> (B, n_patches, n_embd) text-space embeddings, in raster order."""
        x = self.patch(self.pixels(images)).flatten(2).transpose(1, 2) + self.pos
        x = self.pre_ln(x)
        for blk in self.blocks[:-1]:
            x = blk(x)
        return self.project(x)


def rope_tables(n_pos, d, base):
    """cos/sin (T, 1, d/2) for rotating adjacent pairs (x[2i], x[2i+1]) by pos * base^(-2i/d), as ggml's
    LLAMA_ROPE_TYPE_NORM."""
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.arange(n_pos, dtype=torch.float32)[:, None, None] * inv
    return ang.cos(), ang.sin()


def rope(x, cos, sin):
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).flatten(-2)


def rotary(n_pos, c):
    """The `rotate` of blocks.Layer for positions 0..n_pos-1."""
    cos, sin = rope_tables(n_pos, c.n_embd // c.n_head, c.rope_base)
    return lambda x: rope(x, cos, sin)


class TinyVLM(VLM):
    def __init__(self, c):
        super().__init__(c, Vision(c), qkv_bias=False)
        n_grid = c.image_size // c.patch_size
        self.where = nn.Linear(c.n_embd, 2 * n_grid)  # training-only probe: row and column of a patch
        init_weights(self, c.n_layer)

    def where_logits(self, feats):
        """Training-only probe (not exported): row and column logits of each image token, so that the features
        the text model attends to say where a character is as well as what it is."""
        n = self.c.image_size // self.c.patch_size
        return self.where(feats).view(*feats.shape[:-1], 2, n)

    def forward(self, x, probe_layer=None):
        """x: input embeddings (B, T, n_embd) at positions 0..T-1 -> logits (B, T, n_vocab); with probe_layer,
        also that layer's attention probabilities (B, H, T, T)."""
        probes = () if probe_layer is None else (probe_layer,)
        logits, probs = self.decode(x, rotary(x.shape[1], self.c), probes)
        return logits if probe_layer is None else (logits, probs[probe_layer])
