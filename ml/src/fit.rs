//! The policy of a training, in one place for every driver (one process, its parallel workers,
//! the coordinator of a sharded table): which learner is which (a search's configurations,
//! the folds beside each, the groups beside the model of every row), what happens at the end
//! of each epoch (the records, patience and the best epoch's model, stopping, the NOTICE
//! lines), and what each learner ends as (its history, its folds' scores gathered on the
//! learner whose model is stored). The drivers keep the mechanics: reading the rows, the SGD
//! thread, meeting the other processes or shards, raising errors.
//!
//! A driver runs it as
//!
//! ```text
//! let mut fit = Fit::new(plan, tolerance, &patience, notices);
//! for epoch in 1..=epochs {
//!     ... train the learners on the epoch's rows, score the snapshots ...
//!     let actions = fit.end_epoch(EpochEnd { .. });
//!     ... stop `actions.stop`, send `actions.notices` ...
//!     if actions.done { break }
//! }
//! let finished = fit.finish(results, holdout_scores);
//! ```

use crate::params::search::SelectBy;
use crate::params::Configuration;
use crate::params::Patience;
use crate::scoring::ValidationStats;
use crate::trainer::{search_line, table_header, table_line, EpochRecord, EpochStats};
use crate::trainer::{LearnerRun, Stopped, TrainError};

#[cfg(test)]
mod tests;

/// Who each learner of a training is (all three the same length, one entry per learner, in the
/// order the trainer holds them).
#[derive(Clone, Debug, PartialEq)]
pub struct LearnerPlan {
    /// The configuration of the search it trains (0 without a search).
    pub configuration: Vec<usize>,
    /// With "folds": the fold it holds out; None for the configuration's model of every row.
    /// A configuration's fold learners come right before its model of every row.
    pub fold: Vec<Option<usize>>,
    /// With "group_by": its group; None for the model of every row.
    pub group: Vec<Option<u32>>,
}

impl LearnerPlan {
    /// One learner: the model of every row.
    pub fn one() -> LearnerPlan {
        LearnerPlan {
            configuration: vec![0],
            fold: vec![None],
            group: vec![None],
        }
    }

    pub fn len(&self) -> usize {
        self.configuration.len()
    }

    pub fn is_empty(&self) -> bool {
        self.configuration.is_empty()
    }

    /// Whether learner `i` makes a model that is stored (not a fold's, not a group's: a group's
    /// model is stored in its family, but reported by the group line).
    pub fn is_stored(&self, i: usize) -> bool {
        self.fold[i].is_none() && self.group[i].is_none()
    }
}

/// The NOTICE lines a training sends while it runs (none unless `verbose`).
#[derive(Clone, Debug)]
pub struct Notices {
    pub verbose: bool,
    /// The epochs asked for (`epoch 3/10`).
    pub epochs: u32,
    /// The kind's metric name (the table's column).
    pub metric: &'static str,
    /// A search: its configurations and how the best is chosen (one line per epoch instead of
    /// the table).
    pub search: Option<(Vec<Configuration>, SelectBy)>,
    /// Per-group models: how many groups have a model of their own (one line per epoch after
    /// the table's).
    pub groups: Option<usize>,
}

impl Notices {
    /// A training that reports nothing (or whose driver writes its own lines).
    pub fn quiet(epochs: u32) -> Notices {
        Notices {
            verbose: false,
            epochs,
            metric: "",
            search: None,
            groups: None,
        }
    }
}

/// One epoch's end, as the driver saw it: every learner's statistics (None: it stopped, or was
/// set aside here or in another process), the models it snapshot for validation and their
/// scores, and the time.
pub struct EpochEnd<M> {
    pub epoch: u32,
    pub stats: Vec<Option<EpochStats>>,
    /// Per learner, with patience: its model after the epoch (None when not asked for).
    pub snapshots: Vec<Option<M>>,
    /// Per learner: its model's scores on the validation rows.
    pub validations: Vec<Option<ValidationStats>>,
    /// The training pass, and one model's share of validation.
    pub seconds: f64,
    pub validation_seconds: f64,
}

/// What the driver does after an epoch.
#[derive(Debug, Default, PartialEq)]
pub struct EpochActions {
    /// The learners that train no more (converged, out of patience, or set aside in another
    /// process): each keeps its model as it is now.
    pub stop: Vec<usize>,
    /// The NOTICE lines to send, in order.
    pub notices: Vec<String>,
    /// Every learner is done: no more epochs.
    pub done: bool,
}

/// A learner whose model is stored, after the training: what the trainer made of it (`L`), its
/// history and, with patience, its best epoch's model (`M`).
pub struct Finished<L, M> {
    pub configuration: usize,
    pub group: Option<u32>,
    /// Set aside (diverged here or in another process), or the learner to make the model of.
    pub result: Result<L, TrainError>,
    /// Its seconds of arithmetic, its folds' included.
    pub seconds: f64,
    pub epochs: Vec<EpochRecord>,
    /// With patience: the epoch of the lowest validation loss and its model (the one to keep).
    pub best: Option<(u32, M)>,
    /// With "folds": each fold's model's score on the rows it held out (None: set aside).
    pub cv: Vec<Option<ValidationStats>>,
}

