//! What a model stores of its training rows for `corgipile_drift` (a [`Profile`]): per input
//! column the rows, NULLs, mean, standard deviation, deciles and the shares between them of a
//! number (a [`NumberSketch`] in the statistics pass), the shares of a one-hot column's kept
//! categories, "(other)" and NULL; the label's class shares or deciles ([`LabelSketch`]); the
//! stored model's predictions on a sample of rows after training ([`PredictionSketch`]).
//! Compared with today's rows by `crate::drift`.

use super::quantiles::QuantileSketch;
use crate::moments::Welford;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Bins of a number's profile: deciles (as BigQuery ML's `num_quantiles_histogram_buckets`
/// default, 10).
pub const PROFILE_BINS: u32 = 10;

/// Bytes a [`NumberSketch`] holds at most (its t-digest's, see
/// [`super::quantiles::SKETCH_BYTES`], and its exact counts).
pub const NUMBER_SKETCH_BYTES: usize =
    super::quantiles::SKETCH_BYTES + (PROFILE_BINS as usize + 2) * 16;

/// What a model stores of its training rows, beside its preprocessing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Rows profiled (the statistics pass's: every kept training row, or its sample).
    pub rows: u64,
    /// One per input column, in the preprocessing's order.
    pub columns: Vec<ColumnProfile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<ColumnProfile>,
    /// The stored model's predictions after training (its own, per model: a search's models
    /// share one preprocessing, so the catalog writes this in when it stores each); None for
    /// models trained before it and the models that are not profiled (see docs/reference.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predictions: Option<ColumnProfile>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ColumnProfile {
    pub name: String,
    #[serde(flatten)]
    pub summary: Summary,
}

/// The most categories of a column a drift profile keeps (the most frequent; the others count
/// as "(other)", in training as today).
pub const PROFILE_CATEGORIES: usize = 1000;

/// One column's distribution.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Summary {
    /// `shares[k]` of the non-NULL values in bin `k` of `cuts` (see [`bin_of`]).
    Number {
        rows: u64,
        missing: u64,
        mean: f64,
        std: f64,
        min: f64,
        max: f64,
        cuts: Vec<f64>,
        shares: Vec<f64>,
    },
    /// `shares` of the rows: each of `categories`, then "(other)", then NULL.
    Categories {
        rows: u64,
        missing: u64,
        categories: Vec<String>,
        shares: Vec<f64>,
    },
    /// Each element's mean and standard deviation (an array column or an array model's
    /// features): drift is the largest shift of an element's mean, in training standard
    /// deviations.
    Array {
        rows: u64,
        missing: u64,
        mean: Vec<f64>,
        std: Vec<f64>,
    },
    /// Rows and NULLs only (a hashed text column: its buckets are not profiled).
    Count { rows: u64, missing: u64 },
}

impl Summary {
    /// The shares compared: a number's bins then NULL, or the categories' shares; None for
    /// arrays and counts.
    pub fn distribution(&self) -> Option<Vec<f64>> {
        match self {
            Summary::Number {
                rows,
                missing,
                shares,
                ..
            } => {
                let null = if *rows == 0 {
                    0.0
                } else {
                    *missing as f64 / *rows as f64
                };
                let mut d: Vec<f64> = shares.iter().map(|s| s * (1.0 - null)).collect();
                d.push(null);
                Some(d)
            }
            Summary::Categories { shares, .. } => Some(shares.clone()),
            _ => None,
        }
    }
}

/// A number column's deciles and the shares between them, in bounded memory: a
/// [`QuantileSketch`] of [`PROFILE_BINS`] bins, and exact counts while the column has at most
/// `PROFILE_BINS + 1` distinct values (a flag, a rating: then every value is a bin of its own).
#[derive(Clone, Debug)]
pub struct NumberSketch {
    sketch: QuantileSketch,
    exact: Option<Vec<(f64, u64)>>,
}

impl Default for NumberSketch {
    fn default() -> Self {
        Self::new()
    }
}

impl NumberSketch {
    pub fn new() -> NumberSketch {
        NumberSketch {
            sketch: QuantileSketch::new(PROFILE_BINS),
            exact: Some(Vec::new()),
        }
    }

    /// Adds a finite value.
    pub fn push(&mut self, v: f64) {
        self.sketch.push(v);
        if let Some(exact) = &mut self.exact {
            match exact.binary_search_by(|e| e.0.total_cmp(&v)) {
                Ok(at) => exact[at].1 += 1,
                Err(_) if exact.len() > PROFILE_BINS as usize => self.exact = None,
                // Bounded by PROFILE_BINS + 1 entries: counted in NUMBER_SKETCH_BYTES.
                Err(at) => exact.insert(at, (v, 1)),
            }
        }
    }

    /// The cut points (strictly increasing, above the smallest value), the share of the values
    /// in each bin (one more than the cuts; from the digest's centroids, a centroid wholly in
    /// the bin of its mean, unless exact), the smallest and the largest value. No values: no
    /// cuts, one bin of share 0.
    pub fn finish(self) -> (Vec<f64>, Vec<f64>, f64, f64) {
        if let Some(exact) = self.exact {
            let (Some(first), Some(last)) = (exact.first(), exact.last()) else {
                return (Vec::new(), vec![0.0], 0.0, 0.0);
            };
            let (min, max) = (first.0, last.0);
            let cuts: Vec<f64> = exact.iter().skip(1).map(|e| e.0).collect();
            let counts: Vec<u64> = exact.iter().map(|e| e.1).collect();
            return (cuts, shares(&counts), min, max);
        }
        let (edges, centroids) = self.sketch.edges_and_centroids();
        let (min, max) = (edges[0], edges[edges.len() - 1]);
        // The inner edges: the deciles (equal ones merged by `edges`).
        let cuts: Vec<f64> = edges[1..edges.len() - 1].to_vec();
        let mut weights = vec![0.0; cuts.len() + 1];
        for (mean, weight) in centroids {
            weights[bin_of(&cuts, mean)] += weight;
        }
        let total: f64 = weights.iter().sum();
        let shares = weights
            .iter()
            .map(|w| if total > 0.0 { w / total } else { 0.0 })
            .collect();
        (cuts, shares, min, max)
    }
}

