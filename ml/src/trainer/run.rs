//! The loop over epochs that every training runs — one process, parallel workers, or the
//! coordinator of a sharded table: its history, when it stops (the loss stopped moving), and
//! the per-epoch report lines. The drivers (in the backend) keep only what needs PostgreSQL:
//! reading the rows, meeting the other processes, raising errors.

use super::EpochStats;
use crate::params::Patience;
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

/// Finished epochs, and whether the loss changed by less than `tolerance` (0 = never) from one
/// epoch to the next (the driver runs epochs `1..=epochs` and stops early when it did).
#[derive(Clone, Debug)]
pub(crate) struct EpochLoop {
    tolerance: f64,
    history: Vec<EpochRecord>,
}

impl EpochLoop {
    pub fn new(tolerance: f64) -> EpochLoop {
        EpochLoop {
            tolerance,
            history: Vec::new(),
        }
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

    pub fn into_history(self) -> Vec<EpochRecord> {
        self.history
    }
}

/// One learner's run through a training's epochs (a configuration of a search, a fold, a
/// group, or the one model): its [`EpochLoop`], early stopping on the validation loss after
/// `patience` epochs without improvement (the best epoch's model kept, `M`: a snapshot of
/// it), and whether it is done — converged, out of patience, or set aside by its driver. The
/// driver (one process, or a shard coordinator) asks it after every epoch whether to go on.
#[derive(Clone, Debug)]
pub struct LearnerRun<M> {
    epochs: EpochLoop,
    patience: Option<Patience>,
    /// With patience: the lowest validation loss, its epoch and that epoch's model.
    best: Option<(f64, u32, M)>,
    /// Why it stopped on its validation loss, once it has.
    stopped: Option<Stopped>,
    done: bool,
}

/// A learner stopped by its patience: after `epoch`, `patience` epochs after its `best_epoch`
/// (whose model it keeps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stopped {
    pub epoch: u32,
    pub best_epoch: u32,
    pub patience: u32,
}

impl Stopped {
    /// The NOTICE line that says when and why a training stopped.
    pub fn line(&self) -> String {
        format!(
            "stopped after epoch {}: the validation loss did not improve for {} epochs; the model of epoch {} (the lowest validation loss) is kept",
            self.epoch, self.patience, self.best_epoch
        )
    }
}

impl<M> LearnerRun<M> {
    pub fn new(tolerance: f64, patience: Option<Patience>) -> LearnerRun<M> {
        LearnerRun {
            epochs: EpochLoop::new(tolerance),
            patience,
            best: None,
            stopped: None,
            done: false,
        }
    }

    /// Whether it trains no more.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// It trains no more (set aside: diverged here or in another process).
    pub fn set_done(&mut self) {
        self.done = true;
    }

    /// Records epoch `epoch` (its `record`; `snapshot`: the model after it, needed only with
    /// patience and validation). True when the learner stops after it: converged, or
    /// `patience` epochs after its best validation loss; it is then done.
    pub fn end_epoch(&mut self, epoch: u32, record: EpochRecord, snapshot: Option<M>) -> bool {
        let mut patience_ran_out = false;
        if let (Some(patience), Some(v), Some(model)) =
            (self.patience, &record.validation, snapshot)
        {
            let improved = v.loss.is_finite()
                && self
                    .best
                    .as_ref()
                    .is_none_or(|b| patience.improves(v.loss, b.0));
            if improved {
                self.best = Some((v.loss, epoch, model));
            } else if let Some((_, best_epoch, _)) = &self.best {
                patience_ran_out = epoch - best_epoch >= patience.epochs(record.stats.tuples);
                if patience_ran_out {
                    self.stopped = Some(Stopped {
                        epoch,
                        best_epoch: *best_epoch,
                        patience: epoch - best_epoch,
                    });
                }
            }
        }
        if self.epochs.record(record) || patience_ran_out {
            self.done = true;
        }
        self.done
    }

    /// Why it stopped on its validation loss, if it did.
    pub fn stopped(&self) -> Option<Stopped> {
        self.stopped
    }

    /// With patience: the epoch of the lowest validation loss so far.
    pub fn best_epoch(&self) -> Option<u32> {
        self.best.as_ref().map(|(_, epoch, _)| *epoch)
    }

