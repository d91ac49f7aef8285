//! Drift (`corgipile_drift`): what a model stores of its training rows (a
//! [`Profile`](crate::preprocess::profile::Profile): per
//! input column the rows, NULL share, mean, standard deviation and deciles of a number, the
//! shares of a one-hot column's kept categories; the label's class shares or deciles), what a
//! read of today's rows gives in the same bins ([`Counter`]), and the distances between them
//! ([`distance`]: population stability index, Jensen–Shannon divergence, L-infinity).
//!
//! A number's bins are its training deciles (cut points from a
//! [`NumberSketch`](crate::preprocess::profile::NumberSketch), a t-digest;
//! the exact distinct values when a column has at most
//! [`PROFILE_BINS`](crate::preprocess::profile::PROFILE_BINS) + 1) plus one bin for
//! NULL; a category column's are its kept categories, "(other)" and NULL. Today's rows are
//! counted exactly in the training's bins, so a distance is exact for the rows read.

pub mod distance;

use crate::moments::Welford;
use crate::preprocess::profile::{bin_of, shares, Summary};
use std::collections::HashMap;

/// The distances between a training distribution and today's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Distances {
    pub psi: f64,
    pub jensen_shannon: f64,
    pub l_infinity: f64,
}

/// The distances of two summaries of the same bins; None when they cannot be compared (no
/// bins, different bins, no rows on a side).
pub fn compare(training: &Summary, today: &Summary) -> Option<Distances> {
    let same_bins = match (training, today) {
        (Summary::Number { cuts: a, .. }, Summary::Number { cuts: b, .. }) => a == b,
        (Summary::Categories { categories: a, .. }, Summary::Categories { categories: b, .. }) => {
            a == b
        }
        _ => false,
    };
    let (p, q) = (training.distribution()?, today.distribution()?);
    if !same_bins
        || p.len() != q.len()
        || p.iter().sum::<f64>() == 0.0
        || q.iter().sum::<f64>() == 0.0
    {
        return None;
    }
    Some(Distances {
        psi: distance::psi(&p, &q),
        jensen_shannon: distance::jensen_shannon(&p, &q),
        l_infinity: distance::l_infinity(&p, &q),
    })
}

/// The largest shift of an element's mean in training standard deviations (a standard
/// deviation of 0 counts as 1), and the element; None without elements or rows.
pub fn mean_shift(training: &Summary, today: &Summary) -> Option<(f64, usize)> {
    let (
        Summary::Array {
            mean: m0, std: s0, ..
        },
        Summary::Array {
            rows,
            mean: m1,
            missing,
            ..
        },
    ) = (training, today)
    else {
        return None;
    };
    if m0.len() != m1.len() || m0.is_empty() || rows == missing {
        return None;
    }
    m0.iter()
        .zip(s0)
        .zip(m1)
        .map(|((a, s), b)| (b - a).abs() / if *s > 0.0 { *s } else { 1.0 })
        .enumerate()
        .map(|(j, d)| (d, j))
        .fold(None, |best: Option<(f64, usize)>, x| match best {
            Some(b) if b.0 >= x.0 => Some(b),
            _ => Some(x),
        })
}

/// What a column is, for a [`Counter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnKind {
    Number,
    Text,
    Array,
    Other,
}

/// Today's rows of one column, counted in the training profile's bins (or, without one, its
/// own statistics only).
#[derive(Debug)]
pub enum Counter {
    Number {
        cuts: Vec<f64>,
        counts: Vec<u64>,
        moments: Welford,
        missing: u64,
        min: f64,
        max: f64,
    },
    Categories {
        categories: Vec<String>,
        index: HashMap<Box<[u8]>, usize>,
        /// Each category's, then "(other)", then NULL.
        counts: Vec<u64>,
    },
    Array {
        moments: Vec<Welford>,
        rows: u64,
        missing: u64,
    },
    Count {
        rows: u64,
        missing: u64,
    },
}

