"""The training machinery of train.py (tiny-vlm) and train_qwen2vl.py (tiny-qwen2vl), written once: the options
both take, the curriculum and the step's items (seeded by (--seed, step) only), padded token/target batches, the
loop (learning-rate schedule, clipping, logging, checkpoints every --save-every steps and on SIGTERM/SIGINT, the
watch set's exact match), resuming (log rows past the checkpoint dropped, training-only modules added later start
fresh), data-parallel workers (gloo: summed gradients, items dealt by cost, a supervisor that stops them all),
the blinding schedule and greedy decoding.

The trainers keep what is theirs: the model, the optimiser's groups, the batches' layout and losses, the
prompts. Training items use seeds >= 1,000,000 only (gen_docs.FIRST_TRAIN_SEED).

Fine-tuning (train_qwen2vl.py --init): a run can start from another run's weights with a fresh optimiser
(init_from), its curriculum can resize a share of the single pages as mtmd does (curriculum's `resize`), and the
watch can report more than one exact match (fit's `watch_names`: extra log.csv columns).

From scratch on pages off the token grid (tiny-qwen2vl v3): the curriculum's `resize` applies from step 0 when no
--schedule-from is given, and its `shift` moves a share of the pages by a few pixels against the token grid; a run
can also save every --save-minutes of wall time (a slow, niced run then loses at most that much when killed).
"""

import argparse
import csv
import ctypes
import datetime
import json
import math
import multiprocessing.connection
import os
import random
import signal
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from blocks import EOS, decode
from gen_docs import FIRST_TRAIN_SEED

EVAL_SEED = 230_000  # the watch set's held-out items (below 250,000: 250,000-999,999 are reserved)


def run_options(doc, steps, batch, questions, save_every, threads=2):
    """The options both trainers take (run directory, schedule, batch, seed, threads, checkpoints, watch set, the
    weights of the losses both have), with their defaults."""
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
    ap.add_argument("--save-minutes", type=float, default=0.0,
                    help="also save when this many minutes of wall time have passed since the last save (0: only every "
                         "--save-every steps)")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-items", type=int, default=128)
    ap.add_argument("--glyph-weight", type=float, default=1.0,
                    help="weight of the per-image-token character loss (dense supervision of the projector's output)")
    ap.add_argument("--pointer-weight", type=float, default=1.0,
                    help="weight of the attention loss: pointer heads attend to each answer character's image token")
    return ap


