//! The ends of the shuffle: the receiver pass 1's query sends its rows to (each row to a pile),
//! and the writer that appends pass 2's rows to the new table with the bulk insert path.

use corgipile_ml::shuffle::PileShuffler;
use pgrx::prelude::*;
use pgrx::{check_for_interrupts, pg_guard, PgMemoryContexts};

use super::*;

/// The executor's receiver of pass 1: every row to a random pile.
#[repr(C)]
pub(super) struct PileReceiver {
    pub(super) dest: pg_sys::DestReceiver,
    pub(super) piles: *mut Vec<Pile>,
    pub(super) shuffler: *mut PileShuffler,
    pub(super) bytes_since_check: u64,
}

/// DestReceiver receiveSlot: one row of the query into a random pile.
///
/// # Safety
/// Called by the executor with `slot`, a row of the query, and `dest`, a [`PileReceiver`] whose
/// `piles` and `shuffler` point to live values for the query's run.
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn receive_slot(
    slot: *mut pg_sys::TupleTableSlot,
    dest: *mut pg_sys::DestReceiver,
) -> bool {
    let receiver = &mut *dest.cast::<PileReceiver>();
    let (piles, shuffler) = (&mut *receiver.piles, &mut *receiver.shuffler);
    // A row straight from the table's buffer needs no copy; a projected one is formed here.
    let mut should_free = false;
    let tuple = pg_sys::ExecFetchSlotHeapTuple(slot, false, &mut should_free);
    to_random_pile(
        piles,
        shuffler,
        (*tuple).t_len,
        tuple_body(tuple),
        &mut receiver.bytes_since_check,
    );
    if should_free {
        pg_sys::heap_freetuple(tuple);
    }
    true
}

/// DestReceiver rStartup: nothing to do.
///
/// # Safety
/// Called by the executor (reads nothing it is given).
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn receiver_startup(
    _dest: *mut pg_sys::DestReceiver,
    _operation: i32,
    _typeinfo: pg_sys::TupleDesc,
) {
}

/// DestReceiver rShutdown / rDestroy: nothing to do.
///
/// # Safety
/// Called by the executor (reads nothing it is given).
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn receiver_noop(_dest: *mut pg_sys::DestReceiver) {}

/// Rows inserted by one heap_multi_insert call (COPY's batch size).
pub(super) const INSERT_BATCH: usize = 1000;

/// Inserts into the new table in batches with heap_multi_insert (one WAL record per page, as
/// COPY does; CREATE TABLE AS inserts row by row), with a bulk insert state and no free-space
/// map lookups (WAL is skipped when wal_level = minimal for a table created in this
/// transaction).
pub(super) struct Writer {
    pub(super) rel: pg_sys::Relation,
    pub(super) bistate: pg_sys::BulkInsertState,
    pub(super) cid: pg_sys::CommandId,
    pub(super) slots: Vec<*mut pg_sys::TupleTableSlot>,
    pub(super) pending: usize,
    /// What heap_multi_insert allocates for a batch (its tuple array, TOASTed copies).
    pub(super) batch_memory: PgMemoryContexts,
    pub(super) rows: i64,
}

impl Writer {
    pub(super) fn open(relid: pg_sys::Oid) -> Writer {
        // SAFETY: the relation, slot and bulk-insert state are this writer's own, open from `open` until
        // `close`; FFI calls on the backend thread inside the SQL call's transaction.
        unsafe {
            let rel = pg_sys::table_open(relid, pg_sys::RowExclusiveLock as i32);
            let slots = (0..INSERT_BATCH)
                .map(|_| {
                    pg_sys::MakeSingleTupleTableSlot(
                        (*rel).rd_att,
                        &raw const pg_sys::TTSOpsHeapTuple,
                    )
                })
                .collect();
            Writer {
                rel,
                bistate: pg_sys::GetBulkInsertState(),
                cid: pg_sys::GetCurrentCommandId(true),
                slots,
                pending: 0,
                batch_memory: PgMemoryContexts::new("corgipile_shuffle insert"),
                rows: 0,
            }
        }
    }

    /// Queues one row for insertion; `tuple` must stay valid until the next `flush`.
    ///
    /// # Safety
    /// `tuple` points to a valid heap tuple of the writer's table's row type, which stays
    /// valid (neither freed nor changed) until the next `flush` or `close`.
    pub(super) unsafe fn insert(&mut self, tuple: *mut pg_sys::HeapTupleData) {
        // heap_multi_insert materializes every slot, which copies a row the slot does not
        // own. These rows are ours until the flush: the slot is told it owns the row (no copy)
        // and told otherwise right after the insert, before anything could free it.
        pg_sys::ExecStoreHeapTuple(tuple, self.slots[self.pending], true);
        self.pending += 1;
        if self.pending == INSERT_BATCH {
            self.flush();
        }
    }

    /// Inserts the queued rows (their headers are overwritten in place: a record's length is
    /// no longer needed).
    pub(super) fn flush(&mut self) {
        // SAFETY: the relation, slot and bulk-insert state are this writer's own, open from `open` until
        // `close`; FFI calls on the backend thread inside the SQL call's transaction.
        unsafe {
            if self.pending == 0 {
                return;
            }
            let (rel, slots, n, cid, bistate) = (
                self.rel,
                self.slots.as_mut_ptr(),
                self.pending as i32,
                self.cid,
                self.bistate,
            );
            self.batch_memory.switch_to(|_| {
                pg_sys::heap_multi_insert(
                    rel,
                    slots,
                    n,
                    cid,
                    pg_sys::TABLE_INSERT_SKIP_FSM as i32,
                    bistate,
                )
            });
            for &slot in &self.slots[..self.pending] {
                (*slot).tts_flags &= !(pg_sys::TTS_FLAG_SHOULDFREE as u16);
            }
            self.batch_memory.reset();
            self.rows += self.pending as i64;
            self.pending = 0;
            check_for_interrupts!();
        }
    }

    pub(super) fn close(mut self) -> i64 {
        // SAFETY: the relation, slot and bulk-insert state are this writer's own, open from `open` until
        // `close`; FFI calls on the backend thread inside the SQL call's transaction.
        unsafe {
            self.flush();
            for &slot in &self.slots {
                pg_sys::ExecDropSingleTupleTableSlot(slot);
            }
            pg_sys::FreeBulkInsertState(self.bistate);
            pg_sys::table_finish_bulk_insert(self.rel, pg_sys::TABLE_INSERT_SKIP_FSM as i32);
            pg_sys::table_close(self.rel, pg_sys::NoLock as i32);
            self.rows
        }
    }
}
