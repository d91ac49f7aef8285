#!/usr/bin/env bash
# Install everything needed to build and test corgipile on Debian 12.
#
#   scripts/setup.sh            system packages, cargo-pgrx 0.18.0, `cargo pgrx init`
#   scripts/setup.sh --python   the above, plus the Python venv .venv for tests/
#
# Idempotent: each step checks first and is skipped when already done, so a
# second run takes a second or two.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_MAJOR=15
PG_CONFIG="/usr/lib/postgresql/${PG_MAJOR}/bin/pg_config"
PGRX_VERSION="0.18.0"
APT_PACKAGES=(postgresql-15 postgresql-server-dev-15 libclang-dev clang sudo pkg-config bzip2)

WANT_PYTHON=0
for arg in "$@"; do
    case "$arg" in
        --python) WANT_PYTHON=1 ;;
        -h|--help)
            sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
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

# ---------------------------------------------------------------- pgrx init
PGRX_HOME_DIR="${PGRX_HOME:-$HOME/.pgrx}"
if ! grep -qs "pg${PG_MAJOR}" "$PGRX_HOME_DIR/config.toml"; then
    log "registering the system PostgreSQL $PG_MAJOR with pgrx ($PG_CONFIG)"
    cargo pgrx init --pg${PG_MAJOR} "$PG_CONFIG"
else
    log "pgrx already knows pg${PG_MAJOR} ($PGRX_HOME_DIR/config.toml)"
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
