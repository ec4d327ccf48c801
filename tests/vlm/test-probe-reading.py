#!/usr/bin/env python3
"""vlm/probe_reading.py: where the pointer heads' largest attention weight lands, checked against a second,
straightforward computation on a random-weight tiny-qwen2vl: for each answer character, the prompt is cut after the
position that predicts it (attention is causal, so that query's weights are unchanged), the answer's cell is taken
from the page's (row, column) and the image's start from the <|vision_start|> token. Also classify() on cases
written out by hand, and the CLI's refusals. Needs torch (scripts/setup.sh --training); exits 77 (skipped) without.
Usage: test-probe-reading.py ROOT"""

import os
import subprocess
import sys

try:
    import torch
except ImportError:
    print("torch missing: skipped")
    sys.exit(77)

ROOT = sys.argv[1]
from checks import check, finish  # noqa: E402  (tests/vlm/checks.py)
sys.path.insert(0, os.path.join(ROOT, "vlm"))
import gen_pages  # noqa: E402
import probe_reading as P  # noqa: E402
from blocks import encode  # noqa: E402
from qwen2vl import VISION_START_ID, Config, TinyQwen2VL, prompt, vocab  # noqa: E402

# classify: a 10-column page of 30 cells; the answer's cell is 13 (row 1, column 3)
check([P.classify(t, 13, 10, 30) for t in (13, 10, 19, 3, 23, 29, -1, -5, 30, 40)] ==
      [0, 1, 1, 2, 2, 2, 3, 3, 3, 3], "classify: the cell, its row, other rows, tokens outside the image")

torch.manual_seed(5)
model = TinyQwen2VL(Config(n_vocab=len(vocab()[0]))).eval()
items = [it for it in (gen_pages.item(seed, "qa") for seed in range(8)) if len(it["answer"]) >= 4][:3]  # test seeds
layers = [1, 3]
where, right, total = P.probe(model, items, layers)

expect = {(il, g): [0] * 4 for il in layers for g in range(2)}
n_right = n_total = 0
with torch.no_grad():
    for it in items:
        img = it["images"][0]
        rows, cols = img.shape[0] // 8, img.shape[1] // 8
        ids, pos, _, p = prompt([(rows, cols)], it["context"] + "\n" + it["question"])
        start = ids.index(VISION_START_ID) + 1
        feats = model.vision(torch.from_numpy(img[None]))
        answer = encode(it["answer"]) + [2]  # </s>
        full, full_pos = ids + answer, pos + [(p + i,) * 3 for i in range(len(answer))]
        logits, _ = model(model.embed(torch.tensor([full[:-1]]), feats, [(0, start)]), torch.tensor([full_pos[:-1]]))
        got = logits[0, len(ids) - 1:].argmax(-1)
        n_right += int((got == torch.tensor(answer)).sum())
        n_total += len(answer)
        for i, cell in enumerate(it["cells"]):
            if cell is None:
                continue
            _, r, c = cell
            n = len(ids) + i  # tokens up to and including the one that predicts answer character i
            _, probs = model(model.embed(torch.tensor([full[:n]]), feats, [(0, start)]), torch.tensor([full_pos[:n]]),
                             layers)
            for il in layers:
                for g in range(2):
                    top = int(probs[il][0, 2 * g, -1].argmax()) - start
                    kind = 3 if not 0 <= top < rows * cols else 0 if top == r * cols + c else \
                        1 if top // cols == r else 2
                    expect[il, g][kind] += 1
check(where == expect, f"pointer heads' landing places as a straightforward computation finds them: {where}")
check((right, total) == (n_right, n_total), f"teacher-forced answer tokens: {right}/{total} == {n_right}/{n_total}")
check(sum(where[layers[0], 0]) == sum(c is not None for it in items for c in it["cells"]) > 0,
      "one count per answer character")

script = os.path.join(ROOT, "vlm", "probe_reading.py")
bad = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checks.py")  # exists, not a checkpoint
for args, message in ((["x.pt", "--items", "0"], "--items: 1 to 128"), (["missing.pt"], "missing.pt: no such file"),
                      ([bad, "--layers", "2,x"], "--layers: comma-separated"), ([bad], "not a tiny-qwen2vl checkpoint")):
    r = subprocess.run([sys.executable, script] + args, capture_output=True, text=True)
    check(r.returncode in (1, 2) and message in r.stderr and "Traceback" not in r.stderr, f"refused: {' '.join(args)}")

finish()
