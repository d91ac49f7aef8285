//! The bin edges of a piecewise-linear encoded column (`"encode": "ple"`): the statistics pass
//! feeds every value to a [`QuantileSketch`] (a t-digest, bounded memory whatever the rows), whose
//! quantiles give the edges; [`encode`] and [`decode`] are the encoding (Gorishniy et al., "On
//! Embeddings for Numerical Features in Tabular Deep Learning", NeurIPS 2022) and its inverse.

use serde::{Deserialize, Serialize};
use tdigest::{Centroid, TDigest};

/// Centroids a sketch keeps. The edges' rank error, measured on skewed, uniform and normal
/// columns of 2k to 1M values, is below 0.005 (worst 0.0047; tests:
/// `sketch_edges_match_exact_quantiles*`): under a tenth of a bin's share of the rows at 16 bins.
const CENTROIDS: usize = 200;

/// Distinct values a sketch also keeps exactly while a column has few: a column of at most
/// `bins + 1` distinct values (a flag, a count, a rating) gets them as its edges, so no bin falls
/// between two values that occur (a bin no row fills is a constant feature).
const MAX_EXACT: usize = 1025;

/// Bytes one sketch holds at most: the t-digest's buffer (5 × its centroids, as values) and its
/// centroids (mean and weight), twice while it compresses, and the exact values. Counted
/// against `corgipile.max_buffer_memory` with the category dictionaries.
pub const SKETCH_BYTES: usize = 2 * (5 * CENTROIDS * 8 + CENTROIDS * 16) + MAX_EXACT * 8;

/// Most bins a column may have.
pub const MAX_BINS: u32 = 1024;
/// Bins of a column when `"bins"` is not given (16 was good on every table of #54's survey;
/// 8–64 moved results by at most 0.7 point).
pub const DEFAULT_BINS: u32 = 16;

/// Values the digest takes at each stride before the stride doubles: after the first 131,072
/// values it takes every second one, after 131,072 more every fourth, ... (a t-digest costs
/// about 20 ns a value; a pass over 4.5M rows then feeds it about 800,000 of each column's).
/// The statistics pass reads rows in random block order, so a stride over its stream is a
/// uniform sample; 131,072 values put the sample's own rank error near 0.0014 (one standard
/// deviation at the median).
const VALUES_PER_STRIDE: u64 = 1 << 17;

/// A column's values, summarized for its bin edges.
#[derive(Clone, Debug)]
pub struct QuantileSketch {
    digest: TDigest,
    /// The distinct values while there are at most `bins + 1` of them (sorted); None after.
    exact: Option<Vec<f64>>,
    bins: u32,
    /// Every value's extremes (the digest sees a sample): the outer edges.
    min: f64,
    max: f64,
    /// Values pushed (the digest holds a sample of them), or represented by merged parts.
    values: u64,
    /// The digest takes one value in `stride`; `skip` more are left before the next one,
    /// `taken` were taken at this stride.
    stride: u64,
    skip: u64,
    taken: u64,
}

/// A sketch as a shard sends it to the coordinator (see [`QuantileSketch::part`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SketchPart {
    /// Values the sketch summarizes.
    pub values: u64,
    /// The smallest and largest value (None without values).
    pub range: Option<[f64; 2]>,
    /// The digest's centroids, `[mean, weight]` by increasing mean; the weights add up to
    /// `values`.
    #[serde(deserialize_with = "centroid_list")]
    pub centroids: Vec<[f64; 2]>,
    /// The distinct values, ascending, while there are at most `bins + 1`.
    #[serde(deserialize_with = "exact_list")]
    pub exact: Option<Vec<f64>>,
}

fn centroid_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<[f64; 2]>, D::Error> {
    crate::wire::seq_at_most(d, CENTROIDS)
}

fn exact_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<f64>>, D::Error> {
    struct Exact(Vec<f64>);
    impl<'de> Deserialize<'de> for Exact {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            crate::wire::seq_at_most(d, MAX_EXACT).map(Exact)
        }
    }
    Ok(Option::<Exact>::deserialize(d)?.map(|e| e.0))
}

