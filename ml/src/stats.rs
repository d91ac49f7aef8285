//! One streaming pass over the training data: per-feature mean/variance (for
//! standardization), label mean/variance and class counts (for balanced class
//! weights).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::arena::TupleArena;
use crate::moments::Welford;
use crate::row::Row;
pub use crate::standardize::Standardizer;

/// Streaming per-feature statistics. Sparse rows only visit their non-zeros;
/// the implicit zeros are added at the end (Chan's merge of a group of
/// non-zeros with a group of zeros), so a pass costs O(nnz), not O(d).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(into = "StatsWire", try_from = "StatsWire")]
pub struct FeatureStats {
    rows: u64,
    /// Per feature (index = feature).
    features: Vec<Moments>,
    /// Count, mean and M2 of the labels.
    label: Welford,
    /// Label value (as bits, -0.0 folded into 0.0) → count; None when not tracked.
    classes: Option<HashMap<u64, u64>>,
}

/// One feature's running statistics, kept together: a sparse row's update touches one cache
/// line per non-zero instead of four (on a million features the four arrays were 32 MB of
/// cache misses). 32 bytes, aligned to 32, so never across two lines.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C, align(32))]
struct Moments {
    /// Values visited, their Welford mean and sum of squared deviations.
    welford: Welford,
    /// The largest |value| (for scaling sparse data).
    max_abs: f64,
}

// Still one 32-byte cache-line-aligned slot with the count, mean and M2 in a Welford.
const _: () =
    assert!(std::mem::size_of::<Moments>() == 32 && std::mem::align_of::<Moments>() == 32);

/// How FeatureStats travels between servers (a shard's statistics, as JSON): one array per
/// statistic, as before the per-feature layout.
#[derive(Serialize, Deserialize)]
struct StatsWire {
    rows: u64,
    seen: Vec<u64>,
    mean: Vec<f64>,
    m2: Vec<f64>,
    max_abs: Vec<f64>,
    label_n: u64,
    label_mean: f64,
    label_m2: f64,
    classes: Option<HashMap<u64, u64>>,
}

impl From<FeatureStats> for StatsWire {
    fn from(s: FeatureStats) -> StatsWire {
        StatsWire {
            rows: s.rows,
            seen: s.features.iter().map(|f| f.welford.n()).collect(),
            mean: s.features.iter().map(|f| f.welford.mean()).collect(),
            m2: s.features.iter().map(|f| f.welford.m2()).collect(),
            max_abs: s.features.iter().map(|f| f.max_abs).collect(),
            label_n: s.label.n(),
            label_mean: s.label.mean(),
            label_m2: s.label.m2(),
            classes: s.classes,
        }
    }
}

impl TryFrom<StatsWire> for FeatureStats {
    type Error = String;

    fn try_from(w: StatsWire) -> Result<FeatureStats, String> {
        let d = w.seen.len();
        if w.mean.len() != d || w.m2.len() != d || w.max_abs.len() != d {
            return Err(format!(
                "feature statistics of different lengths: {d} counts, {} means, {} squared deviations, {} maxima",
                w.mean.len(),
                w.m2.len(),
                w.max_abs.len()
            ));
        }
        let features = (0..d)
            .map(|j| Moments {
                welford: Welford::from_parts(w.seen[j], w.mean[j], w.m2[j]),
                max_abs: w.max_abs[j],
            })
            .collect();
        Ok(FeatureStats {
            rows: w.rows,
            features,
            label: Welford::from_parts(w.label_n, w.label_mean, w.label_m2),
            classes: w.classes,
        })
    }
}

/// How many rows ahead `push_arena` prefetches a sparse row's statistics.
const STATS_AHEAD: usize = 4;

/// Sparse statistics of at least this many features (1 MiB) get prefetched; smaller ones stay
/// in cache.
const PREFETCH_STATS_MIN: usize = 1 << 15;

impl Moments {
    #[inline]
    fn push(&mut self, v: f64) {
        self.max_abs = self.max_abs.max(v.abs());
        self.welford.push(v);
    }
}

impl FeatureStats {
    /// `n_features` may be 0 for sparse data (grows with the indices seen).
    /// `track_classes`: count distinct label values (classifiers only: a
    /// regression label would make the map as large as the table).
    pub fn new(n_features: usize, track_classes: bool) -> Self {
        FeatureStats {
            features: vec![Moments::default(); n_features],
            classes: track_classes.then(HashMap::new),
            ..Default::default()
        }
    }

