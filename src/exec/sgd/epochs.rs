//! One epoch of a training: double-buffered (the SGD thread trains one buffer while the
//! backend fills the next) or on the backend alone.

use super::double_buffer::{raise_reply, Job, Reply, Worker};
use super::SgdNode;
use crate::exec::tuple_shuffle::{ShuffledBuffer, TupleShuffle};
use crate::pg::error::raise;
use crate::pipeline::EpochCounts;
use corgipile_ml::trained::Model;
use corgipile_ml::trainer::{EpochStats, TrainError};
use corgipile_ml::trials::Trials;
use pgrx::{pg_sys, PgSqlErrorCode};

impl SgdNode {
    /// One epoch, double-buffered: the worker trains one buffer while we fill the next. With
    /// `fill_next` the next epoch's scan begins before the worker has finished this one: once
    /// this epoch's last buffer is handed over, or, when that buffer is short of full and the
    /// worker still trains the one before it, right away (`end_epoch_filling_ahead`); the next
    /// epoch's first buffer is filled while the worker finishes (otherwise both sides would
    /// wait on each other at every epoch boundary: about one buffer's fill and one's training).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn epoch_with_worker(
        &mut self,
        worker: &mut Worker,
        shuffle: &mut TupleShuffle,
        spares: &mut Vec<ShuffledBuffer>,
        mut first: Option<ShuffledBuffer>,
        epoch: u32,
        snapshot: bool,
        fill_next: bool,
    ) -> EpochEnd {
        worker
            .send(Job::StartEpoch(epoch))
            .unwrap_or_else(|r| raise_reply(r, &self.label_text(), self.config.params.normalize));
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
            // The worker still trains the buffer before (in flight, none spare): see
            // end_epoch_filling_ahead.
            if fill_next && in_flight > 0 && spares.is_empty() && shuffle.can_fill_ahead(&buffer) {
                // SAFETY: a private method of this node that needs only what every method of a live SgdNode
                // has (its child initialized, inside the executor run).
                return unsafe {
                    self.end_epoch_filling_ahead(worker, shuffle, spares, buffer, snapshot)
                };
            }
            worker.send(Job::Train(buffer)).unwrap_or_else(|r| {
                raise_reply(r, &self.label_text(), self.config.params.normalize)
            });
            in_flight += 1;
        }
        worker
            .send(Job::EndEpoch { snapshot })
            .unwrap_or_else(|r| raise_reply(r, &self.label_text(), self.config.params.normalize));
        let mut end = None;
        let (mut next_first, mut rows_of_epoch) = (None, None);
        if fill_next {
            // A buffer to fill: a spare, or the next one the worker is done with.
            while spares.is_empty() && end.is_none() {
                // SAFETY: a private method of this node that needs only what every method of a live SgdNode
                // has (its child initialized, inside the executor run).
                end = unsafe { self.take_reply(worker, spares) };
            }
            rows_of_epoch = Some(shuffle.counts());
            // SAFETY: an FFI call on the backend thread, inside the executor run, on this node's child
            // (initialized in begin, alive until end).
            unsafe { pg_sys::ExecReScan(self.child) };
            next_first = Some(shuffle.next_buffer(spares.pop()));
        }
        // SAFETY: a private method of this node that needs only what every method of a live SgdNode
        // has (its child initialized, inside the executor run).
        unsafe { self.epoch_end(worker, spares, end, next_first, rows_of_epoch) }
    }

    /// The end of a double-buffered epoch whose last buffer, `last`, is short of full (the
    /// usual case: a table is rarely a whole number of buffers) while the worker still trains
    /// the one before it. Waiting for that buffer to come back before reading the next epoch
    /// into it left the backend idle about one buffer's training, every epoch. Instead the
    /// next epoch's scan begins at once and its first rows go into `last`'s room until the
    /// worker is done; they are then moved into the returned buffer, `last` (now only its own
    /// rows) goes to the worker, and the next epoch's first buffer is filled on. Its rows and
    /// their order are what the plain end would have read: the models are the same.
    unsafe fn end_epoch_filling_ahead(
        &mut self,
        worker: &mut Worker,
        shuffle: &mut TupleShuffle,
        spares: &mut Vec<ShuffledBuffer>,
        mut last: ShuffledBuffer,
        snapshot: bool,
    ) -> EpochEnd {
        let rows_of_epoch = Some(shuffle.counts());
        pg_sys::ExecReScan(self.child);
        let from = shuffle.fill_ahead(&mut last, || worker.has_reply());
        while spares.is_empty() {
            if self.take_reply(worker, spares).is_some() {
                raise(
                    PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                    "corgipile SGD worker ended an epoch before its last buffer",
                    None,
                );
            }
        }
        let recycled = spares.pop().expect("a buffer came back");
        let next = shuffle.take_ahead(recycled, &mut last, from);
        let normalize = self.config.params.normalize;
        worker
            .send(Job::Train(last))
            .unwrap_or_else(|r| raise_reply(r, &self.label_text(), normalize));
        worker
            .send(Job::EndEpoch { snapshot })
            .unwrap_or_else(|r| raise_reply(r, &self.label_text(), normalize));
        let next_first = Some(shuffle.fill_on(next));
        self.epoch_end(worker, spares, None, next_first, rows_of_epoch)
    }

    /// The epoch's end as the worker reports it (`end`, when it came already), with the next
    /// epoch's first buffer and this epoch's row counts when its scan has begun.
    unsafe fn epoch_end(
        &mut self,
        worker: &mut Worker,
        spares: &mut Vec<ShuffledBuffer>,
        mut end: Option<EpochResult>,
        next_first: Option<Option<ShuffledBuffer>>,
        rows_of_epoch: Option<EpochCounts>,
    ) -> EpochEnd {
        while end.is_none() {
            end = self.take_reply(worker, spares);
        }
        let (result, labels_seen, model) = end.expect("the epoch ended");
        EpochEnd {
            result,
            labels_seen,
            model,
            next_first,
            rows_of_epoch,
        }
    }

    /// Waits for the worker's next reply: a consumed buffer goes to `spares`; the end of the
    /// epoch is returned; anything else is raised.
    unsafe fn take_reply(
        &mut self,
        worker: &mut Worker,
        spares: &mut Vec<ShuffledBuffer>,
    ) -> Option<EpochResult> {
        match worker.wait(&mut self.backend_wait_seconds) {
            Reply::Consumed(b) => {
                spares.push(b);
                None
            }
            Reply::EpochDone {
                result,
                labels_seen,
                busy_seconds,
                model,
                label_map,
            } => {
                self.worker_busy_seconds += busy_seconds;
                self.binary_labels = label_map;
                Some((result, labels_seen, model))
            }
            other => raise_reply(other, &self.label_text(), self.config.params.normalize),
        }
    }

    /// One epoch, single-buffered: fill, then train, on the backend thread.
    pub(super) fn epoch_on_backend(
        &mut self,
        trainer: &mut Trials,
        shuffle: &mut TupleShuffle,
        spares: &mut Vec<ShuffledBuffer>,
        mut first: Option<ShuffledBuffer>,
        epoch: u32,
    ) -> (Result<Vec<Option<EpochStats>>, TrainError>, Vec<f64>) {
        trainer.start_epoch(epoch);
        loop {
            let next = match first.take() {
                Some(b) => Some(b),
                None => shuffle.next_buffer(spares.pop()),
            };
            let Some(mut buffer) = next else { break };
            let (arena, order) = buffer.visit();
            if let Err(e) = trainer.train_buffer(arena, order) {
                return (Err(e), trainer.labels_seen());
            }
            spares.push(buffer);
        }
        (trainer.finish_epoch(), trainer.labels_seen())
    }
}

/// What the worker reports at the end of an epoch: the epoch's stats, the distinct label values
/// seen, and the model snapshot when one was asked for.
pub(super) type EpochResult = (
    Result<Vec<Option<EpochStats>>, TrainError>,
    Vec<f64>,
    Option<Vec<Option<Model>>>,
);

/// How a double-buffered epoch ended.
pub(super) struct EpochEnd {
    pub(super) result: Result<Vec<Option<EpochStats>>, TrainError>,
    pub(super) labels_seen: Vec<f64>,
    pub(super) model: Option<Vec<Option<Model>>>,
    /// Some when the next epoch's scan has begun: its first buffer (None if it has no rows).
    pub(super) next_first: Option<Option<ShuffledBuffer>>,
    /// This epoch's counts, read before the next epoch's scan reset them.
    pub(super) rows_of_epoch: Option<EpochCounts>,
}
