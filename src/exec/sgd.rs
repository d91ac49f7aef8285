//! CorgiPile SGD: pulls shuffled buffers from TupleShuffle and runs the epochs, rescanning its
//! child between epochs (which draws a new block order and a new tuple shuffle).
//!
//! Double buffering: an SGD worker thread trains on buffer A while this (backend) thread fills
//! buffer B through the executor; owned buffers travel over crossbeam channels. The worker
//! touches only owned Rust data — never PostgreSQL. The backend checks for interrupts while it
//! waits, and the `Worker` guard stops and joins the thread on every exit path, ERROR included.

use super::tuple_shuffle::{ShuffledBuffer, TupleShuffleState};
use crate::catalog::StoredModel;
use crate::classes::ClassValue;
use crate::input::FeatureLayout;
use crate::plan::Mode;
use crate::progress;
use corgipile_ml::arena::TupleArena;
use corgipile_ml::metrics::{BinaryMetrics, MulticlassMetrics, RegressionMetrics};
use corgipile_ml::model::{argmax, sigmoid, sign, softmax_loss, ModelKind, Row};
use corgipile_ml::stats::FeatureStats;
use serde::Serialize;
use serde_json::json;
use std::rc::Rc;
use super::{config_of, create_node, explain, init_child, install_state, methods, state_of};
use crate::error::{notice, raise};
use crate::plan::PipelineConfig;
use corgipile_ml::model::LinearModel;
use corgipile_ml::params::ScheduleKind;
use corgipile_ml::trainer::{EpochStats, TrainConfig, TrainError, Trainer};
use crossbeam_channel::{bounded, unbounded, Receiver, RecvTimeoutError, Sender};
use pgrx::{check_for_interrupts, pg_guard, pg_sys, PgSqlErrorCode};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Per-epoch metrics on the held-out validation rows.
#[derive(Clone, Debug, Serialize)]
pub struct ValidationStats {
    pub loss: f64,
    pub accuracy: Option<f64>,
    pub r2: Option<f64>,
    pub rows: u64,
}

pub struct EpochRecord {
    pub stats: EpochStats,
    /// The training pass (reading, shuffling, SGD), without validation.
    pub seconds: f64,
    pub validation: Option<ValidationStats>,
    pub validation_seconds: f64,
}

/// What a finished training produced; the caller stores it in the catalog.
pub struct TrainOutcome {
    /// In original feature units (a standardizer, if any, is folded in).
    pub model: LinearModel,
    /// Classifiers: label values by class index (binary: [negative, positive]).
    pub classes: Vec<ClassValue>,
    pub standardizer: Option<serde_json::Value>,
    pub epochs: Vec<EpochRecord>,
    pub rows_trained: u64,
    pub rows_skipped: u64,
    pub seconds: f64,
}

/// corgipile_evaluate's answer (a JSON object).
pub type EvaluationReport = serde_json::Value;

pub struct SgdState {
    config: PipelineConfig,
    child: *mut pg_sys::PlanState,
    done: bool,
    pub outcome: Option<TrainOutcome>,
    /// Evaluate mode: the model to score, and the result.
    pub evaluate_model: Option<Rc<StoredModel>>,
    pub evaluation: Option<EvaluationReport>,
    /// Collect mode: every row of the relation, and its classes.
    pub collected: Option<(ShuffledBuffer, Vec<ClassValue>)>,
    /// Trace mode: (label, first feature) in visiting order.
    pub traced: Option<Vec<(f64, f64)>>,
    /// Rows of a validation relation, collected before training.
    pub validation_rows: Option<(ShuffledBuffer, Vec<ClassValue>)>,
    /// Whether to write a progress NOTICE per epoch (off for EXPLAIN ANALYZE).
    pub verbose: bool,
    /// Clears the pg_stat_activity progress state when the query ends or fails.
    progress: Option<progress::Tracker>,
    /// Seconds of each finished epoch's training pass (EXPLAIN ANALYZE).
    epoch_seconds: Vec<f64>,
    // EXPLAIN ANALYZE figures.
    backend_wait_seconds: f64,
    worker_busy_seconds: f64,
    last_stats: Option<EpochStats>,
    epochs_run: u32,
    /// Binary models: the trainer's (negative, positive) labels after the last epoch.
    binary_labels: Option<(f64, f64)>,
}

enum Job {
    StartEpoch(u32),
    Train(ShuffledBuffer),
    /// End the epoch; `snapshot` = also send a copy of the model (for validation).
    EndEpoch { snapshot: bool },
}

enum Reply {
    Consumed(ShuffledBuffer),
    EpochDone {
        result: Result<EpochStats, TrainError>,
        labels_seen: usize,
        label_map: Option<(f64, f64)>,
        busy_seconds: f64,
        model: Option<LinearModel>,
    },
    Failed(TrainError),
    Panicked(String),
}

