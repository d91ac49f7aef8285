//! Every difference between the PostgreSQL majors that corgipile meets, in one place.
//!
//! The crate builds for each major pgrx 0.18 supports (features `pg13` … `pg18`); 15 and 18 are
//! tested. Each difference is written for the range of majors it covers, as the server changed
//! it (e.g. "16 and later"), so the untested majors in between get the right variant too. The
//! rest of the crate calls these helpers and never names a major.

use pgrx::pg_sys;

/// Parses a possibly schema-qualified, possibly quoted name (as regclass input does) into a
/// list of name parts. An invalid name is an ERROR.
///
/// # Safety
/// `name` is a NUL-terminated string that outlives the call; backend thread, in a transaction.
pub unsafe fn qualified_name_list(name: *const std::ffi::c_char) -> *mut pg_sys::List {
    // 16 added a soft-error context; none is passed, so a bad name stays an ERROR.
    #[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15"))]
    let list = pg_sys::stringToQualifiedNameList(name);
    #[cfg(not(any(feature = "pg13", feature = "pg14", feature = "pg15")))]
    let list = pg_sys::stringToQualifiedNameList(name, std::ptr::null_mut());
    list
}

/// Parse analysis and rewriting of one raw statement without parameters.
///
/// # Safety
/// `raw` is a raw statement parsed from `sql`, a NUL-terminated string that outlives the call;
/// backend thread, in a transaction with an active snapshot.
#[cfg(any(feature = "pg13", feature = "pg14"))]
pub unsafe fn analyze_and_rewrite(
    raw: *mut pg_sys::RawStmt,
    sql: *const std::ffi::c_char,
) -> *mut pg_sys::List {
    pg_sys::pg_analyze_and_rewrite(raw, sql, std::ptr::null_mut(), 0, std::ptr::null_mut())
}
/// Parse analysis and rewriting of one raw statement without parameters.
///
/// # Safety
/// `raw` is a raw statement parsed from `sql`, a NUL-terminated string that outlives the call;
/// backend thread, in a transaction with an active snapshot.
#[cfg(not(any(feature = "pg13", feature = "pg14")))]
pub unsafe fn analyze_and_rewrite(
    raw: *mut pg_sys::RawStmt,
    sql: *const std::ffi::c_char,
) -> *mut pg_sys::List {
    pg_sys::pg_analyze_and_rewrite_fixedparams(raw, sql, std::ptr::null(), 0, std::ptr::null_mut())
}

/// Runs a started plan forward to its end (count 0: all rows), once.
///
/// # Safety
/// `qd` went through `ExecutorStart` and not yet through `ExecutorFinish`; backend thread.
pub unsafe fn executor_run_all(qd: *mut pg_sys::QueryDesc) {
    let forward = pg_sys::ScanDirection::ForwardScanDirection;
    // Until 17, ExecutorRun takes `execute_once`; 18 dropped the parameter (a plan always
    // runs once).
    #[cfg(any(
        feature = "pg13",
        feature = "pg14",
        feature = "pg15",
        feature = "pg16",
        feature = "pg17"
    ))]
    pg_sys::ExecutorRun(qd, forward, 0, true);
    #[cfg(not(any(
        feature = "pg13",
        feature = "pg14",
        feature = "pg15",
        feature = "pg16",
        feature = "pg17"
    )))]
    pg_sys::ExecutorRun(qd, forward, 0);
}

/// The attributes (columns, dropped ones included) of a tuple descriptor.
///
/// # Safety
/// `desc` is a valid tuple descriptor that outlives the returned slice and is not changed
/// while it is used.
pub unsafe fn tuple_desc_attrs<'a>(desc: pg_sys::TupleDesc) -> &'a [pg_sys::FormData_pg_attribute] {
    let natts = (*desc).natts as usize;
    // Until 17 the attributes are the descriptor's trailing array; 18 put an array of
    // `CompactAttribute`s there and the full attributes right after it (what TupleDescAttr
    // reads).
    #[cfg(any(
        feature = "pg13",
        feature = "pg14",
        feature = "pg15",
        feature = "pg16",
        feature = "pg17"
    ))]
    let first: *const pg_sys::FormData_pg_attribute = (*desc).attrs.as_ptr();
    #[cfg(not(any(
        feature = "pg13",
        feature = "pg14",
        feature = "pg15",
        feature = "pg16",
        feature = "pg17"
    )))]
    let first: *const pg_sys::FormData_pg_attribute =
        (*desc).compact_attrs.as_ptr().add(natts).cast();
    if natts == 0 {
        return &[];
    }
    std::slice::from_raw_parts(first, natts)
}

/// The local transaction id of this backend's current transaction.
///
/// # Safety
/// A regular backend (MyProc is set); backend thread.
pub unsafe fn local_xid() -> u32 {
    // 17 moved it into the virtual transaction id (`vxid.lxid`).
    #[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15", feature = "pg16"))]
    let lxid = (*pg_sys::MyProc).lxid;
    #[cfg(not(any(feature = "pg13", feature = "pg14", feature = "pg15", feature = "pg16")))]
    let lxid = (*pg_sys::MyProc).vxid.lxid;
    lxid
}
