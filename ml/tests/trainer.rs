//! Trainer behaviour: convergence, update formulas, mini-batches across
//! buffers, determinism, label mapping (incl. the bit-exact flip) and errors.

mod common;

use corgipile_ml::arena::TupleArena;
use corgipile_ml::model::{LinearModel, ModelKind};
use corgipile_ml::shuffle::{block_order, split_blocks, TupleShuffler};
use corgipile_ml::trainer::{EpochStats, LrSchedule, TrainConfig, TrainError, Trainer};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

const KINDS: [ModelKind; 2] = [ModelKind::Svm, ModelKind::Logistic];

type Data = Vec<(f64, Vec<f64>)>;

fn cfg(kind: ModelKind, lr: f64, l2: f64, batch: usize) -> TrainConfig {
    TrainConfig {
        kind,
        learning_rate: lr,
        schedule: LrSchedule::Exponential { decay: 0.9 },
        l2,
        batch_size: batch,
        ..TrainConfig::new(kind)
    }
}

fn uniform(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// `n` tuples of `d` nonzero features in [-2, 2] with labels ±1 from a fixed
/// hyperplane (optionally with some label noise, to keep gradients nonzero).
fn dataset(n: usize, d: usize, seed: u64, noise: f64) -> Vec<(f64, Vec<f64>)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let w: Vec<f64> = (0..d)
        .map(|j| if j % 2 == 0 { 1.0 } else { -0.7 })
        .collect();
    (0..n)
        .map(|_| {
            let x: Vec<f64> = (0..d)
                .map(|_| {
                    let v = 0.05 + 1.95 * uniform(&mut rng);
                    if uniform(&mut rng) < 0.5 {
                        -v
                    } else {
                        v
                    }
                })
                .collect();
            let z: f64 = w.iter().zip(&x).map(|(a, b)| a * b).sum::<f64>() + 0.3;
            let mut y = if z >= 0.0 { 1.0 } else { -1.0 };
            if uniform(&mut rng) < noise {
                y = -y;
            }
            (y, x)
        })
        .collect()
}

fn arena_of(data: &[(f64, Vec<f64>)], d: usize) -> TupleArena {
    let mut a = TupleArena::new(d, data.len());
    for (y, x) in data {
        a.push(*y, x);
    }
    a
}

fn bits(m: &LinearModel) -> (Vec<u64>, u64) {
    (
        m.weights.iter().map(|w| w.to_bits()).collect(),
        m.bias[0].to_bits(),
    )
}

fn stats_bits(s: &EpochStats) -> (u32, u64, u64, u64, u64) {
    (
        s.epoch,
        s.loss.to_bits(),
        s.accuracy.unwrap().to_bits(),
        s.tuples,
        s.learning_rate.to_bits(),
    )
}

use common::run;

#[test]
fn separable_data_reaches_full_training_accuracy() {
    // Points at least 0.2 away from the separating line x0 - x1 = 0.
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut a = TupleArena::new(2, 200);
    while a.len() < 200 {
        let x = [uniform(&mut rng) * 4.0 - 2.0, uniform(&mut rng) * 4.0 - 2.0];
        let m = x[0] - x[1];
        if m.abs() >= 0.2 {
            a.push(if m > 0.0 { 1.0 } else { 0.0 }, &x); // 0/1 labels
        }
    }
    for &kind in &KINDS {
        for &batch in &[1usize, 8] {
            let mut t = Trainer::new(
                TrainConfig {
                    kind,
                    learning_rate: 0.5,
                    schedule: LrSchedule::Exponential { decay: 0.97 },
                    l2: 0.0,
                    batch_size: batch,
                    ..TrainConfig::new(kind)
                },
                2,
            );
            let mut shuffler_perm = Vec::new();
            let mut last = None;
            for e in 1..=200 {
                t.start_epoch(e);
                TupleShuffler::new(11, e).permutation(a.len(), &mut shuffler_perm);
                t.train_buffer(&a, Some(&shuffler_perm)).unwrap();
                last = Some(t.finish_epoch().unwrap());
            }
            assert_eq!(t.label_map(), Some((0.0, 1.0)));
            let m = t.model();
            let correct = (0..a.len())
                .filter(|&i| {
                    m.predict_sign(a.features(i)) == if a.label(i) == 1.0 { 1.0 } else { -1.0 }
                })
                .count();
            assert_eq!(correct, a.len(), "{kind:?} batch {batch}: {last:?}");
        }
    }
}

