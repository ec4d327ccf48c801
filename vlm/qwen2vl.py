"""The Qwen2-VL-style tiny VLM in PyTorch, computed exactly as llama.cpp 0.5.0 computes it (mtmd projector
`qwen2vl_merger`, text arch `qwen2vl`).

- Vision (tools/mtmd/models/qwen2vl.cpp): 4x4-pixel patches from a bias-free patch embedding (Qwen2-VL's Conv3d
  over two identical frames; exported as two Conv2d kernels), no position embedding, pre-norm blocks with
  LayerNorm, biased attention with 2-D rotary positions (ggml's GGML_ROPE_TYPE_VISION: the first half of the
  rotated pairs turns with the patch row, the second with its column) and a quick-GELU MLP. Patches are ordered
  in 2x2 groups, as the graph orders them.
- Merger: LayerNorm (ln_q, v.post_ln), then each 2x2 group of patches concatenated -> Linear -> GELU (tanh form,
  ggml_gelu) -> Linear into the text width: one image token per 8x8 pixels, as many as the image size gives.
- Text (src/models/qwen2vl.cpp): Qwen2 (RMSNorm, Q/K/V with bias, GQA, SwiGLU, untied output) with M-RoPE:
  rotated pairs (x[i], x[i + d/2]) split into sections of temporal / height / width positions (ggml's
  GGML_ROPE_TYPE_MROPE). An image's tokens share the temporal position pos_0 and have height pos_0 + row and
  width pos_0 + column; the image advances the position by max(rows, columns) (mtmd's MTMD_POS_TYPE_MROPE).
The blocks, the character vocabulary and the text model around the layers are blocks.py's (tiny-vlm shares them);
here are the configuration, the control tokens, the rotary positions, the vision tower, the K-bias initialisation,
the row probe and the prompt.
"""

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn

from blocks import BOS, N_BYTES, VLM, VisionTower, VitBlock, encode, init_weights, quick_gelu
from blocks import vocab as char_vocab

K_BIAS_NORM = 2.0
ROW_PROBE_CHARS = 3  # the row probe reads this many characters from the start of a token's text line
GLYPH_SLOTS = 4  # the glyph slots name this many characters whose centres a token holds (a resized token: 0-4)
TRAINING_ONLY = ("row_probe.", "glyph_slots.")  # readouts that shape the image tokens in training, not exported
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"


@dataclass
class Config:
    patch_size: int = 4
    image_size: int = 160  # the default page's side in pixels (mtmd sizes images dynamically)
    v_embd: int = 64  # one head: the ViT's attention over 1,600+ patches is most of a training step
    v_head: int = 1
    v_ff: int = 256
    v_block: int = 2
    v_eps: float = 1e-6
    v_rope_base: float = 10000.0
    n_embd: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 384
    n_layer: int = 4
    rms_eps: float = 1e-6
    rope_base: float = 10000.0
    rope_sections: list = field(default_factory=lambda: [4, 6, 6, 0])  # pairs: temporal, height, width, extra
    n_ctx: int = 4096
    n_vocab: int = 0

    def to_dict(self):
        return asdict(self)


def vocab():
    """The character vocabulary of tiny-vlm plus Qwen2-VL's two control tokens, which mtmd writes around every
    image (llama.cpp's tokenizer matches control tokens as one piece)."""
    tokens, types = char_vocab()
    return tokens + [VISION_START, VISION_END], types + [3, 3]


VISION_START_ID, VISION_END_ID = 3 + N_BYTES + 95, 3 + N_BYTES + 96
assert vocab()[0][VISION_START_ID] == VISION_START and vocab()[0][VISION_END_ID] == VISION_END


def rotate_half_pairs(x, angle):
    """Rotate pairs (x[i], x[i + n]) by angle[..., i] for i < n = angle.shape[-1] (ggml's NEOX, MROPE and VISION
    layouts); x (..., 2n), angle broadcastable to (..., n)."""
    n = angle.shape[-1]
    cos, sin = angle.cos(), angle.sin()
    x0, x1 = x[..., :n], x[..., n: 2 * n]
    return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos, x[..., 2 * n:]), -1)


