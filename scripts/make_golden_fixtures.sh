#!/usr/bin/env bash
# Golden fixtures for tests/test_upgrade.py: models trained by a released corgipile, their catalog
# rows and their predictions on fixed inputs, written into tests/fixtures/golden/<version>/.
# Not run by `make test` (it builds an old version; minutes of CPU): run it by hand when a release
# is made, and commit what it writes. See tests/fixtures/golden/README.md.
#
# Usage: scripts/make_golden_fixtures.sh <version> [<commit>]
#
#   0.1.0 ... 0.4.0         the released versions, at the commits listed below (the code of each
#                           release: the parent of the commit that froze its install script in
#                           sql/released/); built in a git worktree /work/wt-old-<version> with their
#                           own Cargo.lock (pgrx 0.18.0, this toolchain), into a relocated copy of
#                           Debian's PostgreSQL 15 (/opt/corgipile-pg15/old-<version>: 0.1.0 to 0.3.0
#                           build for PostgreSQL 15 only, and every fixture is made on 15; the system
#                           install is never written)
#   current                 this checkout as it is (for the unreleased version in Cargo.toml), built
#                           the same way into its own PostgreSQL 15 copy
#
# Environment: GOLDEN_ROOT (default /work) where the worktrees go, GOLDEN_PG15 (default
# /usr/lib/postgresql/15) the install copied, GOLDEN_PORT (default 28791) the throw-away cluster's
# port, GOLDEN_TARGET (default /work/wt-old-target) where each version gets its own cargo target dir
# (<version>/; a shared one is wrong: cargo would take another checkout's corgipile-ml, whose
# path and version are the same, as up to date).
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
VERSION="${1:?usage: $0 <version>|current [commit]}"
declare -A COMMITS=(
    [0.1.0]=97db5b8c3bdf16051ad9fd6c3f31bbff19781e06  # parent of b7a5885 (0.1.0 install script frozen)
    [0.2.0]=601fbb90e9f7c042339bf960c9459715a28af81e  # parent of da3d319 (0.2.0 install script frozen)
    [0.3.0]=b8eda8224cd0e8b8ea655541f8715b31a79621b4  # parent of 5c6dba3 (0.3.0 install script frozen)
    [0.4.0]=356b9ee0f95d47e3badfaf46269e0690a76b80eb  # parent of 8325b60 (0.4.0 install script frozen)
)
ROOT="${GOLDEN_ROOT:-/work}"
PG15="${GOLDEN_PG15:-/usr/lib/postgresql/15}"
PORT="${GOLDEN_PORT:-28791}"
export PATH="$HOME/.cargo/bin:$PATH"

if [ "$VERSION" = current ]; then
    SRC="$REPO"
    COMMIT="$(git -C "$REPO" rev-parse HEAD)$(git -C "$REPO" diff --quiet HEAD -- src ml sql Cargo.toml Cargo.lock || echo '+uncommitted')"
    VERSION="$(sed -nE 's/^version = "(.*)"/\1/p' "$REPO/Cargo.toml" | head -1)"
    FEATURES=(--no-default-features --features pg15)
else
    COMMIT="${2:-${COMMITS[$VERSION]:?unknown version $VERSION (known: ${!COMMITS[*]})}}"
    SRC="$ROOT/wt-old-$VERSION"
    [ -d "$SRC" ] || git -C "$REPO" worktree add --detach "$SRC" "$COMMIT"
    [ "$(git -C "$SRC" rev-parse HEAD)" = "$(git -C "$REPO" rev-parse "$COMMIT")" ] || { echo "$SRC is not at $COMMIT" >&2; exit 1; }
    FEATURES=()
fi
export CARGO_TARGET_DIR="${GOLDEN_TARGET:-$ROOT/wt-old-target}/$VERSION"
built="$(sed -nE 's/^version = "(.*)"/\1/p' "$SRC/Cargo.toml" | head -1)"
[ "$built" = "$VERSION" ] || { echo "$SRC/Cargo.toml says version $built, not $VERSION" >&2; exit 1; }

# A relocated copy of PostgreSQL 15 (pg_config and the server find their share, lib and include
# directories relative to their own location, so the copy is a separate install).
PGCOPY="/opt/corgipile-pg15/old-$VERSION"
if [ ! -x "$PGCOPY/usr/lib/postgresql/15/bin/pg_config" ]; then
    mkdir -p "$PGCOPY/usr/lib/postgresql" "$PGCOPY/usr/share/postgresql" "$PGCOPY/usr/include"
    cp -a "$PG15" "$PGCOPY/usr/lib/postgresql/"
    cp -a "$(dirname "$PG15")/../../share/postgresql/15" "$PGCOPY/usr/share/postgresql/"
    cp -a /usr/include/postgresql "$PGCOPY/usr/include/"
fi
PG_CONFIG="$PGCOPY/usr/lib/postgresql/15/bin/pg_config"
[ "$("$PG_CONFIG" --sharedir)" = "$PGCOPY/usr/share/postgresql/15" ] || { echo "$PG_CONFIG is not relocated" >&2; exit 1; }

# pgrx's own home for these builds: knows only the copy.
export PGRX_HOME="$ROOT/wt-old-pgrx-home"
mkdir -p "$PGRX_HOME"
printf '[configs]\npg15 = "%s"\n' "$PG_CONFIG" > "$PGRX_HOME/config.toml"

echo "[golden] building corgipile $VERSION ($COMMIT) into $PGCOPY"
(cd "$SRC" && cargo pgrx install --release --pg-config "$PG_CONFIG" "${FEATURES[@]}")
# Later versions ship the install scripts of released ones (sql/released/).
if [ -d "$SRC/sql/released" ]; then
    install -m 644 "$SRC"/sql/released/*.sql "$("$PG_CONFIG" --sharedir)/extension/"
fi

# A throw-away cluster on the copy.
export CORGIPILE_PG_BIN="$PGCOPY/usr/lib/postgresql/15/bin" CORGIPILE_CLUSTER_DIR="/tmp/corgipile-golden-$VERSION" \
       CORGIPILE_PORT="$PORT"
export PGHOST="$CORGIPILE_CLUSTER_DIR" PGPORT="$PORT" PGUSER=postgres
"$REPO/scripts/cluster.sh" destroy >/dev/null 2>&1 || true
trap '"$REPO/scripts/cluster.sh" destroy >/dev/null 2>&1 || true' EXIT
"$REPO/scripts/cluster.sh" start

PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || PY=python3
"$PY" "$REPO/scripts/golden_fixtures.py" --version "$VERSION" --commit "$COMMIT" --command "$0 $*" \
    --out "$REPO/tests/fixtures/golden/$VERSION"
echo "[golden] wrote $REPO/tests/fixtures/golden/$VERSION"
