//! The plain SGD update of one tuple (batch_size 1): dense rows eagerly, sparse rows on
//! their coordinates only (lazy regularization or scaled weights, see `regularization`).
//! Part of the hot loop: inlined into `Trainer::step`.

use super::regularization::{clip, MIN_SCALE};
use super::Trainer;
use crate::row::{sparse_axpy, Row};

impl Trainer {
    /// Plain SGD update with the output gradients `gz`.
    #[inline(always)]
    pub(super) fn update(&mut self, row: Row, gz: &[f64]) {
        let any_grad = gz.iter().any(|&g| g != 0.0);
        if !any_grad && !self.lazy {
            return; // e.g. hinge outside the margin: nothing changes
        }
        let (lr, l2, l1) = (self.lr, self.config.l2, self.config.l1);
        let shrink = 1.0 - lr * l2;
        let c = lr * l1;
        let d = self.model.n_features;
        let w = &mut self.model.weights;
        match row {
            Row::Dense(x) => {
                for (k, &g) in gz.iter().enumerate() {
                    let step = lr * g;
                    let wk = &mut w[k * d..(k + 1) * d];
                    if l2 == 0.0 {
                        for (wj, &xj) in wk.iter_mut().zip(x) {
                            *wj -= step * xj;
                        }
                    } else {
                        for (wj, &xj) in wk.iter_mut().zip(x) {
                            *wj = *wj * shrink - step * xj;
                        }
                    }
                    if l1 != 0.0 {
                        wk.iter_mut().for_each(|wj| *wj = clip(*wj, c));
                    }
                }
                self.work += (gz.len() * d) as u64;
            }
            Row::Sparse { indices, values } if self.scaled_weights => {
                // w ← w·shrink − lr·g·x for every coordinate, as scale ← scale·shrink and
                // v ← v − lr·g·x / scale on the row's coordinates only.
                if l2 != 0.0 {
                    self.scale *= shrink;
                    self.pending = true;
                }
                if any_grad {
                    sparse_axpy(w, -(lr * gz[0] / self.scale), indices, values);
                    self.work += indices.len() as u64;
                }
                if self.scale < MIN_SCALE {
                    self.sync();
                }
            }
            Row::Sparse { indices, values } => {
                if any_grad && gz.len() == 1 {
                    // The common case, with hoisted branches and plain slices.
                    let step = lr * gz[0];
                    let next = self.step + 1;
                    let last = &mut self.last[..];
                    let w = &mut w[..];
                    match (l2 != 0.0, l1 != 0.0) {
                        (false, false) => {
                            for (&j, &v) in indices.iter().zip(values) {
                                w[j as usize] -= step * v;
                            }
                        }
                        (true, false) => {
                            for (&j, &v) in indices.iter().zip(values) {
                                let j = j as usize;
                                w[j] = w[j] * shrink - step * v;
                                last[j] = next;
                            }
                        }
                        (has_l2, true) => {
                            for (&j, &v) in indices.iter().zip(values) {
                                let j = j as usize;
                                let wj = if has_l2 {
                                    w[j] * shrink - step * v
                                } else {
                                    w[j] - step * v
                                };
                                w[j] = clip(wj, c);
                                last[j] = next;
                            }
                        }
                    }
                    self.work += indices.len() as u64;
                } else if any_grad {
                    for (&j, &v) in indices.iter().zip(values) {
                        let j = j as usize;
                        for (k, &g) in gz.iter().enumerate() {
                            let wj = &mut w[k * d + j];
                            let step = lr * g;
                            if l2 == 0.0 {
                                *wj -= step * v;
                            } else {
                                *wj = *wj * shrink - step * v;
                            }
                            if l1 != 0.0 {
                                *wj = clip(*wj, c);
                            }
                        }
                        if self.lazy {
                            self.last[j] = self.step + 1;
                        }
                    }
                    self.work += (gz.len() * indices.len()) as u64;
                }
                // Everything else falls one step behind.
                if self.lazy {
                    self.step += 1;
                    self.pending = true;
                }
            }
        }
        if self.config.fit_intercept {
            for (b, &g) in self.model.bias.iter_mut().zip(gz) {
                *b -= lr * g;
            }
        }
    }
}