# --- items and batches ---------------------------------------------------------------------------------------------
def curriculum(step, rng, multi_from, p_multi, scale_from=None, resize=None, shift=None):
    """(task, n_fields, scale, keywords) for one training item at this step (keywords: the item's token_share and
    shift, only those drawn). Pages grow from 1-2 fields to 4-7 by step 1000; dense supervision (transcribe the
    page, read a line) gives way to field questions by step 3000;
    multi-page needle items (a share p_multi) join at multi_from; from scale_from (None: never) a fifth of the single
    pages are downscaled by 0.5-0.9. resize=(p, lo, hi) (None: never; no draws then, so the items are those of a
    run without it): a share p of the single pages is resized as mtmd does to token_share = U(lo, hi) of their
    native image tokens (gen_pages.item's token_share). shift=(p, n) (None: never, no draws): a share p of the single
    pages is moved by (dy, dx), each uniform in 0..n-1 pixels, before any resize (gen_pages.item's shift)."""
    hi = min(7, 2 + step // 200)
    n = rng.randint(1, hi) if rng.random() < 0.3 else rng.randint(max(1, hi - 3), hi)
    ramp = min(1.0, step / 3000)
    p_read, p_row = 0.4 - 0.2 * ramp, 0.25 - 0.15 * ramp
    p_multi = p_multi if step >= multi_from else 0.0
    scale = rng.uniform(0.5, 0.9) if scale_from is not None and step >= scale_from and rng.random() < 0.2 else None
    extra = {}
    if resize is not None:
        p, lo, hi = resize
        if rng.random() < p:
            extra["token_share"] = rng.uniform(lo, hi)
    if shift is not None:
        p, n_px = shift
        if rng.random() < p:
            extra["shift"] = (rng.randrange(n_px), rng.randrange(n_px))
    u = rng.random()
    if u < p_multi:
        return "multi", None, None, {}
    if u < p_multi + p_read:
        return "read", n, scale, extra
    if u < p_multi + p_read + p_row:
        return "row", n, scale, extra
    return "qa", n, scale, extra


def train_items(base_seed, step, batch, item, **schedule):
    """The step's items, which depend only on (base_seed, step): item(seed, task, n_fields, scale) of curriculum's
    draws (schedule: its keywords; item(..., token_share=F, shift=(dy, dx)) for the pages it resizes or moves), each
    asking its other questions in a shuffled order."""
    rng = random.Random(base_seed * 1_000_003 + step)
    out = []
    for _ in range(batch):
        task, n, scale, extra = curriculum(step, rng, **schedule)
        seed = rng.randrange(FIRST_TRAIN_SEED, 2**31)
        it = item(seed, task, n, scale, **extra)
        rng.shuffle(it["others"])
        out.append(it)
    return out


def padded_batch(seqs, labels):
    """EOS-padded tokens and -100-padded targets (B, T): target[:, i] is what position i must predict, tokens[:, i + 1]
    on answers and -100 elsewhere (checked)."""
    t = max(map(len, seqs))
    tokens = torch.tensor([s + [EOS] * (t - len(s)) for s in seqs])
    target = torch.tensor([lab + [-100] * (t - len(lab)) for lab in labels])
    supervised = target[:, :-1] != -100
    assert torch.equal(target[:, :-1][supervised], tokens[:, 1:][supervised]), "targets out of step"
    return tokens, target


def add_ce(sums, counts, i, logits, target):
    """Adds the summed cross-entropy of logits (..., n_classes) against target (...), -100 ignored, to sums[i] and
    its number of terms to counts[i]: a loss is a sum over the count of the whole batch, however it is split."""
    target = target.reshape(-1)
    sums[i] = sums[i] + F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target, ignore_index=-100,
                                        reduction="sum")
    counts[i] += int((target != -100).sum())


# --- greedy answers (the watch set) ------------------------------------------------------------------------------
def greedy_answers(prompts, logits, extend=None, max_new=16):
    """Greedy answers (decoded) to prompts (lists of ids, extended in place) up to EOS or max_new tokens. logits(tokens)
    gives (B, T, n_vocab) for the EOS-padded prompts, run whole each time (no KV cache: the watch set is small);
    extend(row, token), when given, appends a token (and its position) instead of prompts[row].append. Called under
    torch.no_grad()."""
    extend = extend or (lambda row, token: prompts[row].append(token))
    done, outs = [False] * len(prompts), [[] for _ in prompts]
    for _ in range(max_new):
        t = max(map(len, prompts))
        out = logits(torch.tensor([s + [EOS] * (t - len(s)) for s in prompts]))
        for r, s in enumerate(prompts):
            if done[r]:
                continue
            nxt = int(out[r, len(s) - 1].argmax())
            if nxt == EOS:
                done[r] = True
            else:
                outs[r].append(nxt)
                extend(r, nxt)
        if all(done):
            break
    return [decode(o) for o in outs]


def exact_matches(model, items, greedy, batch):
    """The number of items that greedy(model, items) answers exactly, run `batch` at a time in groups of one image
    count (so no item is padded to a longer one's images)."""
    model.eval()
    right = 0
    for i in range(0, len(items), batch):
        chunk = items[i: i + batch]
        for n in sorted({len(it["images"]) for it in chunk}):
            sub = [it for it in chunk if len(it["images"]) == n]
            right += sum(a == it["answer"] for a, it in zip(greedy(model, sub), sub))
    model.train()
    return right


def watch_exact(model, items, greedy, batch, rank=0, world=1):
    """Exact match on the watch set, each worker decoding its share (the others would otherwise wait idle)."""
    right = torch.tensor([float(exact_matches(model, items[rank::world], greedy, batch))], dtype=torch.float64)
    if world > 1:
        torch.distributed.all_reduce(right)
    return float(right) / len(items)


# --- blinding ------------------------------------------------------------------------------------------------------
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


# --- workers -------------------------------------------------------------------------------------------------------
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


