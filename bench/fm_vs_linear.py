#!/usr/bin/env python3
"""corgipile's factorization machines against its linear models, numpy FMs and scikit-learn.

fm and fm_regression against corgipile's logistic, softmax and linear, an FM written here in numpy
and scikit-learn's linear models, all on the same train/test rows.

Datasets (--only picks some):
  ctr        a generated click log (numpy, --data-seed): text columns user_id (2,000 values 'u123'),
             ad_id (1,000, 'ad4567') and site_id (1,000, 'site89'), Zipf-like popularity (exponent
             0.5), a 0/1 label. Hidden model: the click logit is a per-value effect of each column
             plus two pair effects, user·ad and site·ad, each the dot product of rank-4 latent
             vectors (N(0, 1.1²) entries; a second set of ad vectors for site·ad), an intercept for a
             30% click rate; the label drawn from its sigmoid. A linear model of the one-hot columns
             sees only the per-value effects (every pair effect averages to zero over a value of one
             column); an FM can learn the pairs. Rows with id % 5 = 0 are the test table, the rest the
             training table (generation order, not clustered). The Bayes rate (the true probabilities
             on the test rows) is reported as "oracle".
  ctr_score  the same rows, a regression: the label is the hidden logit plus N(0, 0.5²) noise
             (column score); fm_regression vs linear.
  sparse     bench/sparse_vs_dense.py's criteo-like table (its make_tables, imported): ~40 random
             indices of 1,000,000 per row, values ±0.2 + U(-0.5, 0.5) by label (id % 2; a linear
             label: the FM has nothing to add, it must not lose); rows id % 5 = 0 are the test
             table. --sparse-rows rows (100,000: every index is in ~3 training rows; at 30,000
             every model stays near chance), --sparse-epochs epochs (1: before aca3eb7
             corgipile's fm stepped all its 18M parameters every batch, ~40 ms a batch on 2
             cores, ~100 s an epoch of 80,000 rows), n_features 1,000,000; the corgipile sessions set
             corgipile.max_model_memory to 1GB (the fm needs 549 MB: 54000 at the default 512MB).
Arms, each on the training table, scored on the test table:
  corgipile fm / fm_regression   its defaults but label, features, epochs, seed, max_categories
                                 (every category kept: no "(other)" pooling), verbose false
  corgipile logistic, softmax / linear   the same (their own defaults: SGD, lr 0.01, exponential)
  numpy FM       written here (fm_fit): the textbook FM, one output, logistic or squared loss
                 (the target standardized for training, as corgipile's fm_regression does),
                 mini-batch Adam with lazy (touched rows only) updates, v drawn N(0, 0.01²), w and b
                 0; on the one-hot rows (ctr) or the max-abs-scaled sparse rows (sparse, as
                 corgipile's normalize); learning_rate, batch_size, l2, factors and epochs copied
                 from the corgipile fm's stored params (0.001, 32, 0, 8 when none was stored)
  numpy FM as corgipile's   the same code built and trained as corgipile's fm is: one output per
                 class under a softmax (classification), v drawn U(-0.01, 0.01), Adam lazy (as corgipile
                 since aca3eb7: its fm steps only the touched features of sparse rows, and column
                 lists decode to sparse rows) or, --corgipile-adam dense, every parameter every batch
                 (as corgipile before; not on sparse: a dense step of 18M parameters is too slow in
                 numpy); a diagnostic: what corgipile's fm shares with it and not with the textbook FM
                 comes from those choices
  sklearn        LogisticRegression(lbfgs, C=1, tol=1e-8, max_iter=10000) / Ridge(alpha=1) on the same
                 one-hot (or max-abs-scaled sparse) rows; deterministic: fitted once. (With the default
                 tol 1e-4, lbfgs stops at iteration 0 on the sparse table: its mean-loss gradient at 0
                 is below tol; accuracy 0.5.)
Seeds --seeds (corgipile seed, numpy FM seed); the data do not change with them. Classification:
test accuracy, log-loss and ROC AUC (corgipile: accuracy and log_loss from corgipile_evaluate, AUC
from corgipile_predict_proba over the test rows); regression: R², RMSE. Seconds: the
corgipile_train statement (statistics pass included), the numpy/sklearn fit on rows in memory.
A failing corgipile arm (an ERROR, or --timeout) is reported and not retried with the next seeds.

Usage: bench/fm_vs_linear.py [--quick] [--seeds 1-3] [--epochs 20] [--only ctr,ctr_score,sparse]
                             [--sparse-rows 100000] [--sparse-epochs 1] [--timeout 600]
                             [--corgipile-adam lazy|dense] [--out FILE]
--quick: a 30,000-row ctr table (300 users, 150 ads, 150 sites), 10,000 sparse rows, 1 seed,
5 epochs (1 on sparse); writes bench/results/fm_vs_linear_quick.md and the record fm_vs_linear_quick.
The full run took 10 minutes on 2 cores with corgipile's dense-stepping fm (5 of them its fm on
the sparse table).
Needs PGHOST/PGPORT/PGUSER (make bench-fm sets them); uses (and creates) the database corgipile_fm;
tables are reused when their COMMENT carries the same generation signature. Writes
bench/results/fm_vs_linear.md (+ .json, raw numbers) and appends a record to
bench/results/runs/fm_vs_linear.jsonl."""

import argparse
import json
import os
import sys
import time
import warnings

