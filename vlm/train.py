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
The loop, checkpoints, log and greedy decoding are trainer.py's (train_qwen2vl.py shares them); here are the
batches, the losses and the options.
"""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_docs  # noqa: E402
import trainer  # noqa: E402
from blocks import EOS, encode, vocab  # noqa: E402
from model import Config, TinyVLM, prompt_tokens  # noqa: E402


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
    tokens, target = trainer.padded_batch(seqs, labels)
    return tokens, target, torch.from_numpy(np.stack(images)), slots, torch.tensor(glyphs), torch.tensor(pointers)


def train_items(base_seed, step, batch):
    return trainer.train_items(base_seed, step, batch, lambda seed, task, n, _scale: gen_docs.item(seed, task, n),
                              multi_from=2500, p_multi=0.08)


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
        trainer.add_ce(sums, counts, 0, logits, target[:, :-1])
        trainer.add_ce(sums, counts, 1, model.glyph_logits(feats), glyphs)
        where = model.where_logits(feats)  # (images, patches, 2, grid) against each patch's (row, column)
        n_grid = where.shape[-1]
        rc = torch.stack((torch.arange(n_patches) // n_grid, torch.arange(n_patches) % n_grid), -1)
        trainer.add_ce(sums, counts, 2, where, rc.expand(where.shape[0], -1, -1))
        # Pointer supervision: one head, at the position that predicts an answer character, should attend to
        # the image token showing that character.
        if len(pointers):
            p = probs[pointers[:, 0], 0, pointers[:, 1], pointers[:, 2]]
            sums[3] = sums[3] - torch.log(p + 1e-6).sum()
            counts[3] += len(pointers)
    return [s / max(1, n) for s, n in zip(sums, counts)]


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
    return trainer.greedy_answers(seqs, lambda tokens: model(model.embed(tokens, feats, slots)), max_new=max_new)


def main():
    ap = trainer.run_options(__doc__, steps=6000, batch=32, questions=4, save_every=100)
    ap.add_argument("--pointer-layer", type=int, default=2, help="the layer whose head 0 is the pointer head")
    args = ap.parse_args()

    trainer.start_worker(args)
    os.makedirs(args.run, exist_ok=True)
    config = Config(n_vocab=len(vocab()[0]))
    torch.manual_seed(args.seed)
    model = TinyVLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    held_out = [gen_docs.item(trainer.EVAL_SEED + i, "qa") for i in range(args.eval_items)]
    n_patches = (config.image_size // config.patch_size) ** 2

    def losses(step, stopping):
        loss, glyph, where, pointer = batch_losses(model, train_items(args.seed, step, args.batch), n_patches,
                                                   args.questions, args.pointer_layer)
        total = loss + args.glyph_weight * (glyph + where) + args.pointer_weight * pointer
        return total, [loss.item(), glyph.item(), pointer.item()], stopping

    def watch():
        return trainer.watch_exact(model, held_out, greedy, 32)

    trainer.fit(args, model, opt, losses, watch, ("loss", "glyph", "pointer"))


if __name__ == "__main__":
    main()
