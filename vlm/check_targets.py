#!/usr/bin/env python3
"""The properties the ECOKV paper's claims rest on, measured for a tiny VLM (issue 14's targets), before training
(--init: the model as train*.py initialises it, same seed) or after (a checkpoint, or tiny-vlm's export prefix).

  python3 vlm/check_targets.py vlm/runs/qwen2/ckpt.pt --out models/tiny-qwen2vl-targets.json
  python3 vlm/check_targets.py models/tiny-vlm --out models/tiny-vlm-targets.json
  python3 vlm/check_targets.py vlm/runs/qwen2/ckpt.pt --init --out vlm/runs/qwen2/targets-init.json

Three groups of measures, on held-out items (seeds 240200..240219 for pages, 240300..240399 for questions; below
the reserved 250,000-999,999 and apart from every evaluation set):
- data (the generator): image tokens per page at the default size, share of background cells, and whether every
  glyph's ink covers 2x2 ViT patches (the 5x7 box of tiny-qwen2vl's glyphs always does; narrow characters' ink not);
- geometry (the export run by llama.cpp: `ecokv analyze` and `ecokv run --dump-capture` on each page): mean pairwise
  key cosine per (layer, KV head) (Figure 1), the share of background image tokens whose key has a near-duplicate
  (another image token's key at cosine >= 0.95 in the same head), and ECOKV's r_C, r_E and lambda per head;
- decisions (PyTorch, teacher-forced): of the questions the full model answers right, the share that one
  (layer, KV group) alone decides: answered wrong once that group's query heads cannot attend to the image tokens
  showing the answer (every other group sees everything). The target is at most 0.5 for every group.
Writes FILE (JSON) and prints a table. Needs torch (scripts/setup.sh --training) and a built ecokv.
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import export  # noqa: E402
import export_qwen2vl  # noqa: E402
import gen_docs  # noqa: E402
import gen_pages  # noqa: E402
import qwen2vl  # noqa: E402
from blocks import EOS, causal_mask, encode  # noqa: E402
from model import Config, TinyVLM, prompt_tokens, rotary  # noqa: E402

PAGE_SEED, QA_SEED = 240_200, 240_300
NEAR = 0.95


# --- the two models behind one interface --------------------------------------------------------------------------
class Llava:
    """tiny-vlm: gen_docs pages (12 x 12 cells, one per ViT patch), LLaVA prompt and RoPE."""
    gen, cell = gen_docs, 8

    def __init__(self, model):
        self.m = model

    @staticmethod
    def grid(it):
        return it["pages"][0]

    def answer_tokens(self, it, start):
        cells = gen_docs.answer_cells(it["pages"], it["question"], it["answer"])
        return [start + r * gen_docs.GRID + c for _, r, c in (x for x in cells if x is not None)]

    def inputs(self, it):
        c = self.m.c
        ids, slots = prompt_tokens(1, (c.image_size // c.patch_size) ** 2, it["context"], it["question"])
        n = len(ids)
        ids = ids + encode(it["answer"]) + [EOS]
        x = self.m.embed(torch.tensor([ids]), self.m.vision(torch.from_numpy(it["images"][0][None])), [(0, slots[0])])
        return ids, n, slots[0], x, rotary(len(ids), c)

    def export(self, prefix):
        sd = self.m.state_dict()
        export.write(export.load_gguf_py(GGUF_PY), prefix + ".gguf", "llama", *export.text_model(sd, self.m.c, "check"))
        export.write(export.load_gguf_py(GGUF_PY), prefix + "-mmproj.gguf", "clip", *export.projector(sd, self.m.c, "check"))


class Qwen:
    """tiny-qwen2vl: gen_pages pages (one image token per 8x8 cell), M-RoPE prompt."""
    gen, cell = gen_pages, 8

    def __init__(self, model):
        self.m = model

    @staticmethod
    def grid(it):
        return it["grids"][0]

    def answer_tokens(self, it, start):
        cols = it["images"][0].shape[1] // 8
        return [start + r * cols + c for _, r, c in (x for x in it["cells"] if x is not None)]

    def inputs(self, it):
        ids, pos, slots, p = qwen2vl.prompt([(img.shape[0] // 8, img.shape[1] // 8) for img in it["images"]],
                                            it["context"] + "\n" + it["question"])
        n = len(ids)
        qwen2vl.extend(ids, pos, p, encode(it["answer"]) + [EOS])
        x = self.m.embed(torch.tensor([ids]), [self.m.vision(torch.from_numpy(it["images"][0][None]))[0]], [(0, slots[0])])
        return ids, n, slots[0], x, qwen2vl.rotary(torch.tensor([pos]), self.m.c)

    def export(self, prefix):
        sd = self.m.state_dict()
        gguf = export.load_gguf_py(GGUF_PY)
        export.write(gguf, prefix + ".gguf", "qwen2vl", *export_qwen2vl.text_model(sd, self.m.c, "check"))
        export.write(gguf, prefix + "-mmproj.gguf", "clip", *export_qwen2vl.projector(sd, self.m.c, "check"))


GGUF_PY = os.path.join(HERE, "..", "third_party", "llama.cpp", "gguf-py")


def load(path, init):
    """(Llava or Qwen) for a checkpoint or a tiny-vlm export prefix; init: the same architecture freshly
    initialised with the training seed (what training starts from)."""
    ck = torch.load(path, map_location="cpu") if os.path.isfile(path) else export.import_gguf(path)
    is_qwen = "rope_sections" in ck["config"]
    torch.manual_seed((ck.get("args") or {}).get("seed", 1))
    model = qwen2vl.TinyQwen2VL(qwen2vl.Config(**ck["config"])) if is_qwen else TinyVLM(Config(**ck["config"]))
    if not init:
        model.load_state_dict(ck["model"])
    model.eval()
    return Qwen(model) if is_qwen else Llava(model)


# --- data ---------------------------------------------------------------------------------------------------------
def data_targets(kind, n):
    tokens, background, spans = [], [], []
    for i in range(n):
        it = kind.gen.item(PAGE_SEED + i, "qa")
        grid, img = kind.grid(it), it["images"][0]
        glyph = np.array([[ch != " " for ch in row] for row in grid])
        tokens.append(glyph.size)
        background.append(1 - glyph.mean())
        dark = img.min(-1) < 100
        patch = 4 if isinstance(kind, Qwen) else 8
        for r, c in zip(*np.nonzero(glyph)):
            ys, xs = np.nonzero(dark[r * 8: r * 8 + 8, c * 8: c * 8 + 8])
            spans.append(len(set(ys // patch)) >= 2 and len(set(xs // patch)) >= 2)
    return {"pages": n, "image_tokens_min": int(min(tokens)), "image_tokens_mean": float(np.mean(tokens)),
            "background_share": float(np.mean(background)), "glyphs_over_2x2_patches": float(np.mean(spans))}


# --- geometry through llama.cpp ------------------------------------------------------------------------------------
def read_keys(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8: 8 + n])
    out = {}
    for name, h in header.items():
        if name.endswith(".keys"):
            a, b = h["data_offsets"]
            dtype = {"F32": np.float32, "F16": np.float16}[h["dtype"]]
            out[int(name.split(".")[1])] = np.frombuffer(raw[8 + n + a: 8 + n + b], dtype).reshape(h["shape"]).astype(np.float32)
    return out


def geometry(kind, n, ecokv, tmp):
    prefix = os.path.join(tmp, "model")
    kind.export(prefix)
    per_head, dup = {}, {}
    for i in range(n):
        it = kind.gen.item(PAGE_SEED + i, "qa")
        png, an, cap = (os.path.join(tmp, f) for f in ("page.png", "an", "cap.safetensors"))
        open(png, "wb").write(kind.gen.png_bytes(it["images"][0]))
        common = ["--model", prefix + ".gguf", "--mmproj", prefix + "-mmproj.gguf", "--image", png, "-p", "", "-t", "2"]
        subprocess.run([ecokv, "analyze", *common, "--out", an, "--no-plots", "-m", "snapkv+ecokv", "-b", "64"],
                       check=True, capture_output=True)
        subprocess.run([ecokv, "run", *common, "-m", "snapkv", "-b", "100000", "-n", "1", "--dump-capture", cap],
                       check=True, capture_output=True)
        a = json.load(open(os.path.join(an, "analysis.json")))
        for h in a["heads"]:
            per_head.setdefault((h["layer"], h["kv_head"]), []).append(
                [h["pair_cos_mean"], h["near_duplicates"], h["r_c"], h["r_e"], h["lambda"]])
        first, grid = a["images"][0]["first_cell"], kind.grid(it)
        bg = np.array([ch == " " for row in grid for ch in row])
        for layer, keys in read_keys(cap).items():
            for g in range(keys.shape[0]):
                k = keys[g, first: first + bg.size]
                k = k / np.linalg.norm(k, axis=1, keepdims=True)
                cos = k @ k.T
                np.fill_diagonal(cos, -1)
                dup.setdefault((layer, g), []).append(float((cos.max(1)[bg] >= NEAR).mean()))
    heads = []
    for (layer, g), v in sorted(per_head.items()):
        m = np.mean(v, 0)
        heads.append({"layer": layer, "kv_head": g, "pair_cos_mean": m[0], "near_duplicates_all": m[1], "r_c": m[2],
                      "r_e": m[3], "lambda": m[4], "background_near_duplicates": float(np.mean(dup[(layer, g)]))})
    return heads


# --- decisions (PyTorch) ----------------------------------------------------------------------------------------------
@torch.no_grad()
def decisions(kind, n):
    m = kind.m
    c = m.c
    rep = c.n_head // c.n_head_kv
    right, decided = 0, np.zeros((c.n_layer, c.n_head_kv))
    for i in range(n):
        it = kind.gen.item(QA_SEED + i, "qa")
        ids, start, slot, x0, rotate = kind.inputs(it)
        t = len(ids)
        target = torch.tensor(ids[start:])
        base = causal_mask(t)

        def answers(ablate=None):
            x = x0
            for il, layer in enumerate(m.layers):
                mask = base
                if ablate is not None and ablate[0] == il:
                    mask = base.expand(c.n_head, t, t).clone()
                    heads = slice(ablate[1] * rep, (ablate[1] + 1) * rep)
                    mask[heads, :, kind.answer_tokens(it, slot)] = float("-inf")
                x = layer(x, rotate, mask)
            logits = m.out(m.norm(x))[0, start - 1: t - 1]
            return bool((logits.argmax(-1) == target).all())

        if not answers():
            continue
        right += 1
        for il in range(c.n_layer):
            for g in range(c.n_head_kv):
                decided[il, g] += not answers((il, g))
    share = decided / max(1, right)
    return {"items": n, "right_with_full_cache": right,
            "decided_share": [[float(v) for v in row] for row in share], "max_decided_share": float(share.max())}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="training checkpoint, or tiny-vlm's export prefix")
    ap.add_argument("--init", action="store_true", help="measure the model at initialisation (before training)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--pages", type=int, default=20)
    ap.add_argument("--questions", type=int, default=100)
    ap.add_argument("--ecokv", default=os.path.join(HERE, "..", "build", "bin", "ecokv"))
    a = ap.parse_args()
    kind = load(a.model, a.init)
    with tempfile.TemporaryDirectory() as tmp:
        result = {"model": a.model, "init": a.init, "data": data_targets(kind, a.pages),
                  "geometry": geometry(kind, a.pages, a.ecokv, tmp), "decisions": decisions(kind, a.questions)}
    tmp_out = a.out + ".tmp"
    with open(tmp_out, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp_out, a.out)
    d = result["data"]
    print(f"data: {d['image_tokens_min']}-{d['image_tokens_mean']:.0f} image tokens, background {d['background_share']:.2f}, "
          f"glyphs over 2x2 patches {d['glyphs_over_2x2_patches']:.2f}")
    print("layer head  mean cos  near-dup(bg)  r_C    r_E    lambda  decided")
    for h in result["geometry"]:
        share = result["decisions"]["decided_share"][h["layer"]][h["kv_head"]]
        print(f"{h['layer']:5d} {h['kv_head']:4d} {h['pair_cos_mean']:9.3f} {h['background_near_duplicates']:12.3f} "
              f"{h['r_c']:6.3f} {h['r_e']:6.3f} {h['lambda']:7.3f} {share:8.3f}")
    print(f"decisions: {result['decisions']['right_with_full_cache']}/{a.questions} right with the full cache; the "
          f"largest share decided by one group {result['decisions']['max_decided_share']:.3f}; wrote {a.out}")


if __name__ == "__main__":
    main()
