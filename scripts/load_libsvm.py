#!/usr/bin/env python3
"""Load a LIBSVM-format file into a PostgreSQL table, client side.

Rows are streamed through `psql` (\\copy ... FROM pstdin), so the server may be
remote: pass -h/-p/-U/-d, or rely on the usual PGHOST/PGPORT/PGUSER/PGDATABASE
environment variables (e.g. eval "$(scripts/cluster.sh env)"). Only the Python
standard library is used.

Input lines look like

    <label> <index>:<value> <index>:<value> ...   [# comment]

FILE may be plain text or bzip2-compressed (*.bz2); it is read as a stream.
Blank and comment-only lines are skipped. A malformed line aborts the load
(nothing is committed) with the offending line number.

Tables created (without --append; it is an error if the table exists):

  dense (default):  (id bigint, label float8, features float8[])
      features has exactly N entries; feature with index i is at array
      position i - index_base + 1 (1-based SQL arrays), missing ones are 0.
  --sparse:         (id bigint, label float8, feature_indices int4[],
                     feature_values float8[])
      indices are kept as they are in the file (so 1-based by default).

id is the line number in FILE (1-based), so a table can be re-ordered and
put back, e.g. to cluster it by label:
    CREATE TABLE t_clustered AS SELECT * FROM t ORDER BY label, id;

The number of features N comes from --n-features, otherwise (dense only) from
a first pass over the file (the largest index seen). Pass --n-features when
loading a train and a test split: e.g. a9a's test file only reaches index
122 while the train file has 123, and models need equal-length vectors.
"""

import argparse
import bz2
import os
import re
import shutil
import signal
import subprocess
import sys

FALLBACK_PSQL = os.path.join(os.environ.get("CORGIPILE_PG_BIN", "/usr/lib/postgresql/15/bin"), "psql")
INT4_MAX = 2**31 - 1


class BadLine(Exception):
    def __init__(self, lineno, msg):
        super().__init__(f"line {lineno}: {msg}")
        self.lineno = lineno


def open_input(path):
    if path.endswith(".bz2"):
        return bz2.open(path, "rt", encoding="utf-8", newline="")
    return open(path, "rt", encoding="utf-8", newline="")


def parse_lines(path, index_base):
    """Yield (lineno, label, [(index, value), ...]) for each data line."""
    with open_input(path) as f:
        for lineno, line in enumerate(f, start=1):
            hash_pos = line.find("#")
            if hash_pos >= 0:
                line = line[:hash_pos]
            tokens = line.split()
            if not tokens:
                continue
            try:
                label = float(tokens[0])
            except ValueError:
                raise BadLine(lineno, f"bad label {tokens[0]!r}") from None
            if label != label or label in (float("inf"), float("-inf")):
                raise BadLine(lineno, f"label is not finite: {tokens[0]!r}")
            feats = []
            for tok in tokens[1:]:
                idx_s, sep, val_s = tok.partition(":")
                if not sep:
                    raise BadLine(lineno, f"expected <index>:<value>, got {tok!r}")
                try:
                    idx = int(idx_s)
                except ValueError:
                    raise BadLine(lineno, f"bad feature index in {tok!r}") from None
                if idx < index_base:
                    raise BadLine(lineno, f"feature index {idx} < index base {index_base}")
                if idx > INT4_MAX:
                    raise BadLine(lineno, f"feature index {idx} too large")
                try:
                    val = float(val_s)
                except ValueError:
                    raise BadLine(lineno, f"bad feature value in {tok!r}") from None
                feats.append((idx, val))
            if len(feats) > 1:
                feats.sort(key=lambda p: p[0])
                for a, b in zip(feats, feats[1:]):
                    if a[0] == b[0]:
                        raise BadLine(lineno, f"feature index {a[0]} appears twice")
            yield lineno, label, feats


def scan_n_features(path, index_base):
    """First pass: (number of data lines, n_features = max index - base + 1)."""
    max_idx = None
    rows = 0
    for _lineno, _label, feats in parse_lines(path, index_base):
        rows += 1
        if feats:
            last = feats[-1][0]
            if max_idx is None or last > max_idx:
                max_idx = last
    return rows, (0 if max_idx is None else max_idx - index_base + 1)


def fmt_float(x):
    if x == 0.0:
        return "0"
    return repr(x)  # shortest round-trip form; 'inf'/'nan' are valid float8 input


_BARE_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")


def quote_qualified_name(name):
    """Turn `table`, `schema.table` or `"Odd Name"` into a quoted SQL identifier.

    Unquoted parts are folded to lower case, as PostgreSQL itself would do;
    double-quoted parts are kept verbatim (with "" for a literal quote).
    """
    parts = []
    i, n = 0, len(name)
    while True:
        if i < n and name[i] == '"':
            j = i + 1
            buf = []
            while True:
                if j >= n:
                    raise ValueError(f"unterminated quoted identifier in {name!r}")
                if name[j] == '"':
                    if j + 1 < n and name[j + 1] == '"':
                        buf.append('"')
                        j += 2
                        continue
                    break
                buf.append(name[j])
                j += 1
            part = "".join(buf)
            i = j + 1
        else:
            m = _BARE_IDENT.match(name, i)
            if not m:
                raise ValueError(f"bad table name {name!r}")
            part = m.group(0).lower()
            i = m.end()
        if not part:
            raise ValueError(f"empty identifier in {name!r}")
        parts.append(part)
        if i == n:
            break
        if name[i] != ".":
            raise ValueError(f"bad table name {name!r}")
        i += 1
    if len(parts) > 2:
        raise ValueError(f"table name {name!r}: expected [schema.]table")
    return ".".join('"' + p.replace('"', '""') + '"' for p in parts)


