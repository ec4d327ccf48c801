#!/usr/bin/env bash
# Runs a command with its memory (resident set and page cache, no swap) limited to MIB mebibytes, in a cgroup:
#
#   scripts/with-memory-limit.sh MIB COMMAND [ARG...]
#
# The exit status is the command's; 137 when the kernel's OOM killer ended it (SIGKILL). The cgroup's peak usage is
# printed on stderr: "with-memory-limit: limit 400 MiB, peak 399 MiB, exit 137". Uses `systemd-run --scope -p
# MemoryMax=` where systemd runs, otherwise makes a cgroup of its own (v2 memory.max, or v1 memory.limit_in_bytes;
# root needed) and removes it afterwards. Exit 2 when no memory cgroup can be made.
set -euo pipefail
if [ $# -lt 2 ] || ! [[ $1 =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
    echo "usage: with-memory-limit.sh MIB COMMAND [ARG...]" >&2
    exit 2
fi
mib=$1
shift
bytes=$((mib * 1048576))

if [ -d /run/systemd/system ] && command -v systemd-run >/dev/null; then
    exec systemd-run --scope --quiet -p MemoryMax="$bytes" -p MemorySwapMax=0 "$@"
fi

cg=
peak_file=
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then  # v2: the memory controller must be delegated to children
    grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null ||
        echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    cg=/sys/fs/cgroup/ecokv-limit-$$
    mkdir "$cg" 2>/dev/null && echo "$bytes" >"$cg/memory.max" 2>/dev/null || cg=
    [ -n "$cg" ] && { echo 0 >"$cg/memory.swap.max" 2>/dev/null || true; peak_file=$cg/memory.peak; }
elif [ -d /sys/fs/cgroup/memory ]; then  # v1
    cg=/sys/fs/cgroup/memory/ecokv-limit-$$
    mkdir "$cg" 2>/dev/null && echo "$bytes" >"$cg/memory.limit_in_bytes" 2>/dev/null || cg=
    if [ -n "$cg" ] && [ -f "$cg/memory.memsw.limit_in_bytes" ]; then
        echo "$bytes" >"$cg/memory.memsw.limit_in_bytes"
    fi
    peak_file=$cg/memory.max_usage_in_bytes
fi
if [ -z "$cg" ]; then
    echo "with-memory-limit: cannot make a memory cgroup here (no systemd, not root, or no memory controller)" >&2
    exit 2
fi
trap 'rmdir "$cg" 2>/dev/null || true' EXIT

# The child joins the cgroup before it becomes the command.
(
    echo "$BASHPID" >"$cg/cgroup.procs"
    exec "$@"
) &
set +e
wait $!
rc=$?
set -e
peak=$(cat "$peak_file" 2>/dev/null || echo 0)
echo "with-memory-limit: limit $mib MiB, peak $((peak / 1048576)) MiB, exit $rc" >&2
exit $rc
