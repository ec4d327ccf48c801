#!/usr/bin/env python3
"""Where reading fails on resized pages (docs/investigations/tiny-qwen2vl-smaller-images.md, "Where reading fails").

For a tiny-qwen2vl checkpoint, on N held-out QA items (seeds 230000 + i) drawn natively and resized by mtmd's rule to a
share of the native tokens: greedy exact match; teacher-forced answer characters; the vision's glyph head on tokens
whose target is one character (spaces left out); and whether the pointer heads' most attended image token is the
answer character's.

    /usr/bin/python3 vlm/diag_resized.py vlm/runs/qwen2-grow/ckpt.pt [--items 48]
"""
import argparse
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_pages  # noqa: E402
import trainer  # noqa: E402
import train_qwen2vl as T  # noqa: E402
from qwen2vl import Config, TinyQwen2VL  # noqa: E402

SEED0 = 230000  # held-out diagnosis items (below 250,000)


def diagnose(model, share, n):
    items = [gen_pages.item(SEED0 + i, "qa", token_share=share if share < 1 else None) for i in range(n)]
    right = trainer.exact_matches(model, items, T.greedy, 16)
    with torch.no_grad():
        tokens, positions, target, slots, cell_targets, pointers = T.make_batch(items, 1)
        feats = T.vision_feats(model, [it["images"][0] for it in items])
        logits, probs = model(model.embed(tokens[:, :-1], feats, slots), positions[:, :-1], [2, 3])
        tgt = target[:, :-1]
        m = tgt != -100
        chars = (logits.argmax(-1)[m] == tgt[m]).float().mean().item()
        g_ok = g_n = 0
        for f, cells in zip(feats, cell_targets):
            if cells is None:
                continue
            glyph = cells[0]
            ink = (glyph != -100) & (glyph != glyph.mode().values)  # not the commonest target (space)
            g_ok += (model.glyph_logits(f).argmax(-1)[ink] == glyph[ink]).sum().item()
            g_n += ink.sum().item()
        c = model.c
        heads = torch.arange(0, c.n_head, c.n_head // c.n_head_kv)
        p_ok = 0.0
        for il in (2, 3):
            pr = probs[il][pointers[:, 0]][:, heads]
            pr = pr[torch.arange(len(pointers)), :, pointers[:, 1]]
            p_ok += (pr.argmax(-1) == pointers[:, 2, None]).float().mean().item() / 2
    return right, chars, g_ok / max(1, g_n), p_ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt")
    ap.add_argument("--items", type=int, default=48)
    a = ap.parse_args()
    torch.set_num_threads(1)
    ck = torch.load(a.ckpt)
    model = TinyQwen2VL(Config(**ck["config"]))
    model.load_state_dict(ck["model"], strict=False)
    model.eval()
    print(f"{a.ckpt}: step {ck['step']}, {a.items} items")
    print("share of native tokens | exact | answer chars (teacher-forced) | glyphs named | pointer on the answer")
    for share in (1.0, 0.9, 0.75, 0.6, 0.5):
        right, chars, glyphs, ptr = diagnose(model, share, a.items)
        print(f"{share:>4} | {right}/{a.items} | {chars:.3f} | {glyphs:.3f} | {ptr:.3f}")


if __name__ == "__main__":
    main()
