//! The SGD worker thread of double buffering: it trains on one buffer while the backend fills
//! the next; owned buffers travel over crossbeam channels. The worker touches only owned Rust
//! data — never PostgreSQL. The backend checks for interrupts while it waits, and the `Worker`
//! guard stops and joins the thread on every exit path, ERROR included.

use crate::exec::tuple_shuffle::ShuffledBuffer;
use crate::pg::error::{raise, raise_train_error};
use corgipile_ml::standardize::Standardizer;
use corgipile_ml::stats::FeatureStats;
use corgipile_ml::trained::Model;
use corgipile_ml::trainer::{EpochStats, TrainError};
use corgipile_ml::trials::Trials;
use crossbeam_channel::{bounded, unbounded, Receiver, RecvTimeoutError, Sender};
use pgrx::{check_for_interrupts, PgSqlErrorCode};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub enum Job {
    StartEpoch(u32),
    Train(ShuffledBuffer),
    /// Learner `i` of a search trains no more (early stopping).
    Stop(usize),
    /// From now on, the learners that hold out a fold score it (see `Trials::score_holdouts`).
    ScoreHoldouts(Option<Standardizer>),
    /// End the epoch; `snapshot` = also send a copy of the model (for validation).
    EndEpoch {
        snapshot: bool,
    },
}

pub enum Reply {
    Consumed(ShuffledBuffer),
    EpochDone {
        /// Each learner's (None: set aside, see `Trials`).
        result: Result<Vec<Option<EpochStats>>, TrainError>,
        /// Binary kinds: the distinct label values seen so far.
        labels_seen: Vec<f64>,
        label_map: Option<(f64, f64)>,
        busy_seconds: f64,
        /// Each learner's model, when a snapshot was asked for.
        model: Option<Vec<Option<Model>>>,
    },
    Failed(TrainError),
    Panicked(String),
}

/// The SGD worker thread. Dropping it raises the stop flag, closes the job channel and joins
/// the thread, which stops within about a millisecond of work (the trainer checks the flag
/// between rows), so an ERROR or cancel never waits for a buffer to finish.
pub struct Worker {
    jobs: Option<Sender<Job>>,
    replies: Receiver<Reply>,
    handle: Option<JoinHandle<Trials>>,
    stop: Arc<AtomicBool>,
}

