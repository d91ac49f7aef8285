//! Training on what has no pages of its own — a query (`corgipile_train_query`) or a view that is
//! not a projection and a filter of one table (joins, aggregates, unions): its rows are first
//! spilled through the pile shuffle (pass 1 into PostgreSQL temporary files, so
//! temp_tablespaces and temp_file_limit apply; pass 2 a pile at a time) into a temporary table
//! in a uniformly random order, which the training then reads with its block scan like any
//! table. The query runs as the caller with the statement's snapshot, as a SELECT would; it must
//! be one SELECT that locks no row (see `check_select`: the functions it calls are the
//! caller's business, as in any SELECT). The temporary table is dropped when the training is
//! stored (an ERROR or cancel drops it with the transaction).

use crate::pg::error::raise;
use crate::pg::guc::max_buffer_bytes;
use crate::pg::names::{forget_shown_names, qualified_name, show_as, SPILL_PREFIX};
use pgrx::prelude::*;
use pgrx::{is_a, PgList, PgSqlErrorCode};
use std::ffi::CString;

/// Piles of pass 1: the query's size is not known before it runs; a pile too big for memory in
/// pass 2 is split again, so this only sets how many temporary files are open at once.
const PILES: usize = 64;

fn not_a_select(why: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        format!("the training query must be one SELECT that locks no row: {why}"),
        Some(
            "For example 'SELECT c.*, o.total FROM customers c JOIN orders o USING (customer_id)'."
                .into(),
        ),
    )
}

/// `query` is exactly one SELECT without INTO, data-modifying WITH, or FOR UPDATE / FOR
/// SHARE anywhere (checked on the parser's tree, then on the plan, before anything runs).
/// What it does not check: the functions the query calls run as the caller, with the caller's
/// rights, as in any SELECT (they may write, take advisory locks, ...).
unsafe fn check_select(query: &CString) {
    let statements =
        PgList::<pg_sys::RawStmt>::from_pg(crate::pg::compat::raw_parse(query.as_ptr()));
    if statements.len() != 1 {
        not_a_select("it must be a single statement");
    }
    let stmt = statements
        .get_ptr(0)
        .unwrap_or_else(|| not_a_select("it is empty"));
    let raw = (*stmt).stmt;
    if !is_a(raw, pg_sys::NodeTag::T_SelectStmt) {
        not_a_select("it is not a SELECT");
    }
    check_select_stmt(raw.cast());
    check_no_row_locks(stmt, query);
}

/// No row is locked anywhere in the query: FOR UPDATE / FOR SHARE in a subquery, a WITH
/// query, a sublink or a view the query reads (the parser's tree shows only the top level's).
/// The planner gathers every level's row marks into the plan's (`PlannedStmt.rowMarks`; a
/// plain SELECT has none): the statement is analysed, rewritten (views expanded) and planned,
/// never run.
unsafe fn check_no_row_locks(stmt: *mut pg_sys::RawStmt, query: &CString) {
    let queries = PgList::<pg_sys::Query>::from_pg(crate::pg::compat::analyze_and_rewrite(
        stmt,
        query.as_ptr(),
    ));
    if queries.len() != 1 {
        not_a_select("a rule makes it more than one statement");
    }
    let analysed = queries
        .get_ptr(0)
        .unwrap_or_else(|| not_a_select("a rule makes it no statement"));
    let planned = pg_sys::pg_plan_query(analysed, query.as_ptr(), 0, std::ptr::null_mut());
    if !(*planned).rowMarks.is_null() {
        not_a_select("FOR UPDATE / FOR SHARE locks rows (here in a subquery, a WITH query or a view it reads)");
    }
}

unsafe fn check_select_stmt(select: *mut pg_sys::SelectStmt) {
    if select.is_null() {
        return;
    }
    let s = &*select;
    if !s.intoClause.is_null() {
        not_a_select("SELECT INTO creates a table");
    }
    if !s.lockingClause.is_null() {
        not_a_select("FOR UPDATE / FOR SHARE locks rows");
    }
    if !s.withClause.is_null() {
        for cte in PgList::<pg_sys::CommonTableExpr>::from_pg((*s.withClause).ctes).iter_ptr() {
            let q = (*cte).ctequery;
            if !is_a(q, pg_sys::NodeTag::T_SelectStmt) {
                not_a_select("a WITH query that modifies data");
            }
            check_select_stmt(q.cast());
        }
    }
    check_select_stmt(s.larg);
    check_select_stmt(s.rarg);
}

/// A new temporary table holding every row `query` returns, in a uniformly random order drawn
/// from `seed` (`fill` false: empty, with the query's columns, for an EXPLAIN); its oid and row
/// count.
///
/// `shown_as` is what errors call the table while it lives (see [`shown_name`](crate::pg::names::shown_name)): the view's
/// name, or "the training query" — never the temporary table's name, which the user never saw.
pub fn spill(query: &str, seed: u64, fill: bool, shown_as: &str) -> (pg_sys::Oid, u64) {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        let sql = CString::new(query).unwrap_or_else(|_| not_a_select("it contains a NUL byte"));
        check_select(&sql);
        // A name of this backend's own (temporary tables are per session); the new line ends a
        // trailing comment of the query before our closing parenthesis.
        static SPILLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SPILLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{SPILL_PREFIX}{}_{n}", std::process::id());
        show_as(&name, shown_as);
        Spi::run(&format!(
            "CREATE TEMPORARY TABLE {name} AS ({query}\n) WITH NO DATA"
        ))
        .unwrap_or_else(|e| {
            raise(
                PgSqlErrorCode::ERRCODE_SYNTAX_ERROR,
                format!("invalid training query: {e}"),
                None,
            )
        });
        let relid = Spi::get_one::<pg_sys::Oid>(&format!(
            "SELECT 'pg_temp.{name}'::pg_catalog.regclass::pg_catalog.oid"
        ))
        .ok()
        .flatten()
        .expect("the temporary table was just created");
        if !fill {
            return (relid, 0);
        }
        let rows = super::shuffle_into(query, None, relid, seed, max_buffer_bytes(), PILES, PILES);
        // The planner and the buffer size read the table's statistics.
        Spi::run(&format!("ANALYZE pg_temp.{name}")).ok();
        (relid, rows as u64)
    }
}

/// Makes the rows `spill` wrote visible to the training that reads them in this statement:
/// the statement's snapshot (same transactions visible) with the command id after the
/// inserts. Until [`unsee_spill`]; an ERROR's abort pops it.
pub fn see_spill() {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        pg_sys::CommandCounterIncrement();
        pg_sys::PushCopiedSnapshot(pg_sys::GetActiveSnapshot());
        pg_sys::UpdateActiveSnapshotCommandId();
    }
}

/// Ends [`see_spill`].
///
/// # Safety
/// Paired with an earlier [`see_spill`] of this call: it pops the snapshot that pushed.
pub unsafe fn unsee_spill() {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        pg_sys::PopActiveSnapshot();
    }
}

/// Drops a table `spill` made, once the training is stored.
pub fn drop_spill(relid: pg_sys::Oid) {
    let name = qualified_name(relid);
    // Also forgets the names of spills an ERROR left behind (their tables were rolled back).
    forget_shown_names();
    Spi::run(&format!("DROP TABLE {name}")).ok();
}
