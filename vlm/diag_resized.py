#!/usr/bin/env python3
"""Where reading fails on resized pages (docs/investigations/tiny-qwen2vl-smaller-images.md, "Where reading fails").

For a tiny-qwen2vl checkpoint, on N held-out QA items (seeds 230000 + i) drawn natively and resized by mtmd's rule to a
share of the native tokens: greedy exact match; teacher-forced answer characters, all of them, then split by whether
the character's token holds its ink centre alone or shares it with other centres (a resized token holds up to 4);
the vision's glyph head on tokens whose target is one character (spaces left out); the glyph slots (a training-only
readout, vlm/runs/qwen2-v3/PLAN.md amendment 1) on tokens holding two or more centres, each token named whole (only
for a checkpoint that has them); and whether the pointer heads' most attended image token is the answer character's.

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


def ratio(k, n):
    return f"{k / n:.3f}" if n else "-"


def diagnose(model, share, n, with_slots):
    items = [gen_pages.item(SEED0 + i, "qa", token_share=share if share < 1 else None) for i in range(n)]
    right = trainer.exact_matches(model, items, T.greedy, 16)
    with torch.no_grad():
        tokens, positions, target, slots, cell_targets, pointers = T.make_batch(items, 1)
        feats = T.vision_feats(model, [it["images"][0] for it in items])
        logits, probs = model(model.embed(tokens[:, :-1], feats, slots), positions[:, :-1], [2, 3])
        tgt = target[:, :-1]
        m = tgt != -100
        hit = logits.argmax(-1) == tgt
        chars = hit[m].float().mean().item()
        split = {True: [0, 0], False: [0, 0]}  # centre alone in its token: [right, all]
        starts = dict(slots)  # one image per item
        for row, query, key in pointers.tolist():
            alone = int((cell_targets[row][2][key - starts[row]] != -100).sum()) <= 2  # one glyph, then EOS
            split[alone][0] += int(hit[row, query])
            split[alone][1] += 1
        g_ok = g_n = s_ok = s_n = 0
        for f, cells in zip(feats, cell_targets):
            if cells is None:
                continue
            glyph, _, glyph_slots = cells
            ink = (glyph != -100) & (glyph != glyph.mode().values)  # not the commonest target (space)
            g_ok += (model.glyph_logits(f).argmax(-1)[ink] == glyph[ink]).sum().item()
            g_n += ink.sum().item()
            shared = (glyph_slots != -100).sum(1) > 2
            if with_slots and shared.any():
                named = (model.slot_logits(f[shared]).argmax(-1) == glyph_slots[shared]) | (glyph_slots[shared] == -100)
                s_ok += int(named.all(1).sum())
                s_n += int(shared.sum())
        c = model.c
        heads = torch.arange(0, c.n_head, c.n_head // c.n_head_kv)
        p_ok = 0.0
        for il in (2, 3):
            pr = probs[il][pointers[:, 0]][:, heads]
            pr = pr[torch.arange(len(pointers)), :, pointers[:, 1]]
            p_ok += (pr.argmax(-1) == pointers[:, 2, None]).float().mean().item() / 2
    return (f"{right}/{n} | {chars:.3f}: {ratio(*split[True])} / {ratio(*split[False])} ({split[False][1]}) | "
            f"{ratio(g_ok, g_n)} | {ratio(s_ok, s_n)} | {p_ok:.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt")
    ap.add_argument("--items", type=int, default=48)
    a = ap.parse_args()
    torch.set_num_threads(1)
    ck = torch.load(a.ckpt)
    model = TinyQwen2VL(Config(**ck["config"]))
    model.load_state_dict(ck["model"])
    model.eval()
    # a run without --slot-weight saves the readout as it starts, all zeros: nothing to report
    with_slots = bool(ck["model"].get("glyph_slots.weight", torch.zeros(1)).any())
    print(f"{a.ckpt}: step {ck['step']}, {a.items} items")
    print("share of native tokens | exact | answer tokens right (teacher-forced): all, with EOS: characters whose "
          "centre is alone / shared (how many shared) | glyphs named | tokens of 2+ glyphs named whole (glyph slots) | "
          "pointer on the answer")
    for share in (1.0, 0.9, 0.75, 0.6, 0.5):
        print(f"{share:>4} | {diagnose(model, share, a.items, with_slots)}", flush=True)


if __name__ == "__main__":
    main()
