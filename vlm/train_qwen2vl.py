#!/usr/bin/env python3
"""Train tiny-qwen2vl (vlm/qwen2vl.py) on gen_pages.py's documents (CPU, seeded, resumable).

  python3 vlm/train_qwen2vl.py --run vlm/runs/qwen2 --workers 2   # rerun the same command to resume

RUN/ckpt.pt is written atomically every --save-every steps and on SIGTERM/SIGINT; the items of a step depend only
on (--seed, step), so a run stopped at any moment resumes from its last checkpoint with the same data order.
RUN/log.csv is the learning curve (losses; exact match of greedy answers on the 128-item watch set, held-out
seeds 230000..230127 of gen_pages.py).
--workers N runs N data-parallel processes (gloo): each computes the losses of its share of a step's item groups,
the gradients are summed, and every worker applies the same update, so the run equals one process's to float
rounding. The workers share the watch set's decoding. A SIGTERM to the command or to any worker stops them all after
the same step; worker 0 logs and saves; if a worker dies, the others are stopped at once (rerun to resume).
The loop, checkpoints, log, workers, blinding schedule and greedy decoding are trainer.py's (train.py shares them);
here are the items' blinding, the batches, the losses, the dealing of item groups to workers and the options.

Losses: cross-entropy on the answers (up to --questions per image), plus four training-only losses that add
nothing to the exported files:
- glyph: each image token scored against the character embeddings, the character of its cell as target;
- glyph slots (--slot-weight from --slot-from): each inked image token names, through a training-only readout of
  GLYPH_SLOTS guesses, the characters whose ink centres it holds in reading order, then EOS (gen_pages'
  token_glyphs). On a resized page a token holds up to four glyphs; the glyph loss ignores such a token, since one
  guess cannot name them, so without this loss nothing but the answers taught the tower to tell them apart;
- row (--row-weight from --row-from): each image token guesses the first ROW_PROBE_CHARS characters of its row's
  text line through a training-only probe: the value of "TAX  10.31" has to know its row says TAX, which the text
  model's M-RoPE cannot tell it (its height section turns by at most 0.1 rad a row at base 10000);
- pointer: at each answer position, one query head of *each* KV group in each --pointer-layers layer attends to
  the image token showing the next answer character. Reading is spread over 2 x len(layers) KV groups on purpose
  (tiny-vlm's single pointer head made one KV group decide every answer), and the weight anneals from
  --pointer-weight to a tenth of it between --pointer-anneal steps.
Blinding (--blind P1,P2,... from --blind-from S1,S2,...): from step Sk a share Pk of the items each get one random
(layer, KV group) whose query heads cannot see the item's answer cells (the ablation check_targets.py measures), so
the answer has to be read by more than one group: a real VLM's 100+ KV groups read redundantly, and eviction
removes tokens per group. qwen2 ran 0.5 from step 1,000 and 0.75 from 3,000, when one group still decided 56% of
the right answers (0.62 at step 2,215).
Curriculum: pages grow from 1-2 fields to 4-7 by step 1000; dense supervision (transcription, read a line) gives
way to field questions by step 3000; from step 500 a fifth of the single pages are downscaled (0.5-0.9, so the
model reads smaller images too); multi-page needle items (6%) join at step 2000.

Fine-tune for smaller images (issue 33; docs/investigations/tiny-qwen2vl-smaller-images.md): qwen2's downscaled
pages had no cells, so they got none of the reading losses and the model never learned to read them. With
--resize P a share P of the single pages is resized exactly as mtmd does for --image-max-tokens N
(gen_pages.mtmd_resize), N = U(--resize-tokens) x the page's native image tokens, and keeps glyph, row and pointer
targets (gen_pages.token_targets: the token holding each character's scaled ink centre); the old downscaled pages
are then left out. --init CKPT starts a new run from another's weights with a fresh optimiser; --schedule-from S
runs the curriculum, blinding, pointer anneal and row weight as at step S + step (the original run's last stage);
--watch-resize F adds a column eval_exact_resized: the watch set resized by mtmd to F x native tokens.

  git show 0e8525b:vlm/runs/qwen2/ckpt.pt > vlm/runs/qwen2/ckpt-7007.pt    # once: qwen2's step-7007 weights
  python3 vlm/train_qwen2vl.py --run vlm/runs/qwen2-small --init vlm/runs/qwen2/ckpt-7007.pt --schedule-from 7007 \
      --seed 2 --steps 2000 --lr 4e-4 --warmup 100 --resize 0.55 --resize-tokens 0.25,1 --watch-resize 0.5 \
      --eval-every 200 --workers 2        # rerun the same command to resume (RUN/ckpt.pt wins over --init)

From scratch off the token grid (tiny-qwen2vl v3, issue 48; vlm/runs/qwen2-v3/PLAN.md): without --init and
--schedule-from, --resize applies from step 0; --shift P moves a share P of the single pages by (dy, dx) pixels,
each uniform in 0..7, before any resize (gen_pages.shift_image), so glyphs straddle tokens also at the native size
(with token targets as on resized pages); --vit-width, --vit-heads, --vit-ff and --vit-blocks size the vision tower
(the text model is unchanged); --save-minutes M also saves every M minutes of wall time. The command is in
vlm/README.md ("tiny-qwen2vl v3").
"""

