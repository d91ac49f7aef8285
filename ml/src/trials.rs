//! Models trained side by side on the same shuffled buffers: one [`Learner`] per configuration
//! of a search (one alone for an ordinary training). Reading and shuffling the table is the
//! costly part of an epoch; every buffer, once shuffled, goes through every learner in turn.
//!
//! With several learners, one that diverges is set aside (its error kept, for the report) and
//! the others go on; with one, or when the last one diverges, the error is the training's, as
//! for a learner alone. Any other error (an interrupt, memory) stops them all.
//!
//! k-fold cross-validation: every row belongs to one of k folds ([`fold_of`], a fixed hash of
//! the row); a learner that holds out fold j trains on the other rows only, and while
//! [`Trials::score_holdouts`] is on (the last epoch), scores each buffer's rows of fold j with
//! its model as it stands once it has trained on that buffer: rows it never trains on.
//!
//! Per-group models: every row of a buffer carries a group (`TupleArena::group`, 0 … groups-1,
//! or `NO_GROUP`); a learner of group g trains on that group's rows only, in the buffer's
//! order, beside the learners of every row.

use crate::arena::{TupleArena, NO_GROUP};
use crate::hash::splitmix64;
use crate::learner::Learner;
use crate::row::Row;
use crate::scoring::{ValidationScore, ValidationStats};
use crate::standardize::Standardizer;
use crate::trained::Model;
use crate::trainer::{EpochStats, InterruptCheck, TrainError};

mod buffer_work;
use buffer_work::{BufferWork, Pace};

/// The fold (0 … folds-1) of a row: a hash of its label and features, so the same row falls in
/// the same fold in every epoch and every run (and a duplicated row never straddles two folds).
pub fn fold_of(row: Row<'_>, label: f64, folds: usize) -> usize {
    let mut h = splitmix64(label.to_bits() ^ 0xF01D_5EED);
    match row {
        Row::Dense(values) => {
            for v in values {
                h = splitmix64(h ^ v.to_bits());
            }
        }
        Row::Sparse { indices, values } => {
            for (i, v) in indices.iter().zip(values) {
                h = splitmix64(h ^ (u64::from(*i) << 32) ^ v.to_bits().rotate_left(17));
            }
        }
    }
    (h % folds.max(1) as u64) as usize
}

/// Bytes of rows a chunk of `BufferWork::train_many` holds: well inside a core's L2 cache.
const CHUNK_BYTES: usize = 32 << 10;

/// Where a learner is: training, done early (see [`Trials::stop`]), or set aside.
enum State {
    Going,
    Stopped,
    Failed(TrainError),
}

/// A cross-validation's report: each fold's score on its held-out rows, and the mean and
/// (population) standard deviation of the loss and of the accuracy or R² over the folds that
/// scored rows.
pub fn cross_validation(per_fold: &[Option<ValidationStats>]) -> serde_json::Value {
    let scored: Vec<&ValidationStats> = per_fold.iter().flatten().filter(|v| v.rows > 0).collect();
    let spread = |values: Vec<f64>| {
        if values.is_empty() {
            return (serde_json::Value::Null, serde_json::Value::Null);
        }
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        (serde_json::json!(mean), serde_json::json!(var.sqrt()))
    };
    let (loss, loss_std) = spread(scored.iter().map(|v| v.loss).collect());
    let (accuracy, accuracy_std) = spread(scored.iter().filter_map(|v| v.accuracy).collect());
    let (r2, r2_std) = spread(scored.iter().filter_map(|v| v.r2).collect());
    let mut report = serde_json::json!({
        "folds": per_fold.len(),
        "per_fold": per_fold,
        "loss": loss, "loss_std": loss_std,
        "accuracy": accuracy, "accuracy_std": accuracy_std,
        "r2": r2, "r2_std": r2_std,
    });
    // Over the folds that have them (two classes: F1, ROC AUC; probabilities: log loss).
    type Score = fn(&ValidationStats) -> Option<f64>;
    let extra: [(&str, Score); 3] = [
        ("f1", |v| v.f1),
        ("roc_auc", |v| v.roc_auc),
        ("log_loss", |v| v.log_loss),
    ];
    for (name, get) in extra {
        let values: Vec<f64> = scored.iter().filter_map(|v| get(v)).collect();
        if !values.is_empty() {
            let (mean, std) = spread(values);
            report[name] = mean;
            report[format!("{name}_std")] = std;
        }
    }
    report
}

