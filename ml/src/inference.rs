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

pub mod distributions;

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
        cholesky(&mut self.h, p, check)?;
        // L·Lᵀ·δ = −g: forward, then back substitution.
        let mut delta: Vec<f64> = self.g.iter().map(|v| -v).collect();
        for i in 0..p {
            let s: f64 = (0..i).map(|k| self.h[i * p + k] * delta[k]).sum();
            delta[i] = (delta[i] - s) / self.h[i * p + i];
        }
        for i in (0..p).rev() {
            let s: f64 = (i + 1..p).map(|k| self.h[k * p + i] * delta[k]).sum();
            delta[i] = (delta[i] - s) / self.h[i * p + i];
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

    /// The tests of every coefficient, from the last pass's factor (call after a
    /// [`newton_step`](Self::newton_step) small enough to stop). `check`: as there, once per
    /// column.
    pub fn finish(&self, check: &mut dyn FnMut()) -> Result<Inference, InferenceError> {
        let p = self.dim();
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
        };
        for (&b, se) in self.beta.iter().zip(std_error) {
            let stat = b / se;
            out.std_error.push(se);
            out.statistic.push(stat);
            out.p_value.push(match df {
                None => normal_two_sided(stat),
                Some(df) => t_two_sided(stat, df),
            });
            out.ci_low.push(b - quantile * se);
            out.ci_high.push(b + quantile * se);
        }
        let all = [
            &out.std_error,
            &out.statistic,
            &out.p_value,
            &out.ci_low,
            &out.ci_high,
        ];
        if !all.iter().all(|v| v.iter().all(|x| x.is_finite())) {
            return Err(InferenceError::NonFinite);
        }
        Ok(out)
    }
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
/// `corgipile_model_coefficients` reports; stored as `metrics->'inference'`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Inference {
    /// "z" (logistic, normal) or "t" (linear, Student's t with `df` degrees of freedom).
    pub test: String,
    pub df: Option<f64>,
    pub rows: u64,
    pub log_likelihood: Option<f64>,
    /// Linear: the residual variance RSS / (n − p).
    pub sigma2: Option<f64>,
    pub std_error: Vec<f64>,
    pub statistic: Vec<f64>,
    pub p_value: Vec<f64>,
    pub ci_low: Vec<f64>,
    pub ci_high: Vec<f64>,
}

#[cfg(test)]
mod tests;
