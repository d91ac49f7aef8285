//! Per-tuple cost of SGD on the same values three ways: dense 40 features, sparse over
//! 1,000,000 dimensions and sparse over 40 dimensions (~40 non-zeros per row; logistic,
//! l2 = 1e-4, l1 = 0, batch_size 1). The pure-Rust half of bench/sparse_vs_dense.py: rows
//! go through the arena pushes and `Trainer::train_buffer` the way the extension uses them
//! (buffers of 10% of the rows, each trained in a shuffled order), without the table scan.
//!
//! `cargo run --release -p corgipile-ml --example sparse_vs_dense [rows] [rounds] [variant]`
//! (variant 0, 1 or 2: only that one, e.g. under perf)

use corgipile_ml::arena::TupleArena;
use corgipile_ml::model::ModelKind;
use corgipile_ml::shuffle::TupleShuffler;
use corgipile_ml::trainer::{TrainConfig, Trainer};
use std::time::Instant;

const DIMS: u64 = 1_000_000;
const NNZ: usize = 40;
const EPOCHS: u32 = 3;

/// A row as decoded from the table: int4 indices (1-based), float8 values.
struct RawRow {
    label: f64,
    indices: Vec<i32>,
    values: Vec<f64>,
}

/// splitmix64: a fixed, dependency-free data stream.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn uniform(state: &mut u64) -> f64 {
    (next(state) >> 11) as f64 / (1u64 << 53) as f64
}

/// Like the SQL of bench/sparse_vs_dense.py: NNZ draws over 1..=DIMS, deduplicated and sorted;
/// values ±0.2 by label plus uniform noise.
fn make_rows(n: usize) -> Vec<RawRow> {
    let mut s = 0x5EED;
    (0..n)
        .map(|i| {
            let label = (i % 2) as f64;
            let mut indices: Vec<i32> =
                (0..NNZ).map(|_| (1 + next(&mut s) % DIMS) as i32).collect();
            indices.sort_unstable();
            indices.dedup();
            let shift = if label == 1.0 { 0.2 } else { -0.2 };
            let values = indices
                .iter()
                .map(|_| shift + uniform(&mut s) - 0.5)
                .collect();
            RawRow {
                label,
                indices,
                values,
            }
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Dense,
    Sparse40,
    Sparse1M,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Dense => "dense, 40 features",
            Variant::Sparse40 => "sparse, 40 dimensions",
            Variant::Sparse1M => "sparse, 1,000,000 dimensions",
        }
    }
}

/// What the extension does per row (src/exec/tuple_shuffle.rs, decode_features).
#[inline(never)]
fn push(v: Variant, arena: &mut TupleArena, row: &RawRow, dense: &mut [f64], seq: &[i32]) {
    match v {
        Variant::Dense => {
            // bench_dense: the values padded with zeros to 40.
            dense.fill(0.0);
            dense[..row.values.len()].copy_from_slice(&row.values);
            assert!(dense.iter().all(|x| x.is_finite()));
            arena.push(row.label, dense);
        }
        Variant::Sparse40 => arena
            .try_push_sparse(
                row.label,
                &seq[..row.values.len()],
                1,
                Some(NNZ),
                &row.values,
            )
            .unwrap(),
        Variant::Sparse1M => arena
            .try_push_sparse(row.label, &row.indices, 1, Some(DIMS as usize), &row.values)
            .unwrap(),
    }
}

/// Per-tuple ns of each epoch: (push, train).
fn run(v: Variant, rows: &[RawRow]) -> Vec<(f64, f64)> {
    let buffer = (rows.len() / 10).max(1);
    let mut config = TrainConfig::new(ModelKind::Logistic);
    config.l2 = 1e-4;
    let mut trainer = Trainer::new(config, if v == Variant::Dense { NNZ } else { 0 });
    let mut arena = if v == Variant::Dense {
        TupleArena::new(NNZ, buffer)
    } else {
        TupleArena::new_sparse(buffer, buffer * NNZ)
    };
    let mut dense = vec![0.0; NNZ];
    let seq: Vec<i32> = (1..=NNZ as i32).collect();
    let mut order = Vec::new();
    let mut out = Vec::new();
    for epoch in 1..=EPOCHS {
        trainer.start_epoch(epoch);
        let mut shuffler = TupleShuffler::new(1, epoch);
        let (mut push_ns, mut train_ns) = (0.0, 0.0);
        for chunk in rows.chunks(buffer) {
            arena.clear();
            let t = Instant::now();
            for row in chunk {
                push(v, &mut arena, row, &mut dense, &seq);
            }
            push_ns += t.elapsed().as_nanos() as f64;
            shuffler.permutation(arena.len(), &mut order);
            let t = Instant::now();
            trainer.train_buffer(&arena, Some(&order)).unwrap();
            train_ns += t.elapsed().as_nanos() as f64;
        }
        let t = Instant::now();
        let stats = trainer.finish_epoch().unwrap();
        train_ns += t.elapsed().as_nanos() as f64;
        assert!(stats.accuracy.unwrap() > 0.5, "{}: {stats:?}", v.name());
        let n = rows.len() as f64;
        out.push((push_ns / n, train_ns / n));
    }
    out
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    }
}

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().expect("a number"));
    let n_rows = args.next().unwrap_or(300_000);
    let rounds = args.next().unwrap_or(5);
    let rows = make_rows(n_rows);
    let all = [Variant::Dense, Variant::Sparse40, Variant::Sparse1M];
    if let Some(k) = args.next() {
        let mut s: Vec<f64> = (0..rounds)
            .flat_map(|_| run(all[k], &rows))
            .map(|(p, t)| p + t)
            .collect();
        println!(
            "{}: total {:.1} ns per tuple (median)",
            all[k].name(),
            median(&mut s)
        );
        return;
    }
    let variants = all;
    // Interleaved rounds, so drift of the shared machine hits every variant alike.
    let mut samples: Vec<Vec<(f64, f64)>> = vec![Vec::new(); variants.len()];
    for _ in 0..rounds {
        for (k, &v) in variants.iter().enumerate() {
            samples[k].extend(run(v, &rows));
        }
    }
    println!(
        "{n_rows} rows, ~{NNZ} non-zeros per row, logistic, l2 = 1e-4, batch 1; {rounds} rounds x {EPOCHS} epochs; ns per tuple, median [min-max]"
    );
    let mut totals = Vec::new();
    for (k, &v) in variants.iter().enumerate() {
        let s = &samples[k];
        let mut p: Vec<f64> = s.iter().map(|x| x.0).collect();
        let mut t: Vec<f64> = s.iter().map(|x| x.1).collect();
        let mut a: Vec<f64> = s.iter().map(|x| x.0 + x.1).collect();
        let range = |v: &[f64]| format!("[{:.0}-{:.0}]", v[0], v[v.len() - 1]);
        let (mp, mt, ma) = (median(&mut p), median(&mut t), median(&mut a));
        println!(
            "{:<30} push {mp:6.1} {:<12} train {mt:6.1} {:<12} total {ma:6.1} {}",
            v.name(),
            range(&p),
            range(&t),
            range(&a)
        );
        totals.push((mp, mt, ma));
    }
    let r = |i: usize, j: usize, f: fn(&(f64, f64, f64)) -> f64| f(&totals[i]) / f(&totals[j]);
    println!(
        "sparse 1M / dense: train {:.2}, total {:.2}; sparse 1M / sparse 40: train {:.2}, total {:.2}",
        r(2, 0, |x| x.1),
        r(2, 0, |x| x.2),
        r(2, 1, |x| x.1),
        r(2, 1, |x| x.2)
    );
}