impl SketchPart {
    /// Why this part (from another server: nothing in it is trusted) cannot be merged into a
    /// sketch of `bins` bins: counts, extremes, centroids or exact values no sketch has.
    pub fn check(&self, bins: u32) -> Result<(), String> {
        let Some([lo, hi]) = self.range else {
            if self.values == 0 && self.centroids.is_empty() && self.exact.as_deref() == Some(&[]) {
                return Ok(());
            }
            return Err("a quantile sketch of values without their range".into());
        };
        if self.values == 0 || !(lo.is_finite() && hi.is_finite() && lo <= hi) {
            return Err("a quantile sketch with an impossible range".into());
        }
        if self.centroids.is_empty() || self.centroids.len() > CENTROIDS {
            return Err(format!(
                "a quantile sketch of {} centroids",
                self.centroids.len()
            ));
        }
        let within = |v: f64| v.is_finite() && lo <= v && v <= hi;
        if !self
            .centroids
            .iter()
            .all(|&[m, w]| within(m) && w.is_finite() && w > 0.0)
            || self.centroids.windows(2).any(|p| p[0][0] > p[1][0])
        {
            return Err("a quantile sketch with impossible centroids".into());
        }
        let weight: f64 = self.centroids.iter().map(|c| c[1]).sum();
        if !((weight / self.values as f64) - 1.0).abs().lt(&1e-9) {
            return Err("a quantile sketch whose centroids weigh other than its values".into());
        }
        if let Some(exact) = &self.exact {
            let ends = exact.first() == Some(&lo) && exact.last() == Some(&hi);
            if exact.len() > bins.clamp(1, MAX_BINS) as usize + 1
                || !ends
                || !exact.iter().all(|&v| within(v))
                || exact.windows(2).any(|p| p[0].total_cmp(&p[1]).is_ge())
            {
                return Err("a quantile sketch with impossible exact values".into());
            }
        }
        Ok(())
    }
}

impl QuantileSketch {
    pub fn new(bins: u32) -> QuantileSketch {
        QuantileSketch {
            digest: TDigest::new_with_size(CENTROIDS),
            exact: Some(Vec::new()),
            bins: bins.clamp(1, MAX_BINS),
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            values: 0,
            stride: 1,
            skip: 0,
            taken: 0,
        }
    }

    /// Adds a finite value.
    pub fn push(&mut self, v: f64) {
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.values += 1;
        if self.skip > 0 {
            self.skip -= 1;
        } else {
            self.digest.push(v);
            self.taken += 1;
            if self.taken == VALUES_PER_STRIDE {
                self.stride *= 2;
                self.taken = 0;
            }
            self.skip = self.stride - 1;
        }
        if let Some(exact) = &mut self.exact {
            if let Err(at) = exact.binary_search_by(|e| e.total_cmp(&v)) {
                if exact.len() > self.bins as usize {
                    self.exact = None;
                } else {
                    // Bounded by MAX_EXACT: counted in SKETCH_BYTES.
                    exact.insert(at, v);
                }
            }
        }
    }

    /// What another server needs to merge this sketch into its own ([`SketchPart`]): the
    /// digest's centroids, each weighing the values its sample stands for (the digest takes
    /// one value in a stride that grows with the values seen, so a sketch of many values is
    /// a sample; scaled, the weights add up to the values pushed, and a large shard's sample
    /// weighs as many rows as it has), the extremes and the exact distinct values if still
    /// kept.
    pub fn part(&self) -> SketchPart {
        let mut digest = self.digest.clone();
        digest.flush();
        let count = digest.count();
        let scale = if count > 0.0 {
            self.values as f64 / count
        } else {
            1.0
        };
        SketchPart {
            values: self.values,
            range: (self.values > 0).then_some([self.min, self.max]),
            centroids: digest
                .centroids()
                .iter()
                .map(|c| [c.mean(), c.weight() * scale])
                .collect(),
            exact: self.exact.clone(),
        }
    }

