//! Progress of a running corgipile_train, shown where every DBA already looks: the backend's
//! activity line in pg_stat_activity.query (the corgipile.progress view parses it). No shared
//! memory, so no shared_preload_libraries. The line is
//!
//! `corgipile: relation R model M | phase | epoch k/n | p% | tuples t | loss L | elapsed E s |
//! remaining R s [| shards S] | query: <the statement>`
//!
//! (`loss` is the last finished epoch's; `-` when unknown; `shards` only for a sharded table:
//! the round and each shard's state). Everything here runs on the backend
//! thread only; the state is a thread-local that the SGD node's `Tracker` clears when the query
//! ends or fails.

use corgipile_ml::trainer::{remaining_seconds, ProgressLine};
use pgrx::pg_sys;
use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::time::{Duration, Instant};

/// How often block-level progress may rewrite the activity line.
const REPORT_EVERY: Duration = Duration::from_millis(250);

/// At most this much of the activity line describes the shards.
const SHARDS_MAX_BYTES: usize = 400;

struct Progress {
    relation: String,
    model: &'static str,
    epochs: u32,
    phase: &'static str,
    epoch: u32,
    /// Fraction of the current epoch's blocks started.
    epoch_fraction: f64,
    tuples: u64,
    last_loss: Option<f64>,
    started: Instant,
    /// Time spent in finished epochs (training passes), for the estimate.
    epoch_seconds: f64,
    epochs_done: u32,
    epoch_started: Instant,
    last_report: Instant,
    /// Sharded tables: the round and each shard's state.
    shards: Option<String>,
    query: String,
}

thread_local! {
    static PROGRESS: RefCell<Option<Progress>> = const { RefCell::new(None) };
}

/// Clears the progress state when dropped (with the SGD node's state: at the end of the query,
/// or when an ERROR aborts it), so a later statement never reports a stale training.
pub struct Tracker(());

impl Drop for Tracker {
    fn drop(&mut self) {
        PROGRESS.with(|p| p.borrow_mut().take());
    }
}

/// Start reporting a training of `epochs` epochs.
pub fn start(relation: &str, model: &'static str, epochs: u32) -> Tracker {
    // SAFETY: debug_query_string is the backend's current statement text (or NULL), read on
    // the backend thread while that statement runs.
    let query = unsafe {
        let q = pg_sys::debug_query_string;
        if q.is_null() {
            String::new()
        } else {
            CStr::from_ptr(q).to_string_lossy().into_owned()
        }
    };
    let now = Instant::now();
    PROGRESS.with(|p| {
        *p.borrow_mut() = Some(Progress {
            relation: relation.to_owned(),
            model,
            epochs,
            phase: "starting",
            epoch: 0,
            epoch_fraction: 0.0,
            tuples: 0,
            last_loss: None,
            started: now,
            epoch_seconds: 0.0,
            epochs_done: 0,
            epoch_started: now,
            last_report: now,
            shards: None,
            query,
        })
    });
    report(true);
    Tracker(())
}

/// A new phase: "statistics pass", "training", "validation".
pub fn phase(phase: &'static str) {
    update(true, |p| p.phase = phase);
}

pub fn epoch_started(epoch: u32) {
    update(true, |p| {
        p.phase = "training";
        p.epoch = epoch;
        p.epoch_fraction = 0.0;
        p.tuples = 0;
        p.epoch_started = Instant::now();
    });
}

pub fn epoch_finished(loss: f64) {
    update(true, |p| {
        p.last_loss = Some(loss);
        p.epochs_done += 1;
        p.epoch_seconds += p.epoch_started.elapsed().as_secs_f64();
        p.epoch_fraction = 1.0;
    });
}

/// BlockShuffle starts a block: `blocks_done` of `blocks` this epoch, `tuples` read so far.
/// Cheap when no training is being tracked (evaluation, trace) or a report was made recently.
pub fn scanning(blocks_done: usize, blocks: usize, tuples: u64) {
    update(false, |p| {
        if p.phase == "training" {
            p.epoch_fraction = blocks_done as f64 / blocks.max(1) as f64;
            p.tuples = tuples;
        }
    });
}

/// A sharded training: the fraction of the epoch's rounds done, the tuples trained so far this
/// epoch, and the round and each shard's state (e.g. `round 3/64: s1 done 2000 tuples, s2
/// running 0.4 s`). Rewritten at most every 250 ms unless `force`; `state` is only built then.
pub fn shard_rounds(fraction: f64, tuples: u64, state: impl FnOnce() -> String, force: bool) {
    let due = PROGRESS.with(|p| {
        p.borrow()
            .as_ref()
            .is_some_and(|p| force || p.last_report.elapsed() >= REPORT_EVERY)
    });
    if due {
        update(true, |p| {
            p.epoch_fraction = fraction;
            p.tuples = tuples;
            // The line is cut at track_activity_query_size (1 kB by default): a long shard
            // list must not push " | query: " out of it, or the view loses the row.
            let mut state = state();
            if state.len() > SHARDS_MAX_BYTES {
                let mut end = SHARDS_MAX_BYTES;
                while !state.is_char_boundary(end) {
                    end -= 1;
                }
                state.truncate(end);
                state.push_str(" …");
            }
            p.shards = Some(state);
        });
    }
}

/// Put the statement's own text back as the activity (the training is over).
pub fn finish() {
    let query = PROGRESS.with(|p| p.borrow_mut().take().map(|p| p.query));
    if let Some(q) = query {
        set_activity(&q);
    }
}

fn update(force: bool, f: impl FnOnce(&mut Progress)) {
    let tracked = PROGRESS.with(|p| p.borrow_mut().as_mut().map(f).is_some());
    if tracked {
        report(force);
    }
}

fn report(force: bool) {
    let line = PROGRESS.with(|p| {
        let mut p = p.borrow_mut();
        let p = p.as_mut()?;
        if !force && p.last_report.elapsed() < REPORT_EVERY {
            return None;
        }
        p.last_report = Instant::now();
        Some(p.line())
    });
    if let Some(line) = line {
        set_activity(&line);
    }
}

fn set_activity(text: &str) {
    let text = CString::new(text.replace('\0', " ")).expect("NULs were replaced");
    // SAFETY: pgstat_report_activity copies the string (truncated to
    // track_activity_query_size) into this backend's shared status entry; backend thread only.
    unsafe { pg_sys::pgstat_report_activity(pg_sys::BackendState::STATE_RUNNING, text.as_ptr()) };
}

impl Progress {
    fn line(&self) -> String {
        let in_epoch_seconds = self.epoch_started.elapsed().as_secs_f64();
        ProgressLine {
            relation: &self.relation,
            model: self.model,
            phase: self.phase,
            epoch: self.epoch,
            epochs: self.epochs,
            epoch_fraction: self.epoch_fraction,
            tuples: self.tuples,
            last_loss: self.last_loss,
            elapsed_seconds: self.started.elapsed().as_secs_f64(),
            remaining_seconds: remaining_seconds(
                self.epochs,
                self.epochs_done,
                self.epoch,
                self.epoch_fraction,
                self.epoch_seconds,
                in_epoch_seconds,
            ),
            shards: self.shards.as_deref(),
            query: &self.query,
        }
        .render()
    }
}