/// A training's policy: see the module's documentation.
pub struct Fit<M> {
    plan: LearnerPlan,
    runs: Vec<LearnerRun<M>>,
    /// With workers: the epoch each learner was set aside in another process.
    set_aside_elsewhere: Vec<Option<u32>>,
    notices: Notices,
}

impl<M> Fit<M> {
    /// `patience`: per configuration of the search (one without a search).
    pub fn new(
        plan: LearnerPlan,
        tolerance: f64,
        patience: &[Option<Patience>],
        notices: Notices,
    ) -> Fit<M> {
        let runs = plan
            .configuration
            .iter()
            .map(|&c| LearnerRun::new(tolerance, patience[c]))
            .collect();
        let set_aside_elsewhere = vec![None; plan.len()];
        Fit {
            plan,
            runs,
            set_aside_elsewhere,
            notices,
        }
    }

    /// Why the first stored learner (the model of every row, or the first configuration)
    /// stopped on its validation loss, if it did.
    pub fn stopped(&self) -> Option<Stopped> {
        (0..self.plan.len())
            .find(|&i| self.plan.is_stored(i))
            .and_then(|i| self.runs[i].stopped())
    }

    pub fn plan(&self) -> &LearnerPlan {
        &self.plan
    }

    /// With workers: learner `i` was set aside (it diverged) in another process in `epoch`; it
    /// is set aside here too, so that every process keeps the same models.
    pub fn set_aside_elsewhere(&mut self, i: usize, epoch: u32) {
        self.set_aside_elsewhere[i] = Some(epoch);
    }

    /// Records the epoch of every learner that trained in it, and says what to do next.
    pub fn end_epoch(&mut self, end: EpochEnd<M>) -> EpochActions {
        let EpochEnd {
            epoch,
            stats,
            snapshots,
            mut validations,
            seconds,
            validation_seconds,
        } = end;
        let mut actions = EpochActions::default();
        let searching = self.notices.search.is_some();
        let verbose = self.notices.verbose;
        // A search's stored models' validation scores (the search line names the best).
        let mut scored = Vec::new();
        let mut snapshots = snapshots.into_iter();
        for (i, stats) in stats.into_iter().enumerate() {
            let snapshot = snapshots.next().flatten();
            let run = &mut self.runs[i];
            // Stopped early or set aside (diverged): nothing more to record.
            let Some(stats) = stats else {
                if !run.is_done() && self.set_aside_elsewhere[i].is_some() {
                    actions.stop.push(i);
                }
                run.set_done();
                continue;
            };
            let record = EpochRecord {
                stats,
                seconds,
                validation: validations.get_mut(i).and_then(Option::take),
                validation_seconds,
            };
            // The NOTICE table follows the model of every row (the one stored).
            let stored = self.plan.is_stored(i);
            if verbose && !searching && stored {
                if epoch == 1 {
                    let validated = record.validation.is_some();
                    actions
                        .notices
                        .push(table_header(self.notices.metric, validated));
                }
                actions
                    .notices
                    .push(table_line(self.notices.epochs, &record));
            }
            if stored {
                scored.push((self.plan.configuration[i], record.validation.clone()));
            }
            if run.end_epoch(epoch, record, snapshot) {
                actions.stop.push(i);
                if let (true, true, Some(stopped)) = (verbose, stored && !searching, run.stopped())
                {
                    actions.notices.push(stopped.line());
                }
            }
        }
        if let (true, Some(kept)) = (verbose, self.notices.groups) {
            let going = self.runs.iter().skip(1).filter(|r| !r.is_done()).count();
            actions.notices.push(format!(
                "epoch {epoch}/{}: the model of every row and {going} of {kept} group models trained",
                self.notices.epochs
            ));
        }
        if let (true, Some((configurations, select_by))) = (verbose, &self.notices.search) {
            actions.notices.push(search_line(
                epoch,
                self.notices.epochs,
                &scored,
                configurations,
                *select_by,
            ));
        }
        actions.done = self.runs.iter().all(LearnerRun::is_done);
        actions
    }

    /// Each stored learner's end, from the trainer's `results` (per learner: what it made and
    /// its seconds) and the folds' scores on the rows they held out (`holdouts`, per learner;
    /// empty without folds). A configuration's folds' scores and seconds go to its model of
    /// every row; a learner set aside in another process is `TrainError::Diverged` in the
    /// epoch it was there.
    pub fn finish<L>(
        self,
        results: Vec<(Result<L, TrainError>, f64)>,
        holdouts: Vec<Option<ValidationStats>>,
    ) -> Vec<Finished<L, M>> {
        let mut holdouts = holdouts.into_iter();
        let mut finished = Vec::new();
        let mut cv = Vec::new();
        let mut fold_seconds = 0.0;
        for (i, ((result, seconds), run)) in results.into_iter().zip(self.runs).enumerate() {
            let holdout = holdouts.next().flatten();
            let result = match self.set_aside_elsewhere[i] {
                Some(epoch) => Err(TrainError::Diverged { epoch }),
                None => result,
            };
            if self.plan.fold[i].is_some() {
                cv.push(holdout);
                fold_seconds += seconds;
                continue;
            }
            let (epochs, best) = run.finish();
            finished.push(Finished {
                configuration: self.plan.configuration[i],
                group: self.plan.group[i],
                result,
                seconds: seconds + std::mem::take(&mut fold_seconds),
                epochs,
                best,
                cv: std::mem::take(&mut cv),
            });
        }
        finished
    }
}
