//! SGD trainer for binary linear models.
//!
//! The caller drives epochs: `start_epoch`, any number of `train_buffer` calls
//! (one per filled CorgiPile buffer), then `finish_epoch`. Mini-batches may span
//! buffers; label values are mapped to ±1 on the fly (see [`Trainer::label_map`]).

use crate::arena::TupleArena;
use crate::model::{sign, LinearModel, ModelKind};

#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub kind: ModelKind,
    pub learning_rate: f64,
    /// Per-epoch learning-rate multiplier.
    pub decay: f64,
    /// L2 regularization strength (weights only, not the bias).
    pub l2: f64,
    pub batch_size: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct EpochStats {
    pub epoch: u32,
    /// Mean per-tuple loss (model before each tuple's update) + 0.5·l2·‖w‖².
    pub loss: f64,
    /// Fraction of tuples classified correctly before their update.
    pub accuracy: f64,
    pub tuples: u64,
    pub learning_rate: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TrainError {
    /// A third distinct raw label value was seen: the two known ones, then the
    /// new one. A NaN label is reported this way too (with NaN as the new value).
    TooManyLabels { values: [f64; 3] },
    /// Loss or weights became NaN or infinite.
    Diverged { epoch: u32 },
}

impl TrainError {
    /// A suggestion for the user, suitable for an error HINT.
    pub fn hint(&self) -> &'static str {
        match self {
            TrainError::TooManyLabels { .. } => {
                "svm and logistic are binary classifiers: the label column must hold exactly two distinct values"
            }
            TrainError::Diverged { .. } => {
                "lower learning_rate, raise l2, or scale the features to a smaller range"
            }
        }
    }
}

impl std::fmt::Display for TrainError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrainError::TooManyLabels { values: [a, b, c] } => {
                if c.is_nan() {
                    write!(f, "label value NaN is not a valid class label")
                } else {
                    write!(
                        f,
                        "label column has more than two distinct values (found {a}, {b} and {c})"
                    )
                }
            }
            TrainError::Diverged { epoch } => {
                write!(
                    f,
                    "training diverged in epoch {epoch}: loss or weights became NaN or infinite"
                )
            }
        }
    }
}

impl std::error::Error for TrainError {}

/// What is known about the raw label values.
#[derive(Clone, Copy, Debug)]
enum Labels {
    None,
    /// One value seen, mapped provisionally to `y` (≤ 0 → -1, else +1).
    One {
        value: f64,
        y: f64,
    },
    /// Final mapping: `neg` → -1, `pos` → +1, `neg < pos`.
    Two {
        neg: f64,
        pos: f64,
    },
}

pub struct Trainer {
    config: TrainConfig,
    model: LinearModel,
    labels: Labels,

    epoch: u32,
    lr: f64,
    loss_sum: f64,
    correct: u64,
    tuples: u64,
    /// Tuples with z == 0 this epoch while the label mapping was provisional;
    /// needed to fix `correct` if the mapping flips (see `flip`).
    provisional_ties: u64,

    /// Partial mini-batch: Σ g·x, Σ g, tuple count, and whether any g != 0.
    grad_sum: Vec<f64>,
    grad_bias_sum: f64,
    batch_count: usize,
    batch_has_grad: bool,
}

impl Trainer {
    /// A zero model, ready for epoch 1 (calling `start_epoch(1)` is still expected).
    pub fn new(config: TrainConfig, n_features: usize) -> Self {
        assert!(config.batch_size >= 1, "batch_size must be >= 1");
        let kind = config.kind;
        let mut t = Trainer {
            model: LinearModel::new(kind, n_features),
            // Only mini-batches need the accumulator.
            grad_sum: if config.batch_size > 1 {
                vec![0.0; n_features]
            } else {
                Vec::new()
            },
            config,
            labels: Labels::None,
            epoch: 1,
            lr: 0.0,
            loss_sum: 0.0,
            correct: 0,
            tuples: 0,
            provisional_ties: 0,
            grad_bias_sum: 0.0,
            batch_count: 0,
            batch_has_grad: false,
        };
        t.start_epoch(1);
        t
    }

