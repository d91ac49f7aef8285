#!/usr/bin/env bash
# Type-check corgipile for the PostgreSQL majors whose headers we cannot install (13, 14, 16,
# 17), against the bindings pgrx 0.18 ships pre-generated for every major (what docs.rs builds
# with): DOCS_RS=1 makes pgrx-pg-sys's build script skip bindgen and pg_config, and `--cfg
# docsrs`, given to pgrx-pg-sys alone by a rustc wrapper, makes it include those bindings.
# Nothing is linked or run: this proves that src/compat.rs leaves no major out, not that the
# extension works there.
#
#   scripts/check-majors.sh [MAJOR...]     default: 13 14 16 17
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/check-majors"
majors=("$@")
[ "${#majors[@]}" -gt 0 ] || majors=(13 14 16 17)

wrapper="$(mktemp)"
trap 'rm -f "$wrapper"' EXIT
cat > "$wrapper" <<'SH'
#!/usr/bin/env bash
rustc="$1"; shift
for a in "$@"; do
    if [ "$a" = "pgrx_pg_sys" ]; then exec "$rustc" "$@" --cfg docsrs; fi
done
exec "$rustc" "$@"
SH
chmod +x "$wrapper"

cd "$REPO_ROOT"
for v in "${majors[@]}"; do
    echo "[check-majors] cargo check --features pg$v (pgrx's pre-generated bindings)"
    RUSTC_WRAPPER="$wrapper" DOCS_RS=1 RUSTFLAGS="-D warnings" \
        cargo check --quiet --no-default-features --features "pg$v" --target-dir "$TARGET_DIR"
done
echo "[check-majors] the code type-checks for PostgreSQL ${majors[*]}"
