#!/usr/bin/env bash
# Fetch the pinned llama.cpp source (release 0.5.0) offline-friendly, from the git bundle
# that the npm package node-llama-cpp ships (llama/gitRelease.bundle), then apply our
# patches from patches/llama.cpp/*.patch in sorted order.
#
#   scripts/fetch-llama.sh [--dir DIR] [--npm-dir DIR] [--force]
#
#   --dir DIR      where the source tree goes        (default: <repo>/third_party/llama.cpp)
#   --npm-dir DIR  where the extracted bundle is kept (default: <repo>/third_party/npm)
#   --force        replace DIR even if it holds local edits that are not in patches/
#
# Idempotent: DIR/.ecokv-fetch-stamp records the package, the commit and the sha256 of the
# patch set; when they all match (and CMakeLists.txt says 0.5.0) nothing is done. A changed
# patch set re-clones from the kept bundle (no npm needed) and re-applies. Work is done in
# temp dirs and renamed into place, so an interrupted run leaves no half-written tree.
# The llama.cpp code must never be committed: both default dirs are in .gitignore.
set -euo pipefail
export LC_ALL=C   # sorted patch order independent of the locale

PKG_NAME=node-llama-cpp
PKG_VERSION=3.22.1
PKG="$PKG_NAME@$PKG_VERSION"
EXPECTED_COMMIT=de3ff815ea7d559ee917f063901b8986f038abc6   # "bump version to 0.5.0 (#29333)"
EXPECTED_VERSION=0.5.0
STAMP_NAME=.ecokv-fetch-stamp

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR="$ROOT/third_party/llama.cpp"
NPM_DIR="$ROOT/third_party/npm"
PATCH_DIR="$ROOT/patches/llama.cpp"
FORCE=0

say() { echo "fetch-llama: $*"; }
die() { echo "fetch-llama: error: $*" >&2; exit 1; }
usage() { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --dir)      [[ $# -ge 2 ]] || die "--dir needs a value"; DIR=$2; shift 2 ;;
        --npm-dir)  [[ $# -ge 2 ]] || die "--npm-dir needs a value"; NPM_DIR=$2; shift 2 ;;
        --force)    FORCE=1; shift ;;
        -h|--help)  usage; exit 0 ;;
        *)          usage >&2; die "unknown argument: $1" ;;
    esac
done

command -v git >/dev/null || die "git not found (apt-get install git)"
mkdir -p "$(dirname "$DIR")" "$NPM_DIR"
DIR=$(cd "$(dirname "$DIR")" && pwd)/$(basename "$DIR")
NPM_DIR=$(cd "$NPM_DIR" && pwd)
BUNDLE_DIR="$NPM_DIR/$PKG"
BUNDLE="$BUNDLE_DIR/gitRelease.bundle"

# Serialise concurrent runs (e.g. two CMake configures) on a lock in the ignored npm dir.
if command -v flock >/dev/null; then
    exec 9>"$NPM_DIR/.lock"
    flock 9
fi

# Temp dirs live next to their final place (same filesystem, so `mv` is an atomic rename).
TMPS=()
cleanup() { local t; for t in "${TMPS[@]+"${TMPS[@]}"}"; do rm -rf "$t"; done; }
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$NPM_DIR"/.pack.* "$(dirname "$DIR")/.$(basename "$DIR")".tmp.*  # leftovers of a killed run

# sha256 over "<sha256>  <name>" of each patch, in sorted order; "none" for an empty set.
PATCHES=()
if [[ -d "$PATCH_DIR" ]]; then
    shopt -s nullglob; PATCHES=("$PATCH_DIR"/*.patch); shopt -u nullglob
fi
if [[ ${#PATCHES[@]} -eq 0 ]]; then
    PATCH_SHA=none
else
    PATCH_SHA=$(cd "$PATCH_DIR" && sha256sum -- "${PATCHES[@]##*/}" | sha256sum | cut -d' ' -f1)
fi

stamp_get() { sed -n "s/^$2=//p" "$1/$STAMP_NAME" 2>/dev/null | head -n1; }
tree_version() {  # "0.5.0" from LLAMA_VERSION_{MAJOR,MINOR,PATCH} in CMakeLists.txt
    local f=$1/CMakeLists.txt
    [[ -f $f ]] || return 0
    printf '%s.%s.%s' \
        "$(sed -n 's/^set(LLAMA_VERSION_MAJOR \([0-9]*\))/\1/p' "$f")" \
        "$(sed -n 's/^set(LLAMA_VERSION_MINOR \([0-9]*\))/\1/p' "$f")" \
        "$(sed -n 's/^set(LLAMA_VERSION_PATCH \([0-9]*\))/\1/p' "$f")"
}
# Hash of the working-tree state relative to HEAD (tracked diffs + untracked files),
# used to tell whether a tree holds local edits beyond the applied patch set.
tree_state() {
    { git -C "$1" status --porcelain=v1 --untracked-files=all
      git -C "$1" diff HEAD --binary; } | sha256sum | cut -d' ' -f1
}

# 1. Up to date? Then do nothing.
if [[ -f "$DIR/$STAMP_NAME" ]] \
   && [[ "$(stamp_get "$DIR" package)" == "$PKG" ]] \
   && [[ "$(stamp_get "$DIR" patches_sha256)" == "$PATCH_SHA" ]] \
   && [[ "$(tree_version "$DIR")" == "$EXPECTED_VERSION" ]] \
   && [[ "$(git -C "$DIR" rev-parse HEAD 2>/dev/null)" == "$EXPECTED_COMMIT" ]]; then
    say "up to date: $DIR (llama.cpp $EXPECTED_VERSION, ${#PATCHES[@]} patch(es))"
    exit 0
fi

