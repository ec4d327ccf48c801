#!/usr/bin/env python3
"""Train the tiny VLM on generated documents (CPU, seeded, resumable).

  python3 vlm/train.py --run vlm/runs/main --steps 6000

Checkpoints go to RUN/ckpt.pt (atomically, every --save-every steps and on SIGTERM/SIGINT); rerunning the same
command resumes from there, with the same data order, so a run killed at any point continues where it was.
RUN/log.csv holds the learning curve (loss; exact match of greedy answers on held-out items).

Curriculum, by step: pages start with 1-2 fields and grow to 4-7; the task mix starts with dense supervision
(transcribe the page, read line n) and shifts to questions about one field; multi-image needle items join
halfway. Each image asks up to --questions of its questions in a row. Besides the answers, a dense loss
(--glyph-weight) asks each projected patch to score highest against the text embedding of the character it
shows: without it, a first run's answers were still independent of the image after 500 steps.
Training items use seeds >= 1,000,000 only (gen_docs.FIRST_TRAIN_SEED).
"""

import argparse
import csv
import ctypes
import json
import math
import os
import random
import signal
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_docs  # noqa: E402
from model import BOS, EOS, Config, TinyVLM, decode, encode, vocab  # noqa: E402

EVAL_SEED = 230_000  # held-out items watched during training (below 250,000: 250,000-999,999 are reserved)


# --- batches -----------------------------------------------------------------------------------------------------
def prompt_tokens(n_images, n_patches, context, question):
    """Ids of the prompt as `ecokv eval`/`ecokv run` build it: BOS, then per image its slot and "\n", then the
    context, "\n", the question. Returns (ids, image slot starts)."""
    ids, slots = [BOS], []
    for _ in range(n_images):
        slots.append(len(ids))
        ids += [0] * n_patches + encode("\n")
    ids += encode(context + "\n" + question)
    return ids, slots


def glyph_targets(page):
    """The token of the character each patch shows, in raster order (a blank cell is the space piece)."""
    return [encode(ch)[0] for row in page for ch in row]


def make_batch(items, n_patches, max_questions=1):
    """Token/target tensors. With max_questions > 1 an item asks up to that many of its questions in a row
    (answer, EOS, "\n", next question, ...): more supervised answers per image for the same compute."""
    seqs, labels, slots, images, glyphs, pointers = [], [], [], [], [], []
    for row, it in enumerate(items):
        glyphs += [glyph_targets(p) for p in it["pages"]]
        ids, starts = prompt_tokens(len(it["images"]), n_patches, it["context"], it["question"])
        seq, lab = list(ids), [-100] * (len(ids) - 1)
        extra = it["others"][: max_questions - 1]
        for k, (q, a) in enumerate([(it["question"], it["answer"])] + extra):
            if k:
                question = encode("\n" + q)
                seq += question
                lab += [-100] * len(question)
            answer = encode(a) + [EOS]
            if len(answer) == len(a) + 1:  # one token per character: point each at its cell
                n_grid = int(round(n_patches ** 0.5))
                for i, cell in enumerate(gen_docs.answer_cells(it["pages"], q, a)):
                    if cell is not None:
                        p, r, c = cell
                        pointers.append((row, len(seq) + i - 1, starts[p] + r * n_grid + c))
            seq += answer
            lab += answer
        lab.append(-100)
        seqs.append(seq)
        labels.append(lab)
        slots += [(row, s) for s in starts]
        images += it["images"]
    t = max(map(len, seqs))
    tokens = torch.tensor([s + [EOS] * (t - len(s)) for s in seqs])
    # target[:, i] is what position i must predict: tokens[:, i + 1] on answers, -100 elsewhere.
    target = torch.tensor([lab + [-100] * (t - len(lab)) for lab in labels])
    supervised = target[:, :-1] != -100
    assert torch.equal(target[:, :-1][supervised], tokens[:, 1:][supervised]), "targets out of step"
    return tokens, target, torch.from_numpy(np.stack(images)), slots, torch.tensor(glyphs), torch.tensor(pointers)


