//! The three CustomScan executor nodes (BlockShuffle → TupleShuffle → SGD), the method tables
//! PostgreSQL calls them through, and what they share (`node`: the node trait and its generic
//! C callbacks; `explain`: EXPLAIN properties); getting them into an executor tree (`plan`: the
//! planner hook, the plan) and running it (`run`), as a parallel worker too (`worker`: its entry
//! point).

pub mod block_shuffle;
pub mod node;
mod page_reader;
pub mod plan;
pub mod run;
pub mod sgd;
pub mod tuple_shuffle;
mod worker;

use block_shuffle::BlockShuffle;
use node::{exec_methods, scan_methods};
use pgrx::pg_sys;
use sgd::SgdNode;
use std::sync::atomic::{AtomicPtr, Ordering};
use tuple_shuffle::TupleShuffle;

pub struct Methods {
    pub block_scan: pg_sys::CustomScanMethods,
    pub block_exec: pg_sys::CustomExecMethods,
    pub tuple_scan: pg_sys::CustomScanMethods,
    pub tuple_exec: pg_sys::CustomExecMethods,
    pub sgd_scan: pg_sys::CustomScanMethods,
    pub sgd_exec: pg_sys::CustomExecMethods,
}

static METHODS: AtomicPtr<Methods> = AtomicPtr::new(std::ptr::null_mut());

/// The method tables. They live for the life of the backend (PostgreSQL keeps pointers to them).
pub fn methods() -> &'static Methods {
    let ptr = METHODS.load(Ordering::Acquire);
    assert!(!ptr.is_null(), "corgipile methods used before _PG_init");
    // SAFETY: set once in register_methods from a leaked Box, never freed or mutated.
    unsafe { &*ptr }
}

pub fn register_methods() {
    let methods = Box::new(Methods {
        block_scan: scan_methods::<BlockShuffle>(),
        block_exec: exec_methods::<BlockShuffle>(),
        tuple_scan: scan_methods::<TupleShuffle>(),
        tuple_exec: exec_methods::<TupleShuffle>(),
        sgd_scan: scan_methods::<SgdNode>(),
        sgd_exec: exec_methods::<SgdNode>(),
    });
    let ptr = Box::into_raw(methods);
    METHODS.store(ptr, Ordering::Release);
    // SAFETY: the tables are 'static; registration lets PostgreSQL copy/read our plan nodes.
    unsafe {
        pg_sys::RegisterCustomScanMethods(&(*ptr).block_scan);
        pg_sys::RegisterCustomScanMethods(&(*ptr).tuple_scan);
        pg_sys::RegisterCustomScanMethods(&(*ptr).sgd_scan);
    }
}

/// EXPLAIN helpers (text and structured formats alike).
///
/// Each takes the `ExplainState` of the EXPLAIN being written, as PostgreSQL hands it to an
/// ExplainCustomScan callback or as `NewExplainState` made it: a raw pointer the caller vouches
/// for, hence `unsafe`.
pub mod explain {
    use pgrx::pg_sys;
    use std::ffi::CString;

    /// A text property.
    ///
    /// # Safety
    /// `es` is a valid ExplainState whose output has begun and not ended.
    pub unsafe fn text(es: *mut pg_sys::ExplainState, label: &str, value: &str) {
        let (l, v) = (CString::new(label).unwrap(), CString::new(value).unwrap());
        pg_sys::ExplainPropertyText(l.as_ptr(), v.as_ptr(), es);
    }
    /// An integer property.
    ///
    /// # Safety
    /// As for [`text`].
    pub unsafe fn int(es: *mut pg_sys::ExplainState, label: &str, value: i64) {
        let l = CString::new(label).unwrap();
        pg_sys::ExplainPropertyInteger(l.as_ptr(), std::ptr::null(), value, es);
    }
    /// A float property with `digits` decimals.
    ///
    /// # Safety
    /// As for [`text`].
    pub unsafe fn float(
        es: *mut pg_sys::ExplainState,
        label: &str,
        unit: Option<&str>,
        value: f64,
        digits: i32,
    ) {
        let l = CString::new(label).unwrap();
        let u = unit.map(|u| CString::new(u).unwrap());
        pg_sys::ExplainPropertyFloat(
            l.as_ptr(),
            u.as_ref().map_or(std::ptr::null(), |u| u.as_ptr()),
            value,
            digits,
            es,
        );
    }
    /// A boolean property.
    ///
    /// # Safety
    /// As for [`text`].
    pub unsafe fn boolean(es: *mut pg_sys::ExplainState, label: &str, value: bool) {
        let l = CString::new(label).unwrap();
        pg_sys::ExplainPropertyBool(l.as_ptr(), value, es);
    }
    /// Whether this is EXPLAIN ANALYZE.
    ///
    /// # Safety
    /// `es` is a valid ExplainState.
    pub unsafe fn analyzing(es: *mut pg_sys::ExplainState) -> bool {
        (*es).analyze
    }
}