import os
import random
import sys

# OpenBLAS's own threads spin (sched_yield) against torch's: at this model's sizes a step ran 8.8 s with them,
# 5.8 s with one BLAS thread and 5.3 s with one thread in all (measured side by side at step 600, alone on 2 cores).
# numpy loads OpenBLAS too, so this comes before both imports.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_pages  # noqa: E402
import trainer  # noqa: E402
from blocks import EOS, encode  # noqa: E402
from qwen2vl import (GLYPH_SLOTS, ROW_PROBE_CHARS, TRAINING_ONLY, Config, TinyQwen2VL, extend, prompt,  # noqa: E402
                     vocab)

WATCH_BATCH = 16  # watch-set items decoded at a time


def grid_shape(img):
    return img.shape[0] // gen_pages.CELL, img.shape[1] // gen_pages.CELL


def train_items(base_seed, step, batch, blind=0.0, groups=(), resize=None, shift=0.0):
    """The step's items. With probability `blind` an item gets a "blind" (layer, KV group) from `groups`, whose
    query heads will not see the item's answer cells; drawn from a stream of its own, so the items themselves do
    not depend on blinding. resize=(p, lo, hi): a share p of the single pages resized by mtmd to U(lo, hi) of their
    native tokens (trainer.curriculum); shift: a share of the single pages moved by 0..7 pixels down and right
    before any resize. Either replaces qwen2's downscaled pages."""
    items = trainer.train_items(base_seed, step, batch, gen_pages.item, multi_from=2000, p_multi=0.06,
                                scale_from=None if resize or shift else 500, resize=resize,
                                shift=(shift, gen_pages.CELL) if shift else None)
    blind_rng = random.Random(f"blind {base_seed} {step}")
    for it in items:
        it["blind"] = blind_rng.choice(groups) if groups and blind_rng.random() < blind else None
    return items


