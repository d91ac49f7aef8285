//! Factorization machines (Rendle, ICDM 2010): `fm` (classes, one output per class, softmax)
//! and `fm_regression` (a number). Output `k` of a row `x` is
//!
//! `z_k = b_k + Σ_j w_jk·x_j + Σ_{i<j} <v_ik, v_jk>·x_i·x_j`
//!
//! with a vector `v_jk` of `factors` values per feature and output: every pair of features
//! interacts through its factors' dot product, so a pair's effect is learned even for pairs
//! seen rarely (a one-hot column's factors act as an embedding of its categories). The pairwise
//! sum is computed in linear time as `½ Σ_f [(Σ_j v_jkf·x_j)² − Σ_j v_jkf²·x_j²]`.
//!
//! Trained by the same [`GradientTrainer`](crate::network::GradientTrainer) as networks (Adam
//! or SGD with momentum on mini-batches, a standardized regression target); predicted by
//! [`FmModel`] on the table's units. The family: `family.rs`.

mod family;
mod model;
#[cfg(test)]
mod tests;

pub use family::FmFamily;
pub use model::FmModel;

use crate::learner::Trainable;
use crate::model::Head;
use crate::model::ModelKind;
use crate::network::{for_each_value, try_zeros, Activation, Differentiable, NetworkError, Target};
use crate::params::MAX_FACTORS;
use crate::row::Row;
use crate::trained::Model;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

/// The initial factors are drawn uniformly in [-INIT, INIT): small, so that training starts
/// near the linear model (with 0.1, the pairs' random products drowned a sparse table's signal
/// for its first epoch: ROC AUC 0.61 against 0.93, `make bench-fm`), but not zero (a zero
/// factor's gradient is zero).
const INIT: f64 = 0.01;

/// A factorization machine's parameters and shape.
///
/// Layout (`params`): one block per feature, `outputs × (1 + factors)` values (for each output
/// its weight, then its factors), so a sparse row's non-zero reads one contiguous block; then
/// one bias per output.
#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    pub n_features: usize,
    pub factors: usize,
    pub outputs: usize,
    pub head: Head,
    pub params: Vec<f64>,
}

impl Machine {
    /// Parameters of a machine of this shape, or None if their count overflows.
    pub fn n_params(n_features: usize, factors: usize, outputs: usize) -> Option<usize> {
        outputs
            .checked_mul(factors.checked_add(1)?)?
            .checked_mul(n_features)?
            .checked_add(outputs)
    }

    /// A machine with zero weights and biases and factors drawn from `seed`.
    pub fn new(
        n_features: usize,
        factors: usize,
        outputs: usize,
        head: Head,
        seed: u64,
    ) -> Result<Machine, NetworkError> {
        if n_features == 0 || factors == 0 || factors > MAX_FACTORS || outputs == 0 {
            return Err(NetworkError::BadShape);
        }
        let n = Self::n_params(n_features, factors, outputs).ok_or(NetworkError::BadShape)?;
        let mut params = try_zeros(n)?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let stride = 1 + factors;
        for block in params[..n - outputs].chunks_exact_mut(stride) {
            for v in &mut block[1..] {
                // A uniform draw in [-INIT, INIT) from the top 53 bits.
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                *v = (2.0 * u - 1.0) * INIT;
            }
        }
        Ok(Machine {
            n_features,
            factors,
            outputs,
            head,
            params,
        })
    }

    /// Values per feature: every output's weight and factors.
    fn block(&self) -> usize {
        self.outputs * (1 + self.factors)
    }

    /// Where the biases start.
    fn bias_at(&self) -> usize {
        self.n_features * self.block()
    }

    pub fn bias(&self) -> &[f64] {
        &self.params[self.bias_at()..]
    }

