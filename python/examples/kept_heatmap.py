"""The tiny-qwen2vl sample page asked through the session, compressed by AdaKV + ECOKV, and a heatmap of how many
(layer, KV head) pairs kept each image patch (matplotlib), written to OUT.png.
    python3 python/examples/kept_heatmap.py [OUT.png]        (from the repository root)"""
import sys

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

import ecokv

out = sys.argv[1] if len(sys.argv) > 1 else "kept-heatmap.png"
image = "models/tiny-qwen2vl-sample/images/qa-240014.png"
m = ecokv.Model("models/tiny-qwen2vl.gguf", mmproj="models/tiny-qwen2vl-mmproj.gguf")
seq = m.prefill("", [image], max_tokens=12).compress(method="adakv+ecokv", budget=100)
answer = seq.ask("What is the TOTAL?", max_tokens=12)

first, rows, cols = 2, 21, 24  # the page's image cells: after BOS and <|vision_start|>, a 21 x 24 token grid
counts = np.zeros(rows * cols)
for layer in seq.kept():
    for head in layer:
        inside = head[(head >= first) & (head < first + rows * cols)]
        counts[inside - first] += 1
fig, ax = plt.subplots(figsize=(6, 5))
ax.imshow(plt.imread(image), extent=(0, cols, rows, 0))
shown = ax.imshow(counts.reshape(rows, cols), cmap="Reds", alpha=0.6, extent=(0, cols, rows, 0))
fig.colorbar(shown, label="(layer, KV head) pairs keeping the patch")
ax.set_title(f"AdaKV + ECOKV, budget 100: '{answer}'")
fig.savefig(out, dpi=100)
print(f"{out}: {int(counts.sum())} kept image entries over {rows * cols} patches; answer {answer!r}")
sys.exit(0 if answer == "64.02" else 1)
