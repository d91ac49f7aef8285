"""Concurrency: training while others write and vacuum the table (MVCC snapshot respected),
concurrent trainings, concurrent predictions during a training, and a model deleted under a
predicting session."""

import random
import threading
import time

import psycopg
import psycopg.errors as E
import pytest

from helpers import connect, scalar, train
from tables import points, uniform



@pytest.fixture(scope="module")
def tables(db):
    with connect(db) as c:
        c.execute("""CREATE TABLE busy (id serial PRIMARY KEY, features float8[], label int)""")
        c.execute("""INSERT INTO busy (features, label)
                     SELECT ARRAY[random(), random(), random(), random()], CASE WHEN i % 50 = 0 THEN NULL ELSE i % 2 END
                     FROM generate_series(1, 100000) i""")
        points(c, "static", 100000, features=uniform(4, signal=2))
        c.execute("VACUUM ANALYZE busy, static")
    return db


def writer_threads(dsn, stop, errors, counts):
    def loop(name, body):
        rng = random.Random(name)
        try:
            with connect(dsn) as c:
                for i in range(2000):  # bounded in count ...
                    if stop.is_set():
                        break
                    body(c, rng)
                    counts[name] = counts.get(name, 0) + 1
        except Exception as e:  # noqa: BLE001
            errors.append((name, e))

    def insert(c, rng):
        c.execute("""INSERT INTO busy (features, label)
                     SELECT ARRAY[random(), random(), random(), random()], CASE WHEN g % 7 = 0 THEN NULL ELSE g % 2 END
                     FROM generate_series(1, 50) g""")

    def update(c, rng):
        lo = rng.randint(1, 100000)
        c.execute("UPDATE busy SET label = 1 - label, features[1] = random() WHERE id BETWEEN %s AND %s",
                  (lo, lo + 300))

    def delete(c, rng):
        lo = rng.randint(1, 100000)
        c.execute("DELETE FROM busy WHERE id BETWEEN %s AND %s", (lo, lo + 150))

    def vacuum(c, rng):
        c.execute("VACUUM busy")
        time.sleep(0.05)

    return [threading.Thread(target=loop, args=(n, f), daemon=True)
            for n, f in (("insert", insert), ("update", update), ("delete", delete), ("vacuum", vacuum))]


@pytest.mark.parametrize("double_buffer", [True, False], ids=["double", "single"])
def test_training_sees_its_snapshot_under_concurrent_writes(tables, double_buffer):
    stop, errors, counts = threading.Event(), [], {}
    writers = writer_threads(tables, stop, errors, counts)
    for w in writers:
        w.start()
    try:
        time.sleep(0.3)  # writers are running
        with connect(tables) as conn:
            for attempt in range(2):
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                visible = scalar(conn, "SELECT count(*) FROM busy WHERE label IS NOT NULL AND features IS NOT NULL")
                total = scalar(conn, "SELECT count(*) FROM busy")
                model_id = train(conn, "busy", "svm", {"epochs": 4, "seed": attempt, "double_buffer": double_buffer,
                                                       "buffer_size": "5%"})
                conn.execute("COMMIT")
                tuples = [r[0] for r in conn.execute(
                    "SELECT tuples FROM corgipile.epochs WHERE model_id = %s ORDER BY epoch", (model_id,))]
                trained, skipped = conn.execute(
                    "SELECT rows_trained, rows_skipped FROM corgipile.models WHERE id = %s", (model_id,)).fetchone()
                print(f"concurrent writes (double_buffer={double_buffer}): snapshot count {visible} "
                      f"(total {total}), tuples per epoch {tuples}, rows_trained {trained}, skipped {skipped}")
                assert tuples == [visible] * 4
                assert (trained, trained + skipped) == (visible, total)
    finally:
        stop.set()
        for w in writers:
            w.join(30)
    print(f"writer statements during the trainings: {counts}")
    assert not errors, errors
    assert all(counts.get(n, 0) > 0 for n in ("insert", "update", "delete", "vacuum")), counts


