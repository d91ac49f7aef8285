//! Reading rows: the next heap tuple of the current block (`fetch`, through the leaf's heap
//! scan), or the page reader's next row's plain columns (`fetch_columns`), converted to the
//! parent's columns.

use crate::exec::node::state_of;
use crate::exec::page_reader;
use pgrx::{check_for_interrupts, pg_guard, pg_sys};

use super::*;

/// The attribute numbers behind `plan`'s output when every output column is a plain column
/// of the scanned table (quals are the filter's: see `PageFilter`).
///
/// # Safety
/// `plan` is a valid, finished CustomScan plan (its target list a List of TargetEntry nodes).
pub(super) unsafe fn plain_columns(plan: *mut pg_sys::CustomScan) -> Option<Vec<usize>> {
    // SAFETY: a finished plan: targetlist is a List of TargetEntry nodes.
    let tlist = (*plan).scan.plan.targetlist;
    if tlist.is_null() {
        return None;
    }
    let mut columns = Vec::new();
    for i in 0..(*tlist).length as usize {
        let entry = (*(*tlist).elements.add(i))
            .ptr_value
            .cast::<pg_sys::TargetEntry>();
        let expr = (*entry).expr;
        if (*entry).resjunk || expr.is_null() || (*expr).type_ != pg_sys::NodeTag::T_Var {
            return None;
        }
        let var = expr.cast::<pg_sys::Var>();
        if (*var).varno as u32 != (*plan).scan.scanrelid
            || (*var).varlevelsup != 0
            || (*var).varattno <= 0
        {
            return None;
        }
        columns.push((*var).varattno as usize);
    }
    Some(columns)
}

/// ExecScan access method: the next heap tuple of the current block, moving to the next block
/// of this epoch's order when one is exhausted.
///
/// # Safety
/// Called by ExecScan with `ss`, an initialized BlockShuffle node (as for [`fetch`]).
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn next_tuple(
    ss: *mut pg_sys::ScanState,
) -> *mut pg_sys::TupleTableSlot {
    fetch(ss)
}

/// The next heap tuple in the scan slot, or null at the end of the epoch. Also called
/// directly by TupleShuffle when the output is `plain_columns`.
///
/// # Safety
/// `ss` is an initialized BlockShuffle node, not yet ended.
pub unsafe fn fetch(ss: *mut pg_sys::ScanState) -> *mut pg_sys::TupleTableSlot {
    let node = ss.cast::<pg_sys::CustomScanState>();
    let state = state_of::<BlockShuffle>(node);
    loop {
        if !state.in_block {
            let Some(block) = state.next_block((*(*ss).ps.state).es_snapshot) else {
                return std::ptr::null_mut();
            };
            let scan = state.leaves[block.leaf as usize].scan;
            // SAFETY: rescan resets the scan (and its limits) before new limits are set, as
            // heap_setscanlimits requires a scan that has not started.
            pg_sys::heap_rescan(scan, std::ptr::null_mut(), false, false, false, false);
            pg_sys::heap_setscanlimits(scan, block.start, block.len);
        }
        let leaf = &state.leaves[state.current_leaf];
        // SAFETY: the leaf's slot was created with its table's slot ops (see begin).
        if pg_sys::heap_getnextslot(
            leaf.scan,
            pg_sys::ScanDirection::ForwardScanDirection,
            leaf.slot,
        ) {
            state.last_tid = (*leaf.slot).tts_tid;
            state.tuples_this_epoch += 1;
            if !state.converts {
                return leaf.slot;
            }
            return to_parent_columns(leaf, (*ss).ss_ScanTupleSlot);
        }
        state.in_block = false;
    }
}