    /// Begins `epoch` (>= 1): sets its learning rate `learning_rate·decay^(epoch-1)`
    /// and resets the epoch's sums. A partial mini-batch left over without
    /// `finish_epoch` is discarded.
    pub fn start_epoch(&mut self, epoch: u32) {
        assert!(epoch >= 1, "epochs start at 1");
        self.epoch = epoch;
        self.lr = self.config.learning_rate * self.config.decay.powf(f64::from(epoch - 1));
        self.loss_sum = 0.0;
        self.correct = 0;
        self.tuples = 0;
        self.provisional_ties = 0;
        self.reset_batch();
    }

    /// Trains on the arena's tuples in `order` (a permutation of `0..len`) or in
    /// storage order. Stops at the first error.
    pub fn train_buffer(
        &mut self,
        arena: &TupleArena,
        order: Option<&[u32]>,
    ) -> Result<(), TrainError> {
        debug_assert_eq!(arena.n_features(), self.model.weights.len());
        match order {
            Some(order) => {
                assert_eq!(
                    order.len(),
                    arena.len(),
                    "order must be a permutation of the arena"
                );
                for &i in order {
                    let i = i as usize;
                    self.step(arena.features(i), arena.label(i))?;
                }
            }
            None => {
                for i in 0..arena.len() {
                    self.step(arena.features(i), arena.label(i))?;
                }
            }
        }
        Ok(())
    }

    /// Flushes the partial mini-batch and returns the epoch's statistics.
    pub fn finish_epoch(&mut self) -> Result<EpochStats, TrainError> {
        self.flush_batch();
        let mean_loss = if self.tuples > 0 {
            self.loss_sum / self.tuples as f64
        } else {
            0.0
        };
        let w = &self.model.weights;
        let loss = mean_loss + 0.5 * self.config.l2 * crate::model::dot(w, w);
        let finite =
            loss.is_finite() && self.model.bias.is_finite() && w.iter().all(|v| v.is_finite());
        if !finite {
            return Err(TrainError::Diverged { epoch: self.epoch });
        }
        Ok(EpochStats {
            epoch: self.epoch,
            loss,
            accuracy: if self.tuples > 0 {
                self.correct as f64 / self.tuples as f64
            } else {
                0.0
            },
            tuples: self.tuples,
            learning_rate: self.lr,
        })
    }

    pub fn model(&self) -> &LinearModel {
        &self.model
    }

    /// `(negative, positive)`: the raw label values mapped to -1 and +1.
    /// None unless two distinct values have been seen.
    pub fn label_map(&self) -> Option<(f64, f64)> {
        match self.labels {
            Labels::Two { neg, pos } => Some((neg, pos)),
            _ => None,
        }
    }

    /// Distinct raw label values seen so far, ascending (0, 1 or 2 of them).
    pub fn labels_seen(&self) -> Vec<f64> {
        match self.labels {
            Labels::None => Vec::new(),
            Labels::One { value, .. } => vec![value],
            Labels::Two { neg, pos } => vec![neg, pos],
        }
    }

    /// One SGD step on one tuple.
    #[inline]
    fn step(&mut self, x: &[f64], raw_label: f64) -> Result<(), TrainError> {
        let y = self.map_label(raw_label)?;
        let kind = self.config.kind;
        let z = self.model.decision(x);
        if !z.is_finite() {
            return Err(TrainError::Diverged { epoch: self.epoch });
        }

        self.loss_sum += kind.loss(z, y);
        if sign(z) == y {
            self.correct += 1;
        }
        if z == 0.0 && matches!(self.labels, Labels::One { .. }) {
            self.provisional_ties += 1;
        }
        self.tuples += 1;

        let g = kind.dloss_dz(z, y);
        let lr = self.lr;
        let l2 = self.config.l2;
        if self.config.batch_size == 1 {
            if g == 0.0 && l2 == 0.0 {
                return Ok(()); // hinge outside the margin: nothing changes
            }
            let step = lr * g;
            let w = &mut self.model.weights;
            if l2 == 0.0 {
                for (wj, &xj) in w.iter_mut().zip(x) {
                    *wj -= step * xj;
                }
            } else {
                let shrink = 1.0 - lr * l2;
                for (wj, &xj) in w.iter_mut().zip(x) {
                    *wj = *wj * shrink - step * xj;
                }
            }
            self.model.bias -= step;
        } else {
            if g != 0.0 {
                for (sj, &xj) in self.grad_sum.iter_mut().zip(x) {
                    *sj += g * xj;
                }
                self.grad_bias_sum += g;
                self.batch_has_grad = true;
            }
            self.batch_count += 1;
            if self.batch_count == self.config.batch_size {
                self.flush_batch();
            }
        }
        Ok(())
    }

