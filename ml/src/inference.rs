//! Standard errors and p-values of a linear or logistic model (the `"inference"` param).
//!
//! SGD ends near the maximum-likelihood estimate, not at it, and standard errors at a point
//! near it are not the MLE's. So the caller polishes the SGD model by Newton–Raphson passes
//! over the rows (IRLS for logistic): each pass pushes every row into [`Information`], which
//! sums the observed information H = Σ w·x̃x̃ᵀ (x̃ = the row and a 1 for the intercept; logistic
//! w = p(1−p), linear w = 1) and the gradient of the loss; [`Information::newton_step`] then
//! solves H·δ = −g by Cholesky. Linear regression is quadratic: the first step lands on the
//! least-squares solution, and its residuals follow from the pass (one pass in all).
//! At the optimum, the covariance is H⁻¹ (logistic, z tests) or σ²·(XᵀX)⁻¹ with σ² =
//! RSS/(n−p) (linear, t tests with n−p degrees of freedom), as statsmodels and MADlib report.
//!
//! With `l2` > 0, the optimum is the penalized one: the loss plus n·l2/2·‖w‖² on the weights
//! in the table's units (not the intercept), and the penalty's Hessian n·l2·I is part of H.
//!
//! Categories: with an intercept, the one-hot features of a categorical column add up to it in
//! every row (H singular). After the first pass, [`Information::drop_references`] drops one
//! reference level per such column from the design, as statsmodels, R's `glm` and BigQuery ML
//! do: its coefficient is 0 by definition (not estimated, no test), the intercept is the
//! reference's level and the other levels' coefficients are contrasts against it. The
//! reference is the most frequent named level (ties: the first in feature order).

pub mod distributions;
mod part;

pub use part::InformationPart;

use crate::preprocess::OneHotGroup;
use crate::row::Row;
use distributions::{normal_two_sided, t_two_sided, t_two_sided_quantile, Z_975};
use serde::{Deserialize, Serialize};

/// Newton passes before giving up (from an SGD start, logistic takes 3 to 5).
pub const MAX_PASSES: u32 = 12;
/// A step whose largest change is below this share of the largest coefficient (plus 1) ends
/// the passes.
pub const TOLERANCE: f64 = 1e-10;
/// A column whose information left after the columns before it (1 − R² of that column on
/// them, weighted) is below this share of its own is taken as collinear with them.
const COLLINEAR: f64 = 1e-10;

use crate::model::Likelihood;

/// Why no standard errors could be computed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InferenceError {
    /// H is not positive definite: coefficient `column` (0-based; `n_features` is the
    /// intercept) is a combination of the ones before it, or constant.
    #[error("singular information matrix at coefficient {column}")]
    Singular { column: usize },
    /// The passes did not settle (logistic: the classes are separable, or nearly so).
    #[error("Newton passes did not converge")]
    NotConverged { step: f64 },
    /// Linear regression needs more rows than coefficients (n − p degrees of freedom).
    #[error("too few rows")]
    TooFewRows { rows: u64, coefficients: usize },
    /// A value overflowed (a huge feature, a diverging step).
    #[error("non-finite value")]
    NonFinite,
}

/// What one Newton pass sums, and the coefficients it is at.
#[derive(Debug)]
pub struct Information {
    family: Likelihood,
    n_features: usize,
    intercept: bool,
    /// Weights, then the intercept (when fitted).
    beta: Vec<f64>,
    /// p × p, row-major; only the lower triangle is summed (then holds the Cholesky factor).
    h: Vec<f64>,
    g: Vec<f64>,
    /// A row's x̃ (dense), reused.
    x: Vec<f64>,
    rows: u64,
    /// Logistic: −log-likelihood; linear: the residual sum of squares (both at `beta`).
    loss: f64,
    /// Linear, unpenalized: the residual sum of squares after the last step, when it is known
    /// without another pass (see [`newton_step`](Self::newton_step)).
    rss_after_step: Option<f64>,
    /// Per feature, the rows of this pass where it is not 0.
    counts: Vec<u64>,
    /// Per coefficient, whether it is out of the design (a reference level: fixed at 0).
    fixed: Vec<bool>,
    /// The coefficients in the design, in order: after a step, the first `free.len()`² values
    /// of `h` hold their factor (stride `free.len()`).
    free: Vec<usize>,
    references: Vec<Reference>,
}

