//! Training on a view. A view over one table whose body is a projection and a filter (one
//! PostgreSQL could update automatically) is read through its base table's block scan: the
//! training query selects from the view, and PostgreSQL's rewriter and planner turn it into a
//! scan of the base table with the view's qual and column expressions, checking privileges as
//! the view says (the view owner's rights on the base table, or the caller's with
//! `security_invoker`), with row-level security and `security_barrier` as for any SELECT.

use crate::pg::error::raise;
use pgrx::{pg_sys, PgSqlErrorCode};
use std::ffi::CStr;

/// Views within views: at most this deep (PostgreSQL's rewriter has no limit; a chain this long
/// is a mistake, or a loop through CREATE OR REPLACE).
const MAX_DEPTH: usize = 32;

/// A view that is not a projection and a filter of one table (through simple views): its
/// qualified name, for a training that spills its rows first; None for anything else.
pub fn must_spill(relid: pg_sys::Oid) -> Option<String> {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        let mut current = relid;
        for _ in 0..MAX_DEPTH {
            if pg_sys::get_rel_relkind(current) as u8 != pg_sys::RELKIND_VIEW {
                return None;
            }
            match simple_base(current) {
                Ok(base) => current = base,
                Err(_) => return Some(crate::pg::names::qualified_name(relid)),
            }
        }
        None
    }
}

/// The base relation of a simple view, or why the view is not one.
unsafe fn simple_base(view: pg_sys::Oid) -> Result<pg_sys::Oid, String> {
    // SAFETY: the view is locked as the query that reads it will lock it.
    let rel = pg_sys::relation_open(view, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    let query = pg_sys::get_view_query(rel);
    let why_not = pg_sys::view_query_is_auto_updatable(query, false);
    // A volatile qual (`WHERE random() < 0.5`) passes other rows each epoch: such a view is
    // read once, as a view that is not simple is (the check a "where" filter gets).
    let volatile =
        why_not.is_null() && pg_sys::contain_volatile_functions((*(*query).jointree).quals);
    let result = if volatile {
        Err("its WHERE calls a volatile function, such as random(), and every epoch must read the same rows".into())
    } else if why_not.is_null() {
        // SAFETY: an automatically updatable view has exactly one base relation, the first
        // item of its FROM list (view_query_is_auto_updatable checked that).
        let from = (*(*query).jointree).fromlist;
        let item = (*(*from).elements).ptr_value.cast::<pg_sys::RangeTblRef>();
        let rte = (*(*(*query).rtable)
            .elements
            .add((*item).rtindex as usize - 1))
        .ptr_value
        .cast::<pg_sys::RangeTblEntry>();
        Ok((*rte).relid)
    } else {
        Err(CStr::from_ptr(why_not).to_string_lossy().into_owned())
    };
    pg_sys::relation_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
    result
}

/// The table whose pages a training of view `relid` reads (a heap table, a materialized view,
/// or a partitioned table), through simple views nested in it; an ERROR for a view that is not
/// a projection and a filter of one table.
///
/// # Safety
/// `relid` is a view (relkind 'v'): PostgreSQL reads its rewrite rule unchecked.
pub unsafe fn base_table(relid: pg_sys::Oid, relname: &str) -> pg_sys::Oid {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        let mut current = relid;
        for _ in 0..MAX_DEPTH {
            let base = simple_base(current).unwrap_or_else(|reason| {
            raise(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                format!("cannot read view {relname} with a block scan: it is not a projection and a filter of one table ({reason})"),
                Some("corgipile_train and corgipile_explain spill such a view's rows first (through the pile shuffle into a temporary table); to evaluate on it, CREATE TABLE ... AS SELECT from the view first.".into()),
            )
        });
            if pg_sys::get_rel_relkind(base) as u8 != pg_sys::RELKIND_VIEW {
                return base;
            }
            current = base;
        }
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("cannot train on view {relname}: it is more than {MAX_DEPTH} views deep"),
            None,
        )
    }
}