/// The SGD worker thread. Dropping it raises the stop flag, closes the job channel and joins
/// the thread, which stops within about a millisecond of work (the trainer checks the flag
/// between rows), so an ERROR or cancel never waits for a buffer to finish.
struct Worker {
    jobs: Option<Sender<Job>>,
    replies: Receiver<Reply>,
    handle: Option<JoinHandle<Trainer>>,
    stop: Arc<AtomicBool>,
}

impl Worker {
    fn spawn(mut trainer: Trainer) -> Worker {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_seen = stop.clone();
        trainer.set_interrupt(Some(Box::new(move || stop_seen.load(Ordering::Relaxed))));
        // Two buffers at most exist, so a small bound never blocks the backend for long.
        let (jobs_tx, jobs_rx) = bounded::<Job>(4);
        let (replies_tx, replies_rx) = unbounded::<Reply>();
        let body = move || {
            let mut busy = 0.0f64;
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                for job in jobs_rx.iter() {
                    match job {
                        Job::StartEpoch(epoch) => {
                            trainer.start_epoch(epoch);
                            busy = 0.0;
                        }
                        Job::Train(buffer) => {
                            let started = Instant::now();
                            let order = (!buffer.order.is_empty()).then_some(buffer.order.as_slice());
                            let result = trainer.train_buffer(&buffer.arena, order);
                            busy += started.elapsed().as_secs_f64();
                            match result {
                                Ok(()) => {
                                    let _ = replies_tx.send(Reply::Consumed(buffer));
                                }
                                Err(e) => {
                                    let _ = replies_tx.send(Reply::Failed(e));
                                    return;
                                }
                            }
                        }
                        Job::EndEpoch { snapshot } => {
                            let result = trainer.finish_epoch();
                            let labels_seen = trainer.labels_seen().len();
                            let model = match snapshot.then(|| trainer.model().try_clone()) {
                                Some(None) => {
                                    let bytes = trainer.model().weights.len() as u64 * 8;
                                    let _ = replies_tx.send(Reply::Failed(TrainError::OutOfMemory { bytes }));
                                    return;
                                }
                                copy => copy.flatten(),
                            };
                            let label_map = trainer.label_map();
                            let _ = replies_tx.send(Reply::EpochDone { result, labels_seen, label_map, busy_seconds: busy, model });
                        }
                    }
                }
            }));
            if let Err(panic) = outcome {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                let _ = replies_tx.send(Reply::Panicked(message));
            }
            trainer
        };
        let handle = spawn_with_signals_blocked(body);
        Worker { jobs: Some(jobs_tx), replies: replies_rx, handle: Some(handle), stop }
    }

    /// Hands the worker a job. Err: the worker has stopped, and the reply that says why.
    #[allow(clippy::result_large_err)] // a rare, one-off error path
    fn send(&self, job: Job) -> Result<(), Reply> {
        if self.jobs.as_ref().expect("worker running").send(job).is_ok() {
            return Ok(());
        }
        while let Ok(reply) = self.replies.try_recv() {
            if matches!(reply, Reply::Failed(_) | Reply::Panicked(_)) {
                return Err(reply);
            }
        }
        Err(Reply::Panicked("the worker thread exited unexpectedly".into()))
    }

    /// Next reply, checking for cancel/statement_timeout every 50 ms while waiting.
    fn wait(&self, waited: &mut f64) -> Reply {
        let started = Instant::now();
        loop {
            match self.replies.recv_timeout(Duration::from_millis(50)) {
                Ok(reply) => {
                    *waited += started.elapsed().as_secs_f64();
                    return reply;
                }
                Err(RecvTimeoutError::Timeout) => {
                    check_for_interrupts!();
                }
                Err(RecvTimeoutError::Disconnected) => raise(
                    PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                    "corgipile SGD worker thread exited unexpectedly",
                    None,
                ),
            }
        }
    }

    fn finish(mut self) -> Trainer {
        self.jobs = None;
        let handle = self.handle.take().expect("worker running");
        match handle.join() {
            Ok(trainer) => trainer,
            Err(_) => raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "corgipile SGD worker thread panicked", None),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // The flag stops the buffer in progress; closing the channel ends the worker's loop.
        self.stop.store(true, Ordering::Relaxed);
        self.jobs = None;
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// Spawn a thread that cannot receive any signal: PostgreSQL's signal handlers must run on the
/// backend thread only. The mask is inherited at creation, so block, spawn, restore.
fn spawn_with_signals_blocked<T: Send + 'static>(body: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
    // SAFETY: plain libc signal-mask calls on this thread with valid, initialized sigsets.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut previous);
        let spawned = std::thread::Builder::new().name("corgipile-sgd".into()).spawn(body);
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
        match spawned {
            Ok(handle) => handle,
            Err(e) => raise(
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_RESOURCES,
                format!("could not start the corgipile SGD worker thread: {e}"),
                Some("Set \"double_buffer\": false to train without a worker thread.".into()),
            ),
        }
    }
}