/// The reference level of a categorical column, dropped from the design.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reference {
    /// The column (`col.dow`, `col.month` for a date/time part).
    pub column: String,
    /// Its feature's name (`col=value`).
    pub feature: String,
    /// Its feature's index, 1-based (`corgipile_model_coefficients.feature_index`).
    pub feature_index: usize,
    /// The rows of that level.
    pub rows: u64,
}

impl Information {
    /// Bytes it holds for a model of `n_features` (H dominates: p² values).
    pub fn bytes(n_features: usize, intercept: bool) -> u64 {
        let p = (n_features + intercept as usize) as u64;
        p.saturating_mul(p).saturating_add(4 * p).saturating_mul(8)
    }

    /// At the coefficients `weights`, `bias`; None when there is no memory for H.
    pub fn try_new(
        family: Likelihood,
        weights: &[f64],
        bias: f64,
        intercept: bool,
    ) -> Option<Information> {
        let n_features = weights.len();
        let p = n_features + intercept as usize;
        let mut h = Vec::new();
        h.try_reserve_exact(p.checked_mul(p)?).ok()?;
        h.resize(p * p, 0.0);
        let mut beta = weights.to_vec();
        if intercept {
            beta.push(bias);
        }
        Some(Information {
            family,
            n_features,
            intercept,
            beta,
            h,
            g: vec![0.0; p],
            x: vec![0.0; p],
            rows: 0,
            loss: 0.0,
            rss_after_step: None,
            counts: vec![0; n_features],
            fixed: vec![false; p],
            free: (0..p).collect(),
            references: Vec::new(),
        })
    }

    fn dim(&self) -> usize {
        self.beta.len()
    }

    /// The coefficients now: weights and intercept (0 when not fitted).
    pub fn coefficients(&self) -> (&[f64], f64) {
        let bias = if self.intercept {
            self.beta[self.n_features]
        } else {
            0.0
        };
        (&self.beta[..self.n_features], bias)
    }

    /// Whether the coefficients are at the optimum after the last step without another pass
    /// (unpenalized least squares, see [`newton_step`](Self::newton_step)).
    pub fn solved(&self) -> bool {
        self.rss_after_step.is_some()
    }

    /// Rows pushed in this pass.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Starts a pass: forgets the last one's sums.
    pub fn start_pass(&mut self) {
        self.h.iter_mut().for_each(|v| *v = 0.0);
        self.g.iter_mut().for_each(|v| *v = 0.0);
        self.rows = 0;
        self.loss = 0.0;
        self.rss_after_step = None;
        self.counts.iter_mut().for_each(|v| *v = 0);
    }

    /// After a pass, with an intercept: drops the reference level of every group whose
    /// features add up to the intercept in every row of the pass (each row sets exactly one of
    /// them), fixing its coefficient at 0. The reference is the group's most frequent named
    /// level (ties: the first), or of its other levels when no named one was seen. The model
    /// is moved to the same predictions (the reference's coefficient added to the intercept,
    /// subtracted from the group's), so the pass's sums stay those of the coefficients.
    /// `name`: a feature's name. Without an intercept (nothing to drop) or before a pass, does
    /// nothing. Returns the references dropped, in group order.
    pub fn drop_references(
        &mut self,
        groups: &[OneHotGroup],
        name: &dyn Fn(usize) -> String,
    ) -> &[Reference] {
        if !self.intercept || self.rows == 0 {
            return &self.references;
        }
        let d = self.n_features;
        for group in groups {
            let features = group.features.start.min(d)..group.features.end.min(d);
            let counts = &self.counts[features.clone()];
            if features.is_empty()
                || counts.iter().sum::<u64>() != self.rows
                || features.clone().any(|j| self.fixed[j])
            {
                continue;
            }
            // The first of the largest count: `max_by_key` would keep the last.
            let most = |range: std::ops::Range<usize>| {
                range.fold(None::<(usize, u64)>, |best, k| match best {
                    Some((_, c)) if c >= counts[k] => best,
                    _ if counts[k] > 0 => Some((k, counts[k])),
                    _ => best,
                })
            };
            let named = group.named.min(counts.len());
            let Some((k, rows)) = most(0..named).or_else(|| most(named..counts.len())) else {
                continue;
            };
            let reference = features.start + k;
            let shift = self.beta[reference];
            for j in features {
                self.beta[j] -= shift;
            }
            self.beta[d] += shift;
            self.fixed[reference] = true;
            self.references.push(Reference {
                column: group.column.clone(),
                feature: name(reference),
                feature_index: reference + 1,
                rows,
            });
        }
        &self.references
    }

