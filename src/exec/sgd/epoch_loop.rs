//! The epochs of a training: each a pass of the rows through the learners (on the SGD thread
//! or the backend, see `epochs.rs`), its statistics (every process's, with workers), the check
//! that it read the rows the first epoch read, validation, and then what the training's policy
//! (`corgipile_ml::fit::Fit`) says to do.

use super::collect::CollectedRows;
use super::double_buffer::{raise_reply, Job, Worker};
use super::side_by_side::copy_scaling;
use super::SgdNode;
use crate::exec::tuple_shuffle::{ShuffledBuffer, TupleShuffle};
use crate::parallel::Team;
use crate::pg::error::{notice, raise_train_error};
use crate::pg::progress;
use crate::pipeline::EpochCounts;
use corgipile_ml::fit::{EpochEnd, Fit};
use corgipile_ml::scoring::ValidationStats;
use corgipile_ml::standardize::Standardizer;
use corgipile_ml::trained::Model;
use corgipile_ml::trainer::{EpochStats, TrainError};
use corgipile_ml::trials::Trials;
use pgrx::pg_sys;
use std::time::Instant;

/// Where the learners train: on the SGD thread while the backend reads (double-buffered), or
/// on the backend between its reads.
pub(super) enum Sgd {
    Thread(Worker),
    Backend(Trials),
}

impl Sgd {
    pub(super) fn new(trainer: Trials, double_buffer: bool) -> Sgd {
        if double_buffer {
            Sgd::Thread(Worker::spawn(trainer))
        } else {
            Sgd::Backend(trainer)
        }
    }

    /// The learners, back on the backend (the SGD thread ended).
    pub(super) fn finish(self) -> Trials {
        match self {
            Sgd::Thread(w) => w.finish(),
            Sgd::Backend(t) => t,
        }
    }
}

/// One epoch's pass as the learners saw it, before the other processes' are added.
struct Pass {
    stats: Vec<Option<EpochStats>>,
    /// Binary kinds: the label values seen.
    labels_seen: Vec<f64>,
    /// With validation: every learner's model after the epoch (None: it stopped).
    snapshots: Option<Vec<Option<Model>>>,
    /// The rows the pass read, when the next pass's scan has begun already.
    counts: Option<EpochCounts>,
}

/// The reading side between epochs: the next epoch's first buffer when it was read ahead, and
/// the buffers the learners are done with.
struct Reading {
    first: Option<ShuffledBuffer>,
    spares: Vec<ShuffledBuffer>,
    /// The scan of the epoch to come has begun (its first buffer filled during the last one).
    rescanned: bool,
}

/// The rows a training read: the last epoch's, and the rows the first skipped.
pub(super) struct RowsRead {
    pub(super) trained: u64,
    pub(super) skipped: u64,
}

impl SgdNode {
    /// Every epoch, until the policy says every learner is done. `first`: epoch 1's first
    /// buffer (read to learn the rows' width), whose reading began at `first_started`.
    ///
    /// # Safety
    /// With a team: its `shared_models` laid out one model per learner of `fit`, and every
    /// process of the team runs these epochs alike (the epochs of [`Team::end_epoch`] and the
    /// rounds of [`Team::gather`] must match across the processes).
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn run_epochs(
        &mut self,
        sgd: &mut Sgd,
        fit: &mut Fit<Model>,
        team: Option<&Team>,
        first: Option<ShuffledBuffer>,
        first_started: Instant,
        validation_rows: Option<&CollectedRows>,
        standardizer: Option<&Standardizer>,
    ) -> RowsRead {
        let params = self.config.params.clone();
        let shuffle = self.shuffle();
        let mut read = RowsRead {
            trained: 0,
            skipped: 0,
        };
        let mut reading = Reading {
            first,
            spares: Vec::new(),
            rescanned: false,
        };
        for epoch in 1..=params.epochs {
            let epoch_started = if epoch == 1 {
                first_started
            } else {
                Instant::now()
            };
            progress::epoch_started(epoch);
            if epoch > 1 && !reading.rescanned {
                pg_sys::ExecReScan(self.child);
            }
            if params.folds.unwrap_or(0) > 0 && epoch == params.epochs {
                // The last epoch: each fold's learner scores the rows it holds out.
                let scaling = standardizer.map(copy_scaling);
                match sgd {
                    Sgd::Thread(w) => w
                        .send(Job::ScoreHoldouts(scaling))
                        .unwrap_or_else(|r| raise_reply(r, &self.label_text(), params.normalize)),
                    Sgd::Backend(t) => t.score_holdouts(scaling),
                }
            }
            // Double-buffered, one process: the first buffer of the next epoch is filled while
            // the worker trains this epoch's last one (with workers, epochs end together).
            let fill_next = team.is_none() && epoch < params.epochs;
            let pass = self.pass(sgd, shuffle, &mut reading, epoch, fill_next);
            let Pass {
                mut stats,
                labels_seen,
                snapshots,
                counts,
            } = pass;
            // With workers: the whole epoch's (every process waits here for the others).
            let (counts, labels_seen) = match team {
                Some(t) => {
                    let whole = t.end_epoch(epoch, &stats, shuffle.counts(), &labels_seen);
                    // A model set aside in another process (it diverged there) is set aside
                    // here too: every process keeps the same models.
                    for (i, (mine, all)) in stats.iter().zip(&whole.stats).enumerate() {
                        if mine.is_some() && all.is_none() {
                            fit.set_aside_elsewhere(i, epoch);
                        }
                    }
                    stats = whole.stats;
                    (whole.counts, whole.labels_seen)
                }
                None => (
                    counts.unwrap_or_else(|| shuffle.counts()),
                    labels_seen.len(),
                ),
            };
            self.check_epoch_rows(epoch, &counts, labels_seen);
            read.trained = counts.rows;
            if epoch == 1 {
                read.skipped = counts.rows_skipped;
            }
            let seconds = epoch_started.elapsed().as_secs_f64();
            if let Some(s) = stats.iter().flatten().next() {
                progress::epoch_finished(s.loss);
                self.last_stats = Some(s.clone());
            }
            self.epoch_seconds.push(seconds);
            let (snapshots, validations, validation_seconds) = self.validate_epoch(
                snapshots,
                &stats,
                standardizer,
                validation_rows,
                team.filter(|_| params.validation.is_some())
                    .map(|t| (t, 2 * epoch)),
                fit.plan().len(),
            );
            let actions = fit.end_epoch(EpochEnd {
                epoch,
                stats,
                snapshots,
                validations,
                seconds,
                validation_seconds,
            });
            for i in actions.stop {
                self.stop_learner(sgd, i);
            }
            actions.notices.into_iter().for_each(notice);
            self.epochs_run = epoch;
            if actions.done {
                break;
            }
        }
        progress::finish();
        read
    }

