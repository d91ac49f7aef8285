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

use std::time::Instant;

use crate::arena::{TupleArena, NO_GROUP};
use crate::hash::splitmix64;
use crate::learner::Learner;
use crate::model::Labels;
use crate::row::Row;
use crate::scoring::{BinaryLabels, ValidationScore, ValidationStats};
use crate::standardize::Standardizer;
use crate::trained::Model;
use crate::trainer::{EpochStats, InterruptCheck, TrainError};

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

/// The work one thread did for its share of learners since it last asked an interrupt check
/// (every learner's check reads the same stop flag). A learner asks on its own every
/// WORK_BETWEEN_CHECKS of its own work; thousands of learners, each trained on a chunk or
/// scoring a fold in turn, would each do that much before asking — seconds in all.
#[derive(Default)]
struct Pace {
    work: usize,
}

impl Pace {
    /// `work` multiply-adds done for `learner`; its check is asked once they add up.
    fn add(&mut self, work: usize, learner: &mut Learner) -> Result<(), TrainError> {
        self.work += work;
        if self.work < crate::trainer::WORK_BETWEEN_CHECKS {
            return Ok(());
        }
        self.work = 0;
        learner.check_interrupt()
    }
}

/// What every learner reads of one buffer.
struct BufferWork<'a> {
    arena: &'a TupleArena,
    order: Option<&'a [u32]>,
    row_folds: &'a [usize],
    fold_rows: &'a [Vec<u32>],
    group_rows: &'a [Vec<u32>],
    scoring: Option<&'a Scoring>,
}

