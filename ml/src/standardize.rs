//! Feature standardization, the one form in which every scaling (standardize, max-abs,
//! a preprocessor's numeric columns) reaches training and prediction.

use serde::{Deserialize, Serialize};

/// Feature standardization `x'_j = (x_j - mean_j)·scale_j` (`mean` unused
/// unless `center`). Features beyond its length pass through unchanged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Standardizer {
    pub mean: Vec<f64>,
    /// 1/std, or 1 where std == 0.
    pub scale: Vec<f64>,
    pub center: bool,
}

impl Standardizer {
    /// A copy, or None when its memory cannot be allocated (its size follows the table's
    /// features: a failed allocation must be an error, not an abort).
    pub fn try_clone(&self) -> Option<Standardizer> {
        let copy = |v: &[f64]| {
            let mut c = Vec::new();
            c.try_reserve_exact(v.len()).ok()?;
            c.extend_from_slice(v);
            Some(c)
        };
        Some(Standardizer {
            mean: copy(&self.mean)?,
            scale: copy(&self.scale)?,
            center: self.center,
        })
    }

    /// Standardized copy of a dense row into `out` (reused; no allocation once warm).
    pub fn apply_dense(&self, x: &[f64], out: &mut Vec<f64>) {
        out.clear();
        self.extend_dense(x, out);
    }

    /// Standardized copy of a dense row appended to `out`: the values [`apply_dense`] gives,
    /// bit for bit, in one pass over the standardizer's features and the rest copied.
    ///
    /// [`apply_dense`]: Self::apply_dense
    pub fn extend_dense(&self, x: &[f64], out: &mut Vec<f64>) {
        let n = x.len().min(self.scale.len());
        let (head, tail) = x.split_at(n);
        if self.center {
            out.extend(
                head.iter()
                    .zip(&self.mean[..n])
                    .zip(&self.scale[..n])
                    .map(|((&v, &m), &s)| (v - m) * s),
            );
        } else {
            out.extend(
                head.iter()
                    .zip(&self.scale[..n])
                    .map(|(&v, &s)| scale_value(v, s)),
            );
        }
        out.extend_from_slice(tail);
    }

    /// Standardized values of a sparse row into `out`; the indices are unchanged. Only the
    /// present entries are touched: centering is exact only for features present in every
    /// row (a preprocessor's numeric columns); plain sparse data is scaled, never centered.
    pub fn apply_sparse(&self, indices: &[u32], values: &[f64], out: &mut Vec<f64>) {
        out.clear();
        self.extend_sparse(indices, values, out);
    }

    /// Standardized values of a sparse row appended to `out` (see [`apply_sparse`]).
    ///
    /// [`apply_sparse`]: Self::apply_sparse
    pub fn extend_sparse(&self, indices: &[u32], values: &[f64], out: &mut Vec<f64>) {
        out.extend(
            indices
                .iter()
                .zip(values)
                .map(|(&j, &v)| self.one(j as usize, v)),
        );
    }

    /// Whether it leaves every value as it is (every scale 1, every mean 0 or not used): as
    /// binary and one-hot features (max |x| = 1) give. Such a standardizer is skipped, so that
    /// neither the buffer nor SGD looks up a scale per non-zero; `v · 1` and `(v - 0) · 1` are
    /// `v` exactly, so the model is the same bit for bit.
    pub fn is_identity(&self) -> bool {
        self.scale.iter().all(|&s| s == 1.0)
            && (!self.center || self.mean.iter().all(|&m| m == 0.0))
    }

    /// Starts loading the scales (and means) a sparse row will use: for a model of millions
    /// of features they are as large as the weights, and as much a cache miss per non-zero.
    #[inline]
    pub fn prefetch_sparse(&self, indices: &[u32]) {
        for &j in indices {
            if let Some(s) = self.scale.get(j as usize) {
                crate::prefetch::prefetch_l2(s);
                if self.center {
                    crate::prefetch::prefetch_l2(&self.mean[j as usize]);
                }
            }
        }
    }

    #[inline]
    fn one(&self, j: usize, v: f64) -> f64 {
        match self.scale.get(j) {
            Some(&s) if self.center => (v - self.mean[j]) * s,
            Some(&s) => scale_value(v, s),
            None => v,
        }
    }
}

/// A value scaled without centering (one place, so that rows scaled in their buffer —
/// `TupleArena::scale_values` — equal rows scaled by SGD bit for bit).
#[inline]
pub fn scale_value(v: f64, scale: f64) -> f64 {
    v * scale
}