def make_batch(items, max_questions):
    """tokens, positions, targets, image slots, cell targets (per image: glyph, row and glyph-slot targets, None
    when downscaled; from token_chars, token_lines and token_glyphs when resized by mtmd) and pointers (batch row,
    predicting position, target position: the image token of the answer character, in the image's own token grid)."""
    seqs, poss, labels, slots, cell_targets, pointers = [], [], [], [], [], []
    for row, it in enumerate(items):
        shapes = [grid_shape(img) for img in it["images"]]
        ids, pos, starts, p = prompt(shapes, it["context"] + "\n" + it["question"])
        lab = [-100] * (len(ids) - 1)
        for k, (q, a, cells) in enumerate([(it["question"], it["answer"], it["cells"])] + it["others"][: max_questions - 1]):
            if k:
                p = extend(ids, pos, p, encode("\n" + q))
                lab += [-100] * len(encode("\n" + q))
            answer = encode(a) + [EOS]
            for i, cell in enumerate(cells or []):
                if cell is not None and len(answer) == len(a) + 1:
                    page, r, c = cell
                    pointers.append((row, len(ids) + i - 1, starts[page] + r * shapes[page][1] + c))
            p = extend(ids, pos, p, answer)
            lab += answer
        lab.append(-100)
        seqs.append(ids)
        poss.append(pos)
        labels.append(lab)
        slots += [(row, s) for s in starts]
        scaled = it["cells"] is None and it["type"] != "multi-needle"
        if "token_chars" in it:  # resized by mtmd: the targets of the resized token grid (None: ignored)
            cell_targets += [(torch.tensor([-100 if ch is None else encode(ch)[0] for line in chars for ch in line]),
                              row_targets(g, lines, len(chars[0])), slot_targets(chars, glyphs))
                             for g, chars, lines, glyphs in zip(it["grids"], it["token_chars"], it["token_lines"],
                                                                it["token_glyphs"])]
        else:
            cell_targets += [None if scaled else (torch.tensor([encode(ch)[0] for line in g for ch in line]),
                                                  row_targets(g), slot_targets(g, g)) for g in it["grids"]]
    tokens, target = trainer.padded_batch(seqs, labels)
    return tokens, padded_positions(poss, tokens.shape[1]), target, slots, cell_targets, \
        torch.tensor(pointers, dtype=torch.long).view(-1, 3)


def slot_targets(chars, glyphs):
    """(tokens, GLYPH_SLOTS) glyph-slot targets: the characters whose centres a token holds (glyphs, per token row a
    sequence of strings: gen_pages' token_glyphs; on the grid, the grid itself), in reading order, then EOS, then
    -100 (ignored); all ignored where no ink reaches the token (chars: gen_pages' token_chars, " " there), so that
    the blank paper, most tokens, does not swamp the loss; EOS alone where ink without a centre does."""
    out = []
    for chars_row, glyphs_row in zip(chars, glyphs):
        for ch, held in zip(chars_row, glyphs_row):
            held = held.strip()  # on the grid a space is a cell without ink
            names = [] if ch == " " and not held else ([encode(x)[0] for x in held] + [EOS])[:GLYPH_SLOTS]
            out.append(names + [-100] * (GLYPH_SLOTS - len(names)))
    return torch.tensor(out)


def padded_positions(poss, t):
    return torch.tensor([p + [p[-1]] * (t - len(p)) for p in poss])


def row_targets(grid, lines=None, cols=None):
    """(cells, ROW_PROBE_CHARS) row-probe targets: the first characters of each cell's text line (spaces past its
    end); -100 (ignored) in rows without text. For a resized page, lines gives each token row's grid row (None:
    ignored) and cols the tokens per row (gen_pages.token_targets)."""
    rows = grid if lines is None else ["" if r is None else grid[r] for r in lines]
    out = []
    for line in rows:
        text = line.strip()
        first = [encode(ch)[0] for ch in (text + " " * ROW_PROBE_CHARS)[:ROW_PROBE_CHARS]] if text else \
            [-100] * ROW_PROBE_CHARS
        out += [first] * (len(line) if cols is None else cols)
    return torch.tensor(out)


def vision_feats(model, images):
    """Image tokens per image; images of one size run as one batch."""
    out = [None] * len(images)
    by_size = {}
    for i, img in enumerate(images):
        by_size.setdefault(img.shape, []).append(i)
    for idx in by_size.values():
        feats = model.vision(torch.from_numpy(np.stack([images[i] for i in idx])))
        for k, i in enumerate(idx):
            out[i] = feats[k]
    return out


def image_area(it):
    return sum(img.shape[0] * img.shape[1] for img in it["images"])


def item_cost(it, max_questions):
    """An item's compute, estimated from its sequence length L as L * (L + 165): fitted to forward+backward times of
    single pages (L ~ 580, 0.55 s) and three-page items (L ~ 1800, 4.5 s); attention's L^2 dominates."""
    n = make_batch([it], max_questions)[0].shape[1]
    return n * (n + 165)