    /// Adds another sketch's values (a [`SketchPart`] that passed [`SketchPart::check`]): the
    /// extremes and the exact distinct values as one sketch of every value would have them
    /// (exactly), the digest as the t-digest merge of both (each weighted by its values, see
    /// [`QuantileSketch::part`]): its quantiles are estimates, as one sketch's are. A sketch
    /// that merged parts reads no more values (the coordinator's reads none: its shards do).
    pub fn merge(&mut self, part: &SketchPart) {
        let Some([lo, hi]) = part.range.filter(|_| part.values > 0) else {
            return;
        };
        let mine = self.part();
        let digest = |p: &SketchPart, lo: f64, hi: f64| {
            let centroids: Vec<Centroid> = p
                .centroids
                .iter()
                .map(|&[m, w]| Centroid::new(m, w))
                .collect();
            let count: f64 = p.centroids.iter().map(|c| c[1]).sum();
            let sum: f64 = p.centroids.iter().map(|c| c[0] * c[1]).sum();
            TDigest::new(centroids, sum, count, Some(hi), Some(lo), CENTROIDS)
        };
        let mut digests = Vec::with_capacity(2);
        if let Some([my_lo, my_hi]) = mine.range {
            digests.push(digest(&mine, my_lo, my_hi));
        }
        digests.push(digest(part, lo, hi));
        self.digest = TDigest::merge_digests(digests);
        self.values = self.values.saturating_add(part.values);
        self.min = self.min.min(lo);
        self.max = self.max.max(hi);
        self.exact = match (self.exact.take(), &part.exact) {
            (Some(mine), Some(theirs)) => {
                let mut union = Vec::with_capacity(mine.len() + theirs.len());
                let (mut i, mut j) = (0, 0);
                while i < mine.len() || j < theirs.len() {
                    let next = match (mine.get(i), theirs.get(j)) {
                        (Some(a), Some(b)) => match a.total_cmp(b) {
                            std::cmp::Ordering::Less => {
                                i += 1;
                                *a
                            }
                            std::cmp::Ordering::Greater => {
                                j += 1;
                                *b
                            }
                            std::cmp::Ordering::Equal => {
                                i += 1;
                                j += 1;
                                *a
                            }
                        },
                        (Some(a), None) => {
                            i += 1;
                            *a
                        }
                        (None, Some(b)) => {
                            j += 1;
                            *b
                        }
                        (None, None) => unreachable!("the loop stops first"),
                    };
                    union.push(next);
                }
                // One sketch drops its exact values at the (bins + 2)-th distinct one.
                (union.len() <= self.bins as usize + 1).then_some(union)
            }
            _ => None,
        };
    }

    /// The bin edges (as [`edges`](Self::edges)) and the digest's centroids (mean, weight),
    /// ascending: what a drift profile's bin shares are counted from.
    pub fn edges_and_centroids(mut self) -> (Vec<f64>, Vec<(f64, f64)>) {
        self.digest.flush();
        let centroids = self
            .digest
            .centroids()
            .iter()
            .map(|c| (c.mean(), c.weight()))
            .collect();
        (self.edges(), centroids)
    }

    /// The bin edges: `bins + 1` strictly increasing values from the smallest value seen to the
    /// largest, the inner ones its quantiles `t / bins` (equal quantiles merged: a column of
    /// few distinct values gets fewer bins), or its distinct values when there are at most
    /// `bins + 1`. At least two edges: a column of one value (or none) gets `[v, v + 1]`.
    pub fn edges(mut self) -> Vec<f64> {
        self.digest.flush();
        let mut edges = match self.exact {
            Some(exact) => exact,
            None => {
                let (lo, hi) = (self.min, self.max);
                let mut edges = vec![lo];
                for t in 1..self.bins {
                    let q = self
                        .digest
                        .estimate_quantile(f64::from(t) / f64::from(self.bins));
                    edges.push(q.unwrap_or(lo).clamp(lo, hi));
                }
                edges.push(hi);
                edges
            }
        };
        edges.dedup_by(|b, a| *b <= *a);
        match edges.as_slice() {
            [] => vec![0.0, 1.0],
            [v] => vec![*v, *v + v.abs().max(1.0)],
            _ => edges,
        }
    }
}

/// The piecewise-linear encoding of `x` over `edges` (`b_0 < … < b_T`), one value per bin `t`
/// (`[b_{t-1}, b_t)`): 1 for a bin wholly below `x`, 0 for a bin above, the fraction
/// `(x - b_{t-1}) / (b_t - b_{t-1})` in `x`'s own bin; the first bin extends linearly below
/// `b_0` (negative) and the last above `b_T` (above 1), so the model stays linear outside the
/// training range. Only the non-zero values are given to `set(bin, value)`, by increasing bin.
#[inline]
pub fn encode(edges: &[f64], x: f64, mut set: impl FnMut(usize, f64)) {
    let bins = edges.len() - 1;
    for t in 0..bins {
        let (lo, hi) = (edges[t], edges[t + 1]);
        if t > 0 && x < lo {
            break;
        }
        let e = if t + 1 < bins && x >= hi {
            1.0
        } else {
            (x - lo) / (hi - lo)
        };
        if e != 0.0 {
            set(t, e);
        }
    }
}

/// The value whose encoding is `e` (one value per bin; the inverse of [`encode`]): read in the
/// last bin that is not 0, `b_0` when all are.
pub fn decode(edges: &[f64], e: &[f64]) -> f64 {
    match (0..e.len()).rev().find(|&t| e[t] != 0.0) {
        Some(t) => edges[t] + e[t] * (edges[t + 1] - edges[t]),
        None => edges[0],
    }
}

/// Whether stored edges can encode: at least two, finite, strictly increasing.
pub fn sound_edges(edges: &[f64]) -> bool {
    edges.len() >= 2 && edges.iter().all(|b| b.is_finite()) && edges.windows(2).all(|w| w[0] < w[1])
}

#[cfg(test)]
mod tests;
