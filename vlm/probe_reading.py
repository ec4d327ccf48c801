#!/usr/bin/env python3
"""Where a tiny-qwen2vl checkpoint reads from: teacher-forced accuracy of answer tokens, greedy exact match, and for
the pointer heads (one query head per KV group in --layers), where their largest attention weight lands at the
answer positions: the answer character's cell, the right row at another column, another row, or a text token.

  python3 vlm/probe_reading.py vlm/runs/qwen2/ckpt.pt --items 48

Items are the watch set's first --items (held-out seeds 230000.., gen_pages.py), as the learning curve measures them.
This is the measure behind vlm/README.md's "wrong row" diagnosis of run qwen1. Prints a table and, with --json, the
figures as JSON."""

import argparse
import json
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy and torch load OpenBLAS (train_qwen2vl.py says why)
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_pages  # noqa: E402
import train_qwen2vl as T  # noqa: E402
import trainer  # noqa: E402
from qwen2vl import Config, TinyQwen2VL  # noqa: E402

WHERE = ("cell", "same row", "other row", "text")


def load(path):
    ck = torch.load(path, map_location="cpu")
    model = TinyQwen2VL(Config(**ck["config"]))
    model.load_state_dict(ck["model"])
    return model.eval(), ck["step"]


@torch.no_grad()
def probe(model, items, layers):
    """({(layer, group): counts per WHERE}, right answer tokens, answer tokens) over the items' first questions."""
    c = model.c
    where = {(il, g): [0] * len(WHERE) for il in layers for g in range(c.n_head_kv)}
    right = total = 0
    for it in items:
        tokens, positions, target, slots, _, pointers = T.make_batch([it], 1)
        feats = T.vision_feats(model, it["images"])
        logits, probs = model(model.embed(tokens[:, :-1], feats, slots), positions[:, :-1], layers)
        answer = target[0, :-1] != -100
        right += int((logits[0].argmax(-1)[answer] == target[0, :-1][answer]).sum())
        total += int(answer.sum())
        cols = T.grid_shape(it["images"][0])[1]
        start, n_cells = slots[0][1], sum(f.shape[0] for f in feats)
        for _, query, key in pointers.tolist():
            for il in layers:
                for g in range(c.n_head_kv):
                    top = int(probs[il][0, g * (c.n_head // c.n_head_kv), query].argmax())
                    where[il, g][classify(top - start, key - start, cols, n_cells)] += 1
    return where, right, total


def classify(top, cell, cols, n_cells):
    """Index into WHERE of the attended token `top` against the answer's `cell` (both relative to the first image
    token; a single page of `cols` columns)."""
    if not 0 <= top < n_cells:
        return 3
    if top == cell:
        return 0
    return 1 if top // cols == cell // cols else 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--items", type=int, default=48)
    ap.add_argument("--layers", default="2,3", help="layers whose pointer heads are probed")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args()
    if not 1 <= a.items <= 128:
        ap.error("--items: 1 to 128 (the watch set)")
    if not os.path.isfile(a.checkpoint):
        ap.error(f"{a.checkpoint}: no such file")
    torch.set_num_threads(1)
    try:
        layers = [int(x) for x in a.layers.split(",")]
    except ValueError:
        ap.error("--layers: comma-separated layer numbers")
    try:
        model, step = load(a.checkpoint)
    except Exception as e:  # torch.load/load_state_dict raise several types on a corrupt or foreign file
        sys.exit(f"probe_reading: {a.checkpoint}: not a tiny-qwen2vl checkpoint ({e})")
    if any(not 0 <= il < model.c.n_layer for il in layers):
        ap.error(f"--layers: 0 to {model.c.n_layer - 1}")
    items = [gen_pages.item(trainer.EVAL_SEED + i, "qa") for i in range(a.items)]
    where, right, total = probe(model, items, layers)
    exact = T.evaluate(model, items) / len(items)
    print(f"step {step}, {a.items} watch items: answer tokens {right / total:.1%} right (teacher-forced), greedy "
          f"exact {exact:.1%}")
    print("| pointer head | " + " | ".join(WHERE) + " |\n|---|" + "---:|" * len(WHERE))
    for (il, g), n in where.items():
        print(f"| layer {il} group {g} | " + " | ".join(f"{x / max(1, sum(n)):.1%}" for x in n) + " |")
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump({"step": step, "items": a.items, "answer_tokens_right": right / total, "exact": exact,
                       "pointer_heads": [{"layer": il, "group": g, **{w: x / max(1, sum(n)) for w, x in zip(WHERE, n)}}
                                         for (il, g), n in where.items()]}, f, indent=1)
        os.replace(a.json + ".tmp", a.json)  # never a half-written file


if __name__ == "__main__":
    main()
