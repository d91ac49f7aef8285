//! CorgiPile SGD: pulls shuffled buffers from TupleShuffle and runs the epochs, rescanning its
//! child between epochs (which draws a new block order and a new tuple shuffle).
//!
//! Double buffering: an SGD worker thread trains on buffer A while this (backend) thread fills
//! buffer B through the executor; owned buffers travel over crossbeam channels. The worker
//! touches only owned Rust data — never PostgreSQL. The backend checks for interrupts while it
//! waits, and the `Worker` guard stops and joins the thread on every exit path, ERROR included.

use super::tuple_shuffle::{ShuffledBuffer, TupleShuffleState};
use super::{config_of, create_node, explain, init_child, install_state, methods, state_of};
use crate::error::{notice, raise};
use crate::plan::PipelineConfig;
use corgipile_ml::model::LinearModel;
use corgipile_ml::trainer::{EpochStats, TrainConfig, TrainError, Trainer};
use crossbeam_channel::{bounded, unbounded, Receiver, RecvTimeoutError, Sender};
use pgrx::{check_for_interrupts, pg_guard, pg_sys, PgSqlErrorCode};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub struct EpochRecord {
    pub stats: EpochStats,
    pub seconds: f64,
}

/// What a finished training produced; the caller stores it in the catalog.
pub struct TrainOutcome {
    pub model: LinearModel,
    /// Raw label values mapped to the negative and positive class.
    pub label_map: (f64, f64),
    pub epochs: Vec<EpochRecord>,
    pub rows_trained: u64,
    pub rows_skipped: u64,
    pub seconds: f64,
}

pub struct SgdState {
    config: PipelineConfig,
    child: *mut pg_sys::PlanState,
    done: bool,
    pub outcome: Option<TrainOutcome>,
    /// Whether to write a progress NOTICE per epoch (off for EXPLAIN ANALYZE).
    pub verbose: bool,
    // EXPLAIN ANALYZE figures.
    backend_wait_seconds: f64,
    worker_busy_seconds: f64,
    last_stats: Option<EpochStats>,
    epochs_run: u32,
}

enum Job {
    StartEpoch(u32),
    Train(ShuffledBuffer),
    EndEpoch,
}

enum Reply {
    Consumed(ShuffledBuffer),
    EpochDone { result: Result<EpochStats, TrainError>, labels_seen: usize, busy_seconds: f64 },
    Failed(TrainError),
    Panicked(String),
}

/// The SGD worker thread. Dropping it closes the job channel and joins the thread.
struct Worker {
    jobs: Option<Sender<Job>>,
    replies: Receiver<Reply>,
    handle: Option<JoinHandle<Trainer>>,
}

impl Worker {
    fn spawn(mut trainer: Trainer) -> Worker {
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
                        Job::EndEpoch => {
                            let result = trainer.finish_epoch();
                            let labels_seen = trainer.labels_seen().len();
                            let _ = replies_tx.send(Reply::EpochDone { result, labels_seen, busy_seconds: busy });
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
        Worker { jobs: Some(jobs_tx), replies: replies_rx, handle: Some(handle) }
    }

    fn send(&self, job: Job) {
        if self.jobs.as_ref().expect("worker running").send(job).is_err() {
            // The worker stopped: it says why in its last reply.
            while let Ok(reply) = self.replies.try_recv() {
                if matches!(reply, Reply::Failed(_) | Reply::Panicked(_)) {
                    raise_reply(reply);
                }
            }
            raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "corgipile SGD worker thread exited unexpectedly", None);
        }
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
        // Closing the channel ends the worker's loop; it finishes at most one buffer first.
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

fn raise_train_error(e: TrainError) -> ! {
    match e {
        TrainError::TooManyLabels { values } => raise(
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            format!(
                "the label column has more than two distinct values (saw {}, {} and {})",
                values[0], values[1], values[2]
            ),
            Some("svm and logistic are binary classifiers: the label must have exactly two distinct values.".into()),
        ),
        TrainError::Diverged { epoch } => raise(
            PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            format!("training diverged in epoch {epoch}: the loss or the weights became NaN or infinite"),
            Some("Use a smaller learning_rate (or scale the features).".into()),
        ),
    }
}

/// Raise the ERROR a worker failure stands for.
fn raise_reply(reply: Reply) -> ! {
    match reply {
        Reply::Failed(e) => raise_train_error(e),
        Reply::Panicked(message) => raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("corgipile SGD worker failed: {message}"),
            None,
        ),
        _ => raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "corgipile SGD worker sent an unexpected reply", None),
    }
}

