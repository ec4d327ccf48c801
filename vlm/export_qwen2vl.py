#!/usr/bin/env python3
"""Export a tiny-qwen2vl checkpoint (vlm/train_qwen2vl.py) to the two GGUF files llama.cpp 0.5.0 loads: the text
model (arch qwen2vl) and the mmproj (arch clip, projector type qwen2vl_merger), with the pinned tree's gguf-py.

  python3 vlm/export_qwen2vl.py vlm/runs/qwen2/ckpt.pt --out models/tiny-qwen2vl

writes PREFIX.gguf and PREFIX-mmproj.gguf (F32; each through a temp file, renamed when complete).
"""

import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from export import export_main, f32, text_kv, vision_kv  # noqa: E402
from qwen2vl import Config, vocab  # noqa: E402


def text_model(sd, c, name):
    kv = text_kv(c, name, *vocab(), rope_sections=c.rope_sections)
    t = [("token_embd.weight", f32(sd["tok.weight"]))]
    for i in range(c.n_layer):
        p, b = f"layers.{i}.", f"blk.{i}."
        pairs = [("attn_norm.weight", "attn_norm.weight"), ("wq.weight", "attn_q.weight"), ("wq.bias", "attn_q.bias"),
                 ("wk.weight", "attn_k.weight"), ("wk.bias", "attn_k.bias"), ("wv.weight", "attn_v.weight"),
                 ("wv.bias", "attn_v.bias"), ("wo.weight", "attn_output.weight"),
                 ("ffn_norm.weight", "ffn_norm.weight"), ("gate.weight", "ffn_gate.weight"),
                 ("up.weight", "ffn_up.weight"), ("down.weight", "ffn_down.weight")]
        t += [(b + dst, f32(sd[p + src])) for src, dst in pairs]
    t += [("output_norm.weight", f32(sd["norm.weight"])), ("output.weight", f32(sd["out.weight"]))]
    return kv, t


def projector(sd, c, name):
    kv = vision_kv(c, name, "qwen2vl_merger", False)  # quick GELU, as Qwen2-VL
    v = "vision."
    w = sd[v + "patch.weight"]
    # Qwen2-VL's Conv3d over two frames becomes two Conv2d kernels summed over the same still image: all of the
    # kernel in the first, zeros in the second.
    t = [("v.patch_embd.weight", f32(w)), ("v.patch_embd.weight.1", f32(torch.zeros_like(w)))]
    for i in range(c.v_block):
        p, b = f"{v}blocks.{i}.", f"v.blk.{i}."
        for src, dst in [("ln1", "ln1"), ("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"), ("o", "attn_out"),
                         ("ln2", "ln2"), ("up", "ffn_up"), ("down", "ffn_down")]:
            t += [(b + dst + ".weight", f32(sd[p + src + ".weight"])), (b + dst + ".bias", f32(sd[p + src + ".bias"]))]
    t += [("v.post_ln.weight", f32(sd[v + "post_ln.weight"])), ("v.post_ln.bias", f32(sd[v + "post_ln.bias"]))]
    for k in ("0", "2"):
        t += [(f"mm.{k}.weight", f32(sd[f"{v}mm{k}.weight"])), (f"mm.{k}.bias", f32(sd[f"{v}mm{k}.bias"]))]
    return kv, t


def main():
    export_main(__doc__, "ecokv tiny-qwen2vl", "qwen2vl", Config, text_model, projector)


if __name__ == "__main__":
    main()