def length_groups(items, size=6):
    """The items in groups of at most `size` of the same image count and similar image area, so that little of a
    forward pass is padding (attention costs the square of the longest sequence of a group)."""
    out = []
    for n_images in sorted({len(it["images"]) for it in items}):
        group = sorted((it for it in items if len(it["images"]) == n_images), key=image_area)
        out += [group[i: i + size] for i in range(0, len(group), size)]
    return out


def worker_groups(items, rank, world, max_questions):
    """Worker `rank`'s share of a step's items, in length_groups: each item, costliest first, goes to the worker with
    the least estimated work so far (each step waits for the slowest worker). Dealing by image area gave every
    multi-page item, which costs as much as 8 single pages, to worker 0: 1.3x worker 1's CPU time."""
    return length_groups(trainer.deal(items, world, lambda it: item_cost(it, max_questions))[rank])


def blind_masks(items, pointers, t, c):
    """{layer: (B, H, t) key masks}: -inf on an item's answer cells (the pointers' targets) for the query heads of
    its blind KV group, so that group cannot read the answer and the others must (check_targets.py measures the
    same ablation)."""
    masks = {}
    for row, it in enumerate(items):
        if it.get("blind") is None:
            continue
        layer, g = it["blind"]
        rep = c.n_head // c.n_head_kv
        mask = masks.setdefault(layer, torch.zeros(len(items), c.n_head, t))
        cells = pointers[pointers[:, 0] == row, 2]
        mask[row, g * rep: (g + 1) * rep, cells[cells < t]] = float("-inf")
    return masks