struct Trial {
    learner: Learner,
    state: State,
    /// Seconds spent training it (its share of the arithmetic; the scan is shared).
    seconds: f64,
    /// Cross-validation: the fold it never trains on, and its score on that fold's rows.
    holdout: Option<usize>,
    score: Option<ValidationScore>,
    /// Per-group models: the group whose rows alone it trains on.
    group: Option<u32>,
}

/// What scoring the held-out folds needs: the scaling to fold into a model before it scores
/// rows as they are in the buffer.
struct Scoring {
    standardizer: Option<Standardizer>,
}

impl Trial {
    fn is_going(&self) -> bool {
        matches!(self.state, State::Going)
    }
}

pub struct Trials {
    trials: Vec<Trial>,
    /// Cross-validation: how many folds (0: none).
    folds: usize,
    scoring: Option<Scoring>,
    /// Per buffer: each row's fold, and each fold's rows (in the buffer's order).
    row_folds: Vec<usize>,
    fold_rows: Vec<Vec<u32>>,
    /// Per-group models: how many groups, and per buffer each group's rows (in the buffer's
    /// order).
    groups: usize,
    group_rows: Vec<Vec<u32>>,
    /// Threads that train a buffer's learners (see [`Trials::set_threads`]).
    threads: usize,
}

impl Trials {
    pub fn new(learners: Vec<Learner>) -> Trials {
        Trials::with_folds(learners.into_iter().map(|l| (l, None)).collect(), 0)
    }

    /// Learners for cross-validation over `folds` folds: each with the fold it holds out, or
    /// None to train on every row.
    pub fn with_folds(learners: Vec<(Learner, Option<usize>)>, folds: usize) -> Trials {
        assert!(!learners.is_empty(), "at least one learner trains");
        Trials {
            trials: learners
                .into_iter()
                .map(|(learner, holdout)| Trial {
                    learner,
                    state: State::Going,
                    seconds: 0.0,
                    holdout: holdout.filter(|_| folds > 0),
                    score: None,
                    group: None,
                })
                .collect(),
            folds,
            scoring: None,
            row_folds: Vec::new(),
            fold_rows: Vec::new(),
            groups: 0,
            group_rows: Vec::new(),
            threads: 1,
        }
    }

    /// Per-group models over `groups` groups: each learner with the group whose rows alone it
    /// trains on, or None to train on every row.
    pub fn with_groups(learners: Vec<(Learner, Option<u32>)>, groups: usize) -> Trials {
        let (learners, of): (Vec<Learner>, Vec<Option<u32>>) = learners.into_iter().unzip();
        let mut trials = Trials::new(learners);
        for (t, group) in trials.trials.iter_mut().zip(of) {
            t.group = group.filter(|&g| (g as usize) < groups);
        }
        trials.groups = groups;
        trials
    }

    /// The rows of each group in this buffer, in the order given (all rows in storage order
    /// without one); rows of no group are in none.
    fn split_groups(&mut self, arena: &TupleArena, order: Option<&[u32]>) {
        self.group_rows.resize_with(self.groups, Vec::new);
        for rows in &mut self.group_rows {
            rows.clear();
        }
        let mut push = |i: u32| {
            let g = arena.group(i as usize);
            if g != NO_GROUP {
                if let Some(rows) = self.group_rows.get_mut(g as usize) {
                    rows.push(i);
                }
            }
        };
        match order {
            Some(order) => order.iter().copied().for_each(&mut push),
            None => (0..arena.len() as u32).for_each(&mut push),
        }
    }

    /// From now on (the last epoch), every learner that holds out a fold scores that fold's
    /// rows of each buffer it trains on. `standardizer`: the scaling the learners apply
    /// themselves (folded into their models to score rows as they are in a buffer).
    pub fn score_holdouts(&mut self, standardizer: Option<Standardizer>) {
        self.scoring = Some(Scoring { standardizer });
    }

    /// Each learner's score on the fold it holds out (None: it holds out none, or it was set
    /// aside).
    pub fn take_holdout_scores(&mut self) -> Vec<Option<ValidationScore>> {
        self.scoring = None;
        self.trials
            .iter_mut()
            .map(|t| match t.state {
                State::Failed(_) => None,
                _ => t.score.take(),
            })
            .collect()
    }

    /// The rows of each fold in this buffer, in the order given (all rows in storage order
    /// without one).
    fn split_folds(&mut self, arena: &TupleArena, order: Option<&[u32]>) {
        let n = arena.len();
        self.row_folds.clear();
        self.row_folds
            .extend((0..n).map(|i| fold_of(arena.row(i), arena.label(i), self.folds)));
        self.fold_rows.resize_with(self.folds, Vec::new);
        for rows in &mut self.fold_rows {
            rows.clear();
        }
        let mut push = |i: u32| self.fold_rows[self.row_folds[i as usize]].push(i);
        match order {
            Some(order) => order.iter().copied().for_each(&mut push),
            None => (0..n as u32).for_each(&mut push),
        }
    }

