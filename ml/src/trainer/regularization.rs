//! Lazy L1/L2 regularization for sparse rows.
//!
//! A sparse step only touches the row's coordinates; the decay `w ← w·(1-lr·l2)` and the
//! L1 clip `w ← clip(w, lr·l1)` that every other coordinate should have received are
//! owed: `Trainer::step` counts the sparse steps taken and `last[j]` records up to which
//! step coordinate j is current, so `catch_up` applies the missed steps at once (in closed
//! form when there are many, see [`pending_reg`]) before the coordinate is used, and
//! `sync` settles every coordinate (once per epoch, before dense steps, and before the
//! model is read).
//!
//! Without L1, with one output and batch_size 1, the weights are instead stored as `v`
//! with w = scale·v (`scaled_weights`): the per-step decay of every coordinate is one
//! multiply of `scale`, and `sync` folds it back into the weights.
//!
//! The state (`lazy`, `step`, `last`, `pending`, `scaled_weights`, `scale`) lives in
//! [`Trainer`] itself: the hot loop in `step`/`update` reads it next to the weights.

use super::Trainer;

/// `scale` below this is folded into the weights (keeps v = w/scale far from overflow).
pub(super) const MIN_SCALE: f64 = 1e-100;

/// Moves w toward 0 by `c`, stopping at 0.
#[inline]
pub(super) fn clip(w: f64, c: f64) -> f64 {
    if w > c {
        w - c
    } else if w < -c {
        w + c
    } else {
        0.0
    }
}

/// `k` regularization-only steps `w ← clip(w·s, c)`. Few steps are applied one
/// by one (bit-identical to the eager dense update); many in closed form:
/// |w| decreases monotonically, so after k steps it is
/// `s^k|w| - c(1 - s^k)/(1 - s)` (`|w| - ck` if s = 1), floored at 0.
#[inline]
pub(super) fn pending_reg(w: f64, k: u64, s: f64, c: f64) -> f64 {
    if k <= 16 || s <= 0.0 {
        let mut w = w;
        for _ in 0..k {
            w *= s;
            if c != 0.0 {
                w = clip(w, c);
            }
            if w == 0.0 {
                break;
            }
        }
        return w;
    }
    let sk = if k <= i32::MAX as u64 {
        s.powi(k as i32)
    } else {
        s.powf(k as f64)
    };
    if c == 0.0 {
        return w * sk;
    }
    let drop = if s == 1.0 {
        c * k as f64
    } else {
        c * (1.0 - sk) / (1.0 - s)
    };
    let a = (w.abs() * sk - drop).max(0.0);
    if w < 0.0 {
        -a
    } else {
        a
    }
}

impl Trainer {
    /// Lazy regularization: brings the coordinates of `indices` up to date by
    /// applying the decay/clipping of the steps they missed. The learning rate
    /// is constant within an epoch and every coordinate is synced before it
    /// changes, so k missed steps are k identical `w ← clip(w·(1-lr·l2), lr·l1)`.
    #[inline]
    pub(super) fn catch_up(&mut self, indices: &[u32]) {
        if !self.lazy {
            return;
        }
        for &j in indices {
            self.catch_up_one(j as usize);
        }
    }

    #[inline]
    fn catch_up_one(&mut self, j: usize) {
        let k = self.step - self.last[j];
        if k == 0 {
            return;
        }
        self.last[j] = self.step;
        let s = 1.0 - self.lr * self.config.l2;
        let c = self.lr * self.config.l1;
        let d = self.model.n_features;
        for r in 0..self.model.n_outputs {
            let i = r * d + j;
            let w = self.model.weights[i];
            // Zero stays zero; most coordinates of a huge sparse model are zero,
            // which keeps the per-epoch sync a cheap scan.
            if w != 0.0 {
                self.model.weights[i] = pending_reg(w, k, s, c);
                self.work += 1;
            }
        }
    }

    /// Per-step L2 decay factor of this epoch.
    #[inline]
    pub(super) fn shrink(&self) -> f64 {
        1.0 - self.lr * self.config.l2
    }

    /// Brings every coordinate up to date: O(d·K), once per epoch. A plain
    /// scan over `last` (zero weights stay zero), so it stays cheap for
    /// million-feature models.
    pub(super) fn sync(&mut self) {
        if !self.pending {
            return;
        }
        if self.scaled_weights {
            let s = self.scale;
            let mut work = 0;
            for w in self.model.weights.iter_mut().filter(|w| **w != 0.0) {
                *w *= s;
                work += 1;
            }
            self.work += work;
            self.scale = 1.0;
            self.pending = false;
            return;
        }
        let step = self.step;
        let s = self.shrink();
        let c = self.lr * self.config.l1;
        let d = self.model.n_features;
        let outputs = self.model.n_outputs;
        let w = &mut self.model.weights[..];
        let mut work = 0;
        if outputs == 1 {
            for (wj, last) in w.iter_mut().zip(self.last.iter_mut()) {
                let k = step - *last;
                *last = step;
                if k != 0 && *wj != 0.0 {
                    *wj = pending_reg(*wj, k, s, c);
                    work += 1;
                }
            }
        } else {
            for (j, last) in self.last.iter_mut().enumerate() {
                let k = step - *last;
                if k == 0 {
                    continue;
                }
                *last = step;
                for r in 0..outputs {
                    let wi = &mut w[r * d + j];
                    if *wi != 0.0 {
                        *wi = pending_reg(*wi, k, s, c);
                        work += 1;
                    }
                }
            }
        }
        self.work += work;
        self.pending = false;
    }
}
