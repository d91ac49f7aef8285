//! Rows one at a time from BlockShuffle into a buffer (`pull_row`), and a page's rows at once
//! for a query of dense training rows only (`pull_dense_rows`): the per-row work that bounds
//! an epoch.

use super::{block_shuffle, tid_hash, Pulled, ShuffledBuffer, TupleShuffle};
use crate::decode::{Skip, Target};
use crate::pipeline::FeatureLayout;
use corgipile_ml::arena::TupleArena;
use pgrx::{check_for_interrupts, pg_sys};

impl TupleShuffle {
    /// Pull the next row from BlockShuffle. A training row is decoded into `arena` (created,
    /// and the buffer capacity fixed, on the first row); a validation row into the validation
    /// arena during the first pass.
    pub(super) fn pull_row(&mut self, arena: &mut Option<TupleArena>) -> Pulled {
        if self.exhausted {
            return Pulled::Done;
        }
        // The query's columns (label, features..., validation column) in order.
        let (values, nulls) = if let Some(n) = self.direct {
            let (direct_values, direct_nulls) = (&mut self.direct_values, &mut self.direct_nulls);
            // SAFETY: child is our initialized BlockShuffle node, whose output is exactly
            // these n table columns (plain_columns); the page the values point into stays
            // pinned until the next fetch.
            if !unsafe {
                block_shuffle::fetch_columns(
                    self.child.cast(),
                    &mut direct_values[..n],
                    &mut direct_nulls[..n],
                )
            } {
                return self.end_of_scan();
            }
            (
                self.direct_values.as_mut_ptr(),
                self.direct_nulls.as_mut_ptr(),
            )
        } else {
            // SAFETY: child is our initialized BlockShuffle node; its result slot stays valid
            // until the next ExecProcNode call.
            unsafe {
                let slot = pg_sys::ExecProcNode(self.child);
                if slot.is_null() || ((*slot).tts_flags & pg_sys::TTS_FLAG_EMPTY as u16) != 0 {
                    return self.end_of_scan();
                }
                let natts = (*(*slot).tts_tupleDescriptor).natts;
                if ((*slot).tts_nvalid as i32) < natts {
                    pg_sys::slot_getsomeattrs_int(slot, natts);
                }
                ((*slot).tts_values, (*slot).tts_isnull)
            }
        };
        // SAFETY: the child is our BlockShuffle node (see begin); its state lives as long as
        // this node's. `values`/`nulls` are the row just read (the query's columns, valid until
        // the next row is read), as `target` asks.
        let tid = unsafe { &(*self.block).last_tid };
        let (target, label) = match unsafe {
            self.rows
                .target(values, nulls, tid, (*self.block).row_table())
        } {
            Ok(t) => t,
            Err(Skip::Counted) => {
                self.rows_skipped_this_epoch += 1;
                self.tids_this_epoch = self.tids_this_epoch.wrapping_add(tid_hash(tid));
                return Pulled::Skipped;
            }
            Err(Skip::Uncounted) => return Pulled::Skipped,
        };
        if target == Target::Train && arena.is_none() {
            // SAFETY: the same row, still valid.
            let a = unsafe { self.new_arena_like(values, nulls) };
            if self.config().layout != FeatureLayout::Tabular {
                self.plan_shuffle(&a);
            }
            *arena = Some(a);
        }
        let train_arena = match target {
            Target::Train => arena.as_mut(),
            Target::Validation => None,
        };
        // SAFETY: the same row, still valid.
        if !unsafe {
            self.rows
                .decode(target, label, train_arena, values, nulls, tid)
        } {
            self.rows_skipped_this_epoch += 1;
            self.tids_this_epoch = self.tids_this_epoch.wrapping_add(tid_hash(tid));
            return Pulled::Skipped;
        }
        if target == Target::Validation {
            return Pulled::Validation;
        }
        if let FeatureLayout::Sparse { .. } = self.config().layout {
            // The arena grows with the largest index: the model must fit it.
            let dimension = arena.as_ref().map_or(0, |a| a.n_features());
            self.rows.check_dimension(dimension, tid);
        }
        self.count_taken(1);
        self.tids_this_epoch = self.tids_this_epoch.wrapping_add(tid_hash(tid));
        count_toward_interrupt_check(
            &mut self.until_interrupt_check,
            self.rows_between_interrupt_checks,
        );
        Pulled::Row
    }

