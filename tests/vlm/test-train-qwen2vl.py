#!/usr/bin/env python3
"""tiny-qwen2vl's training (vlm/train_qwen2vl.py) and the machinery it shares with tiny-vlm's (vlm/trainer.py).
- Blinding (--blind): the schedule's share at each step; the items of a step do not depend on it; a blind (layer, KV group) gives its query heads
  exactly zero attention on the item's answer cells, leaves every other head, layer and item as without it, and
  drops its pointer head from the pointer loss; attention with a key mask equals a per-head softmax written out by
  hand, and its gradients pass gradcheck.
- The row probe's targets for a page written out by hand; the workers' shares of a step partition its items at
  like cost.
- A page resized by mtmd: glyph and row targets over its token grid, pointers on the tokens of the answer characters.
- Resuming drops log rows past the checkpoint's step.
- --init with --vit-blocks above the checkpoint's: the grown model computes the checkpoint's image tokens exactly
  (its new blocks start as identities), and other configuration differences are still refused.
- Resuming a checkpoint saved before a training-only module existed: the other parameters and their optimizer
  state come back by name, the new module starts without state; a checkpoint missing anything else is refused.
- --save-minutes saves when that much wall time has passed since the last save.
- tiny-qwen2vl v3's options: the items of runs without them are those of before they existed (hashes pinned from
  that code); the curriculum resizes and shifts its shares of the single pages from step 0; a step-0 batch of pages
  resized to 0.35-1x their tokens has as many image tokens as mtmd's floor(side / beta) sizes allow, in an M-RoPE
  grid of the image's shape; a wider, multi-head ViT gives one text-width token per 8x8 pixels with the parameters
  its sizes give; sizes whose heads cannot hold the 2-D rotary positions are refused.
- trainer.py: the learning rate's warmup and cosine; greedy decoding stops each row at its EOS or at max_new and
  extends the prompts in place; the watch set is decoded in batches of one image count with the model in eval mode;
  tiny-vlm's trainer (vlm/train.py, tested nowhere else) run 3 steps equals 2 steps, a stop and a resumed third, bit
  for bit, and logs each watched step once; a failing worker stops the others at once, finishing workers end the run.
Needs torch (scripts/setup.sh --training); exits 77 (skipped) without it. Usage: test-train-qwen2vl.py ROOT"""

import argparse
import hashlib
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

try:
    import torch
except ImportError:
    print("torch missing: skipped")
    sys.exit(77)

from checks import check, finish  # noqa: E402  (tests/vlm/checks.py)
VLM = os.path.join(sys.argv[1], "vlm")
sys.path.insert(0, VLM)
import train as V  # noqa: E402
import train_qwen2vl as T  # noqa: E402
import trainer  # noqa: E402
from blocks import BOS, EOS, attention, encode  # noqa: E402
from blocks import vocab as char_vocab  # noqa: E402
from model import Config as VlmConfig, TinyVLM  # noqa: E402
from qwen2vl import VISION_END_ID, VISION_START_ID, Config, TinyQwen2VL, vocab  # noqa: E402
from trainer import open_log, resume  # noqa: E402

# attention with a key mask against a loop over heads, queries and keys
torch.manual_seed(3)
b, h, hkv, t, d = 2, 4, 2, 5, 8
q, k, v = torch.randn(b, h, t, d), torch.randn(b, hkv, t, d), torch.randn(b, hkv, t, d)
causal = torch.full((t, t), float("-inf")).triu(1)
key_mask = torch.zeros(b, h, t)
key_mask[1, 2:4, 1] = float("-inf")
out = attention(q, k, v, causal, key_mask=key_mask)
ref = torch.zeros_like(out)
for bi in range(b):
    for hi in range(h):
        g = hi // (h // hkv)
        for i in range(t):
            keys = [j for j in range(i + 1) if key_mask[bi, hi, j] == 0]
            s = [float(q[bi, hi, i] @ k[bi, g, j]) / math.sqrt(d) for j in keys]
            w = [math.exp(x - max(s)) for x in s]
            ref[bi, hi, i] = sum(wj / sum(w) * v[bi, g, j] for wj, j in zip(w, keys))