def start_worker(args, rank=0, world=1):
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    if world > 1:
        torch.distributed.init_process_group("gloo", init_method="file://" + os.path.abspath(args.rendezvous),
                                             rank=rank, world_size=world, timeout=datetime.timedelta(minutes=20))


def deal(items, world, cost):
    """The items in `world` shares: each item, costliest first, goes to the share with the least cost so far (each
    step waits for the slowest worker)."""
    loads, shares = [0] * world, [[] for _ in range(world)]
    for c, it in sorted(((cost(it), it) for it in items), key=lambda c: -c[0]):
        w = loads.index(min(loads))
        loads[w] += c
        shares[w].append(it)
    return shares


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


def launch(args, train):
    """train(rank, args) in this process for one worker, else in args.workers child processes, supervised: a SIGTERM
    or SIGINT is passed on to them (they stop after the same step and worker 0 saves)."""
    if args.workers == 1:
        return train(0, args)
    args.rendezvous = os.path.join(args.run, "workers.rendezvous")
    if os.path.exists(args.rendezvous):  # left by a run that was killed
        os.remove(args.rendezvous)
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
    supervise(workers)


def supervise(workers):
    """Waits for the worker processes. If one dies, the others are killed at once rather than left waiting out
    gloo's timeout in a collective; the last checkpoint is intact (it is written atomically)."""
    running = list(workers)
    while running:
        # Waits on every worker not yet reaped and reaps before reading exit codes: a worker that exits between an
        # is_alive() look and the wait, or is read before the kernel has reaped it, would otherwise be missed and
        # the supervisor would wait forever (seen in 2-worker runs of 3 steps and in the test's failing worker).
        ready = multiprocessing.connection.wait([p.sentinel for p in running])
        done = [p for p in running if p.sentinel in ready]
        for p in done:
            p.join()
        running = [p for p in running if p not in done]
        failed = [workers.index(p) for p in done if p.exitcode != 0]
        if failed:
            for p in running:
                p.kill()
            sys.exit(f"{os.path.basename(sys.argv[0])}: worker {failed[0]} failed (exit code "
                     f"{workers[failed[0]].exitcode}); the others were stopped; rerun the same command to resume from "
                     "the last checkpoint")


# --- checkpoints and the log ---------------------------------------------------------------------------------------
def save(path, model, opt, step, seconds, args):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "seconds": seconds,
                "config": model.c.to_dict(), "args": vars(args)}, tmp)
    os.replace(tmp, path)


def load_weights(path, model, optional=(), grow=()):
    """(checkpoint, names of the parameters it lacks): its weights loaded into model. Another configuration, or
    parameters missing beyond the `optional` prefixes (training-only modules added later), end the run. `grow`:
    configuration keys that may be larger in the model (a grown network; its new parameters are then optional)."""
    ck = torch.load(path)
    want = model.c.to_dict()
    if {k: v for k, v in ck["config"].items() if k not in grow} != {k: v for k, v in want.items() if k not in grow} or \
            any(ck["config"][k] > want[k] for k in grow):
        sys.exit(f"{path} holds another model configuration: {json.dumps(ck['config'])}")
    optional = tuple(optional) + tuple(model.grown_prefixes(ck["config"]) if grow else ())
    missing, unexpected = model.load_state_dict(ck["model"], strict=False)
    if unexpected or any(not name.startswith(tuple(optional)) for name in missing):
        sys.exit(f"{path} does not match the model: missing {missing}, unexpected {unexpected}")
    return ck, missing


def resume(ckpt_path, model, opt, optional=()):
    """(step, seconds trained) of the checkpoint loaded into model and opt; (0, 0) without one. A checkpoint of
    another model configuration is refused; one without parameters whose names start with an `optional` prefix
    (training-only modules added during a run) loads, and those start fresh."""
    if not os.path.exists(ckpt_path):
        return 0, 0.0
    ck, missing = load_weights(ckpt_path, model, optional)
    opt.load_state_dict(optimizer_state(ck["opt"], model, opt, set(missing)))
    print(f"resumed at step {ck['step']}" + (f" ({', '.join(missing)} new)" if missing else ""), file=sys.stderr)
    return ck["step"], ck["seconds"]