import records  # first: the build the run measures is the one checked out now
import provenance

import numpy as np
import psycopg
import scipy.sparse as sp
from scipy.special import expit, softmax
from psycopg import sql
from psycopg.types.json import Jsonb
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import accuracy_score, log_loss, mean_squared_error, r2_score, roc_auc_score
from sklearn.preprocessing import MaxAbsScaler

import sparse_vs_dense
from cancel_latency import installed_library

DBNAME = "corgipile_fm"
HERE = os.path.dirname(os.path.abspath(__file__))
CTR = {"rows": 200_000, "users": 2_000, "ads": 1_000, "sites": 1_000, "zipf": 0.5, "rank": 4,
       "scale": 1.1, "user_sd": 0.5, "ad_sd": 0.5, "site_sd": 0.3, "positive": 0.30, "score_noise": 0.5}
CTR_QUICK = {**CTR, "rows": 30_000, "users": 300, "ads": 150, "sites": 150}
COLUMNS = (("user_id", "users", "u"), ("ad_id", "ads", "ad"), ("site_id", "sites", "site"))
DATASETS = ("ctr", "ctr_score", "sparse")
GEN_VERSION = 1
# The numpy FM's hyperparameters when no corgipile fm stored its own (the mlp defaults).
FM_DEFAULTS = {"learning_rate": 0.001, "batch_size": 32, "l2": 0.0, "factors": 8}
# A second numpy FM built and trained as corgipile's fm is (one output per class, U(-0.01, 0.01)
# factors, its Adam): what corgipile's fm shares with it and not with the first numpy FM comes from
# those choices, not from a bug. Its Adam (--corgipile-adam): "lazy" as corgipile's fm steps since
# aca3eb7 on sparse rows (sparse pairs and column lists both decode to sparse rows), "dense" as it
# stepped before (every parameter every batch; not on the sparse table: too slow in numpy).
AS_CORGIPILE = "numpy FM as corgipile's"
CORGIPILE_ADAM = "lazy"
# The sparse dataset's corgipile sessions: an fm of 1,000,000 features x 8 factors x 2 outputs needs
# 549 MB to train (0.5.0 + fm: parameters, Adam's moments, a batch's activations), more than the
# default corgipile.max_model_memory (512MB): ERROR 54000 without this.
SPARSE_SETTINGS = {"corgipile.max_model_memory": "1GB"}
# Checks (not release targets): corgipile's fm as good as the independent one; the FM worth it on
# pair effects; harmless on a linear label.
AUC_TOL, ACC_TOL, R2_TOL, FM_GAIN = 0.01, 1.0, 0.02, 0.03


def log(msg):
    print(f"[fm {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def connect(dbname=DBNAME):
    return psycopg.connect(dbname=dbname, autocommit=True)


def setup_database():
    with connect("postgres") as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DBNAME,)).fetchone():
            c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DBNAME)))
    with connect() as c:
        c.execute("SET client_min_messages = warning")
        c.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
        c.execute("ALTER EXTENSION corgipile UPDATE")  # a database made by an older corgipile
        return c.execute("SELECT extversion FROM pg_extension WHERE extname = 'corgipile'").fetchone()[0]


def signed(conn, tables, sig):
    return all(conn.execute("SELECT obj_description(to_regclass(%s), 'pg_class')", (t,)).fetchone()[0] == sig
               for t in tables)


def sign(conn, tables, sig):
    for t in tables:
        conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(sql.Identifier(t), sql.Literal(sig)))
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(t)))


# ---------------------------------------------------------------- the click log

def generate_ctr(spec, seed):
    """Codes of each column, the 0/1 label, its true probability and the regression target, for
    ids 1..rows (numpy only: the same seed and spec give the same rows)."""
    rng = np.random.default_rng(seed)
    n, r, s = spec["rows"], spec["rank"], spec["scale"]

    def draw(k):  # Zipf-like popularity, the popular values spread over the codes
        p = 1.0 / np.arange(1, k + 1) ** spec["zipf"]
        return rng.permutation(k)[rng.choice(k, n, p=p / p.sum())]

    codes = {col: draw(spec[key]) for col, key, _ in COLUMNS}
    u, a, t = codes["user_id"], codes["ad_id"], codes["site_id"]
    U, A, A2, S = (rng.normal(0, s, (spec[k], r)) for k in ("users", "ads", "ads", "sites"))
    f = (rng.normal(0, spec["user_sd"], spec["users"])[u] + rng.normal(0, spec["ad_sd"], spec["ads"])[a]
         + rng.normal(0, spec["site_sd"], spec["sites"])[t])
    pairs = (U[u] * A[a]).sum(1) + (S[t] * A2[a]).sum(1)
    f += pairs
    lo, hi = -20.0, 20.0  # the intercept for the wanted click rate (bisection on the mean probability)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if (1 / (1 + np.exp(-(f + mid)))).mean() > spec["positive"] else (mid, hi)
    f += lo
    prob = 1 / (1 + np.exp(-f))
    label = (rng.random(n) < prob).astype(np.int32)
    score = f + rng.normal(0, spec["score_noise"], n)
    return {"codes": codes, "label": label, "prob": prob, "score": score, "logit": f,
            "pair_sd": float(pairs.std()), "id": np.arange(1, n + 1)}