check(torch.allclose(out, ref, atol=1e-5), "attention with a key mask equals the written-out softmax")
qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
check(torch.autograd.gradcheck(lambda a, b_, c: attention(a, b_, c, causal.double(), key_mask=key_mask.double()),
                               (qd, kd, vd)), "its gradients (the mask is added in place) pass gradcheck")

# the blinding schedule: the share of the last --blind-from step reached, none before the first
schedule = trainer.blind_schedule("0.5,0.75", "1000,3000")
check([trainer.blind_at(s, schedule) for s in (0, 999, 1000, 2999, 3000, 8000)] == [0.0, 0.0, 0.5, 0.5, 0.75, 0.75],
      "--blind 0.5,0.75 --blind-from 1000,3000: none, 0.5 from 1000, 0.75 from 3000")
for shares, steps in (("0.5", "1000,3000"), ("1.5", "1000"), ("0.5,0.6", "3000,1000"), ("x", "1")):
    try:
        trainer.blind_schedule(shares, steps)
        check(False, f"--blind {shares} --blind-from {steps} is refused")
    except ValueError as e:
        check("one share (0 to 1) for each step" in str(e) or "steps increasing" in str(e),
              f"--blind {shares} --blind-from {steps} is refused: {e}")

# the items of a step are the same with and without blinding
groups = [(il, g) for il in range(4) for g in range(2)]
plain = T.train_items(1, 2500, 6)
blinded = T.train_items(1, 2500, 6, 1.0, groups)
check([(it["question"], it["answer"]) for it in plain] == [(it["question"], it["answer"]) for it in blinded],
      "blinding leaves the step's items unchanged")
check(all(it["blind"] is None for it in plain) and all(it["blind"] in groups for it in blinded),
      "every item gets a blind group at --blind 1, none at 0")

# a blind group cannot see the answer cells; nothing else changes
model = TinyQwen2VL(Config(n_vocab=len(vocab()[0]))).eval()
items = [it for it in T.train_items(1, 2500, 12, 1.0, groups) if it["cells"] and len(it["images"]) == 1][:2]
items[0]["blind"], items[1]["blind"] = (2, 1), None
tokens, positions, _, slots, _, pointers = T.make_batch(items, 1)
masks = T.blind_masks(items, pointers, tokens.shape[1] - 1, model.c)
check(sorted(masks) == [2], "a key mask for the blind layer only")
with torch.no_grad():
    feats = T.vision_feats(model, [img for it in items for img in it["images"]])
    x = model.embed(tokens[:, :-1], feats, slots)
    logits0, probs0 = model(x, positions[:, :-1], range(4))
    logits1, probs1 = model(x, positions[:, :-1], range(4), masks)
cells = pointers[pointers[:, 0] == 0, 2]
check(len(cells) > 0, "the blinded item has answer cells")
check(float(probs1[2][0, 2:4][:, :, cells].abs().max()) == 0.0, "KV group 1 of layer 2 gives its answer cells 0")
check(float(probs1[2][0, 0:2][:, -1, cells].sum()) > 0.0, "KV group 0 of layer 2 still attends to them")
check(all(torch.equal(probs0[il], probs1[il]) for il in (0, 1)), "layers before the blind one are unchanged")
check(torch.equal(logits0[1], logits1[1]), "the item without a blind group is unchanged")
check(not torch.equal(logits0[0], logits1[0]), "the blinded item's outputs change")

# the pointer loss leaves out the blind group's pointer head (it cannot see the cell it would point at)
with torch.no_grad():
    sums, counts = T.batch_sums(model, [items], 1, [2, 3])
rows = pointers[:, 0]
terms = [-math.log(float(probs1[il][r, g * 2, q, key]) + 1e-6) for il in (2, 3) for g in range(2)
         for r, q, key in pointers.tolist() if not (r == 0 and (il, g) == (2, 1))]
check(counts[2] == 4 * len(pointers) - int((rows == 0).sum()), "one pointer term fewer per blinded answer cell")
check(abs(float(sums[2]) - sum(terms)) < 1e-3 * len(terms), "the pointer loss is the sum over the seeing heads")

# row probe targets: the first 3 characters of each cell's text line, -100 in rows without text
tax, total, blank = [encode(ch)[0] for ch in "TAX"], [encode(ch)[0] for ch in "TOT"], [-100] * 3
rows = T.row_targets(["  TAX  10.31 ", "             ", "TOTAL 1      "]).tolist()
check(rows == [tax] * 13 + [blank] * 13 + [total] * 13, "row targets of a 3-line page")
check(T.row_targets(["  7  "])[0].tolist() == [encode(ch)[0] for ch in "7  "], "a line shorter than 3 is padded")