/// Raise the ERROR for a training failure; `label` renders a trainer label (a value or a
/// class index) as the table shows it; `normalized`: the features were standardized.
fn raise_train_error(e: TrainError, label: &dyn Fn(f64) -> String, normalized: bool) -> ! {
    match e {
        TrainError::TooManyLabels { values } => raise(
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            format!(
                "the label column has more than two distinct values (saw {}, {} and {})",
                label(values[0]), label(values[1]), label(values[2])
            ),
            Some("svm and logistic are binary classifiers: the label must have exactly two distinct values (softmax handles more).".into()),
        ),
        TrainError::InvalidLabel { value, .. } => raise(
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            format!("invalid label {}", label(value)),
            Some(e.hint().into()),
        ),
        TrainError::Diverged { epoch } => raise(
            PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            format!("training diverged in epoch {epoch}: the loss or the weights became NaN or infinite"),
            Some(if normalized {
                "Use a smaller learning_rate (the features are already normalized), or a larger l2.".into()
            } else {
                "Use a smaller learning_rate, or \"normalize\": true to scale the features.".into()
            }),
        ),
        TrainError::OutOfMemory { bytes } => raise(
            PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
            format!("out of memory: the model could not grow by {bytes} bytes"),
            Some("Train a smaller model (fewer features or classes). The server could not allocate it although corgipile.max_model_memory allowed it: that setting may be too high for this server's memory.".into()),
        ),
        TrainError::Interrupted => raise(PgSqlErrorCode::ERRCODE_QUERY_CANCELED, "corgipile training was stopped", None),
    }
}

/// Raise the ERROR a worker failure stands for.
fn raise_reply(reply: Reply, label: &dyn Fn(f64) -> String, normalized: bool) -> ! {
    match reply {
        Reply::Failed(e) => raise_train_error(e, label, normalized),
        Reply::Panicked(message) => raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("corgipile SGD worker failed: {message}"),
            None,
        ),
        _ => raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "corgipile SGD worker sent an unexpected reply", None),
    }
}

impl SgdState {
    unsafe fn run(&mut self) {
        match self.config.mode {
            Mode::Train => self.train(),
            Mode::Evaluate => self.evaluate(),
            Mode::Collect => self.collect(),
            Mode::Trace => self.trace(),
        }
    }

    /// corgipile_trace: the (label, first feature) of every tuple, in the order SGD would
    /// see them in epoch 1.
    unsafe fn trace(&mut self) {
        let shuffle = self.shuffle();
        let mut visited = Vec::new();
        let mut spare = None;
        while let Some(b) = shuffle.next_buffer(spare.take()) {
            for k in 0..b.arena.len() {
                check_for_interrupts!();
                let i = if b.order.is_empty() { k } else { b.order[k] as usize };
                let first = match b.arena.row(i) {
                    Row::Dense(x) => x.first().copied().unwrap_or(f64::NAN),
                    Row::Sparse { indices, values } => {
                        if indices.first() == Some(&0) { values[0] } else { 0.0 }
                    }
                };
                visited.push((b.arena.label(i), first));
            }
            if (visited.len() * std::mem::size_of::<(f64, f64)>()) as u64 > self.config.max_buffer_bytes {
                raise(
                    PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                    format!("the trace of {} does not fit in corgipile.max_buffer_memory", self.config.relation),
                    Some("corgipile_trace is meant for small tables; trace a sample (CREATE TABLE ... AS SELECT ... LIMIT).".into()),
                );
            }
            spare = Some(b);
        }
        self.traced = Some(visited);
    }

    /// SAFETY: our plan always has TupleShuffle as this node's only child.
    unsafe fn shuffle<'a>(&self) -> &'a mut TupleShuffleState {
        state_of::<TupleShuffleState>(self.child.cast())
    }