    /// Dense rows: the standardizer every linear learner going applies to them, when it is
    /// the same for all (a search's and folds' learners share what the statistics pass
    /// learned) and changes something.
    fn shared_scaling(&self, arena: &TupleArena) -> Option<Standardizer> {
        if arena.is_sparse() || arena.scaled_rows() > 0 {
            return None;
        }
        let mut going = self.trials.iter().filter(|t| t.is_going());
        fn own(t: &Trial) -> Option<&Standardizer> {
            t.learner.row_scaling()
        }
        let first = own(going.next()?)?;
        let all_same = going.all(|t| own(t) == Some(first));
        (all_same && !first.is_identity()).then(|| first.clone())
    }

    pub fn len(&self) -> usize {
        self.trials.len()
    }

    pub fn is_empty(&self) -> bool {
        self.trials.is_empty()
    }

    /// Every learner, in order (parallel workers: each exchanges with its own shared model).
    pub fn learners_mut(&mut self) -> impl Iterator<Item = &mut Learner> {
        self.trials.iter_mut().map(|t| &mut t.learner)
    }

    /// Each learner gets its own check, made by `make`.
    pub fn set_interrupt(&mut self, mut make: impl FnMut() -> InterruptCheck) {
        for t in &mut self.trials {
            t.learner.set_interrupt(Some(make()));
        }
    }

    /// Learner `i` trains no more (early stopping): it keeps its model as it is now.
    pub fn stop(&mut self, i: usize) {
        if matches!(self.trials[i].state, State::Going) {
            self.trials[i].state = State::Stopped;
        }
    }

    pub fn start_epoch(&mut self, epoch: u32) {
        for t in self.trials.iter_mut().filter(|t| t.is_going()) {
            t.learner.start_epoch(epoch);
        }
    }