impl Worker {
    pub fn spawn(mut trainer: Trials) -> Worker {
        let stop = Arc::new(AtomicBool::new(false));
        trainer.set_interrupt(|| {
            let stop_seen = stop.clone();
            Box::new(move || stop_seen.load(Ordering::Relaxed))
        });
        // Two buffers at most exist, so a small bound never blocks the backend for long.
        let (jobs_tx, jobs_rx) = bounded::<Job>(4);
        let (replies_tx, replies_rx) = unbounded::<Reply>();
        let body = move || {
            let mut busy = 0.0f64;
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                for job in jobs_rx.iter() {
                    match job {
                        Job::Stop(i) => trainer.stop(i),
                        Job::ScoreHoldouts(scaling) => trainer.score_holdouts(scaling),
                        Job::StartEpoch(epoch) => {
                            trainer.start_epoch(epoch);
                            busy = 0.0;
                        }
                        Job::Train(mut buffer) => {
                            let started = Instant::now();
                            // The tuple shuffle is drawn here, off the backend (see visit).
                            let (arena, order) = buffer.visit();
                            let result = trainer.train_buffer(arena, order);
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
                            let labels_seen = trainer.labels_seen();
                            // What would be stored now (the average, when averaging).
                            let model = match snapshot.then(|| trainer.result_models()) {
                                Some(Err(bytes)) => {
                                    let _ = replies_tx
                                        .send(Reply::Failed(TrainError::OutOfMemory { bytes }));
                                    return;
                                }
                                copy => copy.map(|c| c.expect("Err returned above")),
                            };
                            let label_map = trainer.label_map();
                            let _ = replies_tx.send(Reply::EpochDone {
                                result,
                                labels_seen,
                                label_map,
                                busy_seconds: busy,
                                model,
                            });
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
        Worker {
            jobs: Some(jobs_tx),
            replies: replies_rx,
            handle: Some(handle),
            stop,
        }
    }

    /// Hands the worker a job. Err: the worker has stopped, and the reply that says why.
    #[allow(clippy::result_large_err)] // a rare, one-off error path
    pub fn send(&self, job: Job) -> Result<(), Reply> {
        if self
            .jobs
            .as_ref()
            .expect("worker running")
            .send(job)
            .is_ok()
        {
            return Ok(());
        }
        while let Ok(reply) = self.replies.try_recv() {
            if matches!(reply, Reply::Failed(_) | Reply::Panicked(_)) {
                return Err(reply);
            }
        }
        Err(Reply::Panicked(
            "the worker thread exited unexpectedly".into(),
        ))
    }

    /// Next reply, checking for cancel/statement_timeout every 50 ms while waiting.
    pub fn wait(&self, waited: &mut f64) -> Reply {
        let started = Instant::now();
        let Some(reply) = recv_interruptible(&self.replies) else {
            raise(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                "corgipile SGD worker thread exited unexpectedly",
                None,
            )
        };
        *waited += started.elapsed().as_secs_f64();
        reply
    }

    /// Whether a reply is waiting (`wait` would not block).
    pub fn has_reply(&self) -> bool {
        !self.replies.is_empty()
    }

    pub fn finish(mut self) -> Trials {
        self.jobs = None;
        let handle = self.handle.take().expect("worker running");
        match handle.join() {
            Ok(trainer) => trainer,
            Err(_) => raise(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                "corgipile SGD worker thread panicked",
                None,
            ),
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

/// The statistics pass of double buffering: a thread pushes one buffer's rows into the
/// statistics while the backend fills the next (the pass cost their sum before). Like
/// `Worker`, it touches only owned Rust data, and dropping it stops and joins the thread.
pub struct StatsWorker {
    buffers: Option<Sender<ShuffledBuffer>>,
    returned: Receiver<ShuffledBuffer>,
    handle: Option<JoinHandle<Option<FeatureStats>>>,
    stop: Arc<AtomicBool>,
}

impl StatsWorker {
    /// `classifier`: count the label values too (see `FeatureStats::new`).
    pub fn spawn(classifier: bool) -> StatsWorker {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_seen = stop.clone();
        let (buffers_tx, buffers_rx) = bounded::<ShuffledBuffer>(2);
        let (returned_tx, returned_rx) = unbounded::<ShuffledBuffer>();
        let handle = spawn_with_signals_blocked(move || {
            let mut stats: Option<FeatureStats> = None;
            for buffer in buffers_rx.iter() {
                let st = stats.get_or_insert_with(|| {
                    FeatureStats::new(buffer.arena.n_features(), classifier)
                });
                if !st.push_arena(&buffer.arena, || !stop_seen.load(Ordering::Relaxed)) {
                    return None;
                }
                let _ = returned_tx.send(buffer);
            }
            stats
        });
        StatsWorker {
            buffers: Some(buffers_tx),
            returned: returned_rx,
            handle: Some(handle),
            stop,
        }
    }

    /// Hands the thread a filled buffer.
    pub fn push(&self, buffer: ShuffledBuffer) {
        if self
            .buffers
            .as_ref()
            .expect("running")
            .send(buffer)
            .is_err()
        {
            raise_stats_thread_failed();
        }
    }

    /// A buffer whose rows are counted, to fill again; checks for cancel/statement_timeout
    /// every 50 ms while waiting.
    pub fn wait_returned(&self) -> ShuffledBuffer {
        recv_interruptible(&self.returned).unwrap_or_else(|| raise_stats_thread_failed())
    }

    /// The statistics of every buffer pushed (None if none was).
    pub fn finish(mut self) -> Option<FeatureStats> {
        // Closing the channel ends the thread's loop once it has counted the last buffer. The
        // buffers still coming back are not needed; that channel closes when the thread ends.
        self.buffers = None;
        while recv_interruptible(&self.returned).is_some() {}
        match self.handle.take().expect("running").join() {
            Ok(stats) => stats,
            Err(_) => raise_stats_thread_failed(),
        }
    }
}

impl Drop for StatsWorker {
    fn drop(&mut self) {
        // The flag stops the buffer in progress within a row; closing the channel ends the loop.
        self.stop.store(true, Ordering::Relaxed);
        self.buffers = None;
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// The next message of `rx`, checking for cancel/statement_timeout every 50 ms while waiting;
/// None once the sending thread is gone.
fn recv_interruptible<T>(rx: &Receiver<T>) -> Option<T> {
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(message) => return Some(message),
            Err(RecvTimeoutError::Timeout) => {
                check_for_interrupts!();
            }
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

fn raise_stats_thread_failed() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        "corgipile statistics thread exited unexpectedly",
        None,
    )
}

/// Spawns the worker thread (see `crate::pg::thread`); an ERROR when it cannot be.
fn spawn_with_signals_blocked<T: Send + 'static>(
    body: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    crate::pg::thread::spawn_with_signals_blocked("corgipile-sgd", body).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_RESOURCES,
            format!("could not start the corgipile SGD worker thread: {e}"),
            Some("Set \"double_buffer\": false to train without a worker thread.".into()),
        )
    })
}

/// Raise the ERROR a worker failure stands for.
pub fn raise_reply(reply: Reply, label: &dyn Fn(f64) -> String, normalized: bool) -> ! {
    match reply {
        Reply::Failed(e) => raise_train_error(e, label, normalized),
        Reply::Panicked(message) => raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("corgipile SGD worker failed: {message}"),
            None,
        ),
        _ => raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            "corgipile SGD worker sent an unexpected reply",
            None,
        ),
    }
}