def find_psql(explicit):
    if explicit:
        return explicit
    found = shutil.which("psql")
    if found:
        return found
    if os.access(FALLBACK_PSQL, os.X_OK):
        return FALLBACK_PSQL
    sys.exit("load_libsvm.py: psql not found; install postgresql-client or pass --psql PATH")


def build_args():
    p = argparse.ArgumentParser(
        prog="load_libsvm.py",
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    p.add_argument("file", metavar="FILE", help="LIBSVM file, plain or .bz2")
    p.add_argument("table", metavar="TABLE", help="target table, [schema.]name")
    p.add_argument("--sparse", action="store_true",
                   help="store (feature_indices int4[], feature_values float8[]) instead of a dense features float8[]")
    p.add_argument("--n-features", type=int, metavar="N",
                   help="number of features (dense array length); default: largest index in FILE")
    p.add_argument("--index-base", type=int, default=1, choices=(0, 1), metavar="{0,1}",
                   help="index of the first feature in FILE (default 1)")
    p.add_argument("--append", action="store_true",
                   help="insert into an existing table instead of creating it")
    p.add_argument("--psql", metavar="PATH", help="psql binary (default: psql on PATH)")
    p.add_argument("-h", "--host", help="database server host or socket directory")
    p.add_argument("-p", "--port", help="database server port")
    p.add_argument("-U", "--username", help="database user name")
    p.add_argument("-d", "--dbname", help="database name")
    p.add_argument("--help", action="help", help="show this help message and exit")
    return p


def main(argv=None):
    args = build_args().parse_args(argv)
    prog = "load_libsvm.py"

    if not os.path.isfile(args.file):
        sys.exit(f"{prog}: {args.file}: no such file")
    if args.n_features is not None and args.n_features < 1:
        sys.exit(f"{prog}: --n-features must be positive")
    try:
        table = quote_qualified_name(args.table)
    except ValueError as e:
        sys.exit(f"{prog}: {e}")

    n_features = args.n_features
    base = args.index_base
    if not args.sparse and n_features is None:
        try:
            _rows, n_features = scan_n_features(args.file, base)
        except BadLine as e:
            sys.exit(f"{prog}: {args.file}: {e}")
        except (OSError, EOFError, UnicodeDecodeError) as e:
            sys.exit(f"{prog}: {args.file}: {e}")
        if n_features == 0:
            sys.exit(f"{prog}: {args.file}: no features found; pass --n-features")
    max_idx = None if n_features is None else n_features - 1 + base

    psql = [find_psql(args.psql), "-X", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction"]
    for flag, val in (("-h", args.host), ("-p", args.port), ("-U", args.username), ("-d", args.dbname)):
        if val:
            psql += [flag, val]
    if not args.append:
        if args.sparse:
            cols = "id bigint, label float8, feature_indices int4[], feature_values float8[]"
        else:
            cols = "id bigint, label float8, features float8[]"
        psql += ["-c", f"CREATE TABLE {table} ({cols})"]
    if args.sparse:
        psql += ["-c", f"\\copy {table} (id, label, feature_indices, feature_values) FROM pstdin"]
    else:
        psql += ["-c", f"\\copy {table} (id, label, features) FROM pstdin"]

    proc = subprocess.Popen(psql, stdin=subprocess.PIPE, text=True, encoding="utf-8",
                            bufsize=1 << 20)
    rows = 0
    error = None
    try:
        out = proc.stdin
        zeros = ["0"] * (n_features or 0)
        for lineno, label, feats in parse_lines(args.file, base):
            if max_idx is not None and feats and feats[-1][0] > max_idx:
                raise BadLine(lineno, f"feature index {feats[-1][0]} exceeds n_features={n_features}"
                              + (" (index base 0)" if base == 0 else ""))
            if args.sparse:
                idx = ",".join(str(i) for i, _ in feats)
                val = ",".join(fmt_float(v) for _, v in feats)
                out.write(f"{lineno}\t{fmt_float(label)}\t{{{idx}}}\t{{{val}}}\n")
            else:
                arr = zeros.copy()
                for i, v in feats:
                    arr[i - base] = fmt_float(v)
                out.write(f"{lineno}\t{fmt_float(label)}\t{{{','.join(arr)}}}\n")
            rows += 1
    except BadLine as e:
        error = f"{args.file}: {e}"
    except BrokenPipeError:
        error = "psql stopped reading its input (see its message above)"
    except (OSError, EOFError, UnicodeDecodeError) as e:
        error = f"{args.file}: {e}"
    except KeyboardInterrupt:
        error = "interrupted"

    if error is not None:
        # Abort: psql runs with --single-transaction, so killing it before it
        # commits rolls the whole load back, including the CREATE TABLE.
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.stdin.close()
        except OSError:
            pass
        proc.wait()
        sys.exit(f"{prog}: {error}; nothing was loaded")

    try:
        proc.stdin.close()
    except BrokenPipeError:
        pass
    rc = proc.wait()
    if rc != 0:
        sys.exit(f"{prog}: psql exited with status {rc}; nothing was loaded")
    kind = "sparse" if args.sparse else "dense"
    nf = f", {n_features} features" if n_features is not None else ""
    print(f"loaded {rows} rows into {table} ({kind}{nf})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