def batch_sums(model, groups, max_questions, pointer_layers):
    """Sums and counts of the answer, glyph, pointer, row and glyph-slot loss terms over groups of items
    (length_groups); a loss is its sum over the count of the whole batch, whichever worker computed which groups."""
    sums, counts = [torch.zeros(()) for _ in range(5)], [0] * 5
    c = model.c
    for group in groups:
        tokens, positions, target, slots, cell_targets, pointers = make_batch(group, max_questions)
        feats = vision_feats(model, [img for it in group for img in it["images"]])
        logits, probs = model(model.embed(tokens[:, :-1], feats, slots), positions[:, :-1], pointer_layers,
                              blind_masks(group, pointers, tokens.shape[1] - 1, c))
        trainer.add_ce(sums, counts, 0, logits, target[:, :-1])
        for f, cells in zip(feats, cell_targets):
            if cells is not None:
                glyph, row, glyph_slots = cells
                trainer.add_ce(sums, counts, 1, model.glyph_logits(f), glyph)
                trainer.add_ce(sums, counts, 3, model.row_logits(f), row)
                trainer.add_ce(sums, counts, 4, model.slot_logits(f), glyph_slots)
        if len(pointers):
            heads = torch.arange(0, c.n_head, c.n_head // c.n_head_kv)[None]  # one query head per KV group
            row, query, key = (pointers[:, i, None] for i in range(3))
            for il in pointer_layers:  # one gather per layer: its backward fills the probabilities' gradient once
                pr = probs[il][row, heads, query, key]  # (pointers, KV groups)
                seen = torch.tensor([[group[r].get("blind") != (il, g) for g in range(c.n_head_kv)]
                                     for r in pointers[:, 0].tolist()])  # a blind group cannot point
                sums[2] = sums[2] - torch.log(pr[seen] + 1e-6).sum()
                counts[2] += int(seen.sum())
    return sums, counts


@torch.no_grad()
def greedy(model, items, max_new=16):
    seqs, poss, nexts, slots, images = [], [], [], [], []
    for row, it in enumerate(items):
        ids, pos, starts, p = prompt([grid_shape(img) for img in it["images"]], it["context"] + "\n" + it["question"])
        seqs.append(ids)
        poss.append(pos)
        nexts.append(p)
        slots += [(row, s) for s in starts]
        images += it["images"]
    feats = vision_feats(model, images)

    def logits(tokens):
        return model(model.embed(tokens, feats, slots), padded_positions(poss, tokens.shape[1]))[0]

    def append(r, token):
        nexts[r] = extend(seqs[r], poss[r], nexts[r], [token])

    return trainer.greedy_answers(seqs, logits, append, max_new)


def evaluate(model, items):
    """The number of items whose greedy answer is exactly right."""
    return trainer.exact_matches(model, items, greedy, WATCH_BATCH)


def train(rank, args):
    """One worker: its share of each step's item groups (trainer.fit sums the workers' gradients)."""
    world = args.workers
    trainer.start_worker(args, rank, world)
    config = Config(n_vocab=len(vocab()[0]), rope_base=args.rope_base, v_block=args.vit_blocks, v_embd=args.vit_width,
                    v_head=args.vit_heads, v_ff=args.vit_ff)
    torch.manual_seed(args.seed)
    model = TinyQwen2VL(config)
    # No weight decay on biases and norms (the usual practice; it also keeps the K biases, see qwen2vl.py).
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98))
    held_out = [gen_pages.item(trainer.EVAL_SEED + i, "qa") for i in range(args.eval_items)]
    held_out_small = [gen_pages.item(trainer.EVAL_SEED + i, "qa", token_share=args.watch_resize)
                      for i in range(args.eval_items)] if args.watch_resize else []
    if args.init and not os.path.exists(os.path.join(args.run, "ckpt.pt")):
        trainer.init_from(args.init, model, TRAINING_ONLY, ("v_block",))
    pointer_layers = [int(x) for x in args.pointer_layers.split(",") if x]
    blind_groups = [(il, g) for il in range(config.n_layer) for g in range(config.n_head_kv)]
    a0, a1 = (int(x) for x in args.pointer_anneal.split(","))

    def losses(step, stopping):
        step += args.schedule_from  # the curriculum, blinding, pointer anneal and row weight (and the data's seed)
        w_pointer = args.pointer_weight * (1 - 0.9 * min(1.0, max(0.0, (step - a0) / max(1, a1 - a0))))
        items = train_items(args.seed, step, args.batch, trainer.blind_at(step, args.blind_schedule), blind_groups,
                            args.resize_schedule, args.shift)
        groups = worker_groups(items, rank, world, args.questions)
        sums, counts = batch_sums(model, groups, args.questions, pointer_layers)
        counts, values, stop = trainer.reduce_step(sums, counts, stopping, world)
        loss, glyph, pointer, row, slots = (s / n for s, n in zip(sums, counts))
        w_row = args.row_weight if step >= args.row_from else 0.0
        w_slots = args.slot_weight if step >= args.slot_from else 0.0
        return loss + args.glyph_weight * glyph + w_pointer * pointer + w_row * row + w_slots * slots, values, stop

    def watch():
        native = trainer.watch_exact(model, held_out, greedy, WATCH_BATCH, rank, world)
        if not held_out_small:
            return native
        return native, trainer.watch_exact(model, held_out_small, greedy, WATCH_BATCH, rank, world)

    trainer.fit(args, model, opt, losses, watch, ("loss", "glyph", "pointer", "row", "slots"), rank, world,
                TRAINING_ONLY,
                ("eval_exact_resized",) if held_out_small else ())
    if world > 1:
        torch.distributed.destroy_process_group()