/// A classifier's label classes (by class index, or by value for a two-class label given as
/// its values), or a regression's label (a number): the training profile's label.
#[derive(Clone, Debug)]
pub enum LabelSketch {
    Number(Welford, Box<NumberSketch>),
    /// Count by the label as the decoder gives it (its bits), at most [`MAX_LABEL_CLASSES`].
    Classes(HashMap<u64, u64>),
}

/// Classes a label profile counts; more (a label the decoder numbers as it meets them): the
/// label is not profiled.
pub const MAX_LABEL_CLASSES: usize = 1000;

impl LabelSketch {
    pub fn push(&mut self, label: f64) {
        match self {
            LabelSketch::Number(m, s) => {
                m.push(label);
                s.push(label);
            }
            LabelSketch::Classes(counts) => {
                let n = counts.len();
                if let Some(c) = counts.get_mut(&label.to_bits()) {
                    *c += 1;
                } else if n < MAX_LABEL_CLASSES {
                    counts.insert(label.to_bits(), 1);
                }
            }
        }
    }

    /// The label's summary; `name` gives a class's name from the label as decoded.
    pub fn finish(self, name: impl Fn(f64) -> String) -> Summary {
        match self {
            LabelSketch::Number(m, s) => {
                let (cuts, shares, min, max) = s.finish();
                let (mean, std) = m.mean_std();
                Summary::Number {
                    rows: m.n(),
                    missing: 0,
                    mean,
                    std,
                    min,
                    max,
                    cuts,
                    shares,
                }
            }
            LabelSketch::Classes(counts) => {
                let mut all: Vec<(f64, u64)> = counts
                    .into_iter()
                    .map(|(b, c)| (f64::from_bits(b), c))
                    .collect();
                all.sort_by(|a, b| a.0.total_cmp(&b.0));
                let rows = all.iter().map(|a| a.1).sum();
                let mut counts: Vec<u64> = all.iter().map(|a| a.1).collect();
                counts.extend([0, 0]);
                Summary::Categories {
                    rows,
                    missing: 0,
                    categories: all.iter().map(|a| name(a.0)).collect(),
                    shares: shares(&counts),
                }
            }
        }
    }
}

/// The predictions of a trained model on a sample of rows: a classifier's count of each class
/// (by class index, the model's order; an index past them counts as "(other)"), a regression's
/// number summary in the deciles the number columns use ([`NumberSketch`]). Bounded memory: a
/// sketch, or one count per class.
#[derive(Clone, Debug)]
pub enum PredictionSketch {
    Number {
        moments: Welford,
        sketch: Box<NumberSketch>,
        /// Non-finite predictions (counted as NULL, as today's read counts none).
        missing: u64,
    },
    /// One count per class, then "(other)".
    Classes(Vec<u64>),
}

impl PredictionSketch {
    pub fn number() -> PredictionSketch {
        PredictionSketch::Number {
            moments: Welford::default(),
            sketch: Box::new(NumberSketch::new()),
            missing: 0,
        }
    }

    pub fn classes(n: usize) -> PredictionSketch {
        PredictionSketch::Classes(vec![0; n + 1])
    }

    /// A regression's prediction.
    pub fn push_number(&mut self, v: f64) {
        if let PredictionSketch::Number {
            moments,
            sketch,
            missing,
        } = self
        {
            if v.is_finite() {
                moments.push(v);
                sketch.push(v);
            } else {
                *missing += 1;
            }
        }
    }

    /// A classifier's predicted class index.
    pub fn push_class(&mut self, class: usize) {
        if let PredictionSketch::Classes(counts) = self {
            let other = counts.len() - 1;
            counts[class.min(other)] += 1;
        }
    }

    /// The summary compared with today's predictions: a number's deciles and shares, or the
    /// share of each class named by `names` (the model's classes, in its order), of "(other)"
    /// and of NULL (0), as today's read counts them.
    pub fn finish(self, names: Vec<String>) -> Summary {
        match self {
            PredictionSketch::Number {
                moments,
                sketch,
                missing,
            } => {
                let (cuts, shares, min, max) = sketch.finish();
                let (mean, std) = moments.mean_std();
                Summary::Number {
                    rows: moments.n() + missing,
                    missing,
                    mean,
                    std,
                    min,
                    max,
                    cuts,
                    shares,
                }
            }
            PredictionSketch::Classes(mut counts) => {
                debug_assert_eq!(names.len() + 1, counts.len());
                let rows = counts.iter().sum();
                counts.push(0);
                Summary::Categories {
                    rows,
                    missing: 0,
                    categories: names,
                    shares: shares(&counts),
                }
            }
        }
    }
}

/// Counts as shares of their total (all 0 when the total is 0).
pub fn shares(counts: &[u64]) -> Vec<f64> {
    let total: u64 = counts.iter().sum();
    counts
        .iter()
        .map(|&c| {
            if total == 0 {
                0.0
            } else {
                c as f64 / total as f64
            }
        })
        .collect()
}

/// The bin of `x` among the bins cut at `cuts` (strictly increasing): bin 0 is below `cuts[0]`,
/// bin `k` is `[cuts[k-1], cuts[k])`, the last bin from the last cut up.
pub fn bin_of(cuts: &[f64], x: f64) -> usize {
    cuts.partition_point(|&c| c <= x)
}