def ctr_tables(spec, seed):
    """fm_ctr_train / fm_ctr_test (id % 5 = 0) in the database; the generated data for numpy."""
    g = generate_ctr(spec, seed)
    train, test = "fm_ctr_train", "fm_ctr_test"
    sig = f"fm_vs_linear v{GEN_VERSION} ctr seed {seed} " + json.dumps(spec, sort_keys=True)
    with connect() as c:
        if not signed(c, [train, test], sig):
            log(f"generating the ctr tables ({spec['rows']:,} rows)")
            for t in (train, test):
                c.execute(f"DROP TABLE IF EXISTS {t}")
                c.execute(f"CREATE TABLE {t} (id bigint, user_id text, ad_id text, site_id text, label int, "
                          "score float8)")
            names = {col: np.array([f"{prefix}{i}" for i in range(spec[key])], dtype=object)
                     for col, key, prefix in COLUMNS}
            cols = [names[col][g["codes"][col]] for col, _, _ in COLUMNS]
            is_test = g["id"] % 5 == 0
            for t, rows in ((train, np.flatnonzero(~is_test)), (test, np.flatnonzero(is_test))):
                with c.cursor() as cur, cur.copy(f"COPY {t} (id, user_id, ad_id, site_id, label, score) "
                                                 "FROM STDIN") as cp:
                    for i in rows:
                        cp.write_row((int(g["id"][i]), cols[0][i], cols[1][i], cols[2][i], int(g["label"][i]),
                                      float(g["score"][i])))
            sign(c, [train, test], sig)
        counts = c.execute(f"SELECT (SELECT count(*) FROM {train}), (SELECT count(*) FROM {test})").fetchone()
    is_test = g["id"] % 5 == 0
    assert counts == (int((~is_test).sum()), int(is_test.sum())), counts
    # One-hot: column j's code c is feature offset_j + c; every row has exactly one 1 per column.
    offsets = np.cumsum([0] + [spec[key] for _, key, _ in COLUMNS])
    idx = np.stack([g["codes"][col] + offsets[j] for j, (col, _, _) in enumerate(COLUMNS)], 1)
    val = np.ones(idx.shape)
    d = int(offsets[-1])
    tr, te = ~is_test, is_test
    onehot = sp.csr_matrix((val.ravel(), idx.ravel(), np.arange(0, idx.size + 1, idx.shape[1])), shape=(len(idx), d))
    data = {"train": train, "test": test, "d": d, "idx": (idx[tr], idx[te]), "val": (val[tr], val[te]),
            "X": (onehot[tr], onehot[te])}
    oracle_cls = {"accuracy": float(accuracy_score(g["label"][te], g["prob"][te] > 0.5)),
                  "log_loss": float(log_loss(g["label"][te], g["prob"][te])),
                  "roc_auc": float(roc_auc_score(g["label"][te], g["prob"][te]))}
    oracle_reg = {"r2": float(r2_score(g["score"][te], g["logit"][te])),
                  "rmse": float(np.sqrt(mean_squared_error(g["score"][te], g["logit"][te])))}
    shape = (f"{int(tr.sum()):,} train / {int(te.sum()):,} test rows; user_id {spec['users']:,}, ad_id "
             f"{spec['ads']:,}, site_id {spec['sites']:,} values ({d:,} one-hot features); click rate "
             f"{g['label'].mean():.3f}; the pair effects' sd {g['pair_sd']:.2f} (logit units)")
    cls = {**data, "y": (g["label"][tr], g["label"][te]), "oracle": oracle_cls, "shape": shape,
           "label": "label", "features": [col for col, _, _ in COLUMNS],
           "max_categories": max(spec[key] for _, key, _ in COLUMNS)}
    reg = {**cls, "y": (g["score"][tr], g["score"][te]), "oracle": oracle_reg, "label": "score",
           "shape": shape.split("; click rate")[0] + f"; target sd {g['score'][te].std():.2f}"}
    return cls, reg


# ---------------------------------------------------------------- the sparse table

def sparse_tables(rows):
    """bench/sparse_vs_dense.py's bench_sparse (its make_tables, in this database), split into
    fm_sparse_train / fm_sparse_test (id % 5 = 0); its rows for numpy, max-abs scaled."""
    train, test = "fm_sparse_train", "fm_sparse_test"
    sig = f"fm_vs_linear v{GEN_VERSION} sparse_vs_dense.make_tables rows {rows} dims {sparse_vs_dense.DIMS}"
    with connect() as c:
        if not signed(c, [train, test], sig):
            log(f"building bench/sparse_vs_dense.py's tables ({rows:,} rows)")
            sparse_vs_dense.make_tables(c, rows)
            for t, cond in ((train, "id % 5 <> 0"), (test, "id % 5 = 0")):
                c.execute(f"DROP TABLE IF EXISTS {t}")
                c.execute(f"CREATE TABLE {t} AS SELECT id, label, idx, val FROM bench_sparse WHERE {cond} ORDER BY id")
            c.execute("DROP TABLE bench_sparse, bench_dense, bench_sparse40")  # ours are copies
            sign(c, [train, test], sig)
        (Xtr, ytr), (Xte, yte) = sparse_vs_dense.load(c, train), sparse_vs_dense.load(c, test)
    scaler = MaxAbsScaler().fit(Xtr)  # corgipile's normalize of sparse features: divide by max |value|
    Xtr, Xte = scaler.transform(Xtr).tocsr(), scaler.transform(Xte).tocsr()
    (itr, vtr), (ite, vte) = padded(Xtr), padded(Xte)
    shape = (f"{Xtr.shape[0]:,} train / {Xte.shape[0]:,} test rows x {sparse_vs_dense.DIMS:,} dimensions, "
             f"{Xtr.nnz / Xtr.shape[0]:.1f} non-zeros per row")
    return {"train": train, "test": test, "d": sparse_vs_dense.DIMS, "idx": (itr, ite), "val": (vtr, vte),
            "X": (Xtr, Xte), "y": (ytr.astype(int), yte.astype(int)), "oracle": None, "shape": shape,
            "label": "label", "features": {"indices": "idx", "values": "val"}, "n_features": sparse_vs_dense.DIMS,
            "settings": SPARSE_SETTINGS}