def main():
    ap = trainer.run_options(__doc__, steps=8000, batch=12, questions=3, save_every=50, threads=1)
    ap.add_argument("--workers", type=int, default=1,
                    help="data-parallel processes (gloo on this machine); each takes a share of a step's item groups")
    ap.add_argument("--rope-base", type=float, default=10000.0,
                    help="the text model's M-RoPE base; the width section gets the head's lowest frequencies")
    ap.add_argument("--pointer-layers", default="2,3", help="layers with a pointer head in each KV group")
    ap.add_argument("--pointer-anneal", default="1500,3000", help="steps between which the pointer weight falls to 1/10")
    ap.add_argument("--blind", default="0.5,0.75",
                    help="shares of items whose answer cells one random (layer, KV group) cannot see, so that no group "
                         "alone decides the answers; one per --blind-from step")
    ap.add_argument("--blind-from", default="1000,3000", help="the steps from which each --blind share applies")
    ap.add_argument("--row-weight", type=float, default=0.3, help="weight of the row probe's loss")
    ap.add_argument("--row-from", type=int, default=0, help="the step from which --row-weight applies")
    ap.add_argument("--slot-weight", type=float, default=0.0,
                    help="weight of the glyph-slot loss (each inked image token names the glyphs it holds); 0: off")
    ap.add_argument("--slot-from", type=int, default=0, help="the step from which --slot-weight applies")
    ap.add_argument("--init", default=None,
                    help="start from this checkpoint's weights with a fresh optimiser (a fine-tune; ignored once "
                         "RUN/ckpt.pt exists, which resumes as always)")
    ap.add_argument("--vit-blocks", type=int, default=Config.v_block,
                    help="ViT blocks; with --init from a checkpoint with fewer, the new ones start as identities "
                         "(zero output projections) after the old ones: the same function, more depth to learn with")
    ap.add_argument("--vit-width", type=int, default=Config.v_embd, help="the ViT's width (v_embd)")
    ap.add_argument("--vit-heads", type=int, default=Config.v_head,
                    help="the ViT's attention heads (each head's size a multiple of 4: its 2-D rotary positions)")
    ap.add_argument("--vit-ff", type=int, default=Config.v_ff, help="the ViT's MLP width")
    ap.add_argument("--schedule-from", type=int, default=0,
                    help="run the curriculum, blinding, pointer anneal and row weight as at this step + the step "
                         "(a fine-tune continues the original run's last stage; also offsets the data's seeds)")
    ap.add_argument("--resize", type=float, default=0.0,
                    help="share of single pages resized as mtmd does for --image-max-tokens, with reading targets; "
                         "above 0 it replaces qwen2's downscaled pages (which had none)")
    ap.add_argument("--resize-tokens", default="0.25,1",
                    help="LO,HI: a resized page gets --image-max-tokens U(LO, HI) x its native image tokens")
    ap.add_argument("--shift", type=float, default=0.0,
                    help="share of single pages moved by (dy, dx) pixels, each uniform in 0..7, before any resize, "
                         "with reading targets (gen_pages.item's shift); above 0 it replaces qwen2's downscaled pages")
    ap.add_argument("--watch-resize", type=float, default=0.0,
                    help="also watch exact match on the watch set resized by mtmd to this share of native tokens "
                         "(log.csv column eval_exact_resized); 0: not")
    args = ap.parse_args()
    try:
        args.blind_schedule = trainer.blind_schedule(args.blind, args.blind_from)
    except ValueError as e:
        ap.error(str(e))
    if args.row_weight < 0:
        ap.error("--row-weight is not negative")
    try:
        lo, hi = (float(x) for x in args.resize_tokens.split(","))
    except ValueError:
        ap.error("--resize-tokens LO,HI")
    if not 0 <= args.resize <= 1 or not 0 < lo <= hi <= 1 or not 0 <= args.watch_resize <= 1:
        ap.error("--resize and --watch-resize in 0..1, --resize-tokens 0 < LO <= HI <= 1")
    if not 0 <= args.shift <= 1:
        ap.error("--shift in 0..1")
    if min(args.vit_width, args.vit_heads, args.vit_ff, args.vit_blocks) < 1 or args.vit_width % (4 * args.vit_heads):
        ap.error("--vit-width a multiple of 4 x --vit-heads (2-D rotary positions turn a quarter of each head's "
                 "size by row and a quarter by column); --vit-heads, --vit-ff and --vit-blocks at least 1")
    args.resize_schedule = (args.resize, lo, hi) if args.resize > 0 else None
    if args.init and not os.path.exists(args.init):
        ap.error(f"--init {args.init}: no such checkpoint")
    os.makedirs(args.run, exist_ok=True)
    trainer.launch(args, train)


if __name__ == "__main__":
    main()
