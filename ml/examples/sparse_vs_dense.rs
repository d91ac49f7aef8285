//! Per-tuple cost of SGD on the same values three ways: dense 40 features, sparse over
//! 1,000,000 dimensions and sparse over 40 dimensions (~40 non-zeros per row; logistic,
//! l2 = 1e-4, l1 = 0, batch_size 1). The pure-Rust half of bench/sparse_vs_dense.py: rows are
//! read in order from flat in-memory tables (as a scan reads pages, without PostgreSQL's tuple
//! decoding) and go through the arena pushes and `Trainer::train_buffer` the way the extension
//! uses them (buffers of 10% of the rows, each trained in a shuffled order).
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

/// One of the three tables, stored column by column and row after row, so reading it is a
/// sequential scan as in the database: row i is `offsets[i]..offsets[i + 1]` of `indices`
/// (int4, 1-based; empty for dense) and `values` (float8).
#[derive(Default)]
struct Table {
    labels: Vec<f64>,
    offsets: Vec<usize>,
    indices: Vec<i32>,
    values: Vec<f64>,
}

impl Table {
    fn push(&mut self, label: f64, indices: &[i32], values: &[f64]) {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        self.labels.push(label);
        self.indices.extend_from_slice(indices);
        self.values.extend_from_slice(values);
        self.offsets.push(self.values.len());
    }

    fn len(&self) -> usize {
        self.labels.len()
    }

    fn values(&self, i: usize) -> &[f64] {
        &self.values[self.offsets[i]..self.offsets[i + 1]]
    }

    fn indices(&self, i: usize) -> &[i32] {
        &self.indices[self.offsets[i]..self.offsets[i + 1]]
    }
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
/// values ±0.2 by label plus uniform noise. The tables in `Variant` order.
fn make_tables(n: usize) -> [Table; 3] {
    let mut s = 0x5EED;
    let mut t: [Table; 3] = Default::default();
    let seq: Vec<i32> = (1..=NNZ as i32).collect();
    for i in 0..n {
        let label = (i % 2) as f64;
        let mut indices: Vec<i32> = (0..NNZ).map(|_| (1 + next(&mut s) % DIMS) as i32).collect();
        indices.sort_unstable();
        indices.dedup();
        let shift = if label == 1.0 { 0.2 } else { -0.2 };
        let mut values: Vec<f64> = indices
            .iter()
            .map(|_| shift + uniform(&mut s) - 0.5)
            .collect();
        t[1].push(label, &seq[..values.len()], &values);
        t[2].push(label, &indices, &values);
        values.resize(NNZ, 0.0);
        t[0].push(label, &[], &values);
    }
    t
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
fn push(v: Variant, arena: &mut TupleArena, table: &Table, i: usize) {
    let (label, values) = (table.labels[i], table.values(i));
    match v {
        Variant::Dense => {
            assert!(values.iter().all(|x| x.is_finite()));
            arena.push(label, values);
        }
        Variant::Sparse40 => arena
            .try_push_sparse(label, table.indices(i), 1, Some(NNZ), values)
            .unwrap(),
        Variant::Sparse1M => arena
            .try_push_sparse(label, table.indices(i), 1, Some(DIMS as usize), values)
            .unwrap(),
    }
}

/// Per-tuple ns of each epoch: (push, train).
fn run(v: Variant, table: &Table) -> Vec<(f64, f64)> {
    let n = table.len();
    let buffer = (n / 10).max(1);
    let mut config = TrainConfig::new(ModelKind::Logistic);
    config.l2 = 1e-4;
    let mut trainer = Trainer::new(config, if v == Variant::Dense { NNZ } else { 0 });
    let mut arena = if v == Variant::Dense {
        TupleArena::new(NNZ, buffer)
    } else {
        TupleArena::new_sparse(buffer, buffer * NNZ)
    };
    let mut order = Vec::new();
    let mut out = Vec::new();
    for epoch in 1..=EPOCHS {
        trainer.start_epoch(epoch);
        let mut shuffler = TupleShuffler::new(1, epoch);
        let (mut push_ns, mut train_ns) = (0.0, 0.0);
        for start in (0..n).step_by(buffer) {
            arena.clear();
            let t = Instant::now();
            for i in start..n.min(start + buffer) {
                push(v, &mut arena, table, i);
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
        out.push((push_ns / n as f64, train_ns / n as f64));
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
    let tables = make_tables(n_rows);
    let all = [Variant::Dense, Variant::Sparse40, Variant::Sparse1M];
    let variants: Vec<usize> = match args.next() {
        Some(k) => vec![k],
        None => (0..all.len()).collect(),
    };
    // Interleaved rounds, so drift of the shared machine hits every variant alike.
    let mut samples: Vec<Vec<(f64, f64)>> = vec![Vec::new(); all.len()];
    for _ in 0..rounds {
        for &k in &variants {
            samples[k].extend(run(all[k], &tables[k]));
        }
    }
    println!(
        "{n_rows} rows, ~{NNZ} non-zeros per row, logistic, l2 = 1e-4, batch 1; {rounds} rounds x {EPOCHS} epochs; ns per tuple, median [min-max]"
    );
    let mut totals = Vec::new();
    for &k in &variants {
        let s = &samples[k];
        let mut p: Vec<f64> = s.iter().map(|x| x.0).collect();
        let mut t: Vec<f64> = s.iter().map(|x| x.1).collect();
        let mut a: Vec<f64> = s.iter().map(|x| x.0 + x.1).collect();
        let range = |v: &[f64]| format!("[{:.0}-{:.0}]", v[0], v[v.len() - 1]);
        let (mp, mt, ma) = (median(&mut p), median(&mut t), median(&mut a));
        println!(
            "{:<30} push {mp:6.1} {:<12} train {mt:6.1} {:<12} total {ma:6.1} {}",
            all[k].name(),
            range(&p),
            range(&t),
            range(&a)
        );
        totals.push((mp, mt, ma));
    }
    if totals.len() < all.len() {
        return;
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