#[test]
fn batch_size_one_follows_the_update_formula_exactly() {
    let d = 5;
    let data = dataset(30, d, 1, 0.1);
    let a = arena_of(&data, d);
    for &kind in &KINDS {
        for &l2 in &[0.0, 0.05] {
            let config = cfg(kind, 0.1, l2, 1);
            let mut t = Trainer::new(config.clone(), d);
            t.start_epoch(2);
            t.train_buffer(&a, None).unwrap();

            let lr = 0.1 * 0.9;
            let (mut w, mut b) = (vec![0.0f64; d], 0.0f64);
            let (mut loss, mut correct) = (0.0, 0u64);
            for (y, x) in &data {
                let z = corgipile_ml::row::dot(&w, x) + b;
                loss += kind.head().scalar().unwrap().loss(z, *y);
                if (if z >= 0.0 { 1.0 } else { -1.0 }) == *y {
                    correct += 1;
                }
                let g = kind.head().scalar().unwrap().dloss_dz(z, *y);
                for j in 0..d {
                    w[j] = w[j] * (1.0 - lr * l2) - lr * g * x[j];
                }
                b -= lr * g;
            }
            assert_eq!(
                bits(t.model()),
                bits(&LinearModel::single(kind, w.clone(), b)),
                "{kind:?} l2={l2}"
            );
            let s = t.finish_epoch().unwrap();
            assert_eq!(s.epoch, 2);
            assert_eq!(s.tuples, 30);
            assert_eq!(s.learning_rate, lr);
            assert_eq!(s.accuracy, Some(correct as f64 / 30.0));
            let reg: f64 = 0.5 * l2 * w.iter().map(|v| v * v).sum::<f64>();
            assert!((s.loss - (loss / 30.0 + reg)).abs() < 1e-12);
        }
    }
}

#[test]
fn mini_batch_follows_the_averaged_update_formula() {
    let d = 3;
    let data = dataset(7, d, 2, 0.0);
    let a = arena_of(&data, d);
    let (lr, l2, bs) = (0.2, 0.01, 3usize);
    let kind = ModelKind::Logistic;
    let mut t = Trainer::new(
        TrainConfig {
            kind,
            learning_rate: lr,
            schedule: LrSchedule::Exponential { decay: 1.0 },
            l2,
            batch_size: bs,
            ..TrainConfig::new(kind)
        },
        d,
    );
    t.start_epoch(1);
    t.train_buffer(&a, None).unwrap();
    t.finish_epoch().unwrap();

    let (mut w, mut b) = (vec![0.0f64; d], 0.0f64);
    for chunk in data.chunks(bs) {
        // All tuples of a batch see the model from before the batch.
        let mut sg = vec![0.0; d];
        let mut sb = 0.0;
        for (y, x) in chunk {
            let g = kind
                .head()
                .scalar()
                .unwrap()
                .dloss_dz(corgipile_ml::row::dot(&w, x) + b, *y);
            for j in 0..d {
                sg[j] += g * x[j];
            }
            sb += g;
        }
        let n = chunk.len() as f64; // last batch (1 tuple) is flushed by finish_epoch
        for j in 0..d {
            w[j] = w[j] * (1.0 - lr * l2) - lr * (sg[j] / n);
        }
        b -= lr * (sb / n);
    }
    assert_eq!(bits(t.model()), bits(&LinearModel::single(kind, w, b)));
}

#[test]
fn mini_batch_spanning_buffers_equals_one_buffer() {
    let d = 4;
    let data = dataset(50, d, 3, 0.15);
    let whole = vec![arena_of(&data, d)];
    let split = vec![
        arena_of(&data[..3], d),
        arena_of(&data[3..21], d),
        arena_of(&data[21..], d),
    ];
    for &kind in &KINDS {
        for &l2 in &[0.0, 0.02] {
            let (mut t1, s1) = run(cfg(kind, 0.05, l2, 4), d, &whole, 3);
            let (mut t2, s2) = run(cfg(kind, 0.05, l2, 4), d, &split, 3);
            assert_eq!(bits(t1.model()), bits(t2.model()));
            assert_eq!(s1, s2);
        }
    }
}

/// Full CorgiPile pipeline over a "table" of pages holding `per_page` tuples each.
fn corgipile_run(
    kind: ModelKind,
    seed: u64,
    data: &[(f64, Vec<f64>)],
    d: usize,
) -> (Vec<u64>, u64) {
    let per_page = 5;
    let n_pages = data.len().div_ceil(per_page) as u32;
    let blocks = split_blocks(n_pages, 2);
    let mut t = Trainer::new(cfg(kind, 0.1, 0.001, 2), d);
    let mut buf = TupleArena::new(d, 30);
    let mut perm = Vec::new();
    for e in 1..=4 {
        t.start_epoch(e);
        let mut shuffler = TupleShuffler::new(seed, e);
        for (k, &bi) in block_order(blocks.len(), seed, e, true).iter().enumerate() {
            let (start, len) = blocks[bi];
            for p in start..start + len {
                for tup in data.iter().skip(p as usize * per_page).take(per_page) {
                    buf.push(tup.0, &tup.1);
                }
            }
            // Buffer holds 3 blocks.
            if k % 3 == 2 || k + 1 == blocks.len() {
                shuffler.permutation(buf.len(), &mut perm);
                t.train_buffer(&buf, Some(&perm)).unwrap();
                buf.clear();
            }
        }
        t.finish_epoch().unwrap();
    }
    bits(t.model())
}