    /// Output `k` of `row` (its pre-activation), with `sums` (`factors` long) left holding
    /// `Σ_j v_jkf·x_j` for the gradient.
    fn output(&self, row: &Row, k: usize, sums: &mut [f64]) -> f64 {
        let (f, block) = (self.factors, self.block());
        let at = k * (1 + f);
        sums.iter_mut().for_each(|s| *s = 0.0);
        let (mut linear, mut squares) = (0.0, 0.0);
        for_each_value(row, self.n_features, |j, x| {
            let p = &self.params[j * block + at..j * block + at + 1 + f];
            linear += p[0] * x;
            for (s, &v) in sums.iter_mut().zip(&p[1..]) {
                let vx = v * x;
                *s += vx;
                squares += vx * vx;
            }
        });
        let pairs: f64 = sums.iter().map(|s| s * s).sum::<f64>() - squares;
        self.params[self.bias_at() + k] + linear + 0.5 * pairs
    }

    /// d z_k / d x_j at `row` (its sums for output `k` in `sums`): `w_jk + Σ_f v_jkf·(s_f −
    /// v_jkf·x_j)`.
    fn slope(&self, j: usize, x: f64, k: usize, sums: &[f64]) -> f64 {
        let at = j * self.block() + k * (1 + self.factors);
        let p = &self.params[at..at + 1 + self.factors];
        p[0] + p[1..]
            .iter()
            .zip(sums)
            .map(|(&v, &s)| v * (s - v * x))
            .sum::<f64>()
    }
}

/// A batch's buffers: each row's outputs (then the head's values), its sums per output and
/// factor, the deltas, the gradient, and the features the batch touched.
pub struct Workspace {
    batch: usize,
    outputs: Vec<f64>,
    sums: Vec<f64>,
    delta: Vec<f64>,
    gradient: Vec<f64>,
    /// The features of the batch's sparse rows, sorted, once each: the gradient is zero
    /// elsewhere (but on the biases), so only their blocks are zeroed and stepped.
    touched: Vec<usize>,
    /// The batch had a dense row (or no memory to list features): every parameter counts.
    every: bool,
}

impl Workspace {
    /// Bytes the workspace of `batch` rows holds for a machine of `n_params` parameters.
    pub fn bytes(n_params: usize, factors: usize, outputs: usize, batch: usize) -> u64 {
        let b = batch.max(1) as u64;
        let per_row = (outputs as u64).saturating_mul(factors as u64 + 2);
        8u64.saturating_mul(b.saturating_mul(per_row).saturating_add(n_params as u64))
    }
}

impl Differentiable for Machine {
    type Workspace = Workspace;

    fn params(&self) -> &[f64] {
        &self.params
    }

    fn params_mut(&mut self) -> &mut [f64] {
        &mut self.params
    }

    fn head(&self) -> Head {
        self.head
    }

    fn n_outputs(&self) -> usize {
        self.outputs
    }

    fn is_weight(&self) -> Vec<bool> {
        let mut out = vec![true; self.params.len()];
        out[self.bias_at()..].iter_mut().for_each(|w| *w = false);
        out
    }

    fn workspace(&self, batch: usize) -> Result<Workspace, NetworkError> {
        let batch = batch.max(1);
        let k = self.outputs;
        Ok(Workspace {
            batch,
            outputs: try_zeros(batch.saturating_mul(k))?,
            sums: try_zeros(batch.saturating_mul(k).saturating_mul(self.factors))?,
            delta: try_zeros(batch.saturating_mul(k))?,
            gradient: try_zeros(self.params.len())?,
            touched: Vec::new(),
            every: true,
        })
    }

