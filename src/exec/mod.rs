//! The three CustomScan executor nodes and the plumbing they share.
//!
//! Each node's C-side state is a `NodeState<T>`: PostgreSQL's `CustomScanState` followed by a
//! pointer to the node's Rust state. The Rust state is allocated with
//! `leak_and_drop_on_delete` in the executor's query memory context, so it is dropped (and any
//! worker thread joined) when the executor ends normally *or* when an ERROR aborts the query.

pub mod block_shuffle;
pub mod sgd;
pub mod tuple_shuffle;

use crate::plan::{plan_block_shuffle, PipelineConfig};
use pgrx::{pg_sys, PgMemoryContexts};
use std::sync::atomic::{AtomicPtr, Ordering};

pub struct Methods {
    pub path: pg_sys::CustomPathMethods,
    pub block_scan: pg_sys::CustomScanMethods,
    pub block_exec: pg_sys::CustomExecMethods,
    pub tuple_scan: pg_sys::CustomScanMethods,
    pub tuple_exec: pg_sys::CustomExecMethods,
    pub sgd_scan: pg_sys::CustomScanMethods,
    pub sgd_exec: pg_sys::CustomExecMethods,
}

static METHODS: AtomicPtr<Methods> = AtomicPtr::new(std::ptr::null_mut());

pub const BLOCK_SHUFFLE_NAME: &std::ffi::CStr = c"CorgiPile BlockShuffle";
pub const TUPLE_SHUFFLE_NAME: &std::ffi::CStr = c"CorgiPile TupleShuffle";
pub const SGD_NAME: &std::ffi::CStr = c"CorgiPile SGD";

/// The method tables. They live for the life of the backend (PostgreSQL keeps pointers to them).
pub fn methods() -> &'static Methods {
    let ptr = METHODS.load(Ordering::Acquire);
    assert!(!ptr.is_null(), "corgipile methods used before _PG_init");
    // SAFETY: set once in register_methods from a leaked Box, never freed or mutated.
    unsafe { &*ptr }
}