impl BufferWork<'_> {
    /// Trains `t` on the buffer (without the rows of the fold it holds out; `kept`: scratch),
    /// then, while scoring, scores that fold's rows. With `chunk`, see [`BufferWork::train_many`].
    fn train(&self, t: &mut Trial, kept: &mut Vec<u32>, pace: &mut Pace) -> Result<(), TrainError> {
        let started = Instant::now();
        let result = self.train_rows(t, self.order, kept).and_then(|()| {
            let rows = match t.group {
                Some(g) => self.group_rows.get(g as usize).map_or(0, Vec::len),
                None => self.order.map_or(self.arena.len(), <[u32]>::len),
            };
            pace.add(rows * self.row_cost(), &mut t.learner)?;
            self.score_fold(t, pace)
        });
        t.seconds += started.elapsed().as_secs_f64();
        result
    }

    /// Trains linear learners that read every row (or every row but a fold's) chunk by chunk
    /// of the buffer's order, every learner on a chunk before the next: a chunk is read from
    /// memory once and stays in cache for all of them (each learner on its own reads the whole
    /// buffer in shuffled order, a cache miss a row). With `scaling` (every learner's own
    /// standardizer, the same for all), a chunk's rows are standardized once, into a small
    /// arena in training order, rather than by every learner. A linear learner's steps do not
    /// depend on where its buffer is cut (a mini-batch spans calls), nor on who standardized
    /// its rows, so its model is bit for bit the one `train` gives. Returns each learner's
    /// result, as `train` would.
    fn train_many(
        &self,
        share: &mut [(usize, &mut Trial)],
        chunk: usize,
        scaling: Option<&Standardizer>,
        pace: &mut Pace,
    ) -> Vec<(usize, Result<(), TrainError>)> {
        let arena = self.arena;
        let n = self.order.map_or(arena.len(), <[u32]>::len);
        let mut results: Vec<Result<(), TrainError>> = share.iter().map(|_| Ok(())).collect();
        let (mut kept, mut identity) = (Vec::new(), Vec::new());
        let mut scaled = match scaling.map(|_| TupleArena::try_new(arena.n_features(), chunk)) {
            Some(Err(_)) => {
                let bytes = (chunk * (arena.n_features() + 1) * 8) as u64;
                return share
                    .iter()
                    .map(|(i, _)| (*i, Err(TrainError::OutOfMemory { bytes })))
                    .collect();
            }
            Some(Ok(a)) => Some(a),
            None => None,
        };
        let mut chunk_folds = Vec::new();
        'chunks: for start in (0..n).step_by(chunk.max(1)) {
            let end = (start + chunk).min(n);
            let rows = match self.order {
                Some(order) => &order[start..end],
                None => {
                    identity.clear();
                    identity.extend(start as u32..end as u32);
                    &identity[..]
                }
            };
            if let (Some(s), Some(a)) = (scaling, scaled.as_mut()) {
                a.clear();
                chunk_folds.clear();
                for (k, &r) in rows.iter().enumerate() {
                    // Shuffled order: start loading a row a few ahead (see TupleArena::prefetch).
                    if let Some(&ahead) = rows.get(k + 8) {
                        arena.prefetch(ahead as usize);
                    }
                    a.push_standardized(arena.label(r as usize), arena.features(r as usize), s);
                    if let Some(&f) = self.row_folds.get(r as usize) {
                        chunk_folds.push(f);
                    }
                }
            }
            for ((_, t), result) in share.iter_mut().zip(&mut results) {
                if result.is_err() {
                    continue;
                }
                let started = Instant::now();
                *result = match &scaled {
                    Some(a) => match t.holdout {
                        Some(fold) => {
                            kept.clear();
                            kept.extend(
                                (0..a.len() as u32).filter(|&k| chunk_folds[k as usize] != fold),
                            );
                            t.learner.train_buffer(a, Some(&kept))
                        }
                        None => t.learner.train_buffer(a, None),
                    },
                    None => self.train_rows(t, Some(rows), &mut kept),
                }
                .and_then(|()| pace.add(rows.len() * self.row_cost(), &mut t.learner));
                t.seconds += started.elapsed().as_secs_f64();
                // One learner's check saw the stop: the others would each train on until
                // their own (thousands of learners, a check's work each, add up to seconds).
                if matches!(result, Err(TrainError::Interrupted)) {
                    break 'chunks;
                }
            }
        }
        if results
            .iter()
            .any(|r| matches!(r, Err(TrainError::Interrupted)))
        {
            return share
                .iter()
                .map(|(i, _)| (*i, Err(TrainError::Interrupted)))
                .collect();
        }
        share
            .iter_mut()
            .zip(results)
            .map(|((i, t), result)| {
                let started = Instant::now();
                let result = result.and_then(|()| self.score_fold(t, pace));
                t.seconds += started.elapsed().as_secs_f64();
                (*i, result)
            })
            .collect()
    }

    /// Trains `t` on `order` (the buffer's rows, or some of them, in training order): its
    /// group's rows of the buffer, or `order` without the rows of the fold it holds out.
    fn train_rows(
        &self,
        t: &mut Trial,
        order: Option<&[u32]>,
        kept: &mut Vec<u32>,
    ) -> Result<(), TrainError> {
        match t.holdout {
            // Its group's rows (none in this buffer: still called, so a sparse model grows
            // with the buffer's width as every other model does).
            None if t.group.is_some() => {
                let rows = t.group.and_then(|g| self.group_rows.get(g as usize));
                t.learner
                    .train_buffer(self.arena, Some(rows.map_or(&[][..], |r| &r[..])))
            }
            None => t.learner.train_buffer(self.arena, order),
            Some(fold) => {
                kept.clear();
                let folds = self.row_folds;
                match order {
                    Some(order) => {
                        kept.extend(order.iter().filter(|&&r| folds[r as usize] != fold))
                    }
                    None => kept.extend(
                        (0..self.arena.len() as u32).filter(|&r| folds[r as usize] != fold),
                    ),
                }
                t.learner.train_buffer(self.arena, Some(kept))
            }
        }
    }

    /// While scoring: `t` scores the buffer's rows of the fold it holds out.
    /// Multiply-adds of one row for a linear learner of one output (about).
    fn row_cost(&self) -> usize {
        let arena = self.arena;
        1 + match arena.is_sparse() {
            true => arena.nnz() / arena.len().max(1),
            false => arena.n_features(),
        }
    }

    fn score_fold(&self, t: &mut Trial, pace: &mut Pace) -> Result<(), TrainError> {
        let (Some(scoring), Some(fold)) = (self.scoring, t.holdout) else {
            return Ok(());
        };
        let Some(model) = t.learner.result_model() else {
            return Err(TrainError::OutOfMemory {
                bytes: t.learner.n_params() as u64 * 8,
            });
        };
        // Rows scaled in their buffer are in the learner's units; the others in the table's.
        let arena = self.arena;
        let scaled = !arena.is_empty() && arena.scaled_rows() == arena.len();
        let model = match (&scoring.standardizer, scaled) {
            (Some(s), false) => model.fold_standardizer(s),
            _ => model,
        };
        if t.score.is_none() {
            // A two-class kind scores by the labels its learner mapped (once it has met both).
            let kind = t.learner.kind();
            let binary = match (kind.labels(), t.learner.label_map()) {
                (Labels::TwoClasses, None) => return Ok(()),
                (_, map) => {
                    map.map(|(negative, positive)| BinaryLabels::Values { negative, positive })
                }
            };
            t.score = Some(ValidationScore::new(kind, binary));
        }
        let score = t.score.as_mut().expect("made above");
        // A search of thousands of folded learners spends about as long scoring as training.
        let row_cost = match &model {
            Model::Linear(m) => self.row_cost() * m.n_outputs,
            Model::Network(_) => model.n_params(),
        };
        for rows in self.fold_rows[fold].chunks(256) {
            for &r in rows {
                score.push(&model, arena.row(r as usize), arena.label(r as usize));
            }
            pace.add(rows.len() * row_cost, &mut t.learner)?;
        }
        Ok(())
    }
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
            match &t.learner {
                Learner::Linear(trainer) => trainer.config().standardizer.as_ref(),
                Learner::Network { .. } => None,
            }
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
                .all(|t| !t.is_going() || matches!(t.learner, Learner::Linear(_))))
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