    fn add_loss_and_gradient(
        &self,
        rows: &[Row],
        labels: &[f64],
        weights: &[f64],
        of_rows: usize,
        first: bool,
        ws: &mut Workspace,
    ) -> f64 {
        let (b, k, f) = (rows.len(), self.outputs, self.factors);
        assert!(b <= ws.batch, "a batch larger than its workspace");
        assert_eq!(b, labels.len());
        for (i, row) in rows.iter().enumerate() {
            for o in 0..k {
                let sums = &mut ws.sums[(i * k + o) * f..(i * k + o + 1) * f];
                ws.outputs[i * k + o] = self.output(row, o, sums);
            }
            if self.head == Head::SOFTMAX {
                crate::model::softmax_loss(&mut ws.outputs[i * k..(i + 1) * k], 0);
            }
        }
        let inv_b = 1.0 / of_rows.max(1) as f64;
        let loss = self.head.delta(
            &ws.outputs[..b * k],
            labels,
            weights,
            inv_b,
            &mut ws.delta[..b * k],
        );
        let (block, bias_at) = (self.block(), self.bias_at());
        if first {
            // Zero the gradient where the last batch wrote it.
            if ws.every {
                ws.gradient.iter_mut().for_each(|g| *g = 0.0);
            } else {
                for &j in &ws.touched {
                    ws.gradient[j * block..(j + 1) * block].fill(0.0);
                }
                ws.gradient[bias_at..].fill(0.0);
            }
            ws.touched.clear();
            ws.every = false;
        }
        self.note_touched(rows, ws);
        for (i, row) in rows.iter().enumerate() {
            let delta = &ws.delta[i * k..(i + 1) * k];
            for (g, d) in ws.gradient[bias_at..].iter_mut().zip(delta) {
                *g += d;
            }
            let sums = &ws.sums[i * k * f..(i + 1) * k * f];
            for_each_value(row, self.n_features, |j, x| {
                for (o, &d) in delta.iter().enumerate() {
                    let at = j * block + o * (1 + f);
                    let p = &self.params[at + 1..at + 1 + f];
                    let g = &mut ws.gradient[at..at + 1 + f];
                    let dx = d * x;
                    g[0] += dx;
                    for ((g, &v), &s) in g[1..].iter_mut().zip(p).zip(&sums[o * f..(o + 1) * f]) {
                        *g += dx * (s - v * x);
                    }
                }
            });
        }
        loss * inv_b
    }

    fn outputs<'w>(&self, ws: &'w Workspace, i: usize) -> &'w [f64] {
        &ws.outputs[i * self.outputs..(i + 1) * self.outputs]
    }

    fn gradient(ws: &Workspace) -> &[f64] {
        &ws.gradient
    }

    fn touched(&self, ws: &Workspace) -> Option<Vec<std::ops::Range<usize>>> {
        if ws.every {
            return None;
        }
        let block = self.block();
        let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
        ranges.try_reserve_exact(ws.touched.len() + 1).ok()?;
        ranges.extend(ws.touched.iter().map(|&j| j * block..(j + 1) * block));
        ranges.push(self.bias_at()..self.params.len());
        Some(ranges)
    }

    /// Each stored value reads and writes its feature's block, three passes.
    fn work_per_row(&self, rows: &[Row]) -> usize {
        let widest = rows
            .iter()
            .map(|r| match r {
                Row::Dense(x) => x.len().min(self.n_features),
                Row::Sparse { indices, .. } => indices.len(),
            })
            .max()
            .unwrap_or(0);
        3 * (widest.max(1) * self.block() + self.outputs)
    }
}

impl Machine {
    /// Adds the features `rows` have values for to the batch's touched ones (every feature for
    /// a dense row), sorted and once each.
    fn note_touched(&self, rows: &[Row], ws: &mut Workspace) {
        if ws.every {
            return;
        }
        let mut values = 0;
        for row in rows {
            match row {
                Row::Dense(_) => {
                    ws.every = true;
                    return;
                }
                Row::Sparse { indices, .. } => values += indices.len(),
            }
        }
        if ws.touched.try_reserve(values).is_err() {
            ws.every = true;
            return;
        }
        for row in rows {
            if let Row::Sparse { indices, .. } = row {
                let inside = indices
                    .iter()
                    .map(|&j| j as usize)
                    .filter(|&j| j < self.n_features);
                ws.touched.extend(inside);
            }
        }
        ws.touched.sort_unstable();
        ws.touched.dedup();
    }
}

impl Trainable for Machine {
    fn try_copy(&self) -> Option<Machine> {
        let mut params = Vec::new();
        params.try_reserve_exact(self.params.len()).ok()?;
        params.extend_from_slice(&self.params);
        Some(Machine { params, ..*self })
    }

    /// `[n_features, factors, outputs]`, as its stored form says.
    fn shape(&self) -> (Option<Vec<usize>>, Option<Activation>) {
        (
            Some(vec![self.n_features, self.factors, self.outputs]),
            None,
        )
    }

    fn into_model(self, kind: ModelKind, target: Target) -> Model {
        let mut model = FmModel::new(kind, self);
        model.fold_target(target);
        Model::new(model)
    }
}