fn exec_methods(
    name: &'static std::ffi::CStr,
    begin: unsafe extern "C-unwind" fn(*mut pg_sys::CustomScanState, *mut pg_sys::EState, i32),
    exec: unsafe extern "C-unwind" fn(*mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot,
    end: unsafe extern "C-unwind" fn(*mut pg_sys::CustomScanState),
    rescan: unsafe extern "C-unwind" fn(*mut pg_sys::CustomScanState),
    explain: unsafe extern "C-unwind" fn(*mut pg_sys::CustomScanState, *mut pg_sys::List, *mut pg_sys::ExplainState),
) -> pg_sys::CustomExecMethods {
    pg_sys::CustomExecMethods {
        CustomName: name.as_ptr(),
        BeginCustomScan: Some(begin),
        ExecCustomScan: Some(exec),
        EndCustomScan: Some(end),
        ReScanCustomScan: Some(rescan),
        ExplainCustomScan: Some(explain),
        ..Default::default()
    }
}

pub fn register_methods() {
    let methods = Box::new(Methods {
        path: pg_sys::CustomPathMethods {
            CustomName: BLOCK_SHUFFLE_NAME.as_ptr(),
            PlanCustomPath: Some(plan_block_shuffle),
            ReparameterizeCustomPathByChild: None,
        },
        block_scan: pg_sys::CustomScanMethods {
            CustomName: BLOCK_SHUFFLE_NAME.as_ptr(),
            CreateCustomScanState: Some(block_shuffle::create),
        },
        block_exec: exec_methods(
            BLOCK_SHUFFLE_NAME,
            block_shuffle::begin,
            block_shuffle::exec,
            block_shuffle::end,
            block_shuffle::rescan,
            block_shuffle::explain,
        ),
        tuple_scan: pg_sys::CustomScanMethods {
            CustomName: TUPLE_SHUFFLE_NAME.as_ptr(),
            CreateCustomScanState: Some(tuple_shuffle::create),
        },
        tuple_exec: exec_methods(
            TUPLE_SHUFFLE_NAME,
            tuple_shuffle::begin,
            tuple_shuffle::exec,
            tuple_shuffle::end,
            tuple_shuffle::rescan,
            tuple_shuffle::explain,
        ),
        sgd_scan: pg_sys::CustomScanMethods {
            CustomName: SGD_NAME.as_ptr(),
            CreateCustomScanState: Some(sgd::create),
        },
        sgd_exec: exec_methods(SGD_NAME, sgd::begin, sgd::exec, sgd::end, sgd::rescan, sgd::explain),
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

/// C-side node state: the CustomScanState PostgreSQL knows, plus our Rust state.
#[repr(C)]
pub struct NodeState<T> {
    pub css: pg_sys::CustomScanState,
    pub rust: *mut T,
}

/// CreateCustomScanState body shared by the three nodes.
pub unsafe fn create_node<T>(cscan: *mut pg_sys::CustomScan, exec: &'static pg_sys::CustomExecMethods) -> *mut pg_sys::Node {
    // SAFETY: palloc0 gives zeroed memory of the right size in the executor's context; the
    // executor fills in the rest of the ScanState in ExecInitCustomScan.
    let node = pg_sys::palloc0(std::mem::size_of::<NodeState<T>>()).cast::<NodeState<T>>();
    (*node).css.ss.ps.type_ = pg_sys::NodeTag::T_CustomScanState;
    (*node).css.flags = (*cscan).flags;
    (*node).css.methods = exec;
    node.cast()
}

/// Attach the Rust state to a node; it is dropped when the query memory context goes away.
pub unsafe fn install_state<T>(node: *mut pg_sys::CustomScanState, value: T) {
    // SAFETY: `node` was made by create_node::<T>; BeginCustomScan runs in es_query_cxt.
    let ptr = PgMemoryContexts::CurrentMemoryContext.leak_and_drop_on_delete(value);
    (*node.cast::<NodeState<T>>()).rust = ptr;
}

/// The Rust state of a node made by `create_node::<T>`.
pub unsafe fn state_of<'a, T>(node: *mut pg_sys::CustomScanState) -> &'a mut T {
    // SAFETY: callers pass only nodes created with the same T, after install_state.
    let ptr = (*node.cast::<NodeState<T>>()).rust;
    assert!(!ptr.is_null(), "corgipile node used before BeginCustomScan");
    &mut *ptr
}

/// The pipeline config carried by this node's plan.
pub unsafe fn config_of(node: *mut pg_sys::CustomScanState) -> PipelineConfig {
    let cscan = (*node).ss.ps.plan.cast::<pg_sys::CustomScan>();
    PipelineConfig::from_list((*cscan).custom_private)
}

/// Whether `plan` is a CustomScan with these methods.
pub unsafe fn is_node(plan: *mut pg_sys::Plan, scan_methods: &pg_sys::CustomScanMethods) -> bool {
    !plan.is_null()
        && (*plan).type_ == pg_sys::NodeTag::T_CustomScan
        && std::ptr::eq((*plan.cast::<pg_sys::CustomScan>()).methods, scan_methods)
}

/// Init the single child plan of a scanrelid = 0 node (kept in custom_ps so EXPLAIN shows it).
pub unsafe fn init_child(node: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, eflags: i32) -> *mut pg_sys::PlanState {
    let cscan = (*node).ss.ps.plan.cast::<pg_sys::CustomScan>();
    let child_plan = (*(*(*cscan).custom_plans).elements).ptr_value.cast::<pg_sys::Plan>();
    let child = pg_sys::ExecInitNode(child_plan, estate, eflags);
    (*node).custom_ps = pg_sys::lappend(std::ptr::null_mut(), child.cast());
    child
}

/// EXPLAIN helpers (text and structured formats alike).
pub mod explain {
    use pgrx::pg_sys;
    use std::ffi::CString;

    pub unsafe fn text(es: *mut pg_sys::ExplainState, label: &str, value: &str) {
        let (l, v) = (CString::new(label).unwrap(), CString::new(value).unwrap());
        pg_sys::ExplainPropertyText(l.as_ptr(), v.as_ptr(), es);
    }
    pub unsafe fn int(es: *mut pg_sys::ExplainState, label: &str, value: i64) {
        let l = CString::new(label).unwrap();
        pg_sys::ExplainPropertyInteger(l.as_ptr(), std::ptr::null(), value, es);
    }
    pub unsafe fn float(es: *mut pg_sys::ExplainState, label: &str, unit: Option<&str>, value: f64, digits: i32) {
        let l = CString::new(label).unwrap();
        let u = unit.map(|u| CString::new(u).unwrap());
        pg_sys::ExplainPropertyFloat(l.as_ptr(), u.as_ref().map_or(std::ptr::null(), |u| u.as_ptr()), value, digits, es);
    }
    pub unsafe fn boolean(es: *mut pg_sys::ExplainState, label: &str, value: bool) {
        let l = CString::new(label).unwrap();
        pg_sys::ExplainPropertyBool(l.as_ptr(), value, es);
    }
    pub unsafe fn analyzing(es: *mut pg_sys::ExplainState) -> bool {
        (*es).analyze
    }
}