    /// Adds one row; `y` is 0 or 1 (logistic) or the target (linear). O(p²) for a dense row.
    pub fn push(&mut self, row: Row, y: f64) {
        let p = self.dim();
        let d = self.n_features;
        self.x.iter_mut().for_each(|v| *v = 0.0);
        match row {
            Row::Dense(v) => {
                let n = v.len().min(d);
                self.x[..n].copy_from_slice(&v[..n]);
            }
            Row::Sparse { indices, values } => {
                for (&j, &v) in indices.iter().zip(values) {
                    if let Some(x) = self.x.get_mut(j as usize).filter(|_| (j as usize) < d) {
                        *x = v;
                    }
                }
            }
        }
        if self.intercept {
            self.x[d] = 1.0;
        }
        let z = crate::row::dot(&self.beta, &self.x);
        let (weight, residual) = match self.family {
            Likelihood::Logistic => {
                let prob = crate::model::sigmoid(z);
                // −log-likelihood of y at z, stable for large |z|: softplus(z) − y·z.
                self.loss += z.max(0.0) + (-z.abs()).exp().ln_1p() - y * z;
                (prob * (1.0 - prob), prob - y)
            }
            Likelihood::Linear => {
                let r = z - y;
                self.loss += r * r;
                (1.0, r)
            }
        };
        for i in 0..p {
            let xi = self.x[i];
            if xi == 0.0 {
                continue;
            }
            if let Some(c) = self.counts.get_mut(i) {
                *c += 1;
            }
            self.g[i] += residual * xi;
            let wxi = weight * xi;
            let row = &mut self.h[i * p..i * p + i + 1];
            for (hij, &xj) in row.iter_mut().zip(&self.x[..=i]) {
                *hij += wxi * xj;
            }
        }
        self.rows += 1;
    }

    /// Adds the penalty, factors H (Cholesky, in place) and moves the coefficients by the
    /// Newton step; returns the step's size relative to the coefficients (see [`TOLERANCE`]).
    /// The factor stays for [`finish`](Self::finish). `check` is called once per column of
    /// the O(p³) factorisation (O(p²) work each): the caller's interrupt check.
    pub fn newton_step(&mut self, l2: f64, check: &mut dyn FnMut()) -> Result<f64, InferenceError> {
        let p = self.dim();
        let penalty = l2 * self.rows as f64;
        for j in 0..self.n_features.min(p) {
            self.h[j * p + j] += penalty;
            self.g[j] += penalty * self.beta[j];
        }
        if self.family == Likelihood::Logistic {
            let w = &self.beta[..self.n_features];
            self.loss += 0.5 * penalty * w.iter().map(|v| v * v).sum::<f64>();
        }
        if !self.h.iter().chain(&self.g).all(|v| v.is_finite()) {
            return Err(InferenceError::NonFinite);
        }
        self.compact();
        let free = &self.free;
        let q = free.len();
        cholesky(&mut self.h[..q * q], q, check).map_err(|e| match e {
            InferenceError::Singular { column } => InferenceError::Singular {
                column: free[column],
            },
            e => e,
        })?;
        // L·Lᵀ·δ = −g (the coefficients in the design): forward, then back substitution.
        let mut reduced: Vec<f64> = free.iter().map(|&j| -self.g[j]).collect();
        for i in 0..q {
            let s: f64 = (0..i).map(|k| self.h[i * q + k] * reduced[k]).sum();
            reduced[i] = (reduced[i] - s) / self.h[i * q + i];
        }
        for i in (0..q).rev() {
            let s: f64 = (i + 1..q).map(|k| self.h[k * q + i] * reduced[k]).sum();
            reduced[i] = (reduced[i] - s) / self.h[i * q + i];
        }
        // A fixed coefficient does not move.
        let mut delta = vec![0.0; p];
        for (&j, v) in free.iter().zip(reduced) {
            delta[j] = v;
        }
        // Least squares is quadratic: one step lands on the solution (H does not depend on the
        // coefficients), and its RSS is RSS + gᵀδ (as δᵀHδ = −gᵀδ), so no second pass is
        // needed, unless the subtraction lost digits (the start was far from the solution).
        if self.family == Likelihood::Linear && penalty == 0.0 {
            let after = self.loss + self.g.iter().zip(&delta).map(|(g, d)| g * d).sum::<f64>();
            self.rss_after_step = (after > 1e-6 * self.loss).then_some(after);
        }
        let step = delta.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let size = self.beta.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (b, d) in self.beta.iter_mut().zip(&delta) {
            *b += d;
        }
        if !self.beta.iter().all(|v| v.is_finite()) {
            return Err(InferenceError::NonFinite);
        }
        Ok(step / (1.0 + size))
    }