#[test]
fn seeded_runs_are_bitwise_reproducible() {
    let d = 6;
    let data = dataset(200, d, 4, 0.05);
    for &kind in &KINDS {
        let a = corgipile_run(kind, 42, &data, d);
        assert_eq!(a, corgipile_run(kind, 42, &data, d));
        assert_ne!(a, corgipile_run(kind, 43, &data, d));
    }
}

/// Replaces the ±1 labels by raw values `neg`/`pos`.
fn relabel(data: &[(f64, Vec<f64>)], neg: f64, pos: f64) -> Vec<(f64, Vec<f64>)> {
    data.iter()
        .map(|(y, x)| (if *y > 0.0 { pos } else { neg }, x.clone()))
        .collect()
}

#[test]
fn label_flip_is_bit_exact() {
    let d = 5;
    // Clustered start: 25 negatives, then a mix (label noise keeps gradients alive).
    let mut data: Vec<_> = dataset(400, d, 5, 0.1)
        .into_iter()
        .filter(|t| t.0 < 0.0)
        .take(25)
        .collect();
    data.extend(dataset(200, d, 6, 0.1));
    let mut pos_first: Vec<_> = dataset(400, d, 7, 0.1)
        .into_iter()
        .filter(|t| t.0 > 0.0)
        .take(25)
        .collect();
    pos_first.extend(dataset(200, d, 8, 0.1));

    // (data, raw negative value, raw positive value): in each case the first
    // value's provisional guess is wrong, so the trainer must flip.
    let cases: Vec<(&Data, f64, f64)> = vec![
        (&data, 3.0, 7.0),        // starts with 3 (> 0 → guessed positive, is negative)
        (&pos_first, -5.0, -2.0), // starts with -2 (≤ 0 → guessed negative, is positive)
        (&pos_first, 0.0, 0.5),
    ];
    for &kind in &KINDS {
        for &batch in &[1usize, 3, 40] {
            for &l2 in &[0.0, 0.01] {
                for (base, neg, pos) in &cases {
                    let reference = arena_of(base, d); // labels already -1/+1: no flip
                    let raw = relabel(base, *neg, *pos);
                    let buffers = [arena_of(&raw[..60], d), arena_of(&raw[60..], d)];
                    let (mut t_ref, s_ref) = run(
                        cfg(kind, 0.1, l2, batch),
                        d,
                        std::slice::from_ref(&reference),
                        3,
                    );
                    let (mut t_raw, s_raw) = run(cfg(kind, 0.1, l2, batch), d, &buffers, 3);
                    let ctx = format!("{kind:?} batch={batch} l2={l2} labels {neg}/{pos}");
                    assert_eq!(t_raw.label_map(), Some((*neg, *pos)), "{ctx}");
                    assert_eq!(bits(t_raw.model()), bits(t_ref.model()), "{ctx}");
                    let sb: Vec<_> = s_raw.iter().map(stats_bits).collect();
                    let rb: Vec<_> = s_ref.iter().map(stats_bits).collect();
                    assert_eq!(sb, rb, "{ctx}");
                }
            }
        }
    }
}

#[test]
fn any_two_label_values_give_identical_results() {
    let d = 3;
    let base = dataset(100, d, 9, 0.1);
    let (mut t_ref, s_ref) = run(
        cfg(ModelKind::Svm, 0.1, 0.0, 1),
        d,
        &[arena_of(&base, d)],
        2,
    );
    for (neg, pos) in [(0.0, 1.0), (-1.0, 1.0), (3.0, 7.0), (-7.0, -3.0)] {
        let raw = relabel(&base, neg, pos);
        let (mut t, s) = run(cfg(ModelKind::Svm, 0.1, 0.0, 1), d, &[arena_of(&raw, d)], 2);
        assert_eq!(t.label_map(), Some((neg, pos)));
        assert_eq!(t.labels_seen(), vec![neg, pos]);
        assert_eq!(bits(t.model()), bits(t_ref.model()));
        assert_eq!(s, s_ref);
    }
}