# --- vision ------------------------------------------------------------------------------------------------------
def patch_positions(ph, pw):
    """(row, column) of each patch in the graph's order: 2x2 groups in raster order of the groups."""
    pos = [(y + dy, x + dx) for y in range(0, ph, 2) for x in range(0, pw, 2) for dy in (0, 1) for dx in (0, 1)]
    return torch.tensor(pos, dtype=torch.float32)


def vision_angles(ph, pw, d, base):
    """(n_patches, d/2) rotation angles: pair k < d/4 turns by row * base^(-4k/d), pair d/4 + k by column *
    base^(-4k/d) (ggml_rope_multi in VISION mode with n_dims d/2 and sections d/4: independent sections)."""
    inv = base ** (-4.0 * torch.arange(d // 4, dtype=torch.float32) / d)
    pos = patch_positions(ph, pw)
    return torch.cat((pos[:, :1] * inv, pos[:, 1:] * inv), -1)


class Vision(VisionTower):
    """Blocks with 2-D rotary positions and a quick-GELU MLP, then the merger."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.patch = nn.Conv2d(3, c.v_embd, c.patch_size, c.patch_size, bias=False)
        self.blocks = nn.ModuleList(VitBlock(c, quick_gelu) for _ in range(c.v_block))
        self.post_ln = nn.LayerNorm(c.v_embd, eps=c.v_eps)
        self.mm0 = nn.Linear(4 * c.v_embd, 4 * c.v_embd)
        self.mm2 = nn.Linear(4 * c.v_embd, c.n_embd)

    def forward(self, images):
        """images: uint8 (B, H, W, 3), H and W multiples of 2 x patch_size, all the same size -> (B, H*W/(4p^2),
        n_embd) image tokens in raster order of the merged grid."""
        c = self.c
        x = self.patch(self.pixels(images))  # (B, E, ph, pw)
        b, e, ph, pw = x.shape
        x = x.view(b, e, ph // 2, 2, pw // 2, 2).permute(0, 2, 4, 3, 5, 1).reshape(b, ph * pw, e)  # 2x2 groups
        angle = vision_angles(ph, pw, e // c.v_head, c.v_rope_base)[None, None]
        for blk in self.blocks:
            x = blk(x, lambda t: rotate_half_pairs(t, angle))
        return self.project(self.post_ln(x).reshape(b, ph * pw // 4, 4 * e))


# --- text --------------------------------------------------------------------------------------------------------
def mrope_angles(positions, d, base, sections):
    """positions (..., T, 3) as (temporal, height, width) -> (..., T, d/2) angles: pair k turns by the position
    of its section times base^(-2k/d) (ggml's MROPE: one frequency sequence over all pairs)."""
    inv = base ** (-2.0 * torch.arange(d // 2, dtype=torch.float32) / d)
    plane = torch.tensor([0] * sections[0] + [1] * sections[1] + [2] * sections[2] +
                         [3] * (d // 2 - sum(sections[:3])))
    padded = torch.cat((positions, torch.zeros_like(positions[..., :1])), -1)  # the unused 4th plane is 0
    return padded[..., plane] * inv


def rotary(positions, c):
    """The `rotate` of blocks.Layer for positions (B, T, 3) as (temporal, height, width)."""
    angle = mrope_angles(positions.float(), c.n_embd // c.n_head, c.rope_base, c.rope_sections)[:, :, None]
    return lambda x: rotate_half_pairs(x, angle)


class TinyQwen2VL(VLM):
    def __init__(self, c):
        super().__init__(c, Vision(c), qkv_bias=True)
        init_weights(self, c.n_layer, (nn.Linear, nn.Embedding, nn.Conv2d))
        # Real Qwen2 checkpoints have large k_proj biases, a shared direction in every key that makes keys
        # anisotropic (the ECOKV paper's Figure 1). Without RoPE it would not change attention at all (q.b is
        # the same for every key); with M-RoPE it changes little. Start each head's bias at norm K_BIAS_NORM.
        for layer in self.layers:
            nn.init.normal_(layer.wk.bias, 0.0, K_BIAS_NORM / math.sqrt(c.n_embd // c.n_head))
        # Training-only (not exported), made last so the other parameters start as they did before it existed.
        self.row_probe = nn.Linear(c.n_embd, ROW_PROBE_CHARS * c.n_embd, bias=False)
        self.glyph_slots = nn.Linear(c.n_embd, GLYPH_SLOTS * c.n_embd, bias=False)
        nn.init.zeros_(self.glyph_slots.weight)  # no gradient into the tower until the readout has learned some

    def load_state_dict(self, state, strict=True):
        """As nn.Module's, except that a checkpoint saved before a training-only readout existed (TRAINING_ONLY)
        loads strictly all the same: the readout is left as initialised (it is never exported)."""
        result = super().load_state_dict(state, strict=False)
        if strict and (result.unexpected_keys or any(not n.startswith(TRAINING_ONLY) for n in result.missing_keys)):
            raise RuntimeError(f"the checkpoint does not match the model: missing {result.missing_keys}, "
                               f"unexpected {result.unexpected_keys}")
        return result

    def grown_prefixes(self, old):
        """Parameter names a checkpoint of configuration `old` (fewer ViT blocks) lacks."""
        return [f"vision.blocks.{i}." for i in range(old["v_block"], self.c.v_block)]

    @torch.no_grad()
    def grow(self, old):
        """After loading a checkpoint with fewer ViT blocks (`old`), make the blocks it lacks identities: their attention
        output and MLP down projections start at zero, so the grown model computes what the checkpoint did, and
        training moves them from there (a function-preserving growth in depth)."""
        for blk in list(self.vision.blocks)[old["v_block"]:]:
            for lin in (blk.o, blk.down):
                lin.weight.zero_()
                lin.bias.zero_()

    def row_logits(self, feats):
        """Training-only readout (not exported): (n, ROW_PROBE_CHARS, n_vocab), each image token's guess at the first
        characters of the text line of its row, scored against the character embeddings (held fixed: the probe
        shapes the image tokens, not the vocabulary)."""
        return self.row_probe(feats).view(feats.shape[0], ROW_PROBE_CHARS, -1) @ self.tok.weight.detach().t()

    def slot_logits(self, feats):
        """Training-only readout (not exported): (n, GLYPH_SLOTS, n_vocab), each image token's guess at the
        characters whose centres it holds, in reading order, then EOS (gen_pages.token_glyphs), scored as row_logits
        is. A resized token holds up to four glyphs, which its one glyph_logits guess cannot name."""
        return self.glyph_slots(feats).view(feats.shape[0], GLYPH_SLOTS, -1) @ self.tok.weight.detach().t()

    def forward(self, x, positions, probe_layers=(), key_masks=None):
        """x (B, T, n_embd), positions (B, T, 3) -> blocks.VLM.decode's (logits, {layer: probabilities})."""
        return self.decode(x, rotary(positions, self.c), probe_layers, key_masks)

    @torch.no_grad()
    def cache(self, images, text):
        """Per layer the post-RoPE keys and values (H_kv, T, d) that llama.cpp caches for the prompt of images
        (uint8 arrays) and text."""
        feats = [self.vision(torch.from_numpy(img[None]))[0] for img in images]
        ids, pos, slots, _ = prompt([(img.shape[0] // 8, img.shape[1] // 8) for img in images], text)
        x = self.embed(torch.tensor([ids]), feats, [(0, s) for s in slots])
        return self.kv_cache(x, rotary(torch.tensor([pos]), self.c))


# --- prompts -----------------------------------------------------------------------------------------------------
def prompt(grid_shapes, text):
    """The prompt as `ecokv run`/`ecokv eval` build it through mtmd: <s>, then per image <|vision_start|>, its
    tokens, <|vision_end|> and "\\n", then text. grid_shapes: (rows, columns) of image tokens per image.
    Returns (ids with 0 in image slots, positions as (temporal, height, width) per token, image slot starts, the
    next position)."""
    ids, pos, slots = [BOS], [(0, 0, 0)], []
    p = 1
    for rows, cols in grid_shapes:
        ids.append(VISION_START_ID)
        pos.append((p, p, p))
        p += 1
        slots.append(len(ids))
        ids += [0] * (rows * cols)
        pos += [(p, p + r, p + c) for r in range(rows) for c in range(cols)]
        p += max(rows, cols)
        p = extend(ids, pos, p, [VISION_END_ID] + encode("\n"))
    p = extend(ids, pos, p, encode(text))
    return ids, pos, slots, p


def extend(ids, pos, next_pos, tokens):
    """Append text tokens at consecutive positions; returns the next position."""
    for t in tokens:
        ids.append(t)
        pos.append((next_pos, next_pos, next_pos))
        next_pos += 1
    return next_pos