impl SgdState {
    unsafe fn train(&mut self) {
        let started = Instant::now();
        // SAFETY: our plan always has TupleShuffle as this node's only child.
        let shuffle = state_of::<TupleShuffleState>(self.child.cast());
        let params = self.config.params.clone();
        let Some(first) = shuffle.next_buffer(None) else {
            let skipped = shuffle.rows_skipped_this_epoch;
            if skipped > 0 {
                raise(
                    PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                    format!("all {skipped} rows of {} were skipped (NULL label, NULL or empty features)", self.config.relation),
                    Some("Rows need a non-NULL label and a non-empty features array.".into()),
                );
            }
            raise(
                PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
                format!("{} has no rows to train on", self.config.relation),
                Some("The table is empty, or the WHERE clause / row-level security policies hide every row.".into()),
            );
        };
        let n_features = first.arena.n_features();
        let train_config = TrainConfig {
            kind: self.config.model,
            learning_rate: params.learning_rate,
            decay: params.decay,
            l2: params.l2,
            batch_size: params.batch_size as usize,
        };
        let trainer = Trainer::new(train_config, n_features);
        let mut epochs: Vec<EpochRecord> = Vec::new();
        let mut rows_skipped = 0;
        let mut first = Some(first);
        let (mut worker, mut local) = if params.double_buffer {
            (Some(Worker::spawn(trainer)), None)
        } else {
            (None, Some(trainer))
        };
        let mut spares: Vec<ShuffledBuffer> = Vec::new();

        for epoch in 1..=params.epochs {
            let epoch_started = Instant::now();
            if epoch > 1 {
                pg_sys::ExecReScan(self.child);
            }
            let (result, labels_seen) = match (&mut worker, &mut local) {
                (Some(w), _) => self.epoch_with_worker(w, shuffle, &mut spares, first.take(), epoch),
                (None, Some(t)) => self.epoch_on_backend(t, shuffle, &mut spares, first.take(), epoch),
                _ => unreachable!(),
            };
            let stats = result.unwrap_or_else(|e| raise_train_error(e));
            if epoch == 1 {
                rows_skipped = shuffle.rows_skipped_this_epoch;
                if labels_seen < 2 {
                    raise(
                        PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                        format!("the label column of {} has only one distinct value", self.config.relation),
                        Some("Binary classifiers need rows of both classes.".into()),
                    );
                }
            }
            let seconds = epoch_started.elapsed().as_secs_f64();
            if self.verbose {
                notice(format!(
                    "corgipile epoch {:>3}/{}: loss {:.6}  accuracy {:.4}  tuples {}  lr {:.3e}  {:.3} s",
                    epoch, params.epochs, stats.loss, stats.accuracy, stats.tuples, stats.learning_rate, seconds
                ));
            }
            let converged = params.tolerance > 0.0
                && epochs.last().is_some_and(|prev: &EpochRecord| (prev.stats.loss - stats.loss).abs() < params.tolerance);
            self.epochs_run = epoch;
            self.last_stats = Some(stats.clone());
            epochs.push(EpochRecord { stats, seconds });
            if converged {
                break;
            }
        }
        let trainer = match worker.take() {
            Some(w) => w.finish(),
            None => local.take().expect("local trainer"),
        };
        let label_map = trainer.label_map().expect("two labels were checked after epoch 1");
        self.outcome = Some(TrainOutcome {
            model: trainer.model().clone(),
            label_map,
            rows_trained: epochs.last().map_or(0, |e| e.stats.tuples),
            rows_skipped,
            epochs,
            seconds: started.elapsed().as_secs_f64(),
        });
    }

    /// One epoch, double-buffered: the worker trains one buffer while we fill the next.
    unsafe fn epoch_with_worker(
        &mut self,
        worker: &mut Worker,
        shuffle: &mut TupleShuffleState,
        spares: &mut Vec<ShuffledBuffer>,
        mut first: Option<ShuffledBuffer>,
        epoch: u32,
    ) -> (Result<EpochStats, TrainError>, usize) {
        worker.send(Job::StartEpoch(epoch));
        let mut in_flight = 0;
        loop {
            while in_flight >= 2 {
                match worker.wait(&mut self.backend_wait_seconds) {
                    Reply::Consumed(b) => {
                        spares.push(b);
                        in_flight -= 1;
                    }
                    other => raise_reply(other),
                }
            }
            let next = match first.take() {
                Some(b) => Some(b),
                None => shuffle.next_buffer(spares.pop()),
            };
            let Some(buffer) = next else { break };
            worker.send(Job::Train(buffer));
            in_flight += 1;
        }
        worker.send(Job::EndEpoch);
        loop {
            match worker.wait(&mut self.backend_wait_seconds) {
                Reply::Consumed(b) => spares.push(b),
                Reply::EpochDone { result, labels_seen, busy_seconds } => {
                    self.worker_busy_seconds += busy_seconds;
                    return (result, labels_seen);
                }
                other => raise_reply(other),
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
    };
    install_state(node, state);
}

/// Runs the whole training on the first call; returns no rows.
#[pg_guard]
pub unsafe extern "C-unwind" fn exec(node: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
    let state = state_of::<SgdState>(node);
    if !state.done {
        state.done = true;
        state.train();
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
    explain::text(es, "Learning Rate", &format!("{} (x{} per epoch)", p.learning_rate, p.decay));
    explain::int(es, "Batch Size", p.batch_size as i64);
    explain::float(es, "L2", None, p.l2, 6);
    if p.tolerance > 0.0 {
        explain::float(es, "Tolerance", None, p.tolerance, 6);
    }
    if explain::analyzing(es) {
        explain::int(es, "Epochs Run", state.epochs_run as i64);
        if let Some(stats) = &state.last_stats {
            explain::float(es, "Final Loss", None, stats.loss, 6);
            explain::float(es, "Final Training Accuracy", None, stats.accuracy, 4);
            explain::int(es, "Tuples Per Epoch", stats.tuples as i64);
        }
        if p.double_buffer {
            explain::float(es, "Worker Busy", Some("s"), state.worker_busy_seconds, 3);
            explain::float(es, "Backend Waiting On Worker", Some("s"), state.backend_wait_seconds, 3);
        }
    }
}
