#!/usr/bin/env python3
"""Mutated GGUF files through `ecokv run`: every one must end in a clean exit (0: it still loads and runs, 1: a clean
error), never a signal (crash, assert) or a hang. Clean errors are counted apart when they do not name the file (a
mutation inside the weights that makes the prefill compute NaN is found only when it is computed).

Each case takes one bundled model file (stories260K, the tiny VLM, its projector: in turn), mutates it from its seed
(mostly inside the header, key/values and tensor table, where a byte decides structure; sometimes a truncation or a
change in the tensor data) and runs it. Seeds are the case numbers from --first-seed (held-out range below 250,000;
the ctest run uses 0..N-1, the issue-15 report 0..2999).

  mutate.py --ecokv BIN --models DIR --cases N [--first-seed S] [--timeout T] [--json OUT] [--keep DIR]
"""
import argparse, json, os, random, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..', 'third_party', 'llama.cpp', 'gguf-py'))
import gguf  # noqa: E402  (llama.cpp's own reader, to find where the header ends)

STORY = 'Once upon a time there was a little girl named Lily. She liked to play with her ball in the park.'


def header_size(path):
    r = gguf.GGUFReader(path)
    return int(min(t.data_offset for t in r.tensors))


def mutate(data, head, rng):
    data = bytearray(data)
    kind = rng.random()
    if kind < 0.10:  # truncated
        return bytes(data[:rng.randrange(len(data))]), 'truncate'
    lo, hi = (0, head) if kind < 0.95 else (head, len(data))
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(lo, hi)
        op = rng.random()
        if op < 0.35:
            data[at] ^= 1 << rng.randrange(8)
        elif op < 0.65:
            data[at] = rng.randrange(256)
        elif op < 0.8:
            data[at] = rng.choice([0x00, 0xFF, 0x7F, 0x80, 0x01])
        else:  # a little-endian integer (a length, a count, a type, a dimension) set to an edge value
            width = rng.choice([4, 8])
            at = min(at - at % 4, len(data) - width)
            v = rng.choice([0, 1, 2, 0xFFFFFFFF, 0x7FFFFFFF, 1 << 20, 1 << 31, (1 << 64) - 1, 1 << 40])
            data[at:at + width] = (v % (1 << (8 * width))).to_bytes(width, 'little')
    return bytes(data), 'header' if kind < 0.95 else 'data'


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--ecokv', required=True)
    ap.add_argument('--models', required=True)
    ap.add_argument('--cases', type=int, default=300)
    ap.add_argument('--first-seed', type=int, default=0)
    ap.add_argument('--timeout', type=float, default=60)
    ap.add_argument('--json')
    ap.add_argument('--keep', help='copy crashing and hanging files here')
    a = ap.parse_args()
    if not 0 <= a.first_seed and a.first_seed + a.cases <= 250_000:
        sys.exit('mutate.py: seeds must stay below 250,000 (250,000-999,999 are reserved for external checks)')
    m = lambda f: os.path.join(a.models, f)
    image = m('tiny-vlm-sample.png')
    targets = [
        ('stories260K.gguf', lambda p: ['--model', p, '-p', STORY, '-b', '8']),
        ('tiny-vlm.gguf', lambda p: ['--model', p, '--mmproj', m('tiny-vlm-mmproj.gguf'), '--image', image]),
        ('tiny-vlm-mmproj.gguf', lambda p: ['--model', m('tiny-vlm.gguf'), '--mmproj', p, '--image', image]),
    ]
    originals = {f: (open(m(f), 'rb').read(), header_size(m(f))) for f, _ in targets}
    counts = {'ran': 0, 'clean_error': 0, 'error_without_file': 0, 'crash': 0, 'hang': 0}
    failures = []
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.cases):
            seed = a.first_seed + i
            name, args = targets[seed % len(targets)]  # a seed alone reproduces a case
            data, kind = mutate(*originals[name], random.Random(seed))
            path = os.path.join(tmp, f'{seed}-{name}')
            with open(path, 'wb') as f:
                f.write(data)
            cmd = [a.ecokv, 'run', *args(path), '-n', '2', '-t', '1']
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, errors='replace', timeout=a.timeout)
                rc, err = p.returncode, p.stderr.strip().splitlines()
                outcome = ('ran' if rc == 0 else
                           'clean_error' if rc == 1 and path in p.stderr else
                           'error_without_file' if rc == 1 else 'crash')
            except subprocess.TimeoutExpired:
                rc, err, outcome = None, [], 'hang'
            counts[outcome] += 1
            if outcome not in ('ran', 'clean_error'):  # error_without_file: reported, not a failure
                failures.append({'seed': seed, 'file': name, 'kind': kind, 'outcome': outcome, 'rc': rc,
                                 'stderr': err[-3:]})
                if a.keep and outcome in ('crash', 'hang'):
                    os.makedirs(a.keep, exist_ok=True)
                    os.replace(path, os.path.join(a.keep, os.path.basename(path)))
            if path and os.path.exists(path):
                os.remove(path)
            if (i + 1) % max(1, a.cases // 20) == 0:
                print(f'[mutate] {i + 1}/{a.cases} {counts} {time.time() - t0:.0f} s', file=sys.stderr, flush=True)
    result = {'cases': a.cases, 'first_seed': a.first_seed, 'counts': counts, 'failures': failures}
    if a.json:
        with open(a.json, 'w') as f:
            json.dump(result, f, indent=1)
    print(json.dumps({'cases': a.cases, 'counts': counts}))
    for f in failures[:20]:
        print(f'  seed {f["seed"]} {f["file"]} ({f["kind"]}): {f["outcome"]} rc={f["rc"]} {f["stderr"][-1:]}')
    return 1 if counts['crash'] or counts['hang'] else 0


if __name__ == '__main__':
    sys.exit(main())
