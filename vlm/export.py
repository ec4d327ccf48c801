#!/usr/bin/env python3
"""Export a tiny-VLM checkpoint to the two GGUF files llama.cpp 0.5.0 loads: the text model (arch llama) and
the mmproj (arch clip, projector type mlp), with gguf-py from the pinned llama.cpp tree.

  python3 vlm/export.py vlm/runs/main/ckpt.pt --out models/tiny-vlm

writes models/tiny-vlm.gguf and models/tiny-vlm-mmproj.gguf (F32; each written to a temp file, then renamed).
"""

import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from blocks import BOS, CLIP_MEAN, CLIP_STD, EOS, UNK, vocab  # noqa: E402
from model import Config  # noqa: E402


def load_gguf_py(path):
    sys.path.insert(0, path)
    try:
        import gguf
    except ImportError:
        sys.exit(f"export: cannot import gguf-py from {path} (run scripts/fetch-llama.sh, or pass --gguf-py)")
    return gguf


def f32(t):
    return t.detach().to(torch.float32).contiguous().numpy()


def write(gguf, path, arch, kv, tensors):
    """kv: list of (method name, key or None, value); tensors: list of (name, array)."""
    tmp = path + ".tmp"
    try:
        w = gguf.GGUFWriter(tmp, arch)
        for method, key, value in kv:
            getattr(w, method)(*([key] if key else []), value)
        for name, array in tensors:
            w.add_tensor(name, array)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):  # failed or interrupted: leave nothing half-written
            os.remove(tmp)


