//! A Newton pass split over shards: each shard sums its rows into an [`Information`] at the
//! coordinator's coefficients and sends what the pass summed ([`InformationPart`]: the lower
//! triangle of H, the gradient, rows, loss, per-feature counts); the coordinator checks each
//! part (it comes from another server) and adds them all into its own [`Information`], which
//! then takes the step as after one server's pass. Sums of sums: the same numbers, up to the
//! order of additions.

use super::Information;
use crate::wire::BYTES_PER_VALUE;
use serde::{Deserialize, Serialize};

/// What one pass over some of the rows summed (see [`Information::part`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InformationPart {
    /// The lower triangle of H, row by row: p(p+1)/2 values (p: the features, and the
    /// intercept when fitted).
    pub h: Vec<f64>,
    /// The gradient of the loss: p values.
    pub g: Vec<f64>,
    pub rows: u64,
    /// Logistic: −log-likelihood; linear: the residual sum of squares.
    pub loss: f64,
    /// Per feature, the rows where it is not 0 (what a reference level is chosen by).
    pub counts: Vec<u64>,
}

/// Longest text of a number serde_json writes (a float's shortest form, `-2.2250738585072014e-308`,
/// or a u64), with its comma.
const NUMBER_TEXT: u64 = 25;

impl InformationPart {
    /// How many values the lower triangle of H holds for `n_features` (and the intercept).
    pub fn triangle(n_features: usize, intercept: bool) -> Option<usize> {
        let p = n_features.checked_add(intercept as usize)?;
        p.checked_mul(p.checked_add(1)?).map(|v| v / 2)
    }

    /// The most that reading a part of `n_features` (and the intercept) from JSON can take
    /// (`crate::wire` charges: its text and every value), with room for the reply around it.
    pub fn wire_bytes(n_features: usize, intercept: bool) -> u64 {
        let p = (n_features + intercept as usize) as u64;
        let values = p
            .saturating_mul(p + 1)
            .saturating_div(2)
            .saturating_add(p)
            .saturating_add(n_features as u64)
            .saturating_add(16);
        values
            .saturating_mul(BYTES_PER_VALUE + NUMBER_TEXT)
            .saturating_add(64 * 1024)
    }

    /// Why this part (from another server) cannot be added to a pass of `n_features` (and the
    /// intercept): sizes other than the model's, values that are not finite, a negative loss
    /// or diagonal of H (both are sums of non-negative terms), counts over its rows.
    pub fn check(&self, n_features: usize, intercept: bool) -> Result<(), String> {
        let p = n_features + intercept as usize;
        let triangle = Self::triangle(n_features, intercept).unwrap_or(usize::MAX);
        if self.h.len() != triangle || self.g.len() != p || self.counts.len() != n_features {
            return Err(format!(
                "an information part of {}/{}/{} values for a model of {p} coefficients ({triangle}/{p}/{n_features} expected)",
                self.h.len(),
                self.g.len(),
                self.counts.len()
            ));
        }
        if !self.h.iter().chain(&self.g).all(|v| v.is_finite()) {
            return Err("an information part with values that are not finite".into());
        }
        if !(self.loss.is_finite() && self.loss >= 0.0) {
            return Err(format!("an information part of loss {}", self.loss));
        }
        if (0..p).any(|i| self.h[i * (i + 1) / 2 + i] < 0.0) {
            return Err("an information matrix with a negative diagonal".into());
        }
        if self.counts.iter().any(|&c| c > self.rows) {
            return Err("a feature counted in more rows than the part has".into());
        }
        Ok(())
    }

    /// Adds `other`'s sums (a part of the same shape, checked).
    pub fn merge(&mut self, other: &InformationPart) {
        debug_assert_eq!(self.h.len(), other.h.len());
        add(&mut self.h, &other.h);
        add(&mut self.g, &other.g);
        self.rows = self.rows.saturating_add(other.rows);
        self.loss += other.loss;
        for (c, o) in self.counts.iter_mut().zip(&other.counts) {
            *c = c.saturating_add(*o);
        }
    }
}

fn add(to: &mut [f64], from: &[f64]) {
    for (t, f) in to.iter_mut().zip(from) {
        *t += f;
    }
}

impl Information {
    /// What this pass summed, to send (call after the pass, before its step).
    pub fn part(&self) -> InformationPart {
        let p = self.dim();
        let mut h = Vec::with_capacity(p * (p + 1) / 2);
        for i in 0..p {
            h.extend_from_slice(&self.h[i * p..i * p + i + 1]);
        }
        InformationPart {
            h,
            g: self.g.clone(),
            rows: self.rows,
            loss: self.loss,
            counts: self.counts.clone(),
        }
    }

    /// Adds a part (`InformationPart::check`ed against this model) to this pass's sums, as if
    /// its rows had been pushed here.
    pub fn add_part(&mut self, part: &InformationPart) {
        let p = self.dim();
        debug_assert_eq!(part.h.len(), p * (p + 1) / 2);
        for i in 0..p {
            let from = &part.h[i * (i + 1) / 2..][..=i];
            add(&mut self.h[i * p..i * p + i + 1], from);
        }
        add(&mut self.g, &part.g);
        self.rows = self.rows.saturating_add(part.rows);
        self.loss += part.loss;
        for (c, o) in self.counts.iter_mut().zip(&part.counts) {
            *c = c.saturating_add(*o);
        }
    }
}