    /// The run's history, and with patience the best epoch and its model (the one to keep).
    pub fn finish(self) -> (Vec<EpochRecord>, Option<(u32, M)>) {
        let best = self.best.map(|(_, epoch, model)| (epoch, model));
        (self.epochs.into_history(), best)
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
            stats: crate::test_rows::epoch_stats(epoch, loss),
            seconds: 1.5,
            validation: None,
            validation_seconds: 0.0,
        }
    }

    #[test]
    fn stops_once_the_loss_stops_moving() {
        let mut run = EpochLoop::new(0.01);
        assert!(!run.record(record(1, 0.5)));
        assert!(!run.record(record(2, 0.4)));
        assert!(run.record(record(3, 0.395)));
        let history = run.into_history();
        assert_eq!(history.len(), 3);
        assert_eq!(history[2].stats.loss, 0.395);
    }

    /// An epoch whose validation loss is `validation`.
    fn validated(epoch: u32, loss: f64, validation: f64) -> EpochRecord {
        let mut r = record(epoch, loss);
        r.validation = Some(ValidationStats {
            loss: validation,
            ..ValidationStats::empty()
        });
        r
    }

    #[test]
    fn patience_keeps_the_best_epochs_model_and_stops_after_it() {
        let mut run: LearnerRun<&str> = LearnerRun::new(0.0, Some(Patience::Epochs(2)));
        assert!(!run.end_epoch(1, validated(1, 0.9, 0.50), Some("m1")));
        assert!(!run.end_epoch(2, validated(2, 0.8, 0.40), Some("m2")));
        assert!(!run.end_epoch(3, validated(3, 0.7, 0.45), Some("m3")));
        assert_eq!(run.best_epoch(), Some(2));
        // A NaN validation loss is no improvement.
        assert!(run.end_epoch(4, validated(4, 0.6, f64::NAN), Some("m4")));
        assert!(run.is_done());
        assert_eq!(
            run.stopped(),
            Some(Stopped {
                epoch: 4,
                best_epoch: 2,
                patience: 2
            })
        );
        let (history, best) = run.finish();
        assert_eq!(history.len(), 4);
        assert_eq!(best, Some((2, "m2")));
    }

    /// An epoch of `tuples` training rows whose validation loss is `validation`.
    fn validated_rows(epoch: u32, tuples: u64, validation: f64) -> EpochRecord {
        let mut r = validated(epoch, 0.5, validation);
        r.stats.tuples = tuples;
        r
    }

    #[test]
    fn auto_patience_waits_for_about_six_hundred_thousand_rows_and_a_real_improvement() {
        // 1,000 rows an epoch: 10 epochs (the most); 4.5M rows: 2 (the fewest); 100,000: 6.
        assert_eq!(Patience::Auto.epochs(1_000), 10);
        assert_eq!(Patience::Auto.epochs(4_500_000), 2);
        assert_eq!(Patience::Auto.epochs(100_000), 6);
        assert_eq!(Patience::Auto.epochs(0), 10);
        assert_eq!(Patience::Epochs(7).epochs(4_500_000), 7);
        // An improvement of less than 0.01% of the best is none.
        assert!(!Patience::Auto.improves(0.99995, 1.0));
        assert!(Patience::Auto.improves(0.9998, 1.0));
        assert!(Patience::Epochs(1).improves(0.99995, 1.0));

        // A big table: stops two epochs after its best, though the loss still creeps down.
        let mut run: LearnerRun<u32> = LearnerRun::new(0.0, Some(Patience::Auto));
        let losses = [0.5, 0.4, 0.39999, 0.399989, 0.3];
        let mut stopped_at = None;
        for (i, &loss) in losses.iter().enumerate() {
            let epoch = i as u32 + 1;
            if run.end_epoch(epoch, validated_rows(epoch, 4_500_000, loss), Some(epoch)) {
                stopped_at = Some(epoch);
                break;
            }
        }
        assert_eq!(stopped_at, Some(4));
        assert_eq!(run.finish().1, Some((2, 2)));

        // A small table waits ten epochs.
        let mut run: LearnerRun<u32> = LearnerRun::new(0.0, Some(Patience::Auto));
        assert!(!run.end_epoch(1, validated_rows(1, 5_000, 0.5), Some(1)));
        for epoch in 2..=10 {
            assert!(!run.end_epoch(epoch, validated_rows(epoch, 5_000, 0.6), Some(epoch)));
        }
        assert!(run.end_epoch(11, validated_rows(11, 5_000, 0.6), Some(11)));
        assert_eq!(
            run.stopped().map(|s| (s.epoch, s.best_epoch, s.patience)),
            Some((11, 1, 10))
        );
    }

    #[test]
    fn a_run_stops_on_convergence_or_when_set_aside() {
        let mut run: LearnerRun<()> = LearnerRun::new(0.01, None);
        assert!(!run.end_epoch(1, record(1, 0.5), None));
        assert!(run.end_epoch(2, record(2, 0.495), None));
        let mut run: LearnerRun<()> = LearnerRun::new(0.0, Some(Patience::Epochs(1)));
        // Without a validation loss, patience never runs out.
        for epoch in 1..=5 {
            assert!(!run.end_epoch(epoch, record(epoch, 0.5), Some(())));
        }
        run.set_done();
        assert!(run.is_done() && run.best_epoch().is_none());
        assert_eq!(run.finish().1, None);
    }

    #[test]
    fn without_tolerance_it_never_stops_early() {
        let mut run = EpochLoop::new(0.0);
        assert!(!run.record(record(1, 0.5)));
        assert!(!run.record(record(2, 0.5)));
        assert!(!converged(Some(1.0), 1.0, 0.0));
        assert!(!converged(None, 1.0, 1.0));
        assert!(converged(Some(1.0), 1.0, 1e-9));
    }
}