/// The page reader: the next row's `plain_columns` into `values`/`nulls` (in their order);
/// false at the end of the epoch. The same rows in the same order as `fetch`; values of
/// by-reference types point into the row's page, pinned until the next call.
///
/// # Safety
/// `ss` is an initialized BlockShuffle node whose `plain_columns` is set, with as many entries
/// in `values` and `nulls`, not yet ended.
pub unsafe fn fetch_columns(
    ss: *mut pg_sys::ScanState,
    values: &mut [pg_sys::Datum],
    nulls: &mut [bool],
) -> bool {
    let node = ss.cast::<pg_sys::CustomScanState>();
    let state = state_of::<BlockShuffle>(node);
    loop {
        if state.cursor.tuple < state.cursor.ntuples {
            if take_tuple(state, values, nulls) {
                return true;
            }
            continue;
        }
        let cursor = &mut state.cursor;
        if state.in_block && cursor.page < cursor.end {
            // As heapam checks per page (a block of many empty or dead pages, or slow I/O).
            check_for_interrupts!();
            let leaf = &mut state.leaves[state.current_leaf];
            let scan = leaf.scan.cast::<pg_sys::HeapScanDescData>();
            // SAFETY: the page is within the relation as it was when the executor started,
            // and the relation cannot shrink while we hold our lock (truncation needs an
            // AccessExclusiveLock); the scan is in page mode (checked in next_block's caller).
            cursor.ntuples = crate::pg::compat::read_heap_page(scan, cursor.page, &mut leaf.stream);
            crate::pg::compat::count_tuples_returned(leaf.rel, cursor.ntuples);
            cursor.page += 1;
            cursor.tuple = 0;
            continue;
        }
        let Some(block) = state.next_block((*(*ss).ps.state).es_snapshot) else {
            return false;
        };
        let leaf = &mut state.leaves[block.leaf as usize];
        let scan = leaf.scan;
        if !leaf.stream_started {
            leaf.stream
                .start(scan.cast(), std::mem::take(&mut leaf.ranges));
            leaf.stream_started = true;
        }
        leaf.stream.range_started();
        if (*scan).rs_flags & pg_sys::ScanOptions::SO_ALLOW_PAGEMODE == 0 {
            crate::pg::error::raise(
                pgrx::PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                "corgipile: the scan is not in page mode (not an MVCC snapshot)",
                Some("This is a bug; please report it.".into()),
            );
        }
        let deform_to = state
            .leaves
            .iter()
            .map(|l| l.attrs.len())
            .max()
            .unwrap_or(0);
        let cursor = &mut state.cursor;
        cursor.values.resize(deform_to, pg_sys::Datum::from(0usize));
        cursor.nulls.resize(deform_to, true);
        cursor.page = block.start;
        cursor.end = block.start + block.len;
        cursor.tuple = 0;
        cursor.ntuples = 0;
    }
}

/// The page reader's rows left on the current page, each given to `row` with its tid (its
/// plain columns in `values`/`nulls`, as [`fetch_columns`] gives them), until `row` returns
/// false or the page has no more: the same rows, in the same order, with the same
/// bookkeeping, as calls of `fetch_columns` would give; `fetch_columns` goes on from there
/// (and moves to the next page). One call per row less for a consumer that takes many rows.
///
/// # Safety
/// As for [`fetch_columns`].
#[inline]
pub unsafe fn rows_on_page(
    ss: *mut pg_sys::ScanState,
    values: &mut [pg_sys::Datum],
    nulls: &mut [bool],
    mut row: impl FnMut(&[pg_sys::Datum], &[bool], &pg_sys::ItemPointerData) -> bool,
) {
    let state = state_of::<BlockShuffle>(ss.cast::<pg_sys::CustomScanState>());
    while state.cursor.tuple < state.cursor.ntuples {
        if take_tuple(state, values, nulls) && !row(values, nulls, &state.last_tid) {
            return;
        }
    }
}

/// The current page's next visible tuple: deformed, its plain columns into `values`/`nulls`;
/// false when the page reader's filter rejects it.
///
/// # Safety
/// The cursor has a tuple left (`tuple < ntuples`); as for [`fetch_columns`].
#[inline(always)]
unsafe fn take_tuple(
    state: &mut BlockShuffle,
    values: &mut [pg_sys::Datum],
    nulls: &mut [bool],
) -> bool {
    let cursor = &mut state.cursor;
    let leaf = &mut state.leaves[state.current_leaf];
    let scan = leaf.scan.cast::<pg_sys::HeapScanDescData>();
    // SAFETY: read_heap_page listed the page's visible tuples and holds its pin (see the
    // module comment of page_reader); offsets come from that list.
    let offset = (*scan).rs_vistuples[cursor.tuple];
    cursor.tuple += 1;
    let page = pg_sys::BufferGetPage((*scan).rs_cbuf);
    let item = (*page.cast::<pg_sys::PageHeaderData>())
        .pd_linp
        .as_ptr()
        .add(offset as usize - 1);
    let tup = page
        .cast::<u8>()
        .add((*item).lp_off() as usize)
        .cast::<pg_sys::HeapTupleHeaderData>();
    let len = (*item).lp_len() as usize;
    let block = (*scan).rs_cblock;
    state.last_tid = pg_sys::ItemPointerData {
        ip_blkid: pg_sys::BlockIdData {
            bi_hi: (block >> 16) as u16,
            bi_lo: (block & 0xffff) as u16,
        },
        ip_posid: offset,
    };
    state.tuples_this_epoch += 1;
    let n = leaf.attrs.len();
    let (values_n, nulls_n) = (&mut cursor.values[..n], &mut cursor.nulls[..n]);
    if !page_reader::deform(tup, len, &leaf.attrs, values_n, nulls_n) {
        deform_slowly(leaf, tup, len, state.last_tid, values_n, nulls_n);
    }
    if let Some(filter) = &mut state.filter {
        let table = (*leaf.rel).rd_id;
        let (values, nulls) = (&cursor.values[..n], &cursor.nulls[..n]);
        if !filter.passes(&leaf.filter_columns, values, nulls, state.last_tid, table) {
            return false;
        }
    }
    for (k, &attno) in leaf.columns.iter().enumerate() {
        values[k] = cursor.values[attno - 1];
        nulls[k] = cursor.nulls[attno - 1];
    }
    true
}