def optimiser(m):  # as train_qwen2vl.train builds it
    decay = [p for n, p in m.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in m.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}])


# a checkpoint from before the row probe resumes into a model with it
torch.manual_seed(5)
old = TinyQwen2VL(Config(n_vocab=len(vocab()[0])))
del old.row_probe
old_opt = optimiser(old)
for p in old.parameters():
    p.grad = torch.randn_like(p)
old_opt.step()
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "ckpt.pt")
    torch.save({"model": old.state_dict(), "opt": old_opt.state_dict(), "step": 7, "seconds": 3.0,
                "config": old.c.to_dict()}, path)
    new = TinyQwen2VL(Config(n_vocab=len(vocab()[0])))
    new_opt = optimiser(new)
    check(resume(path, new, new_opt, optional=("row_probe.",)) == (7, 3.0), "resumed at the saved step")
    olds, news = dict(old.named_parameters()), dict(new.named_parameters())
    check(all(torch.equal(olds[n], news[n]) for n in olds), "every saved parameter is back")
    check(all(torch.equal(old_opt.state[olds[n]]["exp_avg_sq"], new_opt.state[news[n]]["exp_avg_sq"]) for n in olds),
          "every saved parameter's optimizer state is back, by name")
    check(news["row_probe.weight"] not in new_opt.state, "the new probe starts without optimizer state")
    for p in new.parameters():
        p.grad = torch.ones_like(p)
    new_opt.step()
    check(int(new_opt.state[news["row_probe.weight"]]["step"]) == 1, "and steps from there")
    try:
        resume(path, TinyQwen2VL(Config(n_vocab=len(vocab()[0]))), optimiser(new), optional=())
        refused = False
    except SystemExit:
        refused = True
    check(refused, "without the optional prefix, the same checkpoint is refused")

# the workers' shares: a partition of the step's items, of like cost. Step 2000 holds one three-page item, which costs
# about as much as the eleven single pages together
items = T.train_items(1, 2000, 12)
check(sorted(len(it["images"]) for it in items) == [1] * 11 + [3], "step 2000: eleven single pages and one of three")
shares = [[it for g in T.worker_groups(items, r, 2, 3) for it in g] for r in range(2)]
check(sorted(map(id, shares[0] + shares[1])) == sorted(map(id, items)), "two workers' shares partition the items")
groups = [g for r in range(2) for g in T.worker_groups(items, r, 2, 3)]
check(all(len({len(it["images"]) for it in g}) == 1 and len(g) <= 6 for g in groups),
      "each group holds at most 6 items of one image count")
lengths = [[len(T.make_batch([it], 3)[0][0]) for it in share] for share in shares]
loads = [sum(n * (n + 165) for n in ns) for ns in lengths]
check(abs(loads[0] - loads[1]) <= max(n * (n + 165) for ns in lengths for n in ns),
      f"the shares' estimated costs differ by at most one item's: {loads}")
multi = [r for r in range(2) if any(len(it["images"]) == 3 for it in shares[r])][0]
check(len(shares[multi]) < len(shares[1 - multi]), f"the worker with the three-page item gets fewer pages: {lengths}")
check(sorted(id(it) for g in T.worker_groups(items, 0, 1, 3) for it in g) == sorted(map(id, items)),
      "one worker gets every item")