    fn no_rows(&self, skipped: u64) -> ! {
        if skipped > 0 {
            raise(
                PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                format!("all {skipped} rows of {} were skipped (NULL label, NULL or empty features)", self.config.relation),
                Some("Rows need a non-NULL label and non-NULL, non-empty features.".into()),
            );
        }
        raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            format!("{} has no rows to train on", self.config.relation),
            Some("The table is empty, or row-level security policies (or the validation split) hide every row.".into()),
        );
    }

    /// Renders a trainer label as the table shows it (class indices → class values).
    fn label_text(&self) -> impl Fn(f64) -> String + '_ {
        // SAFETY: the child state outlives this borrow (both live until the query ends).
        let classes = unsafe { &self.shuffle().classes };
        let uses_classes = self.config.label.uses_classes();
        move |v: f64| {
            if uses_classes && v >= 0.0 && (v as usize) < classes.len() {
                classes.classes[v as usize].to_text()
            } else {
                v.to_string()
            }
        }
    }

    /// One pass of statistics before training, for `normalize` and `class_weight`.
    unsafe fn statistics_pass(&mut self, config: &mut TrainConfig) {
        let params = &self.config.params;
        let shuffle = self.shuffle();
        let mut stats: Option<FeatureStats> = None;
        let mut spare = None;
        while let Some(b) = shuffle.next_buffer(spare.take()) {
            let st = stats.get_or_insert_with(|| FeatureStats::new(b.arena.n_features(), self.config.model.is_classifier()));
            for i in 0..b.arena.len() {
                check_for_interrupts!();
                st.push(b.arena.row(i), b.arena.label(i));
            }
            spare = Some(b);
        }
        let Some(stats) = stats else { self.no_rows(shuffle.rows_skipped_this_epoch) };
        if params.normalize {
            let sparse = matches!(self.config.layout, FeatureLayout::Sparse { .. });
            config.standardizer = Some(stats.standardizer(!sparse));
        }
        if let (Some(class_weight), true) = (&params.class_weight, self.config.model.is_classifier()) {
            // counts: (trainer label, rows), ascending: values, or class indices.
            let counts = stats.class_counts();
            let label_text = self.label_text();
            if self.config.model.is_binary() && counts.len() != 2 {
                raise(
                    PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                    format!("the label column of {} has {} distinct values; binary classifiers need exactly two", self.config.relation, counts.len()),
                    None,
                );
            }
            let k = if self.config.model.is_binary() { 2 } else { counts.iter().map(|c| c.0 as usize + 1).max().unwrap_or(0) };
            // Weights by class position: binary [negative, positive]; softmax by class index.
            let mut labels = Vec::with_capacity(k);
            let mut n = vec![0u64; k];
            for (position, (label, count)) in counts.iter().enumerate() {
                let at = if self.config.model.is_binary() { position } else { *label as usize };
                n[at] = *count;
            }
            #[allow(clippy::needless_range_loop)] // binary indexes counts, softmax does not
            for position in 0..k {
                let trainer_label = if self.config.model.is_binary() { counts[position].0 } else { position as f64 };
                labels.push(label_text(trainer_label));
            } // (binary: k == counts.len() == 2)
            let weights = class_weight
                .resolve(&labels, &n)
                .unwrap_or_else(|e| raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, e.message, e.hint));
            if self.config.model.is_binary() {
                config.label_values = Some((counts[0].0, counts[1].0));
            }
            config.class_weights = Some(weights);
        }
        pg_sys::ExecReScan(self.child);
    }

    unsafe fn train(&mut self) {
        let started = Instant::now();
        let params = self.config.params.clone();
        self.progress = Some(progress::start(&self.config.relation, self.config.model.name(), params.epochs));
        let mut train_config = params.train_config(self.config.model);
        if params.normalize || params.class_weight.is_some() {
            progress::phase("statistics pass");
            self.statistics_pass(&mut train_config);
        }
        let shuffle = self.shuffle();
        let Some(first) = shuffle.next_buffer(None) else { self.no_rows(shuffle.rows_skipped_this_epoch) };
        let n_features = match self.config.layout {
            FeatureLayout::Dense { .. } => first.arena.n_features(),
            FeatureLayout::Sparse { n_features, .. } => n_features.map_or(0, |n| n as usize),
        };
        let standardizer = train_config.standardizer.clone();
        let mut trainer = Trainer::try_new(train_config, n_features)
            .unwrap_or_else(|e| raise_train_error(e, &self.label_text(), params.normalize));
        // Single-buffered, the backend trains: it must still answer cancel between rows.
        trainer.set_interrupt(Some(Box::new(|| {
            check_for_interrupts!();
            false
        })));
        let mut epochs: Vec<EpochRecord> = Vec::new();
        let mut rows_skipped = 0;
        let mut first = Some(first);
        let (mut worker, mut local) = if params.double_buffer {
            (Some(Worker::spawn(trainer)), None)
        } else {
            (None, Some(trainer))
        };
        let mut spares: Vec<ShuffledBuffer> = Vec::new();
        let validate = params.validation.is_some();

        for epoch in 1..=params.epochs {
            let epoch_started = Instant::now();
            progress::epoch_started(epoch);
            if epoch > 1 {
                pg_sys::ExecReScan(self.child);
            }
            let (result, labels_seen, snapshot) = match (&mut worker, &mut local) {
                (Some(w), _) => self.epoch_with_worker(w, shuffle, &mut spares, first.take(), epoch, validate),
                (None, Some(t)) => {
                    let (r, l) = self.epoch_on_backend(t, shuffle, &mut spares, first.take(), epoch);
                    self.binary_labels = t.label_map();
                    let snapshot = validate.then(|| {
                        t.model().try_clone().unwrap_or_else(|| {
                            raise_train_error(TrainError::OutOfMemory { bytes: t.model().weights.len() as u64 * 8 }, &|v| v.to_string(), false)
                        })
                    });
                    (r, l, snapshot)
                }
                _ => unreachable!(),
            };
            let stats = result.unwrap_or_else(|e| raise_train_error(e, &self.label_text(), params.normalize));
            if epoch == 1 {
                rows_skipped = shuffle.rows_skipped_this_epoch;
                let classes_seen = if self.config.model == ModelKind::Softmax { shuffle.classes.len() } else { labels_seen };
                if self.config.model.is_classifier() && classes_seen < 2 {
                    raise(
                        PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                        format!("the label column of {} has only one distinct value", self.config.relation),
                        Some("Classifiers need rows of at least two classes.".into()),
                    );
                }
            }
            let seconds = epoch_started.elapsed().as_secs_f64();
            progress::epoch_finished(stats.loss);
            self.epoch_seconds.push(seconds);
            if snapshot.is_some() {
                progress::phase("validation");
            }
            let validation_started = Instant::now();
            let validation = snapshot.map(|m| {
                let m = match &standardizer {
                    Some(s) => m.fold_standardizer(s),
                    None => m,
                };
                self.validate(&m, shuffle, labels_seen)
            });
            let validation_seconds = validation_started.elapsed().as_secs_f64();
            if self.verbose {
                if epoch == 1 {
                    notice(progress_header(self.config.model, validation.is_some()));
                }
                notice(progress_line(epoch, params.epochs, &stats, validation.as_ref(), seconds));
            }
            let converged = params.tolerance > 0.0
                && epochs.last().is_some_and(|prev: &EpochRecord| (prev.stats.loss - stats.loss).abs() < params.tolerance);
            self.epochs_run = epoch;
            self.last_stats = Some(stats.clone());
            epochs.push(EpochRecord { stats, seconds, validation, validation_seconds });
            if converged {
                break;
            }
        }
        progress::finish();
        let trainer = match worker.take() {
            Some(w) => w.finish(),
            None => local.take().expect("local trainer"),
        };
        let label_map = trainer.label_map();
        let mut model = trainer.into_model();
        if let Some(s) = &standardizer {
            model = model.fold_standardizer(s);
        }
        let classes = self.classes_of(label_map, model.n_outputs);
        self.outcome = Some(TrainOutcome {
            model,
            classes,
            standardizer: standardizer.map(|s| serde_json::to_value(s).expect("standardizer serializes")),
            rows_trained: shuffle.rows_this_epoch,
            rows_skipped,
            epochs,
            seconds: started.elapsed().as_secs_f64(),
        });
    }

    /// The label values of the model's classes.
    unsafe fn classes_of(&self, label_map: Option<(f64, f64)>, n_outputs: usize) -> Vec<ClassValue> {
        let dictionary = &self.shuffle().classes.classes;
        match self.config.model {
            ModelKind::Linear => Vec::new(),
            ModelKind::Softmax => dictionary.iter().take(n_outputs).cloned().collect(),
            ModelKind::Svm | ModelKind::Logistic => {
                let (neg, pos) = label_map.expect("two labels were checked after epoch 1");
                if self.config.label.uses_classes() {
                    vec![dictionary[neg as usize].clone(), dictionary[pos as usize].clone()]
                } else {
                    vec![ClassValue::Number(neg), ClassValue::Number(pos)]
                }
            }
        }
    }

    /// Loss and accuracy (or R²) of `model` on the validation rows.
    unsafe fn validate(&self, model: &LinearModel, shuffle: &TupleShuffleState, _labels_seen: usize) -> ValidationStats {
        let arena = match (&self.validation_rows, &shuffle.validation) {
            (Some((b, _)), _) => &b.arena,
            (None, Some(a)) => a,
            (None, None) => return ValidationStats { loss: f64::NAN, accuracy: None, r2: None, rows: 0 },
        };
        let mut scores = Vec::new();
        let (mut loss, mut correct, mut n) = (0.0, 0u64, 0u64);
        let mut regression = RegressionMetrics::new();
        let binary_map = match self.config.model {
            ModelKind::Svm | ModelKind::Logistic => self.binary_labels,
            _ => None,
        };
        for i in 0..arena.len() {
            check_for_interrupts!();
            let (row, label) = (arena.row(i), arena.label(i));
            match self.config.model {
                ModelKind::Linear => {
                    let z = model.decision(row);
                    regression.push(z, label);
                    loss += model.kind.loss(z, label);
                }
                ModelKind::Softmax => {
                    let y = label as usize;
                    model.scores(row, &mut scores);
                    if y >= scores.len() {
                        continue; // a class the model never saw in training
                    }
                    correct += (argmax(&scores) == Some(y)) as u64;
                    loss += softmax_loss(&mut scores, y);
                }
                ModelKind::Svm | ModelKind::Logistic => {
                    let Some((neg, pos)) = binary_map else { continue };
                    let y = if label == pos { 1.0 } else if label == neg { -1.0 } else { continue };
                    let z = model.decision(row);
                    correct += (sign(z) == y) as u64;
                    loss += model.kind.loss(z, y);
                }
            }
            n += 1;
        }
        let mean_loss = if n > 0 { loss / n as f64 } else { f64::NAN };
        match self.config.model {
            ModelKind::Linear => ValidationStats { loss: mean_loss, accuracy: None, r2: Some(regression.finish().r2), rows: n },
            _ => ValidationStats { loss: mean_loss, accuracy: Some(if n > 0 { correct as f64 / n as f64 } else { 0.0 }), r2: None, rows: n },
        }
    }

    /// corgipile_evaluate: score the stored model on every row.
    unsafe fn evaluate(&mut self) {
        let model = self.evaluate_model.clone().expect("evaluate mode has a model");
        let shuffle = self.shuffle();
        let k = model.classes.len();
        // ROC AUC keeps one score per row: bounded by the same limit as the training buffers.
        let auc_rows = self.config.max_buffer_bytes as usize / BinaryMetrics::AUC_BYTES_PER_ROW;
        let mut binary = BinaryMetrics::with_auc_limit(auc_rows);
        let mut multi = MulticlassMetrics::new(k.max(1));
        let mut regression = RegressionMetrics::new();
        let mut probs = Vec::new();
        let (mut scored, mut unknown) = (0u64, 0u64);
        let numeric_classes: Vec<Option<f64>> = model.classes.iter().map(|c| c.as_f64()).collect();
        let mut spare = None;
        while let Some(b) = shuffle.next_buffer(spare.take()) {
            if !b.arena.is_sparse() && b.arena.n_features() != model.n_features() {
                raise(
                    PgSqlErrorCode::ERRCODE_ARRAY_ELEMENT_ERROR,
                    format!("the rows of {} have {} features, model {} expects {}", self.config.relation, b.arena.n_features(), model.id, model.n_features()),
                    Some("Evaluate on rows with the features the model was trained on (see the features param).".into()),
                );
            }
            for i in 0..b.arena.len() {
                check_for_interrupts!();
                let (row, label) = (b.arena.row(i), b.arena.label(i));
                match model.kind() {
                    ModelKind::Linear => regression.push(model.model.decision(row), label),
                    ModelKind::Softmax => {
                        let actual = label as usize;
                        if actual >= k {
                            unknown += 1;
                            continue;
                        }
                        let p = model.model.predict_proba(row, &mut probs).then(|| probs[actual]);
                        multi.push(model.model.predict(row) as usize, actual, p);
                    }
                    ModelKind::Svm | ModelKind::Logistic => {
                        // Labels arrive as values (numeric) or class indices (text, pre-seeded
                        // with the model's classes, so index 1 is the positive class).
                        let positive = if self.config.label.uses_classes() {
                            match label as usize {
                                0 => false,
                                1 => true,
                                _ => {
                                    unknown += 1;
                                    continue;
                                }
                            }
                        } else if Some(label) == numeric_classes[1] {
                            true
                        } else if Some(label) == numeric_classes[0] {
                            false
                        } else {
                            unknown += 1;
                            continue;
                        };
                        let z = model.model.decision(row);
                        let p = (model.kind() == ModelKind::Logistic).then(|| sigmoid(z));
                        binary.push(z, p, positive);
                    }
                }
                scored += 1;
            }
            spare = Some(b);
        }
        let mut report = match model.kind() {
            ModelKind::Linear => serde_json::to_value(regression.finish()),
            ModelKind::Softmax => serde_json::to_value(multi.finish()),
            _ => serde_json::to_value(binary.finish()),
        }
        .expect("metrics serialize");
        report["model_id"] = json!(model.id);
        report["rows_scored"] = json!(scored);
        report["rows_skipped"] = json!(shuffle.rows_skipped_this_epoch + unknown);
        if unknown > 0 {
            report["rows_with_unknown_label"] = json!(unknown);
        }
        if report.get("roc_auc").is_some_and(|v| v.is_null()) && scored as usize > auc_rows {
            report["roc_auc_note"] = json!("not computed: more rows than corgipile.max_buffer_memory can hold scores for");
        }
        self.evaluation = Some(report);
    }

    /// Collect mode: every row in one arena (a validation relation), bounded by the buffer limit.
    unsafe fn collect(&mut self) {
        let shuffle = self.shuffle();
        let mut all: Option<ShuffledBuffer> = None;
        let mut spare = None;
        while let Some(b) = shuffle.next_buffer(spare.take()) {
            let dst = all.get_or_insert_with(|| ShuffledBuffer {
                arena: if b.arena.is_sparse() { TupleArena::new_sparse(0, 0) } else { TupleArena::new(b.arena.n_features(), 0) },
                order: Vec::new(),
            });
            for i in 0..b.arena.len() {
                match b.arena.row(i) {
                    Row::Dense(x) => dst.arena.push(b.arena.label(i), x),
                    Row::Sparse { indices, values } => dst.arena.push_sparse(b.arena.label(i), indices, values),
                }
            }
            if dst.arena.bytes_used() as u64 > self.config.max_buffer_bytes {
                raise(
                    PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                    format!("the validation relation {} does not fit in corgipile.max_buffer_memory", self.config.relation),
                    Some("Use a smaller validation relation, or {\"fraction\": ...} validation.".into()),
                );
            }
            spare = Some(b);
        }
        self.collected = all.map(|b| (b, shuffle.classes.classes.clone()));
    }

    /// One epoch, double-buffered: the worker trains one buffer while we fill the next.
    unsafe fn epoch_with_worker(
        &mut self,
        worker: &mut Worker,
        shuffle: &mut TupleShuffleState,
        spares: &mut Vec<ShuffledBuffer>,
        mut first: Option<ShuffledBuffer>,
        epoch: u32,
        snapshot: bool,
    ) -> (Result<EpochStats, TrainError>, usize, Option<LinearModel>) {
        worker.send(Job::StartEpoch(epoch)).unwrap_or_else(|r| raise_reply(r, &self.label_text(), self.config.params.normalize));
        let mut in_flight = 0;
        loop {
            while in_flight >= 2 {
                match worker.wait(&mut self.backend_wait_seconds) {
                    Reply::Consumed(b) => {
                        spares.push(b);
                        in_flight -= 1;
                    }
                    other => raise_reply(other, &self.label_text(), self.config.params.normalize),
                }
            }
            let next = match first.take() {
                Some(b) => Some(b),
                None => shuffle.next_buffer(spares.pop()),
            };
            let Some(buffer) = next else { break };
            worker.send(Job::Train(buffer)).unwrap_or_else(|r| raise_reply(r, &self.label_text(), self.config.params.normalize));
            in_flight += 1;
        }
        worker.send(Job::EndEpoch { snapshot }).unwrap_or_else(|r| raise_reply(r, &self.label_text(), self.config.params.normalize));
        loop {
            match worker.wait(&mut self.backend_wait_seconds) {
                Reply::Consumed(b) => spares.push(b),
                Reply::EpochDone { result, labels_seen, busy_seconds, model, label_map } => {
                    self.worker_busy_seconds += busy_seconds;
                    self.binary_labels = label_map;
                    return (result, labels_seen, model);
                }
                other => raise_reply(other, &self.label_text(), self.config.params.normalize),
            }
        }
    }

    /// One epoch, single-buffered: fill, then train, on the backend thread.
    unsafe fn epoch_on_backend(
        &mut self,
        trainer: &mut Trainer,
        shuffle: &mut TupleShuffleState,
        spares: &mut Vec<ShuffledBuffer>,
        mut first: Option<ShuffledBuffer>,
        epoch: u32,
    ) -> (Result<EpochStats, TrainError>, usize) {
        trainer.start_epoch(epoch);
        loop {
            let next = match first.take() {
                Some(b) => Some(b),
                None => shuffle.next_buffer(spares.pop()),
            };
            let Some(buffer) = next else { break };
            let order = (!buffer.order.is_empty()).then_some(buffer.order.as_slice());
            if let Err(e) = trainer.train_buffer(&buffer.arena, order) {
                return (Err(e), trainer.labels_seen().len());
            }
            spares.push(buffer);
        }
        (trainer.finish_epoch(), trainer.labels_seen().len())
    }
}