    /// The rows left on the page being read, into `arena` until it is full: what `pull_row`
    /// does for each, for a query of dense training rows only (`RowDecoder::dense_rows_only`)
    /// read by the page reader, without its per-row questions (which target, which layout,
    /// which arena). An epoch is bound by the backend's work per row.
    pub(super) fn pull_dense_rows(&mut self, arena: &mut TupleArena) {
        let room = self.capacity.saturating_sub(arena.len()) as u64;
        let (mut taken, mut skipped, mut tids) = (0u64, 0u64, 0u64);
        let rows = &mut self.rows;
        let countdown = &mut self.until_interrupt_check;
        let every = self.rows_between_interrupt_checks;
        // SAFETY: child is our initialized BlockShuffle node, whose output is exactly these
        // two table columns (plain_columns); the page stays pinned during the call, so each
        // row given to the closure is valid for push_dense_row.
        unsafe {
            block_shuffle::rows_on_page(
                self.child.cast(),
                &mut self.direct_values[..2],
                &mut self.direct_nulls[..2],
                |values, nulls, tid| {
                    tids = tids.wrapping_add(tid_hash(tid));
                    if !rows.push_dense_row(arena, values, nulls, tid) {
                        skipped += 1;
                        return true;
                    }
                    taken += 1;
                    count_toward_interrupt_check(countdown, every);
                    taken < room
                },
            )
        };
        self.rows_skipped_this_epoch += skipped;
        self.tids_this_epoch = self.tids_this_epoch.wrapping_add(tids);
        self.count_taken(taken);
    }

    /// Rows in scan order into `arena` (made by the first row when None) until it holds
    /// `capacity` rows, the pass ends, or `stop()` says so (asked before each page or row):
    /// dense rows a page at a time when the output allows, one row at a time otherwise.
    pub(super) fn pull_rows(
        &mut self,
        arena: &mut Option<TupleArena>,
        mut stop: impl FnMut() -> bool,
    ) {
        let dense_rows = self.direct == Some(2) && self.rows.dense_rows_only();
        while !stop() && arena.as_ref().is_none_or(|a| a.len() < self.capacity) {
            if let (true, Some(a)) = (dense_rows, arena.as_mut()) {
                self.pull_dense_rows(a);
                if a.len() >= self.capacity || stop() {
                    break;
                }
            }
            // The next row, from the next page when this one is done.
            if matches!(self.pull_row(arena), Pulled::Done) {
                break;
            }
        }
    }

    /// The next pass's first rows (it has begun: rescanned), read into the room the pass's
    /// last buffer `last` left while the SGD worker trains the buffer before it, until `back()`
    /// says that buffer has come back (or the room is full, or the pass ends): the backend
    /// would otherwise wait for it idle, once an epoch. Returns where the rows begin in
    /// `last`; `take_ahead` moves them into the next buffer.
    pub fn fill_ahead(&mut self, last: &mut ShuffledBuffer, back: impl FnMut() -> bool) -> usize {
        let from = last.arena.len();
        // SAFETY: our PlanState lives as long as this node's state.
        let instrument = unsafe { (*self.node).instrument };
        if !instrument.is_null() {
            // SAFETY: an FFI call on the backend thread, on the node's live instrumentation.
            unsafe { pg_sys::InstrStartNode(instrument) };
        }
        let before = self.tuples_read;
        // pull_rows takes the arena as an Option; the arena's vectors stay where they are.
        let mut arena = Some(std::mem::take(&mut last.arena));
        self.pull_rows(&mut arena, back);
        last.arena = arena.expect("taken above");
        if !instrument.is_null() {
            // SAFETY: as for InstrStartNode above.
            unsafe { pg_sys::InstrStopNode(instrument, (self.tuples_read - before) as f64) };
        }
        from
    }

    /// `n` more training or validation rows taken this epoch (BlockShuffle's sampling stops
    /// on rows taken).
    pub(super) fn count_taken(&mut self, n: u64) {
        self.tuples_read += n;
        self.rows_this_epoch += n;
        // SAFETY: the child's state lives as long as this node's.
        unsafe { (*self.block).rows_taken = self.rows_this_epoch };
    }

    pub(super) fn end_of_scan(&mut self) -> Pulled {
        self.exhausted = true;
        self.rows.end_of_pass();
        Pulled::Done
    }
}

/// One more row taken: interrupts are checked every `every` rows (`countdown` to the next).
/// Inlined into the row loops, with the check itself out of line (as a call per row it was
/// 1.8% of a dense epoch's backend).
#[inline(always)]
fn count_toward_interrupt_check(countdown: &mut u64, every: u64) {
    *countdown -= 1;
    if *countdown == 0 {
        *countdown = every;
        check_interrupts_now();
    }
}

#[cold]
#[inline(never)]
fn check_interrupts_now() {
    check_for_interrupts!();
}
