#!/usr/bin/env python3
"""Check an export against its checkpoint: llama.cpp (through `ecokv run --dump-capture`) must cache the same
post-RoPE keys and values as the PyTorch model computes, layer by layer, on held-out images.

  python3 vlm/check_export.py vlm/runs/main/ckpt.pt models/tiny-vlm [--ecokv build/bin/ecokv]

This covers the whole path: PNG decoding and normalisation in mtmd, the ViT, the projector, the placement of
the image embeddings, the tokenizer, RMSNorm, RoPE and GQA. The measure is the relative RMS error of each layer's
keys and values, ||cached - torch|| / ||torch||: the cache is F16 (2^-11 relative rounding, about 3e-4 RMS) and the
two float32 forward passes drift apart slightly through the layers, so a faithful export stays below 1e-3, while a
wrong RoPE, normalisation or weight layout gives errors of order 1. The largest single-element error relative to
the largest value is printed too. Exit status 1 when the worst relative RMS error exceeds --tol.
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_docs  # noqa: E402
import gen_pages  # noqa: E402
import qwen2vl  # noqa: E402
from blocks import BOS, encode  # noqa: E402
from model import Config, TinyVLM, rotary  # noqa: E402


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8: 8 + n])
    types = {"F32": np.float32, "F16": np.float16, "U8": np.uint8}
    out = {}
    for name, h in header.items():
        if name != "__metadata__":
            a, b = h["data_offsets"]
            out[name] = np.frombuffer(raw[8 + n + a: 8 + n + b], types[h["dtype"]]).reshape(h["shape"])
    return out


@torch.no_grad()
def torch_kv(model, image, text):
    """Per layer (K, V) as (H_kv, T, D) for the prompt BOS, image, "\\n" + text."""
    c = model.c
    n_patches = (c.image_size // c.patch_size) ** 2
    ids = [BOS] + [0] * n_patches + encode("\n" + text)
    x = model.embed(torch.tensor([ids]), model.vision(torch.from_numpy(image[None])), [(0, 1)])
    return model.kv_cache(x, rotary(len(ids), c))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("prefix", help="export prefix (PREFIX.gguf, PREFIX-mmproj.gguf)")
    ap.add_argument("--ecokv", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin", "ecokv"))
    ap.add_argument("--items", type=int, default=3)
    ap.add_argument("--tol", type=float, default=2e-3, help="largest relative RMS error accepted")
    a = ap.parse_args()
    ck = torch.load(a.checkpoint, map_location="cpu")
    is_qwen = "rope_sections" in ck["config"]  # tiny-qwen2vl (train_qwen2vl.py) or tiny-vlm (train.py)
    model = (qwen2vl.TinyQwen2VL(qwen2vl.Config(**ck["config"])) if is_qwen else TinyVLM(Config(**ck["config"])))
    model.load_state_dict(ck["model"])
    model.eval()
    worst, worst_max = 0.0, 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(a.items):
            it = (gen_pages if is_qwen else gen_docs).item(seed, "qa")
            png, cap = os.path.join(tmp, "page.png"), os.path.join(tmp, "capture.safetensors")
            with open(png, "wb") as f:
                f.write((gen_pages if is_qwen else gen_docs).png_bytes(it["images"][0]))
            text = "Read all text."
            r = subprocess.run([a.ecokv, "run", "--model", a.prefix + ".gguf", "--mmproj", a.prefix + "-mmproj.gguf",
                                "--image", png, "-p", text, "--method", "snapkv", "--budget", "100000", "-n", "1",
                                "--dump-capture", cap], capture_output=True, text=True, errors="replace")
            if r.returncode != 0:
                sys.exit(f"ecokv run failed:\n{r.stderr}")
            got = read_safetensors(cap)
            ref_kv = model.cache(it["images"], text) if is_qwen else torch_kv(model, it["images"][0], text)
            for layer, (k, v) in enumerate(ref_kv):
                for name, ref in (("keys", k), ("values", v)):
                    cached = got[f"layers.{layer}.{name}"].astype(np.float32)
                    if cached.shape != ref.shape:
                        sys.exit(f"layer {layer} {name}: llama.cpp shape {cached.shape}, torch {ref.shape}")
                    rms = float(np.linalg.norm(cached - ref) / np.linalg.norm(ref))
                    err_max = float(np.abs(cached - ref).max() / np.abs(ref).max())
                    worst, worst_max = max(worst, rms), max(worst_max, err_max)
                    print(f"item {seed} layer {layer} {name}: relative RMS error {rms:.2e}, "
                          f"max error / max |value| {err_max:.2e}")
    print(f"worst relative RMS error {worst:.2e} (tolerance {a.tol:.0e}); worst max error / max |value| {worst_max:.2e}")
    sys.exit(0 if worst <= a.tol else 1)


if __name__ == "__main__":
    main()
