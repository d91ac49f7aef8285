//! Per-epoch statistics: the sums gathered while training ([`EpochSums`]) and what
//! `finish_epoch` reports ([`EpochStats`]).

use crate::metrics::r2_score;
use crate::moments::Welford;

/// Statistics of one epoch, measured on each tuple with the model from before
/// that tuple's update (progressive validation).
#[derive(Clone, Debug, PartialEq)]
pub struct EpochStats {
    pub epoch: u32,
    /// Mean per-tuple loss (class-weighted) + 0.5·l2·‖W‖² + l1·‖W‖₁.
    /// Linear: the loss is 0.5·(z - y)², so the mean is half the MSE.
    pub loss: f64,
    /// Classifiers: fraction classified correctly (0 for an empty epoch).
    /// None for linear.
    pub accuracy: Option<f64>,
    /// Linear: 1 - SSE/SST over the epoch's tuples (SST == 0: 1 if SSE == 0
    /// else 0, like scikit-learn). None for classifiers and empty epochs.
    pub r2: Option<f64>,
    pub tuples: u64,
    pub learning_rate: f64,
}

/// Sums over the current epoch's tuples, each measured with the model from before its
/// update. Reset by `start_epoch`.
#[derive(Clone, Debug, Default)]
pub(super) struct EpochSums {
    /// Σ per-tuple loss (class-weighted).
    pub loss_sum: f64,
    /// Classifiers: tuples classified correctly.
    pub correct: u64,
    pub tuples: u64,
    /// Tuples with z == 0 this epoch while the label mapping was provisional;
    /// needed to fix `correct` if the mapping flips (see `Trainer::flip`).
    pub provisional_ties: u64,
    /// Linear: Σ(z - y)², and the Welford mean / M2 of y, for R².
    pub sse: f64,
    pub y: Welford,
}

impl EpochSums {
    /// Classifiers: fraction classified correctly (0 for an empty epoch).
    pub fn accuracy(&self) -> f64 {
        let n = self.tuples;
        if n > 0 {
            self.correct as f64 / n as f64
        } else {
            0.0
        }
    }

    /// Linear: R² over the epoch's tuples (see [`r2_score`]).
    pub fn r2(&self) -> f64 {
        r2_score(self.sse, self.y.m2())
    }
}