    /// Sets aside a learner that diverged, unless it is the last one going: then its error is
    /// the training's.
    fn settle(&mut self, i: usize, result: Result<(), TrainError>) -> Result<(), TrainError> {
        match result {
            Ok(()) => Ok(()),
            Err(e @ TrainError::Diverged { .. }) if self.going() > 1 => {
                self.trials[i].state = State::Failed(e);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// How many learners are still training.
    fn going(&self) -> usize {
        self.trials.iter().filter(|t| t.is_going()).count()
    }

    /// Up to `threads` threads train the learners of a buffer, each learner on one of them
    /// (1, the default: this thread alone). Only where every learner's interrupt check is
    /// plain Rust (the SGD worker's stop flag), never where it calls PostgreSQL.
    pub fn set_threads(&mut self, threads: usize) {
        self.threads = threads.max(1);
    }

    /// Trains every learner still going on the buffer, in the same order (a learner that
    /// holds out a fold: on the other rows, in the same order); with several threads, each
    /// learner on one of them (the same arithmetic, so the same model, as on one).
    pub fn train_buffer(
        &mut self,
        arena: &TupleArena,
        order: Option<&[u32]>,
    ) -> Result<(), TrainError> {
        if self.folds > 0 {
            self.split_folds(arena, order);
        }
        if self.groups > 0 {
            self.split_groups(arena, order);
        }
        let threads = self.threads.min(self.going()).max(1);
        // Linear learners of every row (or every row but a fold's) train chunk by chunk when
        // there are several of them (see `BufferWork::train_many`).
        let chunk = (self.groups == 0
            && self.going() > threads
            && self
                .trials
                .iter()
                .all(|t| !t.is_going() || t.learner.trains_in_chunks()))
        .then(|| {
            let row_bytes = arena.bytes_used() / arena.len().max(1);
            (CHUNK_BYTES / row_bytes.max(1)).clamp(16, 4096)
        });
        let scaling = chunk.and_then(|_| self.shared_scaling(arena));
        let work = BufferWork {
            arena,
            order,
            row_folds: &self.row_folds,
            fold_rows: &self.fold_rows,
            group_rows: &self.group_rows,
            scoring: self.scoring.as_ref(),
        };
        // Learners dealt to the threads by the rows each trains on in this buffer, the
        // biggest first, each to the thread with the fewest rows so far (the model of every
        // row alone on one thread, its groups' models on the others); each thread its own
        // scratch. Which thread trains a learner does not change its model.
        let rows = arena.len();
        let group_rows = &self.group_rows;
        let mut going: Vec<(usize, usize, &mut Trial)> = self
            .trials
            .iter_mut()
            .enumerate()
            .filter(|(_, t)| t.is_going())
            .map(|(i, t)| {
                let work = match (t.group, t.holdout) {
                    (Some(g), _) => group_rows.get(g as usize).map_or(0, Vec::len),
                    (None, Some(_)) => rows - rows / self.folds.max(1),
                    (None, None) => rows,
                };
                (work, i, t)
            })
            .collect();
        if threads > 1 {
            going.sort_by_key(|&(work, i, _)| (std::cmp::Reverse(work), i));
        }
        let mut shares: Vec<Vec<(usize, &mut Trial)>> = (0..threads).map(|_| Vec::new()).collect();
        let mut load = vec![0usize; threads];
        for (work, i, t) in going {
            let least = (0..threads).min_by_key(|&k| (load[k], k)).unwrap_or(0);
            load[least] += work.max(1);
            shares[least].push((i, t));
        }
        let train_share = |mut share: Vec<(usize, &mut Trial)>| match chunk {
            Some(chunk) => {
                work.train_many(&mut share, chunk, scaling.as_ref(), &mut Pace::default())
            }
            None => {
                let (mut kept, mut pace) = (Vec::new(), Pace::default());
                let mut stopped = false;
                share
                    .into_iter()
                    .map(|(i, t)| {
                        // Once one learner saw the stop, the rest of the share need not train.
                        if stopped {
                            return (i, Err(TrainError::Interrupted));
                        }
                        let result = work.train(t, &mut kept, &mut pace);
                        stopped = matches!(result, Err(TrainError::Interrupted));
                        (i, result)
                    })
                    .collect::<Vec<_>>()
            }
        };
        let done: Vec<Vec<(usize, Result<(), TrainError>)>> = if threads == 1 {
            shares.into_iter().map(train_share).collect()
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = shares
                    .into_iter()
                    .map(|share| scope.spawn(|| train_share(share)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .collect()
            })
        };
        let mut results: Vec<Option<Result<(), TrainError>>> = Vec::new();
        results.resize_with(self.trials.len(), || None);
        for (i, r) in done.into_iter().flatten() {
            results[i] = Some(r);
        }
        for (i, result) in results.into_iter().enumerate() {
            if let Some(result) = result {
                self.settle(i, result)?;
            }
        }
        Ok(())
    }

    /// Ends the epoch of every learner: its statistics, None for one not going.
    pub fn finish_epoch(&mut self) -> Result<Vec<Option<EpochStats>>, TrainError> {
        let mut stats = Vec::with_capacity(self.trials.len());
        for i in 0..self.trials.len() {
            if !self.trials[i].is_going() {
                stats.push(None);
                continue;
            }
            match self.trials[i].learner.finish_epoch() {
                Ok(s) => stats.push(Some(s)),
                Err(e) => {
                    self.settle(i, Err(e))?;
                    stats.push(None);
                }
            }
        }
        Ok(stats)
    }

    /// The first learner still going (they all saw the same labels).
    fn first_going(&self) -> &Learner {
        let t = self
            .trials
            .iter()
            .find(|t| !matches!(t.state, State::Failed(_)));
        &t.unwrap_or(&self.trials[0]).learner
    }

    /// Two-class kinds: the distinct raw label values seen (see [`Learner::labels_seen`]).
    pub fn labels_seen(&self) -> Vec<f64> {
        self.first_going().labels_seen()
    }

    /// Two-class kinds: the (negative, positive) raw label values.
    pub fn label_map(&self) -> Option<(f64, f64)> {
        self.first_going().label_map()
    }

    /// The model each learner going would return now (None for the others), or Err with the
    /// bytes of the one that could not be copied.
    pub fn result_models(&mut self) -> Result<Vec<Option<Model>>, u64> {
        let mut models = Vec::with_capacity(self.trials.len());
        for t in &mut self.trials {
            if !t.is_going() {
                models.push(None);
                continue;
            }
            match t.learner.result_model() {
                Some(m) => models.push(Some(m)),
                None => return Err(t.learner.n_params() as u64 * 8),
            }
        }
        Ok(models)
    }

    /// Every learner's trained model or why it was set aside, and its seconds of training.
    pub fn into_results(self) -> Vec<(Result<Learner, TrainError>, f64)> {
        self.trials
            .into_iter()
            .map(|t| {
                let result = match t.state {
                    State::Failed(e) => Err(e),
                    State::Going | State::Stopped => Ok(t.learner),
                };
                (result, t.seconds)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
