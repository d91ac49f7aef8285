//! The loop over epochs that every training runs — one process, parallel workers, or the
//! coordinator of a sharded table: its history, when it stops (the loss stopped moving), and
//! the per-epoch report lines. The drivers (in the backend) keep only what needs PostgreSQL:
//! reading the rows, meeting the other processes, raising errors.

use super::EpochStats;
use crate::scoring::ValidationStats;

/// One finished epoch.
#[derive(Clone, Debug)]
pub struct EpochRecord {
    pub stats: EpochStats,
    /// The training pass (reading, shuffling, SGD), without validation.
    pub seconds: f64,
    pub validation: Option<ValidationStats>,
    pub validation_seconds: f64,
}

/// Epochs `1..=epochs`, stopping early once the loss changed by less than `tolerance`
/// (0 = never) from one epoch to the next.
#[derive(Clone, Debug)]
pub struct EpochLoop {
    epochs: u32,
    tolerance: f64,
    history: Vec<EpochRecord>,
}

impl EpochLoop {
    pub fn new(epochs: u32, tolerance: f64) -> EpochLoop {
        EpochLoop {
            epochs,
            tolerance,
            history: Vec::new(),
        }
    }

    /// The epochs to run, unless [`record`](Self::record) says stop first.
    pub fn epochs(&self) -> std::ops::RangeInclusive<u32> {
        1..=self.epochs
    }

    /// Records a finished epoch; true when training stops after it (converged).
    pub fn record(&mut self, record: EpochRecord) -> bool {
        let converged = converged(
            self.history.last().map(|prev| prev.stats.loss),
            record.stats.loss,
            self.tolerance,
        );
        self.history.push(record);
        converged
    }

    pub fn history(&self) -> &[EpochRecord] {
        &self.history
    }

    pub fn into_history(self) -> Vec<EpochRecord> {
        self.history
    }
}

/// Early stop: the loss moved by less than `tolerance` since the previous epoch.
pub fn converged(previous_loss: Option<f64>, loss: f64, tolerance: f64) -> bool {
    tolerance > 0.0 && previous_loss.is_some_and(|prev| (prev - loss).abs() < tolerance)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// An epoch of 1,000 tuples, accuracy 0.75, 1.5 s.
    pub(in crate::trainer) fn record(epoch: u32, loss: f64) -> EpochRecord {
        EpochRecord {
            stats: EpochStats {
                epoch,
                loss,
                accuracy: Some(0.75),
                r2: None,
                tuples: 1000,
                learning_rate: 0.01,
            },
            seconds: 1.5,
            validation: None,
            validation_seconds: 0.0,
        }
    }

    #[test]
    fn stops_once_the_loss_stops_moving() {
        let mut run = EpochLoop::new(10, 0.01);
        assert_eq!(run.epochs(), 1..=10);
        assert!(!run.record(record(1, 0.5)));
        assert!(!run.record(record(2, 0.4)));
        assert!(run.record(record(3, 0.395)));
        assert_eq!(run.history().len(), 3);
        assert_eq!(run.into_history()[2].stats.loss, 0.395);
    }

    #[test]
    fn without_tolerance_it_never_stops_early() {
        let mut run = EpochLoop::new(3, 0.0);
        assert!(!run.record(record(1, 0.5)));
        assert!(!run.record(record(2, 0.5)));
        assert!(!converged(Some(1.0), 1.0, 0.0));
        assert!(!converged(None, 1.0, 1.0));
        assert!(converged(Some(1.0), 1.0, 1e-9));
    }
}