# resuming drops log rows past the checkpoint's step, so no step is logged twice
with tempfile.TemporaryDirectory() as run:
    log, writer = open_log(run, 0)
    for step in (250, 500, 750):
        writer.writerow([step, step // 10, "1.0", "0.1", "0.2", "2e-3", "0.5"])
    log.close()
    log, writer = open_log(run, 500)
    writer.writerow([750, 99, "0.9", "0.1", "0.2", "2e-3", "0.6"])
    log.close()
    lines = open(os.path.join(run, "log.csv")).read().splitlines()
    check([ln.split(",")[:2] for ln in lines] == [["step", "seconds"], ["250", "25"], ["500", "50"], ["750", "99"]],
          f"the row of step 750 is replaced, not repeated: {lines}")
    check(os.listdir(run) == ["log.csv"], "no temporary file left")

# the learning rate: linear warmup to --lr over --warmup steps, then a cosine to a tenth of it at --steps
sched = argparse.Namespace(lr=1.0, warmup=10, steps=110)
lrs = [trainer.lr_at(s, sched) for s in (0, 9, 10, 60, 110, 200)]
check(all(abs(a - b) < 1e-12 for a, b in zip(lrs, [0.1, 1.0, 1.0, 0.55, 0.1, 0.1])), f"warmup, cosine, floor: {lrs}")

# greedy decoding against a scripted model: row 0 says "AB", row 1 "C", row 2 never stops
A, B, C = encode("ABC")
script = [[A, B, EOS], [C, EOS], [A] * 20]
prompts = [[BOS, 5], [BOS], [BOS, 5, 6]]
starts, calls = [len(p) for p in prompts], []


def scripted(tokens):
    calls.append(tokens.shape[1] == max(map(len, prompts)) and
                 all(bool((tokens[r, len(p):] == EOS).all()) for r, p in enumerate(prompts)))
    out = torch.zeros(*tokens.shape, len(vocab()[0]))
    for r, p in enumerate(prompts):
        out[r, len(p) - 1, script[r][len(p) - starts[r]]] = 1.0
    return out


check(trainer.greedy_answers(prompts, scripted, max_new=5) == ["AB", "C", "AAAAA"], "greedy answers up to EOS or max_new")
check(prompts == [[BOS, 5, A, B], [BOS, C], [BOS, 5, 6] + [A] * 5], "the prompts are extended by the answers, no EOS")
check(len(calls) == 5 and all(calls), "one call per new token, each on the prompts padded with EOS to the longest")

# the watch set: batches of at most 4, split by image count, the model in eval mode while decoding
counts, right = [1, 3, 1, 1, 3, 1, 1], [True, False, True, True, True, False, True]
items = [{"images": [None] * n, "answer": "x", "say": "x" if ok else "y", "id": i}
         for i, (n, ok) in enumerate(zip(counts, right))]
probe, decoded = torch.nn.Linear(1, 1), []


def say(model, sub):
    decoded.append(([it["id"] for it in sub], model.training))
    return [it["say"] for it in sub]


check(trainer.exact_matches(probe, items, say, 4) == 5, "exact matches counted")
check(decoded == [([0, 2, 3], False), ([1], False), ([5, 6], False), ([4], False)], f"decoded as {decoded}")
check(probe.training, "the model is back in training mode")


# tiny-vlm's trainer: resuming continues the run exactly (the learning rate before --warmup ignores --steps)
def tiny_vlm(run, steps):
    sys.argv = ["train.py", "--run", run, "--steps", str(steps), "--batch", "2", "--seed", "1000003", "--threads", "1",
                "--eval-items", "2", "--eval-every", "2", "--save-every", "2"]
    V.main()
    with open(os.path.join(run, "log.csv")) as f:
        steps_logged = [line.split(",")[0] for line in f.read().splitlines()[1:]]
    return torch.load(os.path.join(run, "ckpt.pt")), steps_logged


def same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


with tempfile.TemporaryDirectory() as d:
    (straight, log_a), _ = tiny_vlm(os.path.join(d, "a"), 3), tiny_vlm(os.path.join(d, "b"), 2)
    resumed, log_b = tiny_vlm(os.path.join(d, "b"), 3)
torch.manual_seed(1000003)
init = TinyVLM(VlmConfig(n_vocab=len(char_vocab()[0]))).state_dict()
check(straight["step"] == resumed["step"] == 3 and log_a == log_b == ["2", "3"], f"3 steps, watched at 2 and 3: {log_b}")
check(same(straight["model"], resumed["model"]) and same(straight["opt"], resumed["opt"]),
      "3 steps equal 2 steps and a resumed third: parameters and optimizer state, bit for bit")
check(not same(init, straight["model"]), "and the steps moved the parameters from the seed's initial ones")

# --save-minutes: a save whenever that much wall time has passed since the last one, besides --save-every and the end
saved_at, real_save = [], trainer.save
trainer.save = lambda path, model, opt, step, *rest: (saved_at.append(step), real_save(path, model, opt, step, *rest))
with tempfile.TemporaryDirectory() as d:
    for extra in ([], ["--save-minutes", "1e-6"]):
        sys.argv = ["train.py", "--run", os.path.join(d, str(len(extra))), "--steps", "3", "--batch", "2", "--seed",
                    "1000003", "--threads", "1", "--eval-items", "2", "--eval-every", "1000", "--save-every", "1000"] + extra
        V.main()
        saved_at.append("|")
trainer.save = real_save
check(saved_at == [3, "|", 1, 2, 3, 3, "|"], f"saved at the end only, and with --save-minutes after every step: {saved_at}")

# workers (a stand-in for train(rank, args)): one that fails stops the others at once; finishing ones end the run
with tempfile.TemporaryDirectory() as d:
    with open(os.path.join(d, "stand_in.py"), "w") as f:
        f.write("import sys, time\n\n\ndef train(rank, args):\n    if rank == args.fail:\n        sys.exit(3)\n"
                "    time.sleep(args.sleep)\n")
    code = ("import argparse, sys; sys.path[:0] = sys.argv[1:3]; import stand_in, trainer; trainer.launch(argparse."
            "Namespace(workers=3, run=sys.argv[2], fail=int(sys.argv[3]), sleep=float(sys.argv[4])), stand_in.train)")

    def launch(fail, sleep):
        """(exit status or None after 60 s, stderr, seconds); the stand-ins go with the command on a timeout."""
        t0 = time.time()
        proc = subprocess.Popen([sys.executable, "-c", code, VLM, d, str(fail), str(sleep)], stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            err = proc.communicate(timeout=60)[1]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return None, proc.communicate()[1], time.time() - t0
        return proc.returncode, err, time.time() - t0

    # Each 5 times: a supervisor that missed a worker's exit waited forever (1 run in 3 to 8, before the fix).
    failing = [launch(1, 600) for _ in range(5)]
    check(all(rc == 1 and "worker 1 failed (exit code 3)" in err and took < 60 for rc, err, took in failing),
          f"a failing worker stops the run at once (5 runs): {[(rc, round(took)) for rc, _, took in failing]}")
    finishing = [launch(-1, 0) for _ in range(5)]
    check(all(r[0] == 0 for r in finishing), f"workers finishing at once end the run (5 runs): {[r[0] for r in finishing]}")

# A page resized by mtmd (gen_pages.item(token_share=...)): its glyph targets are the resized token grid's characters
# (None ignored), its row targets as many as its tokens, and each pointer lands in the image on the token that
# holds the answer character's centre, whose target is that character or ignored.
it = T.gen_pages.item(1_000_123, "qa", token_share=0.5)
img = it["images"][0]
rows, cols = img.shape[0] // 8, img.shape[1] // 8
_, _, _, slots, cell_targets, pointers = T.make_batch([it], 3)
glyph, row_t, _ = cell_targets[0]
chars = it["token_chars"][0]
check(rows * cols < len(it["grids"][0]) * len(it["grids"][0][0]) and glyph.numel() == rows * cols
      and row_t.shape == (rows * cols, T.ROW_PROBE_CHARS), f"resized targets: {rows} x {cols} tokens")
check(glyph.tolist() == [-100 if ch is None else encode(ch)[0] for line in chars for ch in line],
      "resized glyph targets: the token grid's characters, None ignored")
start = slots[0][1]
answers = [it["answer"]] + [a for _, a, _ in it["others"][:2]]
wanted = [(a[i], cell) for a, cells in zip(answers, [it["cells"]] + [c for _, _, c in it["others"][:2]])
          for i, cell in enumerate(cells) if cell is not None]
got = [(t - start) for t in pointers[:, 2].tolist()]
check(len(got) == len(wanted) and all(0 <= g < rows * cols for g in got), f"{len(got)} pointers inside the image")
check(all(g == r * cols + c and chars[r][c] in (ch, None) for g, (ch, (_, r, c)) in zip(got, wanted)),
      "each pointer on its character's token, whose target is that character or ignored")

# Glyph slots: per token, the characters whose centres it holds, then EOS; nothing where no ink reaches the token,
# EOS alone where ink without a centre does, no EOS where the slots are full. Written out by hand.
E, A, B = T.EOS, encode("A")[0], encode("B")[0]
want = [[-100] * 4, [E, -100, -100, -100], [A, E, -100, -100], [B, A, E, -100],
        [A, B] + encode("CD"), [A, E, -100, -100], [-100] * 4]
check(T.slot_targets([[" ", None, "A", None], [None, "A", " "]], [["", "", "A", "BA"], ["ABCD", "A", ""]]).tolist()
      == want, "glyph-slot targets of hand-made tokens")
glyph_slots = cell_targets[0][2]
held = it["token_glyphs"][0]
check(glyph_slots.shape == (rows * cols, T.GLYPH_SLOTS) and
      [[x for x in t if x != -100] for t in glyph_slots.tolist()] ==
      [[] if ch == " " else ([encode(g)[0] for g in hs] + [E])[:T.GLYPH_SLOTS]
       for line, hline in zip(chars, held) for ch, hs in zip(line, hline)],
      "the resized page's glyph-slot targets: its tokens' glyphs in reading order")
_, _, _, _, native_cells, _ = T.make_batch([T.gen_pages.item(1_000_123, "qa")], 1)
grid = T.gen_pages.item(1_000_123, "qa")["grids"][0]
check(native_cells[0][2].tolist() == [[-100] * 4 if ch == " " else [encode(ch)[0], E, -100, -100]
                                      for line in grid for ch in line], "on the grid: each glyph, then EOS")

# A checkpoint from before a training-only readout existed loads strictly; one missing any other weight does not.
fresh = TinyQwen2VL(T.Config())
state = {k: v for k, v in fresh.state_dict().items() if not k.startswith("glyph_slots.")}
check(TinyQwen2VL(T.Config()).load_state_dict(state).missing_keys == ["glyph_slots.weight"],
      "a checkpoint without the glyph slots loads (strict)")
try:
    TinyQwen2VL(T.Config()).load_state_dict({k: v for k, v in state.items() if k != "norm.weight"})
    check(False, "a checkpoint without norm.weight is refused")
except RuntimeError as e:
    check("norm.weight" in str(e), f"a checkpoint without norm.weight is refused: {e}")

# Growth in depth: a 2-block checkpoint loaded into a 4-block model computes the same image tokens.
with tempfile.TemporaryDirectory() as d:
    torch.manual_seed(5)
    small = T.TinyQwen2VL(T.Config(n_vocab=len(T.vocab()[0])))
    path = os.path.join(d, "ckpt.pt")
    torch.save({"config": small.c.to_dict(), "model": small.state_dict(), "step": 7}, path)
    grown = T.TinyQwen2VL(T.Config(n_vocab=len(T.vocab()[0]), v_block=4))
    trainer.init_from(path, grown, ("row_probe.",), ("v_block",))
    img = torch.from_numpy(it["images"][0][None].copy())
    with torch.no_grad():
        same = torch.equal(small.vision(img), grown.vision(img))
    check(same and len(grown.vision.blocks) == 4, "a 2-block checkpoint grown to 4 ViT blocks gives the same image tokens")
    wider = T.TinyQwen2VL(T.Config(n_vocab=len(T.vocab()[0]), v_ff=128))
    code = None
    try:
        trainer.init_from(path, wider, ("row_probe.",), ("v_block",))
    except SystemExit as e:
        code = str(e)
    check(code is not None and "another model configuration" in code, "another width is still refused")

# tiny-qwen2vl v3 (issue 48). Runs without --shift, --vit-* and from-scratch resizing draw the items they drew before
# those options existed: hashes of three steps' items (default, default with qwen2's downscaled pages, and the v2
# fine-tune's resized ones with blinding) pinned from the code before the change.
def items_hash(items):
    m = hashlib.sha256()
    for it in items:
        m.update(repr((it["question"], it["answer"], it["cells"], it["others"], it["type"], it.get("token_chars"),
                       it.get("max_tokens"))).encode())
        for img in it["images"]:
            m.update(img.tobytes())
            m.update(repr(img.shape).encode())
    return m.hexdigest()[:16]


check([items_hash(T.train_items(1, 2500, 12)), items_hash(T.train_items(1, 600, 12)),
       items_hash(T.train_items(3, 7012, 12, 0.75, [(3, 0), (3, 1)], (0.6, 0.4, 1.0)))] ==
      ["c6f1b223e9bead3b", "95c3cf4a85ed9d32", "71174ac0fa2832b9"], "runs without the v3 options draw the same items")

# The curriculum from step 0: shares of single pages resized (token share in range) and shifted (0..7 pixels each way).
draws = [trainer.curriculum(0, random.Random(k), multi_from=0, p_multi=0.0, resize=(0.65, 0.35, 1.0), shift=(0.5, 8))
         for k in range(4000)]
shares = [d[3]["token_share"] for d in draws if "token_share" in d[3]]
shifts = [d[3]["shift"] for d in draws if "shift" in d[3]]
check(abs(len(shares) / 4000 - 0.65) < 0.03 and all(0.35 <= x <= 1 for x in shares) and
      abs(len(shifts) / 4000 - 0.5) < 0.03 and set(shifts) == {(y, x) for y in range(8) for x in range(8)} and
      all(d[2] is None and d[1] in (1, 2) for d in draws),
      f"step 0: {len(shares) / 40:.1f}% resized to 0.35-1x tokens, {len(shifts) / 40:.1f}% shifted by all 64 offsets, "
      "pages of 1-2 fields, no downscaling")

# A step-0 batch with every single page resized to 0.35-1x its tokens and shifted. mtmd keeps the aspect ratio and
# floors each side to whole tokens: N tokens allowed of R x C native gives floor(R / beta) x floor(C / beta),
# beta = sqrt(RC/N), so at least N - (R + C) / beta + 1 of them.
items = T.train_items(1_000_048, 0, 12, resize=(1.0, 0.35, 1.0), shift=1.0)
bad = []
for it in items:
    R, C = len(it["grids"][0]), len(it["grids"][0][0])
    rows, cols = (n // 8 for n in it["images"][0].shape[:2])
    n, beta = it["max_tokens"], math.sqrt(R * C / it["max_tokens"])
    if not (math.floor(0.35 * R * C) <= n <= R * C and n - (R + C) / beta + 1 - 1e-6 <= rows * cols <= n and
            len(it["token_chars"][0]) == rows and len(it["token_chars"][0][0]) == cols and "shift" in it):
        bad.append((R, C, n, rows, cols))
tokens, positions, _, slots, cell_targets, _ = T.make_batch(items, 3)
grids_ok = True
for (row, start), it, cells in zip(slots, items, cell_targets):
    rows, cols = (n // 8 for n in it["images"][0].shape[:2])
    pos = positions[row, start: start + rows * cols]
    p = int(pos[0, 0])
    grid = torch.tensor([(p, p + r, p + c) for r in range(rows) for c in range(cols)])
    grids_ok &= torch.equal(pos, grid) and cells[0].numel() == rows * cols and \
        int(tokens[row, start - 1]) == VISION_START_ID and int(tokens[row, start + rows * cols]) == VISION_END_ID
check(not bad and len(slots) == len(items) == 12,
      f"step 0, all pages resized: token counts as mtmd's floor allows {bad}")
check(grids_ok, "each page's image tokens: one M-RoPE (row, column) grid of the resized image's shape between the "
      "vision start and end tokens, as many glyph targets")

# A wider ViT with 2 heads: one token of the text width per 8x8 pixels; its parameters as its sizes give.
E, F_, B = 96, 384, 4
wide = TinyQwen2VL(Config(n_vocab=len(vocab()[0]), v_embd=E, v_head=2, v_ff=F_, v_block=B)).eval()
img = torch.from_numpy(items[0]["images"][0][None].copy())
with torch.no_grad():
    out = wide.vision(img)
n_vision = 3 * E * 16 + B * (4 * E + 4 * (E * E + E) + E * F_ + F_ + F_ * E + E) + 2 * E + (16 * E * E + 4 * E) + \
    (4 * E * 128 + 128)
check(out.shape == (1, img.shape[1] * img.shape[2] // 64, 128) and
      sum(p.numel() for p in wide.vision.parameters()) == n_vision, f"a 96-wide, 2-head ViT: {tuple(out.shape)}, "
      f"{n_vision} parameters")
bad_sizes = subprocess.run([sys.executable, os.path.join(VLM, "train_qwen2vl.py"), "--run", tempfile.gettempdir(),
                            "--vit-width", "100", "--vit-heads", "2"], capture_output=True, text=True)
check(bad_sizes.returncode == 2 and "multiple of 4 x --vit-heads" in bad_sizes.stderr,
      "--vit-width 100 --vit-heads 2 is refused (a head of 50 cannot hold 2-D rotary positions)")
finish()