def text_kv(c, name, tokens, types, rope_sections=None):
    """The text model's metadata: shape, RoPE, and the character vocabulary as a SentencePiece tokenizer."""
    kv = [
        ("add_name", None, name),
        ("add_context_length", None, c.n_ctx),
        ("add_embedding_length", None, c.n_embd),
        ("add_block_count", None, c.n_layer),
        ("add_feed_forward_length", None, c.n_ff),
        ("add_head_count", None, c.n_head),
        ("add_head_count_kv", None, c.n_head_kv),
        ("add_rope_dimension_count", None, c.n_embd // c.n_head),
        ("add_rope_freq_base", None, c.rope_base),
        ("add_layer_norm_rms_eps", None, c.rms_eps),
        ("add_vocab_size", None, c.n_vocab),
        ("add_file_type", None, 0),  # all F32
        ("add_tokenizer_model", None, "llama"),
        ("add_token_list", None, tokens),
        ("add_token_scores", None, [0.0] * len(tokens)),
        ("add_token_types", None, types),
        ("add_bos_token_id", None, BOS),
        ("add_eos_token_id", None, EOS),
        ("add_unk_token_id", None, UNK),
        ("add_add_bos_token", None, True),
        ("add_add_eos_token", None, False),
        ("add_add_space_prefix", None, False),
    ]
    if rope_sections is not None:
        kv.insert(8, ("add_rope_dimension_sections", None, list(rope_sections)))
    return kv


def text_model(sd, c, name):
    kv = text_kv(c, name, *vocab())
    return kv, [(name, f32(sd[key])) for key, part, name in tensor_names(c) if part == "text"]


def vision_kv(c, name, projector_type, use_gelu):
    """The projector's metadata: its type, the ViT's shape and CLIP's normalisation. use_gelu: the ViT MLP's GELU is
    the tanh form (ggml_gelu), else quick GELU."""
    return [
        ("add_name", None, name),
        ("add_bool", "clip.has_vision_encoder", True),
        ("add_bool", "clip.has_audio_encoder", False),
        ("add_string", "clip.projector_type", projector_type),
        ("add_bool", "clip.use_gelu", use_gelu),
        ("add_uint32", "clip.vision.image_size", c.image_size),
        ("add_uint32", "clip.vision.patch_size", c.patch_size),
        ("add_uint32", "clip.vision.embedding_length", c.v_embd),
        ("add_uint32", "clip.vision.feed_forward_length", c.v_ff),
        ("add_uint32", "clip.vision.block_count", c.v_block),
        ("add_uint32", "clip.vision.projection_dim", c.n_embd),
        ("add_uint32", "clip.vision.attention.head_count", c.v_head),
        ("add_float32", "clip.vision.attention.layer_norm_epsilon", c.v_eps),
        ("add_array", "clip.vision.image_mean", list(CLIP_MEAN)),
        ("add_array", "clip.vision.image_std", list(CLIP_STD)),
    ]


def projector(sd, c, name):
    kv = vision_kv(c, name, "mlp", True)  # LLaVA's ViT MLP here: GELU, not CLIP's quick GELU
    return kv, [(name, f32(sd[key])) for key, part, name in tensor_names(c) if part == "mmproj"]


def tensor_names(c):
    """(state-dict key, file "text" or "mmproj", GGUF tensor name) of every exported tensor: the one mapping the
    export and import_gguf() read."""
    out = [("tok.weight", "text", "token_embd.weight")]
    for i in range(c.n_layer):
        out += [(f"layers.{i}.{src}", "text", f"blk.{i}.{dst}") for src, dst in [
            ("attn_norm.weight", "attn_norm.weight"), ("wq.weight", "attn_q.weight"), ("wk.weight", "attn_k.weight"),
            ("wv.weight", "attn_v.weight"), ("wo.weight", "attn_output.weight"), ("ffn_norm.weight", "ffn_norm.weight"),
            ("gate.weight", "ffn_gate.weight"), ("up.weight", "ffn_up.weight"), ("down.weight", "ffn_down.weight")]]
    out += [("norm.weight", "text", "output_norm.weight"), ("out.weight", "text", "output.weight")]
    v = "vision."
    out += [(v + "patch.weight", "mmproj", "v.patch_embd.weight"), (v + "patch.bias", "mmproj", "v.patch_embd.bias"),
            (v + "pos", "mmproj", "v.position_embd.weight"), (v + "pre_ln.weight", "mmproj", "v.pre_ln.weight"),
            (v + "pre_ln.bias", "mmproj", "v.pre_ln.bias")]
    for i in range(c.v_block):
        for src, dst in [("ln1", "ln1"), ("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"), ("o", "attn_out"),
                         ("ln2", "ln2"), ("up", "ffn_up"), ("down", "ffn_down")]:
            out += [(f"{v}blocks.{i}.{src}.{w}", "mmproj", f"v.blk.{i}.{dst}.{w}") for w in ("weight", "bias")]
    out += [(f"{v}mm{k}.{w}", "mmproj", f"mm.{k}.{w}") for k in ("0", "2") for w in ("weight", "bias")]
    return out


def import_gguf(prefix, gguf_py=None):
    """A tiny-vlm checkpoint dict ({"model", "config"}) read back from PREFIX.gguf and PREFIX-mmproj.gguf (for a
    model whose training checkpoint is gone: the export is lossless, all F32). The training-only probe (`where`)
    keeps its initial values."""
    gguf = load_gguf_py(gguf_py or os.path.join(HERE, "..", "third_party", "llama.cpp", "gguf-py"))
    from model import TinyVLM

    c = Config(n_vocab=len(vocab()[0]))
    sd = TinyVLM(c).state_dict()
    files = {part: {t.name: t for t in gguf.GGUFReader(prefix + suffix).tensors}
             for part, suffix in (("text", ".gguf"), ("mmproj", "-mmproj.gguf"))}
    for key, part, name in tensor_names(c):
        data = np.array(files[part][name].data, dtype=np.float32)
        sd[key] = torch.from_numpy(data.reshape(sd[key].shape))
    return {"model": sd, "config": c.to_dict(), "step": None}


def export_main(doc, default_name, arch, config_cls, text_fn, projector_fn):
    """The command line of export.py and export_qwen2vl.py: CHECKPOINT --out PREFIX [--name N] [--gguf-py DIR]."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--out", required=True, help="path prefix: writes PREFIX.gguf and PREFIX-mmproj.gguf")
    ap.add_argument("--gguf-py", default=os.path.join(HERE, "..", "third_party", "llama.cpp", "gguf-py"))
    ap.add_argument("--name", default=default_name)
    a = ap.parse_args()
    gguf = load_gguf_py(a.gguf_py)
    if not os.path.isfile(a.checkpoint):
        sys.exit(f"export: {a.checkpoint}: no such checkpoint")
    ck = torch.load(a.checkpoint, map_location="cpu")
    c = config_cls(**ck["config"])
    sd = ck["model"]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    write(gguf, a.out + ".gguf", arch, *text_fn(sd, c, a.name))
    write(gguf, a.out + "-mmproj.gguf", "clip", *projector_fn(sd, c, a.name + " mmproj"))
    print(f"wrote {a.out}.gguf and {a.out}-mmproj.gguf (step {ck['step']})", file=sys.stderr)


def main():
    export_main(__doc__, "ecokv tiny-vlm", "llama", Config, text_model, projector)


if __name__ == "__main__":
    main()