# 2. Get the bundle (kept in NPM_DIR, so later re-applies need neither npm nor network).
if [[ -f "$BUNDLE" ]] && git bundle list-heads "$BUNDLE" >/dev/null 2>&1; then
    say "reusing bundle $BUNDLE"
else
    command -v npm >/dev/null || die "npm not found; install Node.js/npm (apt-get install npm) or put the bundle at $BUNDLE"
    command -v tar >/dev/null || die "tar not found"
    PACK=$(mktemp -d "$NPM_DIR/.pack.XXXXXX"); TMPS+=("$PACK")
    say "npm pack $PKG ..."
    if ! (cd "$PACK" && npm pack "$PKG" >npm-pack.log 2>&1); then
        tail -n 20 "$PACK/npm-pack.log" >&2 || true
        die "npm pack $PKG failed: package or version not found, or the npm registry is unreachable"
    fi
    shopt -s nullglob; TGZS=("$PACK"/*.tgz); shopt -u nullglob
    [[ ${#TGZS[@]} -eq 1 ]] || die "npm pack $PKG produced no tarball"
    TGZ=${TGZS[0]}
    say "packed $(basename "$TGZ") ($(du -h "$TGZ" | cut -f1)); extracting the bundle"
    mkdir -p "$PACK/out"
    tar -xzf "$TGZ" -C "$PACK" package/llama/gitRelease.bundle \
        || die "$(basename "$TGZ") has no package/llama/gitRelease.bundle (wrong package version?)"
    tar -xzf "$TGZ" -C "$PACK" package/llama/llama.cpp.info.json 2>/dev/null || true
    mv "$PACK/package/llama/"* "$PACK/out/"
    sha256sum "$TGZ" | sed 's,  .*/,  ,' >"$PACK/out/tarball.sha256"
    git bundle list-heads "$PACK/out/gitRelease.bundle" >/dev/null 2>&1 \
        || die "the extracted gitRelease.bundle is not a valid git bundle"
    rm -rf "$BUNDLE_DIR"
    mv "$PACK/out" "$BUNDLE_DIR"
fi
BUNDLE_COMMIT=$(git bundle list-heads "$BUNDLE" | awk '$2 == "HEAD" {print $1}')
[[ "$BUNDLE_COMMIT" == "$EXPECTED_COMMIT" ]] \
    || die "bundle HEAD is '$BUNDLE_COMMIT', expected $EXPECTED_COMMIT (delete $BUNDLE_DIR to re-download)"

# 3. Clone into a temp dir, check the version, apply the patches, write the stamp.
NEW=$(mktemp -d "$(dirname "$DIR")/.$(basename "$DIR").tmp.XXXXXX"); TMPS+=("$NEW")
say "cloning $BUNDLE_COMMIT"
git -c advice.detachedHead=false clone -q "$BUNDLE" "$NEW/src" || die "git clone of $BUNDLE failed"
[[ "$(tree_version "$NEW/src")" == "$EXPECTED_VERSION" ]] \
    || die "cloned tree has version '$(tree_version "$NEW/src")', expected $EXPECTED_VERSION"
echo "/$STAMP_NAME" >>"$NEW/src/.git/info/exclude"   # keep the stamp out of git status/diff
for p in "${PATCHES[@]+"${PATCHES[@]}"}"; do
    say "applying $(basename "$p")"
    git -C "$NEW/src" apply --whitespace=nowarn "$p" \
        || die "patch $(basename "$p") does not apply to llama.cpp $EXPECTED_VERSION ($EXPECTED_COMMIT)"
done
NEW_STATE=$(tree_state "$NEW/src")
write_stamp() {
    cat >"$1/$STAMP_NAME" <<EOF
# written by scripts/fetch-llama.sh; delete to force a re-fetch
package=$PKG
commit=$BUNDLE_COMMIT
version=$EXPECTED_VERSION
patches_sha256=$PATCH_SHA
patches=$(for p in "${PATCHES[@]+"${PATCHES[@]}"}"; do printf '%s ' "$(basename "$p")"; done)
tree_state_sha256=$NEW_STATE
EOF
}

# 4. Put it in place.
if [[ -e "$DIR" ]]; then
    if [[ -d "$DIR/.git" && "$(git -C "$DIR" rev-parse HEAD 2>/dev/null)" == "$EXPECTED_COMMIT" ]] \
       && grep -qx "/$STAMP_NAME" "$DIR/.git/info/exclude" 2>/dev/null; then
        OLD_STATE=$(tree_state "$DIR")
        if [[ "$OLD_STATE" == "$NEW_STATE" ]]; then
            # Typical after exporting an in-tree edit to patches/: the tree already matches.
            # Keep it (file times unchanged, so no rebuild) and just refresh the stamp.
            write_stamp "$DIR"
            say "tree already matches the patch set; stamp updated: $DIR"
            exit 0
        fi
        if [[ "$OLD_STATE" != "$(stamp_get "$DIR" tree_state_sha256)" && $FORCE -eq 0 ]]; then
            die "$DIR has local edits that are not in $PATCH_DIR; save them as a patch (git -C $DIR diff > $PATCH_DIR/NNNN-name.patch), move the tree away, or rerun with --force"
        fi
    elif [[ $FORCE -eq 0 ]]; then
        die "$DIR exists but was not fetched by this script; move it away or rerun with --force"
    fi
fi
write_stamp "$NEW/src"
if [[ -e "$DIR" ]]; then
    say "replacing $DIR"
    mv "$DIR" "$NEW/old"          # the old tree is removed with the temp dir
fi
mv "$NEW/src" "$DIR"
say "done: $DIR (llama.cpp $EXPECTED_VERSION, commit ${BUNDLE_COMMIT:0:10}, ${#PATCHES[@]} patch(es))"