def curriculum(step, rng):
    """(task, n_fields) for one training item at this step."""
    hi = min(7, 2 + step // 200)
    n = rng.randint(1, hi) if rng.random() < 0.3 else rng.randint(max(1, hi - 3), hi)
    ramp = min(1.0, step / 3000)
    p_read, p_row = 0.4 - 0.2 * ramp, 0.25 - 0.15 * ramp
    p_multi = 0.08 if step >= 2500 else 0.0
    u = rng.random()
    if u < p_multi:
        return "multi", None
    if u < p_multi + p_read:
        return "read", n
    if u < p_multi + p_read + p_row:
        return "row", n
    return "qa", n


def train_items(base_seed, step, batch):
    rng = random.Random(base_seed * 1_000_003 + step)
    out = []
    for _ in range(batch):
        task, n = curriculum(step, rng)
        seed = rng.randrange(gen_docs.FIRST_TRAIN_SEED, 2**31)
        it = gen_docs.item(seed, task, n)
        rng.shuffle(it["others"])
        out.append(it)
    return out


def batch_losses(model, items, n_patches, max_questions, pointer_layer):
    """The four training losses of a batch, each a mean over all its terms (answer tokens, patches, pointed
    characters). Items are run in groups of the same image count: padding single-page items to the length of a
    4-page needle item made steps 3-4x slower; the means are those of the whole batch."""
    sums, counts = [torch.zeros(()) for _ in range(4)], [0] * 4  # tensors even when a batch has no pointers
    for n_images in sorted({len(it["images"]) for it in items}):
        group = [it for it in items if len(it["images"]) == n_images]
        tokens, target, images, slots, glyphs, pointers = make_batch(group, n_patches, max_questions)
        feats = model.vision(images)
        logits, probs = model(model.embed(tokens[:, :-1], feats, slots), probe_layer=pointer_layer)
        target = target[:, :-1].reshape(-1)
        sums[0] = sums[0] + F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target, ignore_index=-100,
                                            reduction="sum")
        counts[0] += int((target != -100).sum())
        sums[1] = sums[1] + F.cross_entropy(model.glyph_logits(feats).reshape(-1, logits.shape[-1]),
                                            glyphs.reshape(-1), reduction="sum")
        counts[1] += glyphs.numel()
        where = model.where_logits(feats)  # (images, patches, 2, grid) against each patch's (row, column)
        n_grid = where.shape[-1]
        rc = torch.stack((torch.arange(n_patches) // n_grid, torch.arange(n_patches) % n_grid), -1)
        sums[2] = sums[2] + F.cross_entropy(where.reshape(-1, n_grid), rc.expand(where.shape[0], -1, -1).reshape(-1),
                                            reduction="sum")
        counts[2] += rc.numel() * where.shape[0]
        # Pointer supervision: one head, at the position that predicts an answer character, should attend to
        # the image token showing that character.
        if len(pointers):
            p = probs[pointers[:, 0], 0, pointers[:, 1], pointers[:, 2]]
            sums[3] = sums[3] - torch.log(p + 1e-6).sum()
            counts[3] += len(pointers)
    return [s / max(1, n) for s, n in zip(sums, counts)]


# --- greedy answers (for the learning curve) ---------------------------------------------------------------------
@torch.no_grad()
def greedy(model, items, max_new=16):
    c = model.c
    n_patches = (c.image_size // c.patch_size) ** 2
    seqs, slots, images = [], [], []
    for row, it in enumerate(items):
        ids, starts = prompt_tokens(len(it["images"]), n_patches, it["context"], it["question"])
        seqs.append(ids)
        slots += [(row, s) for s in starts]
        images += it["images"]
    feats = model.vision(torch.from_numpy(np.stack(images)))
    done = [False] * len(items)
    outs = [[] for _ in items]
    for _ in range(max_new):
        t = max(map(len, seqs))
        tokens = torch.tensor([s + [EOS] * (t - len(s)) for s in seqs])
        x = model.tok(tokens)
        for i, (row, start) in enumerate(slots):
            x[row, start: start + n_patches] = feats[i]
        logits = model(x)
        for r, s in enumerate(seqs):
            if done[r]:
                continue
            nxt = int(logits[r, len(s) - 1].argmax())
            if nxt == EOS:
                done[r] = True
            else:
                outs[r].append(nxt)
                s.append(nxt)
        if all(done):
            break
    return [decode(o) for o in outs]


def evaluate(model, items):
    model.eval()
    answers = []
    for i in range(0, len(items), 32):
        answers += greedy(model, items[i: i + 32])
    model.train()
    return sum(a == it["answer"] for a, it in zip(answers, items)) / len(items)


# --- memory --------------------------------------------------------------------------------------------------------
def keep_freed_memory():
    """Keep freed memory in the process instead of handing it back to the kernel (glibc only; elsewhere a no-op).
    Autograd frees and reallocates its attention-sized buffers (tens of MB) every step, and glibc returns each one to
    the kernel (mmap above 128 KiB, heap trimming), so every step page-faulted them back in zeroed: a quarter of the
    training processes' CPU time was system time. Measured on one process computing 6 steps of tiny-qwen2vl's
    batches beside the running training: 8.6 CPU s a step before, 5.0-5.5 after."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3  # glibc's malloc.h
    libc.mallopt(m_mmap_threshold, 32 << 20)  # the largest glibc accepts; larger blocks are still mmapped
    libc.mallopt(m_trim_threshold, 1 << 30)
    libc.mallopt(m_top_pad, 64 << 20)


# --- checkpoints -------------------------------------------------------------------------------------------------
def save(path, model, opt, step, seconds, args):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "seconds": seconds,
                "config": model.c.to_dict(), "args": vars(args)}, tmp)
    os.replace(tmp, path)


def run_options(doc, steps, batch, questions, save_every, threads=2):
    """The options both trainers take (run directory, schedule, batch, seed, threads, checkpoints, watch set), with
    their defaults."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="run directory (checkpoint, log)")
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--questions", type=int, default=questions, help="questions asked per training image")
    ap.add_argument("--threads", type=int, default=threads, help="torch's threads")
    ap.add_argument("--save-every", type=int, default=save_every)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-items", type=int, default=128)
    return ap


def resume(ckpt_path, model, opt, optional=()):
    """(step, seconds trained) of the checkpoint loaded into model and opt; (0, 0) without one. A checkpoint of
    another model configuration is refused; one without parameters whose names start with an `optional` prefix
    (training-only modules added during a run) loads, and those start fresh."""
    if not os.path.exists(ckpt_path):
        return 0, 0.0
    ck = torch.load(ckpt_path)
    if ck["config"] != model.c.to_dict():
        sys.exit(f"{ckpt_path} holds another model configuration: {json.dumps(ck['config'])}")
    missing, unexpected = model.load_state_dict(ck["model"], strict=False)
    if unexpected or any(not name.startswith(tuple(optional)) for name in missing):
        sys.exit(f"{ckpt_path} does not match the model: missing {missing}, unexpected {unexpected}")
    opt.load_state_dict(optimizer_state(ck["opt"], model, opt, set(missing)))
    print(f"resumed at step {ck['step']}" + (f" ({', '.join(missing)} new)" if missing else ""), file=sys.stderr)
    return ck["step"], ck["seconds"]


def optimizer_state(saved, model, opt, new):
    """The saved optimizer state renumbered for opt, whose parameter groups hold the parameters the saved one
    held, in the same order, plus the `new` ones (named), which get no state. Optimizer states are indexed by
    position over the groups' parameters, so a parameter added to a group shifts the ones after it."""
    if not new:
        return saved
    name = {id(p): n for n, p in model.named_parameters()}
    groups = [[name[id(p)] for p in g["params"]] for g in opt.param_groups]
    old = [n for g in groups for n in g if n not in new]
    now = {n: i for i, n in enumerate(n for g in groups for n in g)}
    state = {now[old[i]]: st for i, st in saved["state"].items()}
    param_groups = [{**g, "params": [now[n] for n in names]} for g, names in zip(saved["param_groups"], groups)]
    return {"state": state, "param_groups": param_groups}


def open_log(run, step):
    """RUN/log.csv for appending (with its header when new) and its csv writer. Rows past `step`, the checkpoint's,
    are dropped first: a run stopped between logging and saving, or a log copied later than its checkpoint, would
    otherwise log those steps twice on resuming."""
    path = os.path.join(run, "log.csv")
    if os.path.exists(path):
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        kept = rows[:1] + [r for r in rows[1:] if int(r[0]) <= step]
        if kept != rows:
            with open(path + ".tmp", "w", newline="") as f:
                csv.writer(f).writerows(kept)
            os.replace(path + ".tmp", path)
    new = not os.path.exists(path)
    log = open(path, "a", newline="")
    writer = csv.writer(log)
    if new:
        writer.writerow(["step", "seconds", "loss", "glyph_loss", "pointer_loss", "lr", "eval_exact"])
    return log, writer


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def main():
    ap = run_options(__doc__, steps=6000, batch=32, questions=4, save_every=100)
    ap.add_argument("--glyph-weight", type=float, default=1.0,
                    help="weight of the per-patch character loss on the projector output (dense supervision)")
    ap.add_argument("--pointer-weight", type=float, default=1.0,
                    help="weight of the attention loss: head 0 of --pointer-layer points at each answer character")
    ap.add_argument("--pointer-layer", type=int, default=2)
    args = ap.parse_args()

    keep_freed_memory()
    torch.set_num_threads(args.threads)
    os.makedirs(args.run, exist_ok=True)
    ckpt_path = os.path.join(args.run, "ckpt.pt")
    config = Config(n_vocab=len(vocab()[0]))
    torch.manual_seed(args.seed)
    model = TinyVLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    step, seconds0 = resume(ckpt_path, model, opt)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e6:.2f} M parameters; config {json.dumps(config.to_dict())}", file=sys.stderr)

    held_out = [gen_docs.item(EVAL_SEED + i, "qa") for i in range(args.eval_items)]
    log, writer = open_log(args.run, step)

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    n_patches = (config.image_size // config.patch_size) ** 2
    t_start, losses, glyph_losses, pointer_losses = time.time(), [], [], []
    while step < args.steps and not stop:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        loss, glyph, where_loss, pointer = batch_losses(model, train_items(args.seed, step, args.batch), n_patches,
                                                        args.questions, args.pointer_layer)
        total = loss + args.glyph_weight * (glyph + where_loss) + args.pointer_weight * pointer
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        losses.append(loss.item())
        glyph_losses.append(glyph.item())
        pointer_losses.append(pointer.item())
        if step % 10 == 0:
            el = time.time() - t_start
            per = el / len(losses)
            print(f"step {step}/{args.steps} loss {np.mean(losses[-10:]):.4f} glyph {np.mean(glyph_losses[-10:]):.4f} "
                  f"pointer {np.mean(pointer_losses[-10:]):.3f} "
                  f"{per:.2f} s/step "
                  f"ETA {(args.steps - step) * per / 60:.0f} min", file=sys.stderr, flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            em = evaluate(model, held_out)
            writer.writerow([step, f"{seconds0 + time.time() - t_start:.0f}", f"{np.mean(losses[-50:]):.4f}", f"{np.mean(glyph_losses[-50:]):.4f}",
                             f"{np.mean(pointer_losses[-50:]):.4f}",
                             f"{lr_at(step, args):.2e}", f"{em:.4f}"])
            log.flush()
            print(f"step {step}: held-out exact match {em:.3f}", file=sys.stderr, flush=True)
        if step % args.save_every == 0 or stop:
            save(ckpt_path, model, opt, step, seconds0 + time.time() - t_start, args)
    save(ckpt_path, model, opt, step, seconds0 + time.time() - t_start, args)
    print(f"saved step {step} to {ckpt_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