def padded(X):
    """A CSR matrix as (rows, max non-zeros) index and value arrays, padded with value 0."""
    nnz = np.diff(X.indptr)
    m = int(nnz.max())
    idx, val = np.zeros((X.shape[0], m), dtype=np.int64), np.zeros((X.shape[0], m))
    pos = np.arange(X.nnz) - np.repeat(X.indptr[:-1], nnz)
    rows = np.repeat(np.arange(X.shape[0]), nnz)
    idx[rows, pos], val[rows, pos] = X.indices, X.data
    return idx, val


# ---------------------------------------------------------------- the numpy FM

def fm_fit(idx, val, y, d, *, loss, factors, epochs, lr, batch, l2, seed, init_uniform=False, dense_adam=False):
    """K outputs, score_c(x) = b_c + w_c·x + Σ_{i<j} <v_ic, v_jc> x_i x_j, trained on the mean loss
    of each batch of a fresh permutation per epoch: loss "logistic" (K = 1, y in {0, 1}),
    "softmax" (K = 2, one output per class, as corgipile's fm) or "squared" (K = 1); Adam (β 0.9,
    0.999, ε 1e-8) whose moments of w and v are updated for the batch's features only (lazy, as
    torch.optim.SparseAdam), or of every parameter every batch (dense_adam); v drawn N(0, 0.01²)
    (init_uniform: U(-0.01, 0.01), as corgipile's fm), w and b 0."""
    rng = np.random.default_rng(seed)
    n, k, K = idx.shape[0], factors, 2 if loss == "softmax" else 1
    b, w = np.zeros(K), np.zeros((d, K))
    V = rng.uniform(-0.01, 0.01, (d, K, k)) if init_uniform else rng.normal(0.0, 0.01, (d, K, k))
    params = (b, w, V)
    m1, m2 = [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params]
    b1, b2, eps, t = 0.9, 0.999, 1e-8, 0
    for _ in range(epochs):
        order = rng.permutation(n)
        for lo in range(0, n, batch):
            r = order[lo:lo + batch]
            I, X = idx[r], val[r]
            z, vx, s = fm_scores(b, w, V, I, X)                       # (B, K), (B, m, K, k), (B, K, k)
            if loss == "softmax":
                g = softmax(z, axis=1) - np.eye(K)[y[r].astype(int)]  # dloss/dz
            else:
                g = (expit(z) if loss == "logistic" else z) - y[r][:, None]
            g /= len(r)
            gx = g[:, None, :] * X[..., None]                         # dz_c/dw_ic = x_i: (B, m, K)
            uq, inv = np.unique(I.ravel(), return_inverse=True)
            gw, gv = np.zeros((len(uq), K)), np.zeros((len(uq), K, k))
            np.add.at(gw, inv, gx.reshape(-1, K))
            np.add.at(gv, inv, (gx[..., None] * (s[:, None] - vx)).reshape(-1, K, k))  # x_i (s_cf − v_icf x_i)
            grads = (g.sum(0), gw + l2 * w[uq], gv + l2 * V[uq])
            t += 1
            c1, c2 = 1 - b1 ** t, 1 - b2 ** t
            for j, (p, gr) in enumerate(zip(params, grads)):
                at = slice(None) if j == 0 else uq
                if dense_adam and j > 0:  # the zero gradients of the other features count too
                    at, full = slice(None), np.zeros_like(p)
                    full[uq] = gr
                    gr = full
                m1[j][at] = b1 * m1[j][at] + (1 - b1) * gr
                m2[j][at] = b2 * m2[j][at] + (1 - b2) * gr * gr
                p[at] -= lr * (m1[j][at] / c1) / (np.sqrt(m2[j][at] / c2) + eps)
    return b, w, V


def fm_scores(b, w, V, I, X):
    """The K scores of rows I/X (padded index/value arrays), the v_i x_i and their sums s."""
    vx = V[I] * X[..., None, None]
    s = vx.sum(1)
    return b + (w[I] * X[..., None]).sum(1) + 0.5 * ((s * s).sum(-1) - (vx * vx).sum((1, 3))), vx, s


def fm_predict(model, I, X, chunk=20_000):
    return np.concatenate([fm_scores(*model, I[i:i + chunk], X[i:i + chunk])[0] for i in range(0, len(I), chunk)])


# ---------------------------------------------------------------- metrics and arms

def class_metrics(y, p):
    p = np.clip(p, 1e-15, 1 - 1e-15)
    return {"accuracy": float(accuracy_score(y, p >= 0.5)), "log_loss": float(log_loss(y, p, labels=[0, 1])),
            "roc_auc": float(roc_auc_score(y, p))}


