//! What a relation is called: its name, its schema-qualified name, and what ERRORs call it (a
//! spill's temporary table is shown as the view or query it holds); and whether it is a
//! temporary table.

use crate::pg::error::raise;
use pgrx::spi::quote_qualified_identifier;
use pgrx::{pg_sys, PgSqlErrorCode};
use std::ffi::CStr;

fn no_such_relation(relid: pg_sys::Oid) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
        format!("relation with OID {} does not exist", relid.to_u32()),
        None,
    )
}

/// The relation's name (ERROR 42P01 if there is none). Backend thread.
pub fn relation_name(relid: pg_sys::Oid) -> String {
    // SAFETY: a syscache lookup on the backend thread (every caller of this crate's SQL
    // functions runs there); a missing relation gives NULL, checked.
    let name = unsafe { pg_sys::get_rel_name(relid) };
    if name.is_null() {
        no_such_relation(relid);
    }
    // SAFETY: a palloc'd NUL-terminated string, checked non-NULL above.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

/// The relation's schema-qualified, quoted name (ERROR 42P01 if there is none). Backend thread.
pub fn qualified_name(relid: pg_sys::Oid) -> String {
    // SAFETY: syscache lookups on the backend thread; a missing relation or schema gives NULL,
    // checked before either is read.
    unsafe {
        let rel = pg_sys::get_rel_name(relid);
        let nsp = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid));
        if rel.is_null() || nsp.is_null() {
            no_such_relation(relid);
        }
        quote_qualified_identifier(
            CStr::from_ptr(nsp).to_string_lossy(),
            CStr::from_ptr(rel).to_string_lossy(),
        )
    }
}

/// The prefix of a spill's temporary table (see `crate::shuffle_table::spill`).
pub const SPILL_PREFIX: &str = "corgipile_spill_";

thread_local! {
    /// Temporary table names of this session's spills, and what errors call each (the names
    /// are never reused: a counter is part of them).
    static SHOWN_AS: std::cell::RefCell<Vec<(String, String)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// ERRORs call the spill table `name` `shown` while it lives.
pub fn show_as(name: &str, shown: &str) {
    SHOWN_AS.with(|m| m.borrow_mut().push((name.to_owned(), shown.to_owned())));
}

/// Forgets every spill's shown name (their tables are dropped, or were rolled back).
pub fn forget_shown_names() {
    SHOWN_AS.with(|m| m.borrow_mut().clear());
}

/// What errors call the relation named `relname`: for a spill's temporary table, the view or
/// query it holds (`relname` otherwise).
pub fn shown_name(relname: String) -> String {
    if !relname.starts_with(SPILL_PREFIX) {
        return relname;
    }
    SHOWN_AS.with(|m| {
        m.borrow()
            .iter()
            .find(|(name, _)| *name == relname)
            .map(|(_, shown)| shown.clone())
            .unwrap_or(relname)
    })
}

/// A temporary table (parallel workers cannot read the leader's).
pub fn is_temporary(relid: pg_sys::Oid) -> bool {
    // SAFETY: a catalog lookup (FFI) on the backend thread, inside the transaction of the SQL
    // call; an unknown relation is an ERROR.
    unsafe { pg_sys::get_rel_persistence(relid) as u8 == pg_sys::RELPERSISTENCE_TEMP }
}
