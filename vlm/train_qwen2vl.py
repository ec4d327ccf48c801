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

Losses: cross-entropy on the answers (up to --questions per image), plus three training-only losses that add
nothing to the exported files:
- glyph: each image token scored against the character embeddings, the character of its cell as target;
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
"""

import datetime
import json
import multiprocessing.connection
import os
import random
import signal
import sys
import time

# OpenBLAS's own threads spin (sched_yield) against torch's: at this model's sizes a step ran 8.8 s with them,
# 5.8 s with one BLAS thread and 5.3 s with one thread in all (measured side by side at step 600, alone on 2 cores).
# numpy loads OpenBLAS too, so this comes before both imports.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_docs  # noqa: E402
import gen_pages  # noqa: E402
from model import EOS, decode, encode  # noqa: E402
from qwen2vl import ROW_PROBE_CHARS, Config, TinyQwen2VL, extend, prompt, vocab  # noqa: E402
from train import keep_freed_memory, lr_at, open_log, resume, run_options, save  # noqa: E402

EVAL_SEED = 230_000  # held-out watch set (below 250,000: 250,000-999,999 are reserved)


def grid_shape(img):
    return img.shape[0] // gen_pages.CELL, img.shape[1] // gen_pages.CELL


def curriculum(step, rng):
    """(task, n_fields, scale) for one training item at this step."""
    hi = min(7, 2 + step // 200)
    n = rng.randint(1, hi) if rng.random() < 0.3 else rng.randint(max(1, hi - 3), hi)
    ramp = min(1.0, step / 3000)
    p_read, p_row = 0.4 - 0.2 * ramp, 0.25 - 0.15 * ramp
    p_multi = 0.06 if step >= 2000 else 0.0
    scale = rng.uniform(0.5, 0.9) if step >= 500 and rng.random() < 0.2 else None
    u = rng.random()
    if u < p_multi:
        return "multi", None, None
    if u < p_multi + p_read:
        return "read", n, scale
    if u < p_multi + p_read + p_row:
        return "row", n, scale
    return "qa", n, scale


def train_items(base_seed, step, batch, blind=0.0, groups=()):
    """The step's items. With probability `blind` an item gets a "blind" (layer, KV group) from `groups`, whose
    query heads will not see the item's answer cells; drawn from a stream of its own, so the items themselves do
    not depend on blinding."""
    rng = random.Random(base_seed * 1_000_003 + step)
    blind_rng = random.Random(f"blind {base_seed} {step}")
    out = []
    for _ in range(batch):
        task, n, scale = curriculum(step, rng)
        seed = rng.randrange(gen_docs.FIRST_TRAIN_SEED, 2**31)
        it = gen_pages.item(seed, task, n, scale)
        rng.shuffle(it["others"])
        it["blind"] = blind_rng.choice(groups) if groups and blind_rng.random() < blind else None
        out.append(it)
    return out


def make_batch(items, max_questions):
    """tokens, positions, targets, image slots, cell targets (per image: glyph and row targets, None when
    downscaled) and pointers (batch row, predicting position, target position)."""
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
        cell_targets += [None if scaled else (torch.tensor([encode(ch)[0] for line in g for ch in line]), row_targets(g))
                         for g in it["grids"]]
    t = max(map(len, seqs))
    tokens = torch.tensor([s + [EOS] * (t - len(s)) for s in seqs])
    positions = torch.tensor([p + [p[-1]] * (t - len(p)) for p in poss])
    target = torch.tensor([lab + [-100] * (t - len(lab)) for lab in labels])
    supervised = target[:, :-1] != -100
    assert torch.equal(target[:, :-1][supervised], tokens[:, 1:][supervised]), "targets out of step"
    return tokens, positions, target, slots, cell_targets, torch.tensor(pointers, dtype=torch.long).view(-1, 3)


def row_targets(grid):
    """(cells, ROW_PROBE_CHARS) row-probe targets: the first characters of each cell's text line (spaces past its
    end); -100 (ignored) in rows without text."""
    out = []
    for line in grid:
        text = line.strip()
        first = [encode(ch)[0] for ch in (text + " " * ROW_PROBE_CHARS)[:ROW_PROBE_CHARS]] if text else \
            [-100] * ROW_PROBE_CHARS
        out += [first] * len(line)
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
    loads, shares = [0] * world, [[] for _ in range(world)]
    for cost, it in sorted(((item_cost(it, max_questions), it) for it in items), key=lambda c: -c[0]):
        w = loads.index(min(loads))
        loads[w] += cost
        shares[w].append(it)
    return length_groups(shares[rank])


def blind_schedule(shares, steps):
    """[(step, share)] from --blind and --blind-from, checked."""
    try:
        pairs = list(zip([int(x) for x in steps.split(",")], [float(x) for x in shares.split(",")], strict=True))
    except ValueError:
        raise ValueError(f"--blind {shares!r} and --blind-from {steps!r}: one share (0 to 1) for each step") from None
    if any(not 0.0 <= p <= 1.0 for _, p in pairs) or [s for s, _ in pairs] != sorted({s for s, _ in pairs}):
        raise ValueError(f"--blind {shares!r} and --blind-from {steps!r}: shares from 0 to 1, steps increasing")
    return pairs


def blind_at(step, schedule):
    """The share of blinded items at `step`: that of the last schedule step reached, none before the first."""
    return next((p for s, p in reversed(schedule) if step >= s), 0.0)


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
    """Sums and counts of the answer, glyph, pointer and row loss terms over groups of items (length_groups); a loss is
    its sum over the count of the whole batch, whichever worker computed which groups."""
    sums, counts = [torch.zeros(()) for _ in range(4)], [0] * 4
    c = model.c
    for group in groups:
        tokens, positions, target, slots, cell_targets, pointers = make_batch(group, max_questions)
        feats = vision_feats(model, [img for it in group for img in it["images"]])
        logits, probs = model(model.embed(tokens[:, :-1], feats, slots), positions[:, :-1], pointer_layers,
                              blind_masks(group, pointers, tokens.shape[1] - 1, c))
        target = target[:, :-1].reshape(-1)
        sums[0] = sums[0] + F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target, ignore_index=-100,
                                            reduction="sum")
        counts[0] += int((target != -100).sum())
        for f, cells in zip(feats, cell_targets):
            if cells is not None:
                glyph, row = cells
                sums[1] = sums[1] + F.cross_entropy(model.glyph_logits(f), glyph, reduction="sum")
                counts[1] += glyph.numel()
                sums[3] = sums[3] + F.cross_entropy(model.row_logits(f).flatten(0, 1), row.flatten(), ignore_index=-100,
                                                    reduction="sum")
                counts[3] += int((row != -100).sum())
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
    """Greedy answers (no KV cache: the whole sequence each step; the watch set is small)."""
    seqs, poss, nexts, slots, images = [], [], [], [], []
    for row, it in enumerate(items):
        ids, pos, starts, p = prompt([grid_shape(img) for img in it["images"]], it["context"] + "\n" + it["question"])
        seqs.append(ids)
        poss.append(pos)
        nexts.append(p)
        slots += [(row, s) for s in starts]
        images += it["images"]
    feats = vision_feats(model, images)
    done, outs = [False] * len(items), [[] for _ in items]
    for _ in range(max_new):
        t = max(map(len, seqs))
        tokens = torch.tensor([s + [EOS] * (t - len(s)) for s in seqs])
        positions = torch.tensor([p + [p[-1]] * (t - len(p)) for p in poss])
        logits, _ = model(model.embed(tokens, feats, slots), positions)
        for r, s in enumerate(seqs):
            if done[r]:
                continue
            nxt = int(logits[r, len(s) - 1].argmax())
            if nxt == EOS:
                done[r] = True
            else:
                outs[r].append(nxt)
                nexts[r] = extend(s, poss[r], nexts[r], [nxt])
        if all(done):
            break
    return [decode(o) for o in outs]


def evaluate(model, items):
    """The number of items whose greedy answer is exactly right."""
    model.eval()
    answers = []
    for i in range(0, len(items), 16):
        group = items[i: i + 16]
        for n in sorted({len(it["images"]) for it in group}):
            sub = [it for it in group if len(it["images"]) == n]
            answers += list(zip(greedy(model, sub), sub))
    model.train()
    return sum(a == it["answer"] for a, it in answers)


def watch_exact(model, items, rank, world):
    """Exact match on the watch set, each worker decoding its share (the other would otherwise wait idle)."""
    right = torch.tensor([float(evaluate(model, items[rank::world]))], dtype=torch.float64)
    if world > 1:
        torch.distributed.all_reduce(right)
    return float(right) / len(items)


def reduce_step(sums, counts, stopping, world):
    """Across workers: the batch's term counts, the losses' values and whether any worker was told to stop (one
    collective). Returns (counts, loss values, stop)."""
    local = torch.tensor([float(x) for x in sums] + [float(n) for n in counts] + [float(stopping)], dtype=torch.float64)
    if world > 1:
        torch.distributed.all_reduce(local)
    total, n = local.tolist(), len(sums)
    counts = [max(1.0, c) for c in total[n: 2 * n]]
    return counts, [v / c for v, c in zip(total[:n], counts)], total[2 * n] > 0


def sum_gradients(model, world):
    """Every worker's gradients summed into each worker's, in one collective over a flat buffer."""
    if world == 1:
        return
    params = list(model.parameters())
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    torch.distributed.all_reduce(flat)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset: offset + p.numel()].view_as(p))
        offset += p.numel()


def train(rank, args):
    """One worker. Every worker holds the same model and optimiser state, computes the losses of its share of the
    step's item groups, and applies the summed gradients, so the run equals a single process's to float rounding.
    Worker 0 logs and saves; the workers share the watch set's decoding."""
    world = args.workers
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    if world > 1:
        torch.distributed.init_process_group("gloo", init_method="file://" + os.path.abspath(args.rendezvous),
                                             rank=rank, world_size=world, timeout=datetime.timedelta(minutes=20))
    ckpt_path = os.path.join(args.run, "ckpt.pt")
    config = Config(n_vocab=len(vocab()[0]), rope_base=args.rope_base)
    torch.manual_seed(args.seed)
    model = TinyQwen2VL(config)
    # No weight decay on biases and norms (the usual practice; it also keeps the K biases, see qwen2vl.py).
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98))
    step, seconds0 = resume(ckpt_path, model, opt, optional=("row_probe.",))
    lead = rank == 0
    if lead:
        print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters; {world} worker(s); config "
              f"{json.dumps(config.to_dict())}", file=sys.stderr)
        log, writer = open_log(args.run, step)
    held_out = [gen_pages.item(EVAL_SEED + i, "qa") for i in range(args.eval_items)]
    pointer_layers = [int(x) for x in args.pointer_layers.split(",") if x]
    blind_groups = [(il, g) for il in range(config.n_layer) for g in range(config.n_head_kv)]
    a0, a1 = (int(x) for x in args.pointer_anneal.split(","))

    signals = []
    signal.signal(signal.SIGTERM, lambda *_: signals.append(1))
    signal.signal(signal.SIGINT, lambda *_: signals.append(1))
    t_start, hist, stop = time.time(), [], False
    while step < args.steps and not stop:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        w_pointer = args.pointer_weight * (1 - 0.9 * min(1.0, max(0.0, (step - a0) / max(1, a1 - a0))))
        items = train_items(args.seed, step, args.batch, blind_at(step, args.blind_schedule), blind_groups)
        groups = worker_groups(items, rank, world, args.questions)
        sums, counts = batch_sums(model, groups, args.questions, pointer_layers)
        counts, values, stop = reduce_step(sums, counts, bool(signals), world)
        loss, glyph, pointer, row = (s / n for s, n in zip(sums, counts))
        w_row = args.row_weight if step >= args.row_from else 0.0
        total = loss + args.glyph_weight * glyph + w_pointer * pointer + w_row * row
        opt.zero_grad(set_to_none=True)
        total.backward()
        sum_gradients(model, world)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        em = watch_exact(model, held_out, rank, world) if step % args.eval_every == 0 or step == args.steps else None
        if not lead:
            continue
        hist.append(values)
        if step % 10 == 0:
            per = (time.time() - t_start) / len(hist)
            m = np.mean(hist[-10:], 0)
            print(f"step {step}/{args.steps} loss {m[0]:.4f} glyph {m[1]:.4f} pointer {m[2]:.3f} row {m[3]:.3f} "
                  f"{per:.2f} s/step ETA {(args.steps - step) * per / 3600:.1f} h", file=sys.stderr, flush=True)
        if em is not None:
            m = np.mean(hist[-50:], 0)
            writer.writerow([step, f"{seconds0 + time.time() - t_start:.0f}", f"{m[0]:.4f}", f"{m[1]:.4f}",
                             f"{m[2]:.4f}", f"{lr_at(step, args):.2e}", f"{em:.4f}"])
            log.flush()
            print(f"step {step}: held-out exact match {em:.3f}", file=sys.stderr, flush=True)
        if step % args.save_every == 0 or stop:
            save(ckpt_path, model, opt, step, seconds0 + time.time() - t_start, args)
    if lead:
        save(ckpt_path, model, opt, step, seconds0 + time.time() - t_start, args)
        print(f"saved step {step} to {ckpt_path}", file=sys.stderr)
    if world > 1:
        torch.distributed.destroy_process_group()