    /// Applies the accumulated mini-batch, averaged over its actual size.
    fn flush_batch(&mut self) {
        if self.batch_count == 0 {
            return;
        }
        let lr = self.lr;
        let l2 = self.config.l2;
        if self.batch_has_grad || l2 != 0.0 {
            let n = self.batch_count as f64;
            let shrink = 1.0 - lr * l2;
            for (wj, &sj) in self.model.weights.iter_mut().zip(&self.grad_sum) {
                *wj = *wj * shrink - lr * (sj / n);
            }
            self.model.bias -= lr * (self.grad_bias_sum / n);
        }
        self.reset_batch();
    }

    fn reset_batch(&mut self) {
        if self.batch_has_grad {
            self.grad_sum.iter_mut().for_each(|v| *v = 0.0);
        }
        self.grad_bias_sum = 0.0;
        self.batch_count = 0;
        self.batch_has_grad = false;
    }

    /// Maps a raw label to ±1, learning the mapping as values arrive.
    #[inline]
    fn map_label(&mut self, raw: f64) -> Result<f64, TrainError> {
        match self.labels {
            Labels::Two { neg, pos } => {
                if raw == neg {
                    Ok(-1.0)
                } else if raw == pos {
                    Ok(1.0)
                } else {
                    Err(TrainError::TooManyLabels {
                        values: [neg, pos, raw],
                    })
                }
            }
            Labels::One { value, y } => {
                if raw == value {
                    return Ok(y);
                }
                if raw.is_nan() {
                    return Err(TrainError::TooManyLabels {
                        values: [value, f64::NAN, f64::NAN],
                    });
                }
                let (neg, pos) = if value < raw {
                    (value, raw)
                } else {
                    (raw, value)
                };
                let y_value = if value == neg { -1.0 } else { 1.0 };
                if y_value != y {
                    self.flip(y);
                }
                self.labels = Labels::Two { neg, pos };
                Ok(if raw == neg { -1.0 } else { 1.0 })
            }
            Labels::None => {
                if raw.is_nan() {
                    return Err(TrainError::TooManyLabels {
                        values: [f64::NAN; 3],
                    });
                }
                // Guess: labels like -1/0/false are usually the negative class.
                let y = if raw <= 0.0 { -1.0 } else { 1.0 };
                self.labels = Labels::One { value: raw, y };
                Ok(y)
            }
        }
    }

    /// The provisional label (`wrong_y`) of every tuple seen so far was the
    /// negation of the true one. Both losses satisfy loss(z,y) = loss(-z,-y) and
    /// dloss(-z,-y) = -dloss(z,y), and IEEE arithmetic commutes with negation, so
    /// training with all labels negated produces exactly the negated model (and
    /// negated gradient sums). Negating them therefore yields bit-for-bit the
    /// state of a run that knew the mapping from the start (up to the sign of
    /// weights that are exactly zero).
    fn flip(&mut self, wrong_y: f64) {
        for w in &mut self.model.weights {
            *w = -*w;
        }
        self.model.bias = -self.model.bias;
        for s in &mut self.grad_sum {
            *s = -*s;
        }
        self.grad_bias_sum = -self.grad_bias_sum;
        // z == 0 predicts +1 in both runs, so ties are the one place where
        // "correct" is not symmetric: they were right iff the provisional y was +1.
        if wrong_y > 0.0 {
            self.correct -= self.provisional_ties;
        } else {
            self.correct += self.provisional_ties;
        }
        self.provisional_ties = 0;
    }
}