    /// One epoch's pass of the rows through the learners.
    unsafe fn pass(
        &mut self,
        sgd: &mut Sgd,
        shuffle: &mut TupleShuffle,
        reading: &mut Reading,
        epoch: u32,
        fill_next: bool,
    ) -> Pass {
        let validate = self.config.params.validation.is_some();
        let normalize = self.config.params.normalize;
        let (result, labels_seen, snapshots, counts) = match sgd {
            Sgd::Thread(w) => {
                let end = self.epoch_with_worker(
                    w,
                    shuffle,
                    &mut reading.spares,
                    reading.first.take(),
                    epoch,
                    validate,
                    fill_next,
                );
                reading.rescanned = end.next_first.is_some();
                reading.first = end.next_first.flatten();
                (end.result, end.labels_seen, end.model, end.rows_of_epoch)
            }
            Sgd::Backend(t) => {
                let (r, l) = self.epoch_on_backend(
                    t,
                    shuffle,
                    &mut reading.spares,
                    reading.first.take(),
                    epoch,
                );
                self.binary_labels = t.label_map();
                let snapshots = validate.then(|| {
                    t.result_models().unwrap_or_else(|bytes| {
                        raise_train_error(
                            TrainError::OutOfMemory { bytes },
                            &|v| v.to_string(),
                            false,
                        )
                    })
                });
                (r, l, snapshots, None)
            }
        };
        let stats = result.unwrap_or_else(|e| raise_train_error(e, &self.label_text(), normalize));
        Pass {
            stats,
            labels_seen,
            snapshots,
            counts,
        }
    }

    /// Every epoch reads the rows the first read (one snapshot; only "since" samples the older
    /// blocks afresh): an epoch that read others lost rows somewhere, and its model must not be
    /// stored as if it had not. And a classifier's first epoch has seen two classes.
    unsafe fn check_epoch_rows(&mut self, epoch: u32, counts: &EpochCounts, labels_seen: usize) {
        match &self.first_epoch {
            Some(first) if self.config.read_from.is_none() && !counts.same_rows(first) => {
                self.rows_changed(&format!("epoch {epoch}"), counts, first)
            }
            _ => {}
        }
        if epoch == 1 {
            self.first_epoch = Some(*counts);
            let classes_seen = if self.config.model.has_class_outputs() {
                self.shuffle().rows().classes().len()
            } else {
                labels_seen
            };
            if self.config.model.is_classifier() && classes_seen < 2 {
                self.one_class();
            }
        }
    }

    /// The models of the learners still going (`snapshots`, None without validation), in the
    /// table's units, all scored on the validation rows together; and one model's share of the
    /// time. With workers (`pooling`), every process's scores pooled.
    #[allow(clippy::type_complexity)]
    unsafe fn validate_epoch(
        &mut self,
        snapshots: Option<Vec<Option<Model>>>,
        stats: &[Option<EpochStats>],
        standardizer: Option<&Standardizer>,
        validation_rows: Option<&CollectedRows>,
        pooling: Option<(&Team, u32)>,
        n_learners: usize,
    ) -> (Vec<Option<Model>>, Vec<Option<ValidationStats>>, f64) {
        if snapshots.is_some() {
            progress::phase("validation");
        }
        let mut snapshots = snapshots.unwrap_or_default();
        snapshots.resize_with(n_learners, || None);
        let started = Instant::now();
        let snapshots: Vec<Option<Model>> = snapshots
            .into_iter()
            .zip(stats)
            .map(|(m, stats)| {
                let m = m.filter(|_| stats.is_some())?;
                Some(match standardizer {
                    Some(s) => m.fold_standardizer(s),
                    None => m,
                })
            })
            .collect();
        let validations = self.validate_many(&snapshots, self.shuffle(), validation_rows, pooling);
        let scored = snapshots.iter().flatten().count().max(1);
        let seconds = started.elapsed().as_secs_f64() / scored as f64;
        (snapshots, validations, seconds)
    }

    /// Learner `i` trains no more (early stopping, or set aside in another process): it keeps
    /// its model as it is now.
    fn stop_learner(&self, sgd: &mut Sgd, i: usize) {
        match sgd {
            Sgd::Backend(t) => t.stop(i),
            Sgd::Thread(w) => w.send(Job::Stop(i)).unwrap_or_else(|r| {
                raise_reply(r, &self.label_text(), self.config.params.normalize)
            }),
        }
    }
}