/// A tuple the page reader does not deform itself (fewer attributes than the columns read:
/// a column added later may have a stored default), deformed by PostgreSQL through the leaf's
/// slot, which pins the page for as long as it holds the tuple: its attributes 1..=n into
/// `values`/`nulls` (n = their length), as the page reader would have.
///
/// # Safety
/// `leaf`'s scan has the page holding `tup` read and pinned (its current buffer); `tup` points
/// to a heap tuple of `len` bytes on that page, of the leaf's row type, with at least n
/// attributes in the leaf's descriptor.
pub(super) unsafe fn deform_slowly(
    leaf: &mut TableScan,
    tup: *mut pg_sys::HeapTupleHeaderData,
    len: usize,
    tid: pg_sys::ItemPointerData,
    values: &mut [pg_sys::Datum],
    nulls: &mut [bool],
) {
    let scan = leaf.scan.cast::<pg_sys::HeapScanDescData>();
    leaf.slow_tuple = pg_sys::HeapTupleData {
        t_len: len as u32,
        t_self: tid,
        t_tableOid: (*leaf.rel).rd_id,
        t_data: tup,
    };
    // SAFETY: the slot has the leaf's buffer heap tuple ops; slow_tuple outlives its use by
    // the slot (it is replaced only when the slot is next filled); the buffer is pinned.
    pg_sys::ExecStoreBufferHeapTuple(&mut leaf.slow_tuple, leaf.slot, (*scan).rs_cbuf);
    let n = values.len();
    pg_sys::slot_getsomeattrs_int(leaf.slot, n as i32);
    for i in 0..n {
        values[i] = *(*leaf.slot).tts_values.add(i);
        nulls[i] = *(*leaf.slot).tts_isnull.add(i);
    }
}

/// A leaf's row as a row of the parent (the virtual scan slot). The values point into the
/// leaf slot's buffer page, which stays pinned until the leaf slot is next filled: the same
/// lifetime a row of the scan slot has without conversion.
///
/// # Safety
/// `parent` is the node's scan slot (a valid slot of the parent's row type) and `leaf.slot`
/// holds the leaf's current row; `leaf.map` is null or converts the leaf's rows to the
/// parent's.
pub(super) unsafe fn to_parent_columns(
    leaf: &TableScan,
    parent: *mut pg_sys::TupleTableSlot,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: both slots are valid; a null map means the leaf's descriptor matches the parent's
    // attribute for attribute (convert_tuples_by_name), so natts and types agree.
    let row = if !leaf.map.is_null() {
        pg_sys::execute_attr_map_slot((*leaf.map).attrMap, leaf.slot, parent)
    } else {
        pg_sys::ExecClearTuple(parent);
        let natts = (*(*parent).tts_tupleDescriptor).natts as usize;
        pg_sys::slot_getallattrs(leaf.slot);
        std::ptr::copy_nonoverlapping((*leaf.slot).tts_values, (*parent).tts_values, natts);
        std::ptr::copy_nonoverlapping((*leaf.slot).tts_isnull, (*parent).tts_isnull, natts);
        pg_sys::ExecStoreVirtualTuple(parent)
    };
    // Quals (row-level security, a validation predicate) may read tableoid and ctid, which a
    // virtual slot keeps in these fields (other system columns are an ERROR from the executor).
    (*row).tts_tableOid = (*leaf.slot).tts_tableOid;
    (*row).tts_tid = (*leaf.slot).tts_tid;
    row
}