/// The per-epoch NOTICE.
/// The per-epoch NOTICEs form a table: a header before epoch 1, then one row per epoch.
fn progress_header(model: ModelKind, validation: bool) -> String {
    let metric = if model == ModelKind::Linear { "r2" } else { "accuracy" };
    let mut line = format!("corgipile {:>9} {:>12} {:>9}", "epoch", "loss", metric);
    if validation {
        line.push_str(&format!(" {:>12} {:>9}", "valid loss", format!("valid {}", if model == ModelKind::Linear { "r2" } else { "acc" })));
    }
    line.push_str(&format!(" {:>10} {:>9} {:>9}", "tuples", "lr", "seconds"));
    line
}

fn progress_line(epoch: u32, epochs: u32, stats: &EpochStats, validation: Option<&ValidationStats>, seconds: f64) -> String {
    let metric = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
    let mut line = format!("corgipile {:>9} {:>12.6} {:>9}", format!("{epoch}/{epochs}"), stats.loss, metric(stats.accuracy.or(stats.r2)));
    if let Some(v) = validation {
        line.push_str(&format!(" {:>12.6} {:>9}", v.loss, metric(v.accuracy.or(v.r2))));
    }
    line.push_str(&format!(" {:>10} {:>9.2e} {:>9.3}", stats.tuples, stats.learning_rate, seconds));
    line
}

