"""N copies of the sample receipt, each with one pixel changed: the same page to the model, another image (another
hash) to a cache. Run with Debian's python3 (python3-pil, scripts/setup.sh).
    page-variants.py SAMPLE.png N DIR   ->  DIR/page-0.png ... DIR/page-{N-1}.png"""
import sys

from PIL import Image

sample, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
page = Image.open(sample).convert("RGB")
for i in range(n):
    p = page.copy()
    p.putpixel((0, 0), (i * 7 % 256, 255 - i, 128))
    p.save(f"{out}/page-{i}.png")