def reg_metrics(y, pred):
    return {"r2": float(r2_score(y, pred)), "rmse": float(np.sqrt(mean_squared_error(y, pred)))}


def numpy_fm_run(data, regression, seed, hp, like_corgipile=None):
    """The numpy FM on the training rows, scored on the test rows; a regression target is
    standardized for training (as corgipile's fm_regression does) and the scores mapped back."""
    (itr, ite), (vtr, vte), (ytr, yte) = data["idx"], data["val"], data["y"]
    mu, sd = (float(ytr.mean()), float(ytr.std())) if regression else (0.0, 1.0)
    t0 = time.perf_counter()
    loss = "squared" if regression else "softmax" if like_corgipile else "logistic"
    model = fm_fit(itr, vtr, (ytr - mu) / sd, data["d"], loss=loss, factors=hp["factors"], epochs=hp["epochs"],
                   lr=hp["learning_rate"], batch=hp["batch_size"], l2=hp["l2"], seed=seed,
                   init_uniform=bool(like_corgipile), dense_adam=like_corgipile == "dense")
    secs = time.perf_counter() - t0
    z = fm_predict(model, ite, vte)
    z = z[:, 1] - z[:, 0] if loss == "softmax" else z[:, 0]  # P(1) = sigmoid of the difference
    m = reg_metrics(yte, mu + sd * z) if regression else class_metrics(yte, expit(z))
    return {**m, "seconds": secs, "hyperparameters": hp}


