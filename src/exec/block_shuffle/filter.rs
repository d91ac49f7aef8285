//! The page reader's filter: the scan's quals (a `"where"` filter, row-level security, a WHERE
//! of the query) evaluated on the columns the page reader deformed, so a filtered training keeps
//! the page-at-a-time reader instead of ExecScan's per-row path. Same rows, same order: the
//! quals are the plan's, in the planner's order (row-level security's first), compiled for a
//! slot that holds the deformed values.

use pgrx::pg_sys;

pub(super) struct PageFilter {
    /// The plan's quals, compiled for `slot` (a virtual slot with the scanned relation's
    /// columns).
    qual: *mut pg_sys::ExprState,
    econtext: *mut pg_sys::ExprContext,
    slot: *mut pg_sys::TupleTableSlot,
    /// The scanned relation's attribute numbers the quals read.
    pub(super) columns: Vec<usize>,
}

/// The relation's attribute numbers `qual` reads, or None when it reads a system column or the
/// whole row, or holds a subquery: those take ExecScan's path.
unsafe fn qual_columns(qual: *mut pg_sys::List, scanrelid: pg_sys::Index) -> Option<Vec<usize>> {
    // SAFETY: a finished plan's qual list of expression nodes.
    if pg_sys::contain_subplans(qual.cast()) {
        return None;
    }
    let mut attnos: *mut pg_sys::Bitmapset = std::ptr::null_mut();
    pg_sys::pull_varattnos(qual.cast(), scanrelid, &mut attnos);
    let mut columns = Vec::new();
    let mut member = -1;
    loop {
        member = pg_sys::bms_next_member(attnos, member);
        if member < 0 {
            break;
        }
        // pull_varattnos offsets attribute numbers so system columns (< 0) fit a bitmapset.
        let attno = member + pg_sys::FirstLowInvalidHeapAttributeNumber;
        if attno <= 0 {
            return None;
        }
        columns.push(attno as usize);
    }
    Some(columns)
}

impl PageFilter {
    /// The filter of a BlockShuffle node whose plan has quals; None without quals, or for quals
    /// the page reader cannot evaluate (see `qual_columns`).
    ///
    /// # Safety
    /// `node` is a BlockShuffle node being begun (its expression context and relation set up)
    /// in `estate`; the filter is used only while the node lives.
    pub(super) unsafe fn new(
        node: *mut pg_sys::CustomScanState,
        estate: *mut pg_sys::EState,
    ) -> Option<PageFilter> {
        let plan = (*node).ss.ps.plan.cast::<pg_sys::CustomScan>();
        let qual = (*plan).scan.plan.qual;
        if qual.is_null() {
            return None;
        }
        let columns = qual_columns(qual, (*plan).scan.scanrelid)?;
        let desc = (*(*node).ss.ss_currentRelation).rd_att;
        let slot =
            pg_sys::ExecAllocTableSlot(&mut (*estate).es_tupleTable, desc, &pg_sys::TTSOpsVirtual);
        // The quals are compiled against the node's scan slot type; compile them again for a
        // virtual slot. SAFETY: ExecInitQual reads scanops only while compiling.
        let ps = &mut (*node).ss.ps;
        let (ops, fixed) = (ps.scanops, ps.scanopsfixed);
        ps.scanops = &pg_sys::TTSOpsVirtual;
        ps.scanopsfixed = true;
        let compiled = pg_sys::ExecInitQual(qual, node.cast());
        ps.scanops = ops;
        ps.scanopsfixed = fixed;
        // Every attribute NULL and valid: the slot is never deformed, only its values set.
        // SAFETY: a virtual slot of `natts` attributes; ExecStoreVirtualTuple marks it full.
        let natts = (*desc).natts as usize;
        pg_sys::ExecClearTuple(slot);
        std::slice::from_raw_parts_mut((*slot).tts_isnull, natts).fill(true);
        pg_sys::ExecStoreVirtualTuple(slot);
        Some(PageFilter {
            qual: compiled,
            econtext: ps.ps_ExprContext,
            slot,
            columns,
        })
    }

    /// Whether the row passes the quals. `leaf_columns` are the leaf's attribute numbers of
    /// `self.columns`; `values`/`nulls` the leaf's deformed attributes (1-based numbers, so
    /// index attno - 1), which stay valid (their page pinned) for the call.
    ///
    /// # Safety
    /// The node the filter was made for is still running (its expression context and slot
    /// are valid); `values`/`nulls` hold every attribute in `leaf_columns`, each non-NULL
    /// datum a valid value of its column (its page pinned) for the call.
    pub(super) unsafe fn passes(
        &mut self,
        leaf_columns: &[usize],
        values: &[pg_sys::Datum],
        nulls: &[bool],
        tid: pg_sys::ItemPointerData,
        table: pg_sys::Oid,
    ) -> bool {
        let slot = self.slot;
        for (&column, &attno) in self.columns.iter().zip(leaf_columns) {
            // SAFETY: column is an attribute number of the slot's descriptor (1..=natts).
            *(*slot).tts_values.add(column - 1) = values[attno - 1];
            *(*slot).tts_isnull.add(column - 1) = nulls[attno - 1];
        }
        (*slot).tts_tid = tid;
        (*slot).tts_tableOid = table;
        // What ExecScan does per row: free the last row's allocations, evaluate in per-tuple
        // memory (ExecQual is an inline function, so it is spelled out here).
        let memory = (*self.econtext).ecxt_per_tuple_memory;
        if !(*memory).isReset {
            pg_sys::MemoryContextReset(memory);
        }
        (*self.econtext).ecxt_scantuple = slot;
        let Some(evaluate) = (*self.qual).evalfunc else {
            return true;
        };
        let (state, econtext) = (self.qual, self.econtext);
        let previous = pg_sys::CurrentMemoryContext;
        pg_sys::CurrentMemoryContext = memory;
        let mut is_null = false;
        // SAFETY: an ERROR raised while evaluating (e.g. a division by zero) becomes a Rust
        // panic at this boundary, which pgrx turns back into the ERROR at our guarded entry
        // point; CurrentMemoryContext is then reset by the transaction's abort.
        let passed = pg_sys::ffi::pg_guard_ffi_boundary(|| evaluate(state, econtext, &mut is_null));
        pg_sys::CurrentMemoryContext = previous;
        // A qual ExprState returns false for NULL (EEOP_QUAL), as ExecQual expects.
        !is_null && passed.value() != 0
    }
}
