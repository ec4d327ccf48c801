"""Model-card tables from vlm/evaluate.sh's reports, and the reports copied beside the model.

    python3 vlm/card_tables.py EVAL_OUT SET [--publish DIR]
    python3 vlm/card_tables.py --geometry INIT.json TRAINED.json

prints, for one set (qa-agnostic, qa-prompt, read-agnostic or multi-agnostic), the score tables of both protocols
(`ecokv report`'s first table of OUT/SET-paper.md and OUT/SET-equal.md) under the headings the model cards use.
--publish DIR also copies OUT/SET-{paper,equal}.{md,csv,json} into DIR, each through a temporary file.
--geometry prints the card's geometry table from vlm/check_targets.py's JSON before and after training: per (layer,
KV head) the mean key cosine, the background near-duplicate share and lambda (init -> trained), and the share of
right answers that group decides (trained).
"""
import argparse
import json
import os
import shutil
import sys

HEADINGS = {
    'paper': '**Paper windows** (each method at its paper\'s window: 32 for SnapKV, MixKV and the SnapKV-scored '
             'allocators, ManifoldKV, KeyDiff, LOOK-M; 4 for ECOKV and StreamingLLM):',
    'equal': '**Equal windows** (every method at window 8){extra}:',
}


def first_table(path):
    """The first Markdown table of an `ecokv report` file: the scores."""
    if not os.path.isfile(path):
        sys.exit(f'card_tables: {path} missing (vlm/evaluate.sh writes it)')
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith('|'):
                rows.append(line.rstrip('\n'))
            elif rows:
                break
    if not rows:
        sys.exit(f'card_tables: no table in {path}')
    return rows


def card_tables(out, name):
    parts = []
    for protocol in ('paper', 'equal'):
        rows = first_table(os.path.join(out, f'{name}-{protocol}.md'))
        extra = [what for key, what in (('mixkv_scale', 'MixKV\'s and ECOKV\'s other SPEC §5.2 readings'),
                                        ('smaller image', 'the full cache of a smaller image'))
                 if any(key in r for r in rows)]
        heading = HEADINGS[protocol].format(extra=', with ' + ' and '.join(extra) + ' as extra rows' if extra else '')
        parts.append(heading + '\n\n' + '\n'.join(rows))
    return '\n\n'.join(parts) + '\n'


def publish(out, name, dest):
    os.makedirs(dest, exist_ok=True)
    for protocol in ('paper', 'equal'):
        for ext in ('md', 'csv', 'json'):
            base = f'{name}-{protocol}.{ext}'
            tmp = os.path.join(dest, base + '.tmp')
            try:
                shutil.copyfile(os.path.join(out, base), tmp)
                os.replace(tmp, os.path.join(dest, base))
            finally:  # a failed copy (a missing report, a full disk, Ctrl-C) leaves no .tmp behind
                if os.path.exists(tmp):
                    os.remove(tmp)


def geometry_table(init_path, trained_path):
    def load(path):
        try:
            with open(path) as f:
                j = json.load(f)
            return {(h['layer'], h['kv_head']): h for h in j['geometry']}, j['decisions']['decided_share']
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f'card_tables: {path}: not a check_targets.py result ({e})')
    (init, _), (trained, decided) = load(init_path), load(trained_path)
    if init.keys() != trained.keys():
        sys.exit(f'card_tables: {init_path} and {trained_path} have different (layer, KV head) sets')
    rows = ['| layer | KV head | mean key cosine (init -> trained) | background near-duplicates (init -> trained) | '
            'lambda (init -> trained) | answers it decides |', '|---:|---:|---:|---:|---:|---:|']
    for (layer, head) in sorted(trained):
        a, b = init[(layer, head)], trained[(layer, head)]
        cells = [f'{a[k]:.2f} -> {b[k]:.2f}' for k in ('pair_cos_mean', 'background_near_duplicates', 'lambda')]
        rows.append(f'| {layer} | {head} | ' + ' | '.join(cells) + f' | {decided[layer][head]:.2f} |')
    return '\n'.join(rows) + '\n'


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('out', nargs='?', help='vlm/evaluate.sh output directory')
    ap.add_argument('set', nargs='?', help='qa-agnostic, qa-prompt, read-agnostic or multi-agnostic')
    ap.add_argument('--publish', metavar='DIR', help='copy the set\'s reports into DIR')
    ap.add_argument('--geometry', nargs=2, metavar=('INIT', 'TRAINED'), help='check_targets.py results')
    a = ap.parse_args()
    if a.geometry:
        sys.stdout.write(geometry_table(*a.geometry))
        return
    if not a.set:
        ap.error('EVAL_OUT and SET are required (or --geometry INIT TRAINED)')
    sys.stdout.write(card_tables(a.out, a.set))
    if a.publish:
        try:
            publish(a.out, a.set, a.publish)
        except OSError as e:
            sys.exit(f'card_tables: cannot publish to {a.publish}: {e}')


if __name__ == '__main__':
    main()
