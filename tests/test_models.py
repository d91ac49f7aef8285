"""Every model and data shape, checked against what users compare us with: scikit-learn fitted
on the same training file, closed-form least squares, and scikit-learn's bundled digits."""

import subprocess
import sys

import numpy as np
import psycopg
import pytest

from helpers import REPO, dataset, evaluate, scalar, train


def load_libsvm(dbname, path, table, sparse=False, n_features=None):
    args = [sys.executable, str(REPO / "scripts" / "load_libsvm.py"), str(path), table, "-d", dbname]
    if sparse:
        args.append("--sparse")
    if n_features:
        args += ["--n-features", str(n_features)]
    subprocess.run(args, check=True, capture_output=True)


def load_svmlight(path, n_features):
    """scikit-learn's loader, with the 32-bit sparse indices its linear models accept."""
    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(str(path), n_features=n_features)
    X = X.tocsr()
    X.indices, X.indptr = X.indices.astype(np.int32), X.indptr.astype(np.int32)
    return X, y


def sklearn_ceiling(train_path, test_path, n_features):
    """Converged LogisticRegression / LinearSVC test accuracy on the same files."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import LinearSVC

    Xtr, ytr = load_svmlight(train_path, n_features)
    Xte, yte = load_svmlight(test_path, n_features)
    out = {}
    for name, est in (("logistic", LogisticRegression(max_iter=2000)), ("svm", LinearSVC(max_iter=20000))):
        out[name] = float((est.fit(Xtr, ytr).predict(Xte) == yte).mean())
    return out


CASES = [
    # dataset, train file, test file, n_features, sparse
    ("a9a", "a9a.train.bz2", "a9a.test.bz2", 123, True),
    ("ijcnn1", "ijcnn1.train.bz2", "ijcnn1.test.bz2", 22, False),
]


@pytest.mark.parametrize("name,train_file,test_file,n_features,sparse", CASES)
@pytest.mark.slow
def test_clustered_datasets_match_sklearn(dsn, conn, name, train_file, test_file, n_features, sparse):
    train_path, test_path = dataset(train_file, test_file)
    db = dsn.split("=")[1]
    load_libsvm(db, train_path, f"tm_{name}_file", sparse, n_features)
    load_libsvm(db, test_path, f"tm_{name}_test", sparse, n_features)
    conn.execute(f"CREATE TABLE tm_{name}_clustered AS SELECT * FROM tm_{name}_file ORDER BY label, id")
    features = {"indices": "feature_indices", "values": "feature_values"} if sparse else "features"
    ceiling = sklearn_ceiling(train_path, test_path, n_features)
    for model in ("svm", "logistic"):
        # 10 epochs; a faster learning-rate decay than the default 0.95 settles the last iterate.
        params = {"epochs": 10, "seed": 3, "features": features, "decay": 0.8}
        if sparse:
            params["n_features"] = n_features
        model_id = train(conn, f"tm_{name}_clustered", model, params)
        report = evaluate(conn, model_id, f"tm_{name}_test")
        print(f"{name} {model}: corgipile {report['accuracy']:.4f}  sklearn {ceiling[model]:.4f}")
        assert report["accuracy"] >= ceiling[model] - 0.01
        assert report["rows_scored"] == scalar(conn, f"SELECT count(*) FROM tm_{name}_test")


def test_w8a_sparse_skewed(dsn, conn):
    path = dataset("w8a.bz2")
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import LinearSVC

    load_libsvm(dsn.split("=")[1], path, "w8a_file", sparse=True, n_features=300)
    # A deterministic 80/20 split by line number; training part clustered by label.
    conn.execute("CREATE TABLE w8a_train AS SELECT * FROM w8a_file WHERE id % 5 <> 0 ORDER BY label, id")
    conn.execute("CREATE TABLE w8a_test AS SELECT * FROM w8a_file WHERE id % 5 = 0")
    X, y = load_svmlight(path, 300)
    ids = np.arange(1, X.shape[0] + 1)
    tr, te = ids % 5 != 0, ids % 5 == 0
    for model, est in (("logistic", LogisticRegression(max_iter=2000)), ("svm", LinearSVC(max_iter=20000))):
        ceiling = float((est.fit(X[tr], y[tr]).predict(X[te]) == y[te]).mean())
        model_id = train(conn, "w8a_train", model, {
            "epochs": 10, "seed": 3, "n_features": 300, "decay": 0.8,
            "features": {"indices": "feature_indices", "values": "feature_values"}})
        report = evaluate(conn, model_id, "w8a_test")
        print(f"w8a {model}: corgipile {report['accuracy']:.4f}  sklearn {ceiling:.4f}")
        assert report["accuracy"] >= ceiling - 0.01


def test_linear_regression_recovers_least_squares(conn):
    rng = np.random.default_rng(7)
    n, beta, intercept = 20_000, np.array([2.0, -1.0, 0.5, 3.0, 0.0]), 1.5
    X = rng.normal(size=(n, beta.size))
    y = X @ beta + intercept + rng.normal(scale=0.5, size=n)
    conn.execute("CREATE TABLE reg (id int, x1 float8, x2 float8, x3 float8, x4 float8, x5 float8, y float8)")
    with conn.cursor().copy("COPY reg FROM STDIN") as copy:
        for i, (row, target) in enumerate(zip(X, y)):
            copy.write_row((i, *row, target))
    conn.execute("CREATE TABLE reg_sorted AS SELECT * FROM reg ORDER BY y")  # clustered by the target
    model_id = train(conn, "reg_sorted", "linear", {
        "features": ["x1", "x2", "x3", "x4", "x5"], "label": "y", "epochs": 10, "seed": 1, "learning_rate": 0.01})
    report = evaluate(conn, model_id, "reg", {"features": ["x1", "x2", "x3", "x4", "x5"], "label": "y"})
    A = np.hstack([X, np.ones((n, 1))])
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    r2_ols = 1 - ((A @ coef - y) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    weights = scalar(conn, "SELECT weights FROM corgipile.models WHERE id = %s", (model_id,))
    print(f"linear: R2 corgipile {report['r2']:.5f}  OLS {r2_ols:.5f}; weights {np.round(weights, 3)} vs {np.round(coef[:-1], 3)}")
    assert abs(report["r2"] - r2_ols) <= 0.01
    assert np.allclose(weights, coef[:-1], atol=0.1)
    assert {"mse", "rmse", "mae", "r2", "rows_scored"} <= report.keys()


def test_softmax_digits_clustered_by_class(conn):
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(0)
    order = rng.permutation(len(digits.target))
    test_idx = order[:360]
    conn.execute("CREATE TABLE digits (id int, pixels float8[], digit int, is_test bool)")
    with conn.cursor().copy("COPY digits FROM STDIN") as copy:
        for i in range(len(digits.target)):
            copy.write_row((i, list(map(float, digits.data[i])), int(digits.target[i]), bool(i in set(test_idx))))
    conn.execute("CREATE TABLE digits_train AS SELECT * FROM digits WHERE NOT is_test ORDER BY digit, id")
    conn.execute("CREATE TABLE digits_test AS SELECT * FROM digits WHERE is_test")
    model_id = train(conn, "digits_train", "softmax", {
        "features": "pixels", "label": "digit", "epochs": 10, "seed": 2, "normalize": True})
    report = evaluate(conn, model_id, "digits_test")
    print(f"digits softmax: test accuracy {report['accuracy']:.4f}, macro F1 {report['macro_f1']:.4f}")
    assert report["accuracy"] >= 0.93
    assert len(report["per_class"]) == 10
    # predict_class answers in the table's values; predict_proba sums to one.
    row = scalar(conn, "SELECT pixels FROM digits_test ORDER BY id LIMIT 1")
    assert scalar(conn, "SELECT corgipile_predict_class(%s, %s)", (model_id, row)) in [str(d) for d in range(10)]
    assert abs(sum(scalar(conn, "SELECT corgipile_predict_proba(%s, %s)", (model_id, row))) - 1) < 1e-9


def test_text_labels_and_probabilities(conn):
    conn.execute("""CREATE TABLE pets AS SELECT ARRAY[s + random(), random()] AS features,
                    CASE WHEN s > 0 THEN 'cat' ELSE 'dog' END AS label
                    FROM (SELECT CASE WHEN i % 2 = 0 THEN 1 ELSE -1 END AS s FROM generate_series(1, 2000) i) g""")
    model_id = train(conn, "pets", "logistic", {"epochs": 5, "seed": 1})
    assert scalar(conn, "SELECT corgipile_predict_class(%s, ARRAY[1.5, 0.5])", (model_id,)) == "cat"
    assert scalar(conn, "SELECT corgipile_predict_class(%s, ARRAY[-0.5, 0.5])", (model_id,)) == "dog"
    proba = scalar(conn, "SELECT corgipile_predict_proba(%s, ARRAY[1.5, 0.5])", (model_id,))
    classes = scalar(conn, "SELECT label_mapping->'classes' FROM corgipile.models WHERE id = %s", (model_id,))
    assert proba[classes.index("cat")] > 0.5 and abs(sum(proba) - 1) < 1e-12
    with pytest.raises(psycopg.errors.WrongObjectType):
        scalar(conn, "SELECT corgipile_predict(%s, ARRAY[1.5, 0.5])", (model_id,))
    z = scalar(conn, "SELECT corgipile_decision_function(%s, ARRAY[1.5, 0.5])", (model_id,))
    assert (z > 0) == (classes[1] == "cat")