def sklearn_run(data, regression):
    (Xtr, Xte), (ytr, yte) = data["X"], data["y"]
    est = Ridge(alpha=1.0) if regression else LogisticRegression(solver="lbfgs", C=1.0, tol=1e-8, max_iter=10_000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        t0 = time.perf_counter()
        est.fit(Xtr, ytr)
        secs = time.perf_counter() - t0
    m = reg_metrics(yte, est.predict(Xte)) if regression else class_metrics(yte, est.predict_proba(Xte)[:, 1])
    return {**m, "seconds": secs, "converged": not any(issubclass(w.category, ConvergenceWarning) for w in caught)}


def corgipile_params(data, seed, epochs):
    p = {"label": data["label"], "features": data["features"], "epochs": epochs, "seed": seed, "verbose": False}
    if "max_categories" in data:
        p["max_categories"] = data["max_categories"]  # every category its own feature
    if "n_features" in data:
        p["n_features"] = data["n_features"]
    return p


def positive_index(classes):
    """The position of class 1 (or true) in label_mapping's classes: their order is the model's
    (a softmax of a 0/1 label may hold [1.0, 0.0])."""
    for i, c in enumerate(classes):
        if c is True or str(c).lower() in ("true", "t") or (not isinstance(c, str) and float(c) == 1.0):
            return i
        if isinstance(c, str) and c.strip() in ("1", "1.0"):
            return i
    raise ValueError(f"no class 1 among {classes}")


def corgipile_run(data, kind, params, regression, timeout):
    """One training on a fresh connection; test metrics; the stored params. An ERROR is returned
    as {"error": ...}, not raised (a connection lost is raised, for retrying)."""
    sparse = isinstance(data["features"], dict)
    with connect() as c:
        for name, value in data.get("settings", {}).items():
            c.execute("SELECT set_config(%s, %s, false)", (name, value))
        c.execute(f"SET statement_timeout = {int(timeout * 1000)}")
        try:
            t0 = time.perf_counter()
            mid = c.execute("SELECT corgipile_train(%s, %s, %s)", (data["train"], kind, Jsonb(params))).fetchone()[0]
            secs = time.perf_counter() - t0
        except psycopg.Error as e:
            if connection_lost(e):
                raise
            return {"error": f"{e.sqlstate}: {str(e).splitlines()[0]}", "seconds": time.perf_counter() - t0}
        c.execute("SET statement_timeout = 0")
        out = {"model_id": mid, "seconds": secs}
        stored, mapping, tsecs = c.execute(
            "SELECT params, label_mapping, training_seconds FROM corgipile.models WHERE id = %s", (mid,)).fetchone()
        out.update({"stored_params": stored, "server_training_seconds": tsecs,
                    "epochs": c.execute("SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (mid,)).fetchone()[0],
                    "last_epoch_loss": c.execute("SELECT loss FROM corgipile.epochs WHERE model_id = %s ORDER BY epoch "
                                                 "DESC LIMIT 1", (mid,)).fetchone()[0]})
        try:
            ev = c.execute("SELECT corgipile_evaluate(%s, %s)", (mid, data["test"])).fetchone()[0]
            out["evaluate"] = ev
            if regression:
                out.update({"r2": ev.get("r2"), "rmse": ev.get("rmse")})
            else:
                out.update({"accuracy": ev.get("accuracy"), "log_loss": ev.get("log_loss")})
                # AUC from the probabilities of the positive class over the test rows.
                pos = positive_index((mapping or {}).get("classes", []))
                arg = "t.idx, t.val" if sparse else "t"
                rows = c.execute(f"SELECT label, corgipile_predict_proba(%s, {arg}) FROM {data['test']} t ORDER BY id",
                                 (mid,)).fetchall()
                y = np.array([int(r[0]) for r in rows])
                p = np.array([r[1][pos] for r in rows])
                out["roc_auc"] = float(roc_auc_score(y, p))
                out["client_check"] = class_metrics(y, p)  # should equal evaluate's accuracy and log_loss
                for m, tol in (("accuracy", 1e-9), ("log_loss", 1e-4)):  # relative; log-loss: clipping
                    if out[m] is not None and abs(out["client_check"][m] - out[m]) > tol * max(abs(out[m]), 1e-9):
                        out.setdefault("mismatch", []).append(
                            f"{m}: corgipile_evaluate {out[m]:.6f}, from corgipile_predict_proba {out['client_check'][m]:.6f}")
        except psycopg.Error as e:
            if connection_lost(e):
                raise
            out["error"] = f"scoring: {e.sqlstate}: {str(e).splitlines()[0]}"
        c.execute("SELECT corgipile_drop_model(%s)", (mid,))
    return out


def connection_lost(e):
    """A lost connection or a server restarting (not an ERROR of the statement: 54000, 57014 and
    the like are OperationalErrors too)."""
    return isinstance(e, psycopg.OperationalError) and (e.sqlstate is None or e.sqlstate[:2] == "08"
                                                         or e.sqlstate in ("57P01", "57P02", "57P03"))


def retrying(fn, *args, attempts=3):
    """Rerun fn(*args) when the server dropped the connection (a shared test cluster restarts every
    backend after another session's crash, or the library is being reinstalled)."""
    for attempt in range(1, attempts + 1):
        try:
            return fn(*args)
        except psycopg.OperationalError as e:
            if attempt == attempts or not connection_lost(e):
                raise
            log(f"connection lost ({str(e).splitlines()[0]}); waiting for the server, retrying")
            for _ in range(120):
                time.sleep(1)
                try:
                    connect().close()
                    break
                except psycopg.OperationalError:
                    pass


def med(xs):
    xs = [x for x in xs if x is not None]
    return records.median_range(xs) if xs else None


def run_dataset(key, data, seeds, epochs, timeout):
    regression = key == "ctr_score"
    fm_kind, linear = ("fm_regression", ["linear"]) if regression else ("fm", ["logistic", "softmax"])
    metrics = ["r2", "rmse"] if regression else ["accuracy", "log_loss", "roc_auc"]
    # The diagnostic arm with dense Adam only where a dense step is cheap in numpy.
    cheap = CORGIPILE_ADAM == "lazy" or data["d"] * (FM_DEFAULTS["factors"] + 1) <= 1_000_000
    arms = [f"corgipile {fm_kind}", "numpy FM"] + [AS_CORGIPILE] * cheap + [f"corgipile {k}" for k in linear] + \
           ["sklearn " + ("Ridge" if regression else "LogisticRegression")]
    runs = {a: [] for a in arms}
    failed = {}
    hp = None
    for seed in seeds:
        for arm in arms:
            if arm in failed:
                continue
            if arm.startswith("corgipile"):
                kind = arm.split(" ", 1)[1]
                r = retrying(corgipile_run, data, kind, corgipile_params(data, seed, epochs), regression, timeout)
                if kind == fm_kind and "stored_params" in r:
                    hp = {k: r["stored_params"].get(k, v) for k, v in FM_DEFAULTS.items()}
                if "error" in r and "seconds" in r and "model_id" not in r:
                    failed[arm] = r["error"]
            elif arm.startswith("numpy FM"):
                got = hp or dict(FM_DEFAULTS)
                r = numpy_fm_run(data, regression, seed, {**got, "epochs": epochs,
                                                          "copied_from_corgipile": hp is not None},
                                 like_corgipile=CORGIPILE_ADAM if arm == AS_CORGIPILE else None)
            else:
                if runs[arm]:
                    continue  # deterministic: once
                r = sklearn_run(data, regression)
            r["seed"] = seed
            runs[arm].append(r)
            shown = " ".join(f"{m} {r[m]:.4f}" for m in metrics if r.get(m) is not None)
            log(f"{key} seed {seed} {arm}: {shown} {r['seconds']:.1f} s" + (f" ERROR {r['error']}" if "error" in r else ""))
    summary = {a: {m: med([r.get(m) for r in rs]) for m in metrics + ["seconds"]} for a, rs in runs.items()}
    return {"dataset": key, "regression": regression, "shape": data["shape"], "oracle": data["oracle"],
            "arms": arms, "fm_arm": f"corgipile {fm_kind}", "runs": runs, "summary": summary, "failed": failed,
            "train": data["train"], "test": data["test"], "settings": data.get("settings", {})}


# ---------------------------------------------------------------- report

def fr(s, digits=4):
    if s is None:
        return "–"
    if s["n"] == 1:
        return f"{s['median']:.{digits}f}"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def checks(res):
    """(dataset, check, PASS/FAIL/n/a, what was compared) for the targets table."""
    out = []
    for d in res["datasets"]:
        s, fm = d["summary"], d["summary"][d["fm_arm"]]
        if d["regression"]:
            np_r2, lin = s["numpy FM"]["r2"], s["corgipile linear"]["r2"]
            if fm["r2"] and np_r2:
                gap = fm["r2"]["median"] - np_r2["median"]
                out.append((d["dataset"], f"corgipile fm_regression R² within {R2_TOL} of the numpy FM's",
                            gap >= -R2_TOL, f"{gap:+.4f}"))
            if fm["r2"] and lin:
                gain = fm["r2"]["median"] - lin["median"]
                out.append((d["dataset"], "fm_regression R² above corgipile linear's", gain > 0, f"{gain:+.4f}"))
            continue
        np_auc = s["numpy FM"]["roc_auc"]
        if fm["roc_auc"] and np_auc:
            gap = fm["roc_auc"]["median"] - np_auc["median"]
            out.append((d["dataset"], f"corgipile fm AUC within {AUC_TOL} of the numpy FM's", gap >= -AUC_TOL,
                        f"{gap:+.4f}"))
        lin_best = max((s[a]["roc_auc"]["median"] for a in d["arms"]
                        if a in ("corgipile logistic", "corgipile softmax", "sklearn LogisticRegression")
                        and s[a]["roc_auc"]), default=None)
        lin_acc = max((s[a]["accuracy"]["median"] for a in d["arms"]
                       if a in ("corgipile logistic", "corgipile softmax", "sklearn LogisticRegression")
                       and s[a]["accuracy"]), default=None)
        if fm["roc_auc"] and lin_best is not None:
            gain = fm["roc_auc"]["median"] - lin_best
            if d["dataset"] == "ctr":
                out.append((d["dataset"], f"corgipile fm AUC ≥ the best linear model's + {FM_GAIN}", gain >= FM_GAIN,
                            f"{gain:+.4f}"))
            else:
                out.append((d["dataset"], f"corgipile fm AUC within {AUC_TOL} of the best linear model's (a linear label)",
                            gain >= -AUC_TOL, f"{gain:+.4f}"))
        if fm["accuracy"] and lin_acc is not None and d["dataset"] != "ctr":
            gap = 100 * (fm["accuracy"]["median"] - lin_acc)
            out.append((d["dataset"], f"corgipile fm accuracy within {ACC_TOL} point of the best linear model's",
                        gap >= -ACC_TOL, f"{gap:+.2f} pts"))
    return out


def report(res):
    q = " (--quick)" if res["quick"] else ""
    L = [f"`bench/fm_vs_linear.py`{q}: corgipile's factorization machines (fm, fm_regression) against its "
         "linear models, FMs written in numpy and scikit-learn's linear models, on the same train/test rows. "
         f"corgipile {res['extversion']} ({res['library'][1]}), scikit-learn {res['sklearn_version']}, numpy "
         f"{res['numpy_version']}; seeds {res['seeds']}; {res['epochs']} epochs ({res['sparse_epochs']} on sparse); "
         f"total {res['total_seconds'] / 60:.1f} min on a shared {os.cpu_count()}-core machine. Medians (min–max) "
         "over the seeds; sklearn is fitted once.", ""]
    for d in res["datasets"]:
        metrics = ["r2", "rmse"] if d["regression"] else ["accuracy", "log_loss", "roc_auc"]
        heads = {"r2": "R²", "rmse": "RMSE", "accuracy": "accuracy", "log_loss": "log-loss", "roc_auc": "ROC AUC"}
        settings = "".join(f" corgipile sessions: `SET {k} = '{v}'`." for k, v in d.get("settings", {}).items())
        L += [f"## {d['dataset']}", "", d["shape"] + "." + settings, "",
              "| model | " + " | ".join(f"test {heads[m]}" for m in metrics) + " | training s |",
              "|---|" + "---|" * (len(metrics) + 1)]
        for a in d["arms"]:
            s = d["summary"][a]
            note = f" ({d['failed'][a]})" if a in d["failed"] else ""
            L.append(f"| {a}{note} | " + " | ".join(fr(s[m]) for m in metrics) + f" | {fr(s['seconds'], 2)} |")
        if d["oracle"]:
            L.append("| oracle (the true probabilities / logit) | " + " | ".join(
                f"{d['oracle'][m]:.4f}" for m in metrics) + " | |")
        fm_runs = [r for r in d["runs"][d["fm_arm"]] if "stored_params" in r]
        if fm_runs:
            keep = ("factors", "learning_rate", "learning_rate_schedule", "batch_size", "optimizer", "l2", "average",
                    "normalize", "epochs")
            shown = {k: fm_runs[0]["stored_params"][k] for k in keep if k in fm_runs[0]["stored_params"]}
            L += ["", f"{d['fm_arm']}'s stored params: `{json.dumps(shown)}`; numpy FM: "
                      f"`{json.dumps(d['runs']['numpy FM'][0]['hyperparameters']) if d['runs']['numpy FM'] else '–'}`."]
        errs = [f"ERROR {a} seed {r['seed']}: {r['error']}" for a in d["arms"] for r in d["runs"][a] if "error" in r]
        errs += [f"{a} seed {r['seed']}: {m}" for a in d["arms"] for r in d["runs"][a] for m in r.get("mismatch", [])]
        if errs:
            L += [""] + [f"- {e}" for e in errs]
        L.append("")
    L += ["## Checks", "", "| check | result | dataset | measured |", "|---|---|---|---|"]
    for ds, what, ok, measured in checks(res):
        L.append(f"| {ds}: {what} | {'PASS' if ok else 'FAIL'} | {ds} | {measured} |")
    L += ["", "corgipile: `corgipile_train(train, kind, params)` timed client side (statistics pass and epochs), "
              "`corgipile_evaluate(model, test)` for accuracy / log-loss / R², ROC AUC from "
              "`corgipile_predict_proba` over the test rows (positive class). params: label, features, epochs, "
              "seed, verbose false, max_categories = the largest column's count (ctr: every category a feature), "
              "n_features 1,000,000 (sparse); the rest each kind's defaults. numpy FM: the textbook FM, one output "
              "(logistic or squared loss), lazy Adam (touched features only), v ~ N(0, 0.01²), same rows; numpy "
              "FM as corgipile's: the same code with one output per class under a softmax (classification), v ~ "
              f"U(−0.01, 0.01) and {res['corgipile_adam']} Adam ("
              + ("every parameter every batch" if res["corgipile_adam"] == "dense" else "touched features only")
              + "), as corgipile's fm; sklearn: "
              "LogisticRegression(lbfgs, C=1, tol=1e-8) / Ridge(alpha=1) on the same rows. Timings of numpy/sklearn: rows "
              "already in memory.", "", "Raw numbers: the .json next to this file."]
    if res["library_at_end"] != res["library"]:
        L += ["", "**The library was reinstalled during the run.**"]
    return "\n".join(L) + "\n"


def figures(res):
    out = {}
    for d in res["datasets"]:
        f = {a: {k: v for k, v in s.items() if v is not None} for a, s in d["summary"].items()}
        f = {a: v for a, v in f.items() if v}
        if d["oracle"]:
            f["oracle"] = d["oracle"]
        if d["failed"]:
            f["errors"] = d["failed"]
        out[d["dataset"]] = f
    out["checks"] = {f"{ds}: {what}": {"result": "PASS" if ok else "FAIL", "measured": m}
                     for ds, what, ok, m in checks(res)}
    return out


def parse_seeds(text):
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small tables, 1 seed, 5 epochs: checks the script")
    ap.add_argument("--seeds", default=None, help="e.g. 1-3 or 1,4 (default 1-3; --quick: 1)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs of ctr and ctr_score (default 20; --quick: 5)")
    ap.add_argument("--sparse-epochs", type=int, default=None, help="epochs on sparse (default 1)")
    ap.add_argument("--sparse-rows", type=int, default=None, help="rows of the sparse table (default 100000; --quick: 10000)")
    ap.add_argument("--data-seed", type=int, default=7, help="the ctr table's generator seed")
    ap.add_argument("--only", default=None, help=f"comma-separated datasets (default {','.join(DATASETS)})")
    ap.add_argument("--timeout", type=float, default=600, help="statement_timeout of a training, seconds")
    ap.add_argument("--corgipile-adam", choices=["lazy", "dense"], default="lazy",
                    help="the Adam of the numpy FM as corgipile's: lazy (corgipile since aca3eb7), dense (before)")
    ap.add_argument("--out", default=None, help="results file (default bench/results/fm_vs_linear[_quick].md)")
    args = ap.parse_args()
    global CORGIPILE_ADAM
    CORGIPILE_ADAM = args.corgipile_adam
    import sklearn
    q = args.quick
    seeds = parse_seeds(args.seeds) if args.seeds else ([1] if q else [1, 2, 3])
    epochs = args.epochs or (5 if q else 20)
    sparse_epochs = args.sparse_epochs or 1
    sparse_rows = args.sparse_rows or (10_000 if q else 100_000)
    spec = CTR_QUICK if q else CTR
    keys = args.only.split(",") if args.only else list(DATASETS)
    for k in keys:
        if k not in DATASETS:
            sys.exit(f"unknown dataset {k!r} (known: {', '.join(DATASETS)})")
    name = "fm_vs_linear_quick" if q else "fm_vs_linear"
    out_md = args.out or os.path.join(HERE, "results", f"{name}.md")
    started = time.perf_counter()
    version = retrying(setup_database)
    with connect() as c:
        lib = installed_library(c)
    res = {"quick": q, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "extversion": version, "library": lib,
           "sklearn_version": sklearn.__version__, "numpy_version": np.__version__, "seeds": seeds,
           "epochs": epochs, "sparse_epochs": sparse_epochs, "sparse_rows": sparse_rows, "ctr_spec": spec,
           "data_seed": args.data_seed, "corgipile_adam": CORGIPILE_ADAM, "datasets": []}
    if "ctr" in keys or "ctr_score" in keys:
        cls, reg = retrying(ctr_tables, spec, args.data_seed)
        for key, data in (("ctr", cls), ("ctr_score", reg)):
            if key in keys:
                res["datasets"].append(run_dataset(key, data, seeds, epochs, args.timeout))
    if "sparse" in keys:
        data = retrying(sparse_tables, sparse_rows)
        res["datasets"].append(run_dataset("sparse", data, seeds, sparse_epochs, args.timeout))
    with connect() as c:
        res["library_at_end"] = installed_library(c)
        installed = records.server(c)
    res["total_seconds"] = time.perf_counter() - started
    text = report(res)
    print(text)
    os.makedirs(os.path.dirname(out_md), exist_ok=True)
    with open(os.path.splitext(out_md)[0] + ".json", "w") as f:
        json.dump(res, f, indent=1, default=str)
    provenance.write(out_md, text, "bench-fm", dbname=DBNAME)
    records.append_record(name, figures(res), make_target="bench-fm", results_file=out_md,
                          config={"quick": q, "seeds": seeds, "epochs": epochs, "sparse_epochs": sparse_epochs,
                                  "sparse_rows": sparse_rows, "datasets": keys, "ctr": spec,
                                  "data_seed": args.data_seed, "corgipile_adam": CORGIPILE_ADAM}, **installed)
    log(f"done in {res['total_seconds']:.0f} s")


if __name__ == "__main__":
    main()