def main():
    ap = run_options(__doc__, steps=8000, batch=12, questions=3, save_every=50, threads=1)
    ap.add_argument("--workers", type=int, default=1,
                    help="data-parallel processes (gloo on this machine); each takes a share of a step's item groups")
    ap.add_argument("--rope-base", type=float, default=10000.0,
                    help="the text model's M-RoPE base; the width section gets the head's lowest frequencies")
    ap.add_argument("--glyph-weight", type=float, default=1.0)
    ap.add_argument("--pointer-weight", type=float, default=1.0)
    ap.add_argument("--pointer-layers", default="2,3")
    ap.add_argument("--pointer-anneal", default="1500,3000", help="steps between which the pointer weight falls to 1/10")
    ap.add_argument("--blind", default="0.5,0.75",
                    help="shares of items whose answer cells one random (layer, KV group) cannot see, so that no group "
                         "alone decides the answers; one per --blind-from step")
    ap.add_argument("--blind-from", default="1000,3000", help="the steps from which each --blind share applies")
    ap.add_argument("--row-weight", type=float, default=0.3, help="weight of the row probe's loss")
    ap.add_argument("--row-from", type=int, default=0, help="the step from which --row-weight applies")
    args = ap.parse_args()
    try:
        args.blind_schedule = blind_schedule(args.blind, args.blind_from)
    except ValueError as e:
        ap.error(str(e))
    if args.row_weight < 0:
        ap.error("--row-weight is not negative")
    os.makedirs(args.run, exist_ok=True)
    if args.workers == 1:
        return train(0, args)
    args.rendezvous = os.path.join(args.run, "workers.rendezvous")
    if os.path.exists(args.rendezvous):  # left by a run that was killed
        os.remove(args.rendezvous)
    supervise(args)


def supervise(args):
    """Runs the workers as child processes and waits. A SIGTERM or SIGINT is passed on to them (they stop after the
    same step and worker 0 saves). If one dies, the others are killed at once rather than left waiting out gloo's
    timeout in a collective; the last checkpoint is intact (it is written atomically)."""
    ctx = torch.multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=train, args=(rank, args)) for rank in range(args.workers)]
    for p in workers:
        p.start()

    def forward(sig, _frame):
        for p in workers:
            if p.is_alive():
                os.kill(p.pid, sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while any(p.is_alive() for p in workers):
        multiprocessing.connection.wait([p.sentinel for p in workers if p.is_alive()])
        failed = [rank for rank, p in enumerate(workers) if p.exitcode not in (None, 0)]
        if failed:
            for p in workers:
                if p.is_alive():
                    p.kill()
            sys.exit(f"train_qwen2vl: worker {failed[0]} failed (exit code {workers[failed[0]].exitcode}); the others "
                     "were stopped; rerun the same command to resume from the last checkpoint")


if __name__ == "__main__":
    main()