    pub fn push(&mut self, row: Row, label: f64) {
        self.rows += 1;
        if row.dim() > self.features.len() {
            self.features.resize(row.dim(), Moments::default());
        }
        match row {
            Row::Dense(x) => {
                for (f, &v) in self.features.iter_mut().zip(x) {
                    f.push(v);
                }
            }
            Row::Sparse { indices, values } => {
                for (&j, &v) in indices.iter().zip(values) {
                    self.features[j as usize].push(v);
                }
            }
        }
        self.label.push(label);
        if let Some(c) = &mut self.classes {
            let key = if label == 0.0 { 0.0f64 } else { label };
            *c.entry(key.to_bits()).or_insert(0) += 1;
        }
    }

    /// Pushes every row of `arena`, in storage order, as long as `keep_going` (called before
    /// each row: an interrupt check) says so; returns false if it stopped early. A sparse row's
    /// statistics are prefetched a few rows ahead: with millions of features each non-zero is
    /// a cache miss otherwise.
    pub fn push_arena(&mut self, arena: &TupleArena, mut keep_going: impl FnMut() -> bool) -> bool {
        let prefetch = arena.is_sparse() && self.features.len() >= PREFETCH_STATS_MIN;
        for i in 0..arena.len() {
            if !keep_going() {
                return false;
            }
            if prefetch && i + STATS_AHEAD < arena.len() {
                if let Row::Sparse { indices, .. } = arena.row(i + STATS_AHEAD) {
                    for &j in indices {
                        if let Some(f) = self.features.get(j as usize) {
                            crate::prefetch::prefetch_l2(f);
                        }
                    }
                }
            }
            self.push(arena.row(i), arena.label(i));
        }
        true
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Adds `other`'s rows (statistics of another part of the table; Chan's pairwise merge of
    /// means and squared deviations), as if they had been pushed here.
    pub fn merge(&mut self, other: &FeatureStats) {
        if other.features.len() > self.features.len() {
            self.features
                .resize(other.features.len(), Moments::default());
        }
        for (a, b) in self.features.iter_mut().zip(&other.features) {
            a.welford.merge(&b.welford);
            a.max_abs = a.max_abs.max(b.max_abs);
        }
        self.rows = self.rows.saturating_add(other.rows);
        self.label.merge(&other.label);
        if let (Some(mine), Some(theirs)) = (&mut self.classes, &other.classes) {
            for (k, c) in theirs {
                let count = mine.entry(*k).or_insert(0);
                *count = count.saturating_add(*c);
            }
        }
    }

    /// Why these statistics (from another server) cannot be merged: a value that is not
    /// finite, a negative squared deviation, more values of a feature or classes than rows.
    pub fn check(&self) -> Result<(), String> {
        for (j, m) in self.features.iter().enumerate() {
            let w = &m.welford;
            if !(w.mean().is_finite() && w.m2().is_finite() && m.max_abs.is_finite())
                || w.m2() < 0.0
                || m.max_abs < 0.0
                || w.n() > self.rows
            {
                return Err(format!("impossible statistics of feature {j}"));
            }
        }
        let label = &self.label;
        if !(label.mean().is_finite() && label.m2().is_finite() && label.m2() >= 0.0)
            || label.n() > self.rows
        {
            return Err("impossible label statistics".into());
        }
        if let Some(classes) = &self.classes {
            let total = classes
                .values()
                .try_fold(0u64, |a, &c| a.checked_add(c))
                .ok_or("class counts beyond 2^64")?;
            if total > self.rows || classes.keys().any(|&k| !f64::from_bits(k).is_finite()) {
                return Err("impossible class counts".into());
            }
        }
        Ok(())
    }

    /// Largest dimension seen (or given to `new`).
    pub fn n_features(&self) -> usize {
        self.features.len()
    }

    /// Feature j's (mean, population variance) over all rows, implicit zeros included.
    pub fn feature(&self, j: usize) -> (f64, f64) {
        let n = self.rows;
        let Some(Moments { welford, .. }) = self.features.get(j) else {
            return (0.0, 0.0);
        };
        let (a, mean_a, m2_a) = (welford.n(), welford.mean(), welford.m2());
        if n == 0 || a == 0 {
            return (0.0, 0.0);
        }
        let zeros = n - a;
        let (nf, af, zf) = (n as f64, a as f64, zeros as f64);
        let mean = mean_a * (af / nf);
        let m2 = m2_a + mean_a * mean_a * af * zf / nf;
        (mean, (m2 / nf).max(0.0))
    }

    pub fn means(&self) -> Vec<f64> {
        (0..self.n_features()).map(|j| self.feature(j).0).collect()
    }

    /// Population variances (divided by n, like scikit-learn's StandardScaler).
    pub fn variances(&self) -> Vec<f64> {
        (0..self.n_features()).map(|j| self.feature(j).1).collect()
    }

    /// Label (mean, population variance); (0, 0) if no rows.
    pub fn label_mean_variance(&self) -> (f64, f64) {
        if self.label.n() == 0 {
            return (0.0, 0.0);
        }
        (self.label.mean(), self.label.m2() / self.label.n() as f64)
    }

    /// Distinct label values and their counts, ascending by value; empty
    /// unless created with `track_classes`.
    pub fn class_counts(&self) -> Vec<(f64, u64)> {
        let mut v: Vec<(f64, u64)> = self
            .classes
            .iter()
            .flatten()
            .map(|(&b, &c)| (f64::from_bits(b), c))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    }

    /// Rows counted by class index (a class-output kind's labels) counted by the label values
    /// `values[index]` instead, so that another server's counts of the same values merge
    /// with these. A class index without a value is dropped (it cannot occur: `values` is the
    /// dictionary that numbered them).
    pub fn relabel_classes(&mut self, values: &[f64]) {
        if let Some(classes) = &mut self.classes {
            *classes = classes
                .drain()
                .filter_map(|(index, count)| {
                    let v = values.get(f64::from_bits(index) as usize)?;
                    // -0.0 and 0.0 are one class (as ClassDictionary has them).
                    let v = if *v == 0.0 { 0.0f64 } else { *v };
                    Some((v.to_bits(), count))
                })
                .collect();
        }
    }

    /// Scaling of sparse data: each feature divided by its largest |value| (scikit-learn's
    /// MaxAbsScaler), so zeros stay zeros and rare features are not inflated (dividing a
    /// feature present in 0.1% of the rows by its standard deviation multiplies it by ~30,
    /// and its SGD steps by ~1000).
    pub fn max_abs_scaler(&self) -> Standardizer {
        let d = self.n_features();
        Standardizer {
            mean: vec![0.0; d],
            scale: self
                .features
                .iter()
                .map(|&Moments { max_abs: m, .. }| {
                    if m > 0.0 && m.is_finite() {
                        1.0 / m
                    } else {
                        1.0
                    }
                })
                .collect(),
            center: false,
        }
    }

    /// Standardizer for these statistics; `center` = subtract the mean
    /// (use false for sparse data, so zeros stay zeros).
    pub fn standardizer(&self, center: bool) -> Standardizer {
        let d = self.n_features();
        let mut mean = Vec::with_capacity(d);
        let mut scale = Vec::with_capacity(d);
        for j in 0..d {
            let (m, var) = self.feature(j);
            let sd = var.sqrt();
            mean.push(if center { m } else { 0.0 });
            scale.push(if sd > 0.0 && sd.is_finite() {
                1.0 / sd
            } else {
                1.0
            });
        }
        Standardizer {
            mean,
            scale,
            center,
        }
    }
}

/// scikit-learn's "balanced" class weights: `n / (K · n_c)` for K classes and
/// n rows; a class with no rows gets weight 1.
pub fn balanced_class_weights(counts: &[u64]) -> Vec<f64> {
    let n: u64 = counts.iter().sum();
    let k = counts.len() as f64;
    counts
        .iter()
        .map(|&c| {
            if c == 0 {
                1.0
            } else {
                n as f64 / (k * c as f64)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_max_abs_scaler_of_binary_features_is_the_identity() {
        let mut stats = FeatureStats::new(0, true);
        for (idx, val) in [
            (vec![0u32, 2], vec![1.0, -1.0]),
            (vec![1, 2], vec![1.0, 1.0]),
        ] {
            let row = Row::Sparse {
                indices: &idx,
                values: &val,
            };
            stats.push(row, 1.0);
        }
        // Features 0..3 are ±1 (feature 3 never seen: scale 1 too).
        let mut s = stats.max_abs_scaler();
        s.scale.push(1.0);
        assert!(s.is_identity());
        // One value of 2 is enough to need the scaling.
        let row = Row::Sparse {
            indices: &[1],
            values: &[2.0],
        };
        stats.push(row, 0.0);
        assert!(!stats.max_abs_scaler().is_identity());
        // Centering: only with every mean 0.
        let centered = |mean: f64| Standardizer {
            mean: vec![0.0, mean],
            scale: vec![1.0, 1.0],
            center: true,
        };
        assert!(centered(0.0).is_identity());
        assert!(!centered(0.5).is_identity());
    }

    #[test]
    fn merged_parts_equal_one_pass() {
        let rows: Vec<(Vec<u32>, Vec<f64>, f64)> = (0..50)
            .map(|i| {
                let idx: Vec<u32> = (0..4).filter(|j| (i + j) % 3 != 0).collect();
                let val = idx
                    .iter()
                    .map(|&j| (i as f64 * 0.37 + j as f64).sin() * 4.0)
                    .collect();
                (idx, val, (i % 2) as f64)
            })
            .collect();
        let mut whole = FeatureStats::new(0, true);
        let (mut a, mut b) = (FeatureStats::new(0, true), FeatureStats::new(0, true));
        for (i, (idx, val, y)) in rows.iter().enumerate() {
            let row = Row::Sparse {
                indices: idx,
                values: val,
            };
            whole.push(row, *y);
            if i < 17 {
                a.push(row, *y)
            } else {
                b.push(row, *y)
            }
        }
        let json = serde_json::to_string(&b).unwrap();
        a.merge(&serde_json::from_str(&json).unwrap());
        assert_eq!(a.rows(), whole.rows());
        assert_eq!(a.class_counts(), whole.class_counts());
        for j in 0..4 {
            let (m1, v1) = a.feature(j);
            let (m2, v2) = whole.feature(j);
            assert!(
                (m1 - m2).abs() < 1e-12 && (v1 - v2).abs() < 1e-9,
                "{j}: {m1} {v1} vs {m2} {v2}"
            );
        }
        assert_eq!(a.max_abs_scaler(), whole.max_abs_scaler());
        let (lm, lv) = a.label_mean_variance();
        let (wm, wv) = whole.label_mean_variance();
        assert!((lm - wm).abs() < 1e-12 && (lv - wv).abs() < 1e-12);
    }

    #[test]
    fn dense_and_sparse_give_the_same_statistics() {
        let rows: Vec<Vec<f64>> = vec![
            vec![1.0, 0.0, 5.0, 0.0],
            vec![0.0, 0.0, 7.0, 0.0],
            vec![3.0, 2.0, 0.0, 0.0],
            vec![-2.0, 0.0, 6.0, 0.0],
            vec![0.0, 0.0, 0.0, 0.0],
        ];
        let mut dense = FeatureStats::new(4, true);
        let mut sparse = FeatureStats::new(0, true);
        for (i, r) in rows.iter().enumerate() {
            let label = (i % 2) as f64;
            dense.push(Row::Dense(r), label);
            let (idx, val): (Vec<u32>, Vec<f64>) = r
                .iter()
                .enumerate()
                .filter(|(_, v)| **v != 0.0)
                .map(|(j, &v)| (j as u32, v))
                .unzip();
            sparse.push(
                Row::Sparse {
                    indices: &idx,
                    values: &val,
                },
                label,
            );
        }
        assert_eq!(sparse.n_features(), 3); // feature 3 never non-zero
        for j in 0..4 {
            let col: Vec<f64> = rows.iter().map(|r| r[j]).collect();
            let m = col.iter().sum::<f64>() / 5.0;
            let var = col.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / 5.0;
            let (dm, dv) = dense.feature(j);
            let (sm, sv) = sparse.feature(j);
            assert!(
                (dm - m).abs() < 1e-14 && (dv - var).abs() < 1e-13,
                "dense {j}"
            );
            assert!(
                (sm - m).abs() < 1e-14 && (sv - var).abs() < 1e-13,
                "sparse {j}"
            );
        }
        assert_eq!(dense.class_counts(), vec![(0.0, 3), (1.0, 2)]);
        assert_eq!(dense.rows(), 5);
        // Class indices 0 and 1 of a dictionary that met 7 then -2: counted by value.
        let mut relabeled = dense.clone();
        relabeled.relabel_classes(&[7.0, -2.0]);
        assert_eq!(relabeled.class_counts(), vec![(-2.0, 2), (7.0, 3)]);
        let (lm, lv) = dense.label_mean_variance();
        assert!((lm - 0.4).abs() < 1e-15 && (lv - 0.24).abs() < 1e-15);

        let s = dense.standardizer(true);
        assert_eq!(s.scale[3], 1.0); // constant feature
        let mut out = Vec::new();
        s.apply_dense(&rows[0], &mut out);
        let (m0, v0) = dense.feature(0);
        assert!((out[0] - (1.0 - m0) / v0.sqrt()).abs() < 1e-15);
        let ss = sparse.standardizer(false);
        assert!(ss.mean.iter().all(|&m| m == 0.0));
        ss.apply_sparse(&[0, 2, 9], &[1.0, 5.0, 4.0], &mut out);
        assert_eq!(out[2], 4.0); // beyond the statistics: unchanged
        assert!((out[1] - 5.0 / sparse.feature(2).1.sqrt()).abs() < 1e-15);
    }

    #[test]
    fn json_has_one_array_per_statistic_and_rejects_unequal_ones() {
        let mut s = FeatureStats::new(2, true);
        s.push(Row::Dense(&[1.0, -4.0]), 1.0);
        s.push(Row::Dense(&[3.0, 2.0]), 0.0);
        let json: serde_json::Value = serde_json::to_value(&s).unwrap();
        // The shape shards send (and 0.4.0 development builds sent): arrays, not objects.
        assert_eq!(json["rows"], 2);
        assert_eq!(json["seen"], serde_json::json!([2, 2]));
        assert_eq!(json["mean"], serde_json::json!([2.0, -1.0]));
        assert_eq!(json["m2"], serde_json::json!([2.0, 18.0]));
        assert_eq!(json["max_abs"], serde_json::json!([3.0, 4.0]));
        let back: FeatureStats = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back.features, s.features);
        assert_eq!(back.class_counts(), s.class_counts());
        let mut hostile = json;
        hostile["m2"] = serde_json::json!([2.0]);
        let err = serde_json::from_value::<FeatureStats>(hostile).unwrap_err();
        assert!(err.to_string().contains("different lengths"), "{err}");
    }

    #[test]
    fn push_arena_equals_pushing_row_by_row() {
        // Enough features that push_arena prefetches (PREFETCH_STATS_MIN), and dense rows.
        let d = PREFETCH_STATS_MIN as u32 * 2;
        let mut sparse = TupleArena::new_sparse(0, 0);
        let mut dense = TupleArena::new(3, 0);
        for i in 0..200u32 {
            let idx: Vec<u32> = (0..7)
                .map(|k| (i * 7919 + k * 104_729) % d)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let val: Vec<f64> = idx
                .iter()
                .map(|&j| (j as f64 * 0.01 + i as f64).sin())
                .collect();
            sparse.push_sparse((i % 2) as f64, &idx, &val);
            dense.push((i % 3) as f64, &[i as f64, (i as f64).cos(), -1.5]);
        }
        for arena in [&sparse, &dense] {
            let mut one_by_one = FeatureStats::new(arena.n_features(), true);
            for i in 0..arena.len() {
                one_by_one.push(arena.row(i), arena.label(i));
            }
            let mut calls = 0;
            let mut at_once = FeatureStats::new(arena.n_features(), true);
            assert!(at_once.push_arena(arena, || {
                calls += 1;
                true
            }));
            assert_eq!(calls, arena.len());
            let mut stopped = FeatureStats::new(arena.n_features(), true);
            let mut budget = 50;
            assert!(!stopped.push_arena(arena, || {
                budget -= 1;
                budget >= 0
            }));
            assert_eq!(stopped.rows(), 50, "stops before the row it was refused");
            assert_eq!(at_once.features, one_by_one.features, "bit for bit");
            assert_eq!(at_once.rows(), one_by_one.rows());
            assert_eq!(at_once.class_counts(), one_by_one.class_counts());
            assert_eq!(
                at_once.label_mean_variance(),
                one_by_one.label_mean_variance()
            );
        }
    }

    #[test]
    fn balanced_weights_match_sklearn() {
        // sklearn: compute_class_weight("balanced", classes=[0,1], y=[0,0,0,1]) = [0.667, 2.0]
        let w = balanced_class_weights(&[3, 1]);
        assert!((w[0] - 4.0 / 6.0).abs() < 1e-15 && w[1] == 2.0);
        assert_eq!(balanced_class_weights(&[5, 5, 5]), vec![1.0, 1.0, 1.0]);
        assert_eq!(balanced_class_weights(&[4, 0]), vec![0.5, 1.0]);
    }
}