#[pg_guard]
pub unsafe extern "C-unwind" fn create(cscan: *mut pg_sys::CustomScan) -> *mut pg_sys::Node {
    create_node::<SgdState>(cscan, &methods().sgd_exec)
}

#[pg_guard]
pub unsafe extern "C-unwind" fn begin(node: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, eflags: i32) {
    let config = config_of(node);
    let child = init_child(node, estate, eflags);
    let state = SgdState {
        verbose: config.params.verbose,
        config,
        child,
        done: false,
        outcome: None,
        backend_wait_seconds: 0.0,
        worker_busy_seconds: 0.0,
        last_stats: None,
        epochs_run: 0,
        binary_labels: None,
        evaluate_model: None,
        evaluation: None,
        collected: None,
        traced: None,
        validation_rows: None,
        progress: None,
        epoch_seconds: Vec::new(),
    };
    install_state(node, state);
}

/// Runs the whole training on the first call; returns no rows.
#[pg_guard]
pub unsafe extern "C-unwind" fn exec(node: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
    let state = state_of::<SgdState>(node);
    if !state.done {
        state.done = true;
        state.run();
    }
    std::ptr::null_mut()
}

#[pg_guard]
pub unsafe extern "C-unwind" fn rescan(node: *mut pg_sys::CustomScanState) {
    // Training again from scratch would be a new training: not supported inside one plan.
    let state = state_of::<SgdState>(node);
    state.done = true;
}