impl Counter {
    /// A counter in `training`'s bins; a number without training bins is counted in one bin.
    pub fn for_training(training: Option<&Summary>, kind: ColumnKind) -> Counter {
        match (training, kind) {
            (Some(Summary::Number { cuts, .. }), _) => Counter::in_bins(cuts.clone()),
            (Some(Summary::Categories { categories, .. }), _) => {
                Counter::categories(categories.clone())
            }
            (_, ColumnKind::Number) => Counter::in_bins(Vec::new()),
            (_, ColumnKind::Array) => Counter::Array {
                moments: Vec::new(),
                rows: 0,
                missing: 0,
            },
            _ => Counter::Count {
                rows: 0,
                missing: 0,
            },
        }
    }

    pub fn in_bins(cuts: Vec<f64>) -> Counter {
        Counter::Number {
            counts: vec![0; cuts.len() + 1],
            cuts,
            moments: Welford::default(),
            missing: 0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }

    /// Counts of `categories` (each counted apart, the rest as "(other)").
    pub fn categories(categories: Vec<String>) -> Counter {
        let index = categories
            .iter()
            .enumerate()
            .map(|(i, c)| (Box::from(c.as_bytes()), i))
            .collect();
        Counter::Categories {
            counts: vec![0; categories.len() + 2],
            categories,
            index,
        }
    }

    /// Bytes this counter holds (beside its categories' names).
    pub fn bytes(&self) -> usize {
        match self {
            Counter::Number { cuts, .. } => 16 * cuts.len() + 64,
            Counter::Categories { categories, .. } => {
                categories.iter().map(|c| c.len() + 64).sum::<usize>() + 64
            }
            Counter::Array { moments, .. } => 24 * moments.len() + 32,
            Counter::Count { .. } => 16,
        }
    }

    pub fn number(&mut self, value: Option<f64>) {
        match self {
            Counter::Number {
                cuts,
                counts,
                moments,
                missing,
                min,
                max,
            } => match value {
                Some(v) => {
                    counts[bin_of(cuts, v)] += 1;
                    moments.push(v);
                    *min = min.min(v);
                    *max = max.max(v);
                }
                None => *missing += 1,
            },
            Counter::Count { rows, missing } => {
                *rows += 1;
                *missing += u64::from(value.is_none());
            }
            _ => {}
        }
    }

    /// A text value (a category the training did not keep counts as "(other)").
    pub fn text(&mut self, value: Option<&[u8]>) {
        match self {
            Counter::Categories { index, counts, .. } => {
                let n = counts.len();
                let slot = match value {
                    None => n - 1,
                    Some(v) => index.get(v).copied().unwrap_or(n - 2),
                };
                counts[slot] += 1;
            }
            Counter::Count { rows, missing } => {
                *rows += 1;
                *missing += u64::from(value.is_none());
            }
            _ => {}
        }
    }

    /// An array's elements (the first row's length fixes the counter's; a row of another
    /// length is the decoder's ERROR before this).
    pub fn array(&mut self, value: Option<&[f64]>) {
        if let Counter::Array {
            moments,
            rows,
            missing,
        } = self
        {
            *rows += 1;
            let Some(values) = value else {
                *missing += 1;
                return;
            };
            if moments.is_empty() {
                moments.resize(values.len(), Welford::default());
            }
            for (m, &v) in moments.iter_mut().zip(values) {
                m.push(v);
            }
        }
    }

    /// Today's summary.
    pub fn finish(self) -> Summary {
        match self {
            Counter::Number {
                cuts,
                counts,
                moments,
                missing,
                min,
                max,
            } => {
                let (mean, std) = moments.mean_std();
                let empty = moments.n() == 0;
                Summary::Number {
                    rows: moments.n() + missing,
                    missing,
                    mean,
                    std,
                    min: if empty { 0.0 } else { min },
                    max: if empty { 0.0 } else { max },
                    cuts,
                    shares: shares(&counts),
                }
            }
            Counter::Categories {
                categories, counts, ..
            } => {
                let rows: u64 = counts.iter().sum();
                Summary::Categories {
                    rows,
                    missing: counts[counts.len() - 1],
                    categories,
                    shares: shares(&counts),
                }
            }
            Counter::Array {
                moments,
                rows,
                missing,
            } => {
                let (mean, std) = moments.iter().map(Welford::mean_std).unzip();
                Summary::Array {
                    rows,
                    missing,
                    mean,
                    std,
                }
            }
            Counter::Count { rows, missing } => Summary::Count { rows, missing },
        }
    }
}

#[cfg(test)]
mod tests;
