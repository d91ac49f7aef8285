//! Mini-batches (batch_size > 1): per-tuple gradients are summed, then applied as one
//! averaged step by `flush_batch`. A batch may span buffers; sparse batches list the
//! features they touched so the flush and the reset cost O(touched · K), not O(d · K).

use super::regularization::clip;
use super::Trainer;
use crate::row::Row;

/// The partial mini-batch. Empty vectors when batch_size is 1 (only mini-batches need
/// the accumulators).
#[derive(Debug, Default)]
pub(super) struct MiniBatch {
    /// Σ g·x (K × d, row-major).
    pub grad_sum: Vec<f64>,
    /// Σ g per output.
    pub grad_bias_sum: Vec<f64>,
    /// Tuples in the batch.
    pub count: usize,
    /// Whether any g != 0.
    pub has_grad: bool,
    /// Whether the batch holds a dense row (then the flush updates every
    /// coordinate, else only `touched`).
    pub dense: bool,
    /// Sparse mini-batch: features with a gradient in the batch, and a mark per
    /// feature so each is listed once.
    pub touched: Vec<u32>,
    pub touched_mark: Vec<bool>,
}

impl MiniBatch {
    /// Adds one tuple's gradient to the sums (`d`: the model's features).
    #[inline]
    pub fn accumulate(&mut self, d: usize, row: Row, gz: &[f64]) {
        if let Row::Dense(_) = row {
            self.dense = true;
        }
        if !gz.iter().any(|&g| g != 0.0) {
            return;
        }
        match row {
            Row::Dense(x) => {
                for (k, &g) in gz.iter().enumerate() {
                    for (sj, &xj) in self.grad_sum[k * d..(k + 1) * d].iter_mut().zip(x) {
                        *sj += g * xj;
                    }
                }
            }
            Row::Sparse { indices, values } => {
                for (&j, &v) in indices.iter().zip(values) {
                    let ju = j as usize;
                    if !self.touched_mark[ju] {
                        self.touched_mark[ju] = true;
                        self.touched.push(j);
                    }
                    for (k, &g) in gz.iter().enumerate() {
                        self.grad_sum[k * d + ju] += g * v;
                    }
                }
            }
        }
        for (s, &g) in self.grad_bias_sum.iter_mut().zip(gz) {
            *s += g;
        }
        self.has_grad = true;
    }

    /// Empties the batch (zeroing only what it wrote) for a model of `d` features and
    /// `outputs` outputs.
    pub fn reset(&mut self, d: usize, outputs: usize) {
        if self.has_grad {
            if self.dense {
                self.grad_sum.iter_mut().for_each(|v| *v = 0.0);
            } else {
                for &j in &self.touched {
                    for k in 0..outputs {
                        self.grad_sum[k * d + j as usize] = 0.0;
                    }
                }
            }
        }
        for &j in &self.touched {
            self.touched_mark[j as usize] = false;
        }
        self.touched.clear();
        self.grad_bias_sum.iter_mut().for_each(|v| *v = 0.0);
        self.count = 0;
        self.has_grad = false;
        self.dense = false;
    }
}

impl Trainer {
    /// Applies the accumulated mini-batch, averaged over its actual size.
    pub(super) fn flush_batch(&mut self) {
        if self.batch.count == 0 {
            return;
        }
        let (lr, l2, l1) = (self.lr, self.config.l2, self.config.l1);
        let n = self.batch.count as f64;
        let shrink = 1.0 - lr * l2;
        let c = lr * l1;
        let d = self.model.n_features;
        let outputs = self.model.n_outputs;
        if self.batch.dense {
            if self.batch.has_grad || self.lazy {
                self.sync();
                let w = &mut self.model.weights;
                for (wj, &sj) in w.iter_mut().zip(&self.batch.grad_sum) {
                    *wj = *wj * shrink - lr * (sj / n);
                }
                if l1 != 0.0 {
                    w.iter_mut().for_each(|wj| *wj = clip(*wj, c));
                }
                self.work += w.len() as u64;
                self.update_bias_from_batch(n);
            }
        } else if self.batch.has_grad || self.lazy {
            // Touched coordinates were caught up when their tuples were seen
            // (`step` does not move within a batch).
            let w = &mut self.model.weights;
            for &j in &self.batch.touched {
                let j = j as usize;
                for k in 0..outputs {
                    let i = k * d + j;
                    w[i] = w[i] * shrink - lr * (self.batch.grad_sum[i] / n);
                    if l1 != 0.0 {
                        w[i] = clip(w[i], c);
                    }
                }
                if self.lazy {
                    self.last[j] = self.step + 1;
                }
            }
            self.work += (self.batch.touched.len() * outputs) as u64;
            self.update_bias_from_batch(n);
            if self.lazy {
                self.step += 1;
                self.pending = true;
            }
        }
        self.reset_batch();
    }

    fn update_bias_from_batch(&mut self, n: f64) {
        if self.config.fit_intercept {
            let lr = self.lr;
            for (b, &s) in self.model.bias.iter_mut().zip(&self.batch.grad_bias_sum) {
                *b -= lr * (s / n);
            }
        }
    }

    pub(super) fn reset_batch(&mut self) {
        self.batch
            .reset(self.model.n_features, self.model.n_outputs);
    }
}