def test_four_concurrent_trainings_same_seed_identical(tables):
    results, errors = [None] * 4, []

    def run(i):
        try:
            with connect(tables) as c:
                mid = train(c, "static", "logistic", {"epochs": 3, "seed": 99, "double_buffer": i % 2 == 0})
                results[i] = c.execute("SELECT weights, bias FROM corgipile.models WHERE id = %s", (mid,)).fetchone()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert all(r is not None for r in results)
    # Same seed, same data: bit-identical weights (double- and single-buffered alike).
    assert all(r == results[0] for r in results), results


VECTORS = [[random.Random(i).uniform(-2, 2) for _ in range(4)] for i in range(32)]


@pytest.mark.slow
def test_predict_from_eight_threads_during_training(tables):
    with connect(tables) as c:
        model_id = train(c, "static", "svm", {"epochs": 2, "seed": 5})
        reference = [scalar(c, "SELECT corgipile_predict(%s, %s::float8[])", (model_id, v)) for v in VECTORS]
    assert len(set(reference)) == 2, "choose vectors on both sides of the hyperplane"
    stop, errors, calls, mismatches = threading.Event(), [], [0] * 8, []
    duration = 8.0

    def predictor(k):
        try:
            with connect(tables) as c:
                i = k
                deadline = time.monotonic() + duration
                while time.monotonic() < deadline and i < 200_000:
                    v = VECTORS[i % len(VECTORS)]
                    p = scalar(c, "SELECT corgipile_predict(%s, %s::float8[])", (model_id, v))
                    if p != reference[i % len(VECTORS)]:
                        mismatches.append((v, p))
                    calls[k] += 1
                    i += 1
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def trainer():
        try:
            with connect(tables) as c:
                while not stop.is_set():
                    train(c, "static", "logistic", {"epochs": 3})
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    tt = threading.Thread(target=trainer, daemon=True)
    tt.start()
    ps = [threading.Thread(target=predictor, args=(k,)) for k in range(8)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(duration + 30)
    stop.set()
    tt.join(60)
    print(f"concurrent predict: {sum(calls)} calls from 8 threads in {duration:.0f} s during training, "
          f"{len(mismatches)} mismatches")
    assert not errors, errors
    assert not mismatches, mismatches[:5]
    assert min(calls) > 10


def test_model_deleted_while_other_session_predicts(tables):
    with connect(tables) as a, connect(tables) as b:
        model_id = train(a, "static", "svm", {"epochs": 1, "seed": 1})
        ok = 0
        deleted = False
        deadline = time.monotonic() + 10
        error = None
        while time.monotonic() < deadline:
            try:
                scalar(b, "SELECT corgipile_predict(%s, ARRAY[1, 2, 3, 4]::float8[])", (model_id,))
                assert not deleted, "a statement started after the DELETE committed still used the model"
                ok += 1
            except psycopg.Error as e:
                error = e
                break
            if ok == 50:
                a.execute("DELETE FROM corgipile.models WHERE id = %s", (model_id,))
                deleted = True
        assert deleted and ok == 50
        assert isinstance(error, E.UndefinedObject), error
        assert scalar(b, "SELECT 1") == 1
        # A statement that predicts many rows keeps one consistent model (or errors): never a crash.
        model2 = train(a, "static", "svm", {"epochs": 1, "seed": 1})
        t_err = []

        def deleter():
            time.sleep(0.2)
            a.execute("DELETE FROM corgipile.models WHERE id = %s", (model2,))

        t = threading.Thread(target=deleter)
        t.start()
        try:
            n = scalar(b, "SELECT count(corgipile_predict(%s, features)) FROM static, generate_series(1, 5)", (model2,))
            assert n == 500_000
        except E.UndefinedObject as e:
            t_err.append(e)
        t.join(10)
        assert scalar(b, "SELECT 1") == 1
        with pytest.raises(E.UndefinedObject):
            b.execute("SELECT corgipile_predict(%s, ARRAY[1, 2, 3, 4]::float8[])", (model2,))
