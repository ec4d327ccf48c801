#!/usr/bin/env bash
# tiny-qwen2vl v3 (issue 48): start or resume its training in the background, at the lowest CPU priority.
#
#   bash vlm/train_qwen2vl_v3.sh          # from the repository root; the same command resumes
#
# Trains from scratch (vlm/runs/qwen2-v3/PLAN.md: the tower's size, the measured speeds, the stop rules and the
# amendments: the glyph slots from step 5,616) into
# vlm/runs/qwen2-v3/: ckpt.pt (every 50 steps, at most every 4 minutes of wall time, and on SIGTERM), log.csv (the
# watch set every 250 steps, native and at 0.5x tokens), train.log (appended). The items of a step depend only on
# the step, so a run stopped at any moment resumes from its last checkpoint with the data it would have seen.
# A lock (flock on RUN/.lock, held by the trainer) refuses a second copy while one runs. Stop it with `kill -TERM PID`
# (the PID it prints; pgrep -f 'run vlm/runs/qwen2-v3' -o): the workers finish their step and the checkpoint is saved.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=vlm/runs/qwen2-v3
mkdir -p "$RUN"
if ! flock -n "$RUN/.lock" true; then
    echo "train_qwen2vl_v3.sh: a run already holds $RUN/.lock (pgrep -af qwen2-v3)" >&2
    exit 1
fi
echo "== $(date -u +%FT%TZ) start/resume (host $(hostname))" >> "$RUN/train.log"
(
    flock -n 9 || { echo "train_qwen2vl_v3.sh: $RUN/.lock is held: another run" >&2; exit 1; }
    # nohup and nice exec, so $! is the trainer's own PID; it keeps the lock's descriptor until it exits
    OPENBLAS_NUM_THREADS=1 exec nohup nice -n 19 /usr/bin/python3 vlm/train_qwen2vl.py --run "$RUN" \
        --seed 1000048 --steps 12000 --lr 2e-3 --warmup 200 \
        --vit-width 96 --vit-heads 1 --vit-ff 384 --vit-blocks 4 \
        --resize 0.65 --resize-tokens 0.35,1 --shift 0.5 --watch-resize 0.5 \
        --glyph-weight 2 --pointer-anneal 4000,8000 --slot-weight 1 --slot-from 5616 \
        --eval-every 250 --save-every 50 --save-minutes 4 --workers 2 --threads 1
) 9> "$RUN/.lock" >> "$RUN/train.log" 2>&1 < /dev/null &
echo "started: PID $! (the trainer; its 2 workers are its children), log $RUN/train.log"