def init_from(path, model, optional=(), grow=()):
    """Load the model weights of another run's checkpoint (a fine-tune's start; the optimiser starts fresh). Refused
    as resume() refuses: another configuration, or parameters missing beyond the `optional` prefixes. With `grow`
    (configuration keys the model may have larger), the model's grow(old config) makes the new parts start as no-ops."""
    ck, _ = load_weights(path, model, optional, grow)
    if grow:
        model.grow(ck["config"])
    print(f"initialised from {path} (its step {ck['step']}); a fresh optimiser", file=sys.stderr)
    return ck["step"]


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


def open_log(run, step, extra=()):
    """RUN/log.csv for appending (with its header when new, `extra` columns after eval_exact) and its csv writer.
    Rows past `step`, the checkpoint's, are dropped first: a run stopped between logging and saving, or a log copied
    later than its checkpoint, would otherwise log those steps twice on resuming."""
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
        writer.writerow(["step", "seconds", "loss", "glyph_loss", "pointer_loss", "lr", "eval_exact", *extra])
    return log, writer


# --- the loop ------------------------------------------------------------------------------------------------------
def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def fit(args, model, opt, losses, watch, names, rank=0, world=1, optional=(), watch_names=()):
    """Train from RUN/ckpt.pt (or from the start) to --steps. losses(step, stopping) -> (this worker's total loss,
    the loss values to log, stop: whether any worker was told to stop); watch() -> the watch set's exact match, which
    every worker helps compute, or with watch_names (more log.csv columns) a tuple of it and one more per name.
    Every worker applies the summed gradients, so the run equals a single process's to float rounding. Worker 0
    prints the values under `names` (the first three are log.csv's loss columns), logs and saves."""
    ckpt_path = os.path.join(args.run, "ckpt.pt")
    step, seconds0 = resume(ckpt_path, model, opt, optional)
    lead = rank == 0
    if lead:
        print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters; {world} worker(s); config "
              f"{json.dumps(model.c.to_dict())}", file=sys.stderr)
        log, writer = open_log(args.run, step, watch_names)
    signals = []
    signal.signal(signal.SIGTERM, lambda *_: signals.append(1))
    signal.signal(signal.SIGINT, lambda *_: signals.append(1))
    t_start, hist, stop = time.time(), [], False
    last_save, save_seconds = t_start, 60 * getattr(args, "save_minutes", 0.0)
    seconds = lambda: seconds0 + time.time() - t_start  # noqa: E731
    while step < args.steps and not stop:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        total, values, stop = losses(step, bool(signals))
        opt.zero_grad(set_to_none=True)
        total.backward()
        sum_gradients(model, world)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        em = watch() if step % args.eval_every == 0 or step == args.steps else None
        if not lead:
            continue
        hist.append(values)
        if step % 10 == 0:
            per = (time.time() - t_start) / len(hist)
            print(f"step {step}/{args.steps} " + " ".join(f"{n} {m:.4f}" for n, m in zip(names, np.mean(hist[-10:], 0)))
                  + f" {per:.2f} s/step ETA {(args.steps - step) * per / 3600:.1f} h", file=sys.stderr, flush=True)
        if em is not None:
            em, *more = em if watch_names else (em,)
            m = np.mean(hist[-50:], 0)
            writer.writerow([step, f"{seconds():.0f}", f"{m[0]:.4f}", f"{m[1]:.4f}", f"{m[2]:.4f}",
                             f"{lr_at(step, args):.2e}", f"{em:.4f}"] + [f"{x:.4f}" for x in more])
            log.flush()
            print(f"step {step}: held-out exact match {em:.3f}" + "".join(f", {n} {x:.3f}" for n, x in
                                                                       zip(watch_names, more)),
                  file=sys.stderr, flush=True)
        if step % args.save_every == 0 or stop or (save_seconds > 0 and time.time() - last_save >= save_seconds):
            save(ckpt_path, model, opt, step, seconds(), args)
            last_save = time.time()
    if lead:
        save(ckpt_path, model, opt, step, seconds(), args)
        print(f"saved step {step} to {ckpt_path}", file=sys.stderr)