    /// Moves the lower triangle of H's rows and columns in the design (`free`, the
    /// coefficients not fixed) to the first `free.len()`² values of `h`, stride `free.len()`.
    /// In place: each value moves to an index no larger than its own, and in increasing order,
    /// so none is overwritten before it is read.
    fn compact(&mut self) {
        let p = self.dim();
        self.free = (0..p).filter(|&j| !self.fixed[j]).collect();
        let q = self.free.len();
        if q == p {
            return;
        }
        for i in 0..q {
            for j in 0..=i {
                self.h[i * q + j] = self.h[self.free[i] * p + self.free[j]];
            }
        }
    }

    /// The tests of every coefficient, from the last pass's factor (call after a
    /// [`newton_step`](Self::newton_step) small enough to stop); a fixed one (a reference
    /// level) has none. `check`: as there, once per column.
    pub fn finish(&self, check: &mut dyn FnMut()) -> Result<Inference, InferenceError> {
        // The coefficients estimated: their factor is q × q.
        let p = self.free.len();
        let rows = self.rows;
        let (df, scale2, quantile) = match self.family {
            Likelihood::Logistic => (None, 1.0, Z_975),
            Likelihood::Linear => {
                if rows <= p as u64 {
                    return Err(InferenceError::TooFewRows {
                        rows,
                        coefficients: p,
                    });
                }
                let df = (rows - p as u64) as f64;
                let rss = self.rss_after_step.unwrap_or(self.loss);
                (Some(df), rss / df, t_two_sided_quantile(0.05, df))
            }
        };
        // diag(H⁻¹)_j = Σ_i (L⁻¹)_ij²: one column of L⁻¹ at a time (forward substitution).
        let mut column = vec![0.0; p];
        let mut std_error = Vec::with_capacity(p);
        for j in 0..p {
            check();
            column.iter_mut().for_each(|v| *v = 0.0);
            column[j] = 1.0 / self.h[j * p + j];
            for i in j + 1..p {
                let s: f64 = (j..i).map(|k| self.h[i * p + k] * column[k]).sum();
                column[i] = -s / self.h[i * p + i];
            }
            let variance: f64 = column[j..].iter().map(|v| v * v).sum();
            std_error.push((scale2 * variance).sqrt());
        }
        // Back to every coefficient: none for a fixed one.
        let mut every = vec![None; self.dim()];
        for (&j, se) in self.free.iter().zip(std_error) {
            every[j] = Some(se);
        }
        let mut out = Inference {
            test: match self.family {
                Likelihood::Logistic => "z",
                Likelihood::Linear => "t",
            }
            .to_string(),
            df,
            rows,
            log_likelihood: (self.family == Likelihood::Logistic).then_some(-self.loss),
            sigma2: df.map(|_| scale2),
            std_error: Vec::with_capacity(p),
            statistic: Vec::with_capacity(p),
            p_value: Vec::with_capacity(p),
            ci_low: Vec::with_capacity(p),
            ci_high: Vec::with_capacity(p),
            reference: self.references.clone(),
        };
        for (&b, se) in self.beta.iter().zip(every) {
            let stat = se.map(|se| b / se);
            out.std_error.push(se);
            out.statistic.push(stat);
            out.p_value.push(stat.map(|stat| match df {
                None => normal_two_sided(stat),
                Some(df) => t_two_sided(stat, df),
            }));
            out.ci_low.push(se.map(|se| b - quantile * se));
            out.ci_high.push(se.map(|se| b + quantile * se));
        }
        let all = [
            &out.std_error,
            &out.statistic,
            &out.p_value,
            &out.ci_low,
            &out.ci_high,
        ];
        if !all
            .iter()
            .all(|v| v.iter().flatten().all(|x| x.is_finite()))
        {
            return Err(InferenceError::NonFinite);
        }
        Ok(out)
    }
}