#[test]
fn label_tracking_and_too_many_labels() {
    let mut t = Trainer::new(cfg(ModelKind::Logistic, 0.1, 0.0, 1), 1);
    assert_eq!(t.labels_seen(), Vec::<f64>::new());
    assert_eq!(t.label_map(), None);
    let mut a = TupleArena::new(1, 4);
    a.push(2.0, &[1.0]);
    a.push(2.0, &[1.0]);
    t.train_buffer(&a, None).unwrap();
    assert_eq!(t.labels_seen(), vec![2.0]);
    assert_eq!(t.label_map(), None);

    a.clear();
    a.push(1.0, &[1.0]);
    a.push(0.0, &[1.0]);
    t.train_buffer(&a, None).unwrap_err();
    let err = {
        let mut t = Trainer::new(cfg(ModelKind::Logistic, 0.1, 0.0, 1), 1);
        t.train_buffer(
            &arena_of(&[(2.0, vec![1.0]), (1.0, vec![1.0]), (0.0, vec![1.0])], 1),
            None,
        )
        .unwrap_err()
    };
    assert_eq!(
        err,
        TrainError::TooManyLabels {
            values: [1.0, 2.0, 0.0]
        }
    );
    assert_eq!(
        err.to_string(),
        "label column has more than two distinct values (found 1, 2 and 0)"
    );
    assert_eq!(t.label_map(), Some((1.0, 2.0)));

    // NaN is never a valid label.
    let mut t = Trainer::new(cfg(ModelKind::Svm, 0.1, 0.0, 1), 1);
    let e = t
        .train_buffer(&arena_of(&[(f64::NAN, vec![1.0])], 1), None)
        .unwrap_err();
    assert!(matches!(e, TrainError::TooManyLabels { .. }));
    assert_eq!(e.to_string(), "label value NaN is not a valid class label");
}

#[test]
fn divergence_is_reported() {
    let a = arena_of(
        &[(1.0, vec![1e200]), (-1.0, vec![1e200]), (1.0, vec![-1e200])],
        1,
    );
    for &kind in &KINDS {
        let mut t = Trainer::new(cfg(kind, 1e6, 0.0, 1), 1);
        t.start_epoch(1);
        let r = t
            .train_buffer(&a, None)
            .and_then(|_| t.finish_epoch().map(|_| ()));
        assert_eq!(r, Err(TrainError::Diverged { epoch: 1 }), "{kind:?}");
    }
    assert_eq!(
        TrainError::Diverged { epoch: 4 }.to_string(),
        "training diverged in epoch 4: loss or weights became NaN or infinite, or the loss more than 1000 times a zero model's"
    );
}

#[test]
fn learning_rate_decays_and_empty_epoch_is_zero() {
    let mut t = Trainer::new(
        TrainConfig {
            kind: ModelKind::Svm,
            learning_rate: 0.5,
            schedule: LrSchedule::Exponential { decay: 0.5 },
            l2: 0.0,
            batch_size: 1,
            ..TrainConfig::new(ModelKind::Svm)
        },
        2,
    );
    t.start_epoch(3);
    let s = t.finish_epoch().unwrap();
    assert_eq!(
        s,
        EpochStats {
            epoch: 3,
            loss: 0.0,
            accuracy: Some(0.0),
            r2: None,
            tuples: 0,
            learning_rate: 0.125
        }
    );
}

/// Cancel must not wait for a whole buffer: the interrupt check runs between rows and stops
/// the buffer at once, however expensive one row is (softmax over many classes here).
#[test]
fn interrupt_check_stops_a_buffer_early() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let kind = ModelKind::Softmax;
    let mut arena = TupleArena::new(50, 0);
    for i in 0..2000 {
        arena.push((i % 500) as f64, &[0.5; 50]);
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let mut t = Trainer::new(TrainConfig::new(kind), 50);
    t.set_interrupt(Some(Box::new(move || {
        seen.fetch_add(1, Ordering::Relaxed) >= 2
    })));
    assert_eq!(t.train_buffer(&arena, None), Err(TrainError::Interrupted));
    // Up to 500 classes x 51 = 25,500 multiply-adds a row: a check every ~10 rows or more
    // often, so the third check comes long before the end of the buffer.
    assert_eq!(calls.load(Ordering::Relaxed), 3);
    assert!(t.finish_epoch().unwrap().tuples < 1000);
    // Without a check (or one that says go on) the whole buffer trains.
    let mut t = Trainer::new(TrainConfig::new(kind), 50);
    t.set_interrupt(Some(Box::new(|| false)));
    t.train_buffer(&arena, None).unwrap();
    assert_eq!(t.finish_epoch().unwrap().tuples, 2000);
}

/// A model too large for the process is an error, not an abort of the server process.
#[test]
fn a_model_that_cannot_be_allocated_is_an_error() {
    let kind = ModelKind::Svm;
    match Trainer::try_new(TrainConfig::new(kind), usize::MAX / 16) {
        Err(TrainError::OutOfMemory { .. }) => {}
        other => panic!("expected OutOfMemory, got {:?}", other.map(|_| ())),
    }
}
