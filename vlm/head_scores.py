#!/usr/bin/env python3
"""SparseMM's visual-head scores for a tiny VLM checkpoint (tiny-vlm or tiny-qwen2vl), the SparseMM way, in its
official JSON format (what `--head-scores` of sparsemm reads).

  python3 vlm/head_scores.py models/tiny-vlm --out models/tiny-vlm-head-scores.json      # a GGUF export, or
  python3 vlm/head_scores.py vlm/runs/qwen2/ckpt.pt --out models/tiny-qwen2vl-head-scores.json

SparseMM (visual_head/*_visual_head.py; ../shared/notes/reference-implementations.md 2.6) runs the model on OCR
images and, for each output token that matches a text whose bounding box is known, adds 1/|box tokens| to every
(layer, query head) whose top-1 attention from that token's query row falls inside the box; a head's scores per
sample go to head_score["l-h"]. Here the OCR task is the generator's own transcription ("Read all text."), whose
every character's cell is known (one image token per character, so a box is one token): for each character of the
reference transcription, teacher-forced, every head whose most attended position (over the whole prompt, as in
SparseMM) is that character's image token scores 1. Teacher forcing on the reference instead of SparseMM's greedy
decode differs only where the model misreads (it transcribes 96% of characters right).

Items: held-out seeds 240100..240199 (--seed, --items), below the reserved 250,000-999,999 and apart from every
evaluation set (vlm/README.md).
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_docs  # noqa: E402
import gen_pages  # noqa: E402
import qwen2vl  # noqa: E402
from blocks import EOS, encode  # noqa: E402
from model import Config, TinyVLM, prompt_tokens  # noqa: E402


def llava_attention(model, it):
    """(layer -> (H, T, T) attention), answer start, cell -> position map for a tiny-vlm item."""
    c = model.c
    n_patches = (c.image_size // c.patch_size) ** 2
    ids, slots = prompt_tokens(1, n_patches, it["context"], it["question"])
    start = len(ids)
    ids = ids + encode(it["answer"]) + [EOS]
    x = model.embed(torch.tensor([ids]), model.vision(torch.from_numpy(it["images"][0][None])), [(0, slots[0])])
    probs = {il: model(x, probe_layer=il)[1][0] for il in range(c.n_layer)}
    n_grid = c.image_size // c.patch_size
    cells = [None if x is None else slots[0] + x[1] * n_grid + x[2]
             for x in gen_docs.answer_cells(it["pages"], it["question"], it["answer"])]
    return probs, start, cells


def qwen_attention(model, it):
    ids, pos, slots, p = qwen2vl.prompt([(img.shape[0] // 8, img.shape[1] // 8) for img in it["images"]],
                                        it["context"] + "\n" + it["question"])
    start = len(ids)
    qwen2vl.extend(ids, pos, p, encode(it["answer"]) + [EOS])
    feats = [model.vision(torch.from_numpy(img[None]))[0] for img in it["images"]]
    x = model.embed(torch.tensor([ids]), feats, [(0, s) for s in slots])
    _, probs = model(x, torch.tensor([pos]), probe_layers=range(model.c.n_layer))
    cols = it["images"][0].shape[1] // 8
    cells = [None if x is None else slots[x[0]] + x[1] * cols + x[2] for x in it["cells"]]
    return {il: p[0] for il, p in probs.items()}, start, cells


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="training checkpoint, or the export prefix of tiny-vlm (PREFIX.gguf)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=240_100)
    ap.add_argument("--items", type=int, default=100)
    a = ap.parse_args()
    if a.seed < 0 or a.seed + a.items > 250_000:
        ap.error("head-score items must use held-out seeds below 250,000")
    if os.path.isfile(a.checkpoint):
        ck = torch.load(a.checkpoint, map_location="cpu")
    else:
        from export import import_gguf

        ck = import_gguf(a.checkpoint)
    is_qwen = "rope_sections" in ck["config"]
    model = qwen2vl.TinyQwen2VL(qwen2vl.Config(**ck["config"])) if is_qwen else TinyVLM(Config(**ck["config"]))
    model.load_state_dict(ck["model"])
    model.eval()
    c = model.c
    scores = {f"{il}-{h}": [] for il in range(c.n_layer) for h in range(c.n_head)}
    for i in range(a.items):
        it = (gen_pages if is_qwen else gen_docs).item(a.seed + i, "read")
        probs, start, cells = (qwen_attention if is_qwen else llava_attention)(model, it)
        for il, p in probs.items():
            top = p.argmax(-1)  # (H, T): the most attended position of every query row
            for h in range(c.n_head):
                # the query row that outputs character k is start + k - 1
                hits = sum(1.0 for k, cell in enumerate(cells) if cell is not None and int(top[h, start + k - 1]) == cell)
                scores[f"{il}-{h}"].append(hits)
        print(f"\r{i + 1}/{a.items} items", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(scores, f)
    os.replace(tmp, a.out)
    means = {k: sum(v) / len(v) for k, v in scores.items()}
    best = sorted(means, key=means.get, reverse=True)[:4]
    print(f"wrote {a.out}; top heads (layer-head: mean hits per item): "
          + ", ".join(f"{k}: {means[k]:.1f}" for k in best), file=sys.stderr)


if __name__ == "__main__":
    main()