/// The Newton passes from `info`'s coefficients to the optimum, and its tests: one server's
/// (each `pass` pushes every row) and a shard coordinator's (each `pass` adds every shard's
/// part) alike. `pass(info, n)` fills pass `n` (1-based; `info` was started); after the first,
/// the reference level of each of `groups` is dropped (`name`: a feature's name); then a step,
/// until one is below [`TOLERANCE`] (least squares: the first), at most [`MAX_PASSES`].
/// `check`: the caller's interrupt check (see [`Information::newton_step`]). Returns the
/// tests and the passes made.
pub fn newton_passes(
    info: &mut Information,
    l2: f64,
    (groups, name): (&[OneHotGroup], &dyn Fn(usize) -> String),
    pass: &mut dyn FnMut(&mut Information, u32),
    check: &mut dyn FnMut(),
) -> Result<(Inference, u32), InferenceError> {
    let mut passes = 0;
    let mut last_step = f64::INFINITY;
    while last_step >= TOLERANCE {
        if passes == MAX_PASSES {
            return Err(InferenceError::NotConverged { step: last_step });
        }
        passes += 1;
        info.start_pass();
        pass(info, passes);
        if passes == 1 {
            info.drop_references(groups, name);
        }
        last_step = info.newton_step(l2, check)?;
        if info.solved() {
            break; // least squares: one pass
        }
    }
    Ok((info.finish(check)?, passes))
}

/// Cholesky factor of the symmetric p × p matrix whose lower triangle `a` holds (row-major),
/// in place. A pivot that keeps less than [`COLLINEAR`] of its column's own information is a
/// singular (or indefinite) matrix: an error naming the column.
fn cholesky(a: &mut [f64], p: usize, check: &mut dyn FnMut()) -> Result<(), InferenceError> {
    for j in 0..p {
        check();
        let own = a[j * p + j];
        let s: f64 = (0..j).map(|k| a[j * p + k] * a[j * p + k]).sum();
        let pivot = own - s;
        // NaN fails too: `is_nan` is checked with the comparison.
        if pivot.is_nan() || pivot <= COLLINEAR * own {
            return Err(InferenceError::Singular { column: j });
        }
        let l = pivot.sqrt();
        a[j * p + j] = l;
        for i in j + 1..p {
            let s: f64 = (0..j).map(|k| a[i * p + k] * a[j * p + k]).sum();
            a[i * p + j] = (a[i * p + j] - s) / l;
        }
    }
    Ok(())
}

/// Per coefficient (weights in feature order, then the intercept when fitted): what
/// `corgipile_model_coefficients` reports; stored as `metrics->'inference'`. A reference level
/// (fixed at 0) has no test: None (JSON null) in every array.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Inference {
    /// "z" (logistic, normal) or "t" (linear, Student's t with `df` degrees of freedom).
    pub test: String,
    pub df: Option<f64>,
    pub rows: u64,
    pub log_likelihood: Option<f64>,
    /// Linear: the residual variance RSS / (n − p).
    pub sigma2: Option<f64>,
    pub std_error: Vec<Option<f64>>,
    pub statistic: Vec<Option<f64>>,
    pub p_value: Vec<Option<f64>>,
    pub ci_low: Vec<Option<f64>>,
    pub ci_high: Vec<Option<f64>>,
    /// The reference level of each categorical column, dropped from the design.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference: Vec<Reference>,
}

#[cfg(test)]
mod tests;