#[pg_guard]
pub unsafe extern "C-unwind" fn end(node: *mut pg_sys::CustomScanState) {
    let state = state_of::<SgdState>(node);
    pg_sys::ExecEndNode(state.child);
}

#[pg_guard]
pub unsafe extern "C-unwind" fn explain(node: *mut pg_sys::CustomScanState, _ancestors: *mut pg_sys::List, es: *mut pg_sys::ExplainState) {
    let state = state_of::<SgdState>(node);
    let p = &state.config.params;
    explain::text(es, "Model", state.config.model.name());
    explain::int(es, "Epochs", p.epochs as i64);
    let schedule = match p.learning_rate_schedule {
        ScheduleKind::Constant => "constant".to_string(),
        ScheduleKind::Exponential => format!("x{} per epoch", p.decay),
        ScheduleKind::InverseSqrt => "divided by sqrt(epoch)".to_string(),
    };
    explain::text(es, "Learning Rate", &format!("{} ({schedule})", p.learning_rate));
    if p.l1 > 0.0 {
        explain::float(es, "L1", None, p.l1, 6);
    }
    if p.normalize {
        explain::boolean(es, "Normalize", true);
    }
    if let Some(v) = &p.validation {
        explain::text(es, "Validation", &format!("{v:?}"));
    }
    explain::int(es, "Batch Size", p.batch_size as i64);
    explain::float(es, "L2", None, p.l2, 6);
    if p.tolerance > 0.0 {
        explain::float(es, "Tolerance", None, p.tolerance, 6);
    }
    if explain::analyzing(es) {
        explain::int(es, "Epochs Run", state.epochs_run as i64);
        if let Some(stats) = &state.last_stats {
            explain::float(es, "Final Loss", None, stats.loss, 6);
            if let Some(a) = stats.accuracy {
                explain::float(es, "Final Training Accuracy", None, a, 4);
            }
            if let Some(r2) = stats.r2 {
                explain::float(es, "Final Training R2", None, r2, 4);
            }
            explain::int(es, "Tuples Per Epoch", stats.tuples as i64);
        }
        let times: Vec<String> = state.epoch_seconds.iter().map(|s| format!("{:.3}", s * 1000.0)).collect();
        explain::text(es, "Epoch Times (ms)", &times.join(", "));
        if p.double_buffer {
            explain::float(es, "Worker Busy", Some("s"), state.worker_busy_seconds, 3);
            explain::float(es, "Backend Waiting On Worker", Some("s"), state.backend_wait_seconds, 3);
        }
    }
}
