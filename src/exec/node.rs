//! The CustomScan layer the three nodes share: a small trait each node implements, and the
//! guarded C callbacks PostgreSQL calls, written once and generic over the node.
//!
//! A node's C-side state is a `NodeState<N>`: PostgreSQL's `CustomScanState` followed by a
//! pointer to the node's Rust state. The Rust state is allocated with
//! `leak_and_drop_on_delete` in the executor's query memory context, so it is dropped (and any
//! worker thread joined) when the executor ends normally *or* when an ERROR aborts the query.

use crate::pg::error::raise;
use crate::pipeline::PipelineConfig;
use pgrx::{pg_guard, pg_sys, PgMemoryContexts, PgSqlErrorCode};
use std::ffi::CStr;

/// One CorgiPile executor node.
pub trait Node: Sized + 'static {
    /// The name EXPLAIN shows.
    const NAME: &'static CStr;

    /// The node's execution callbacks (see `exec_methods`), registered once per backend.
    fn exec_methods() -> &'static pg_sys::CustomExecMethods;

    /// BeginCustomScan: builds the node's state from its plan's config.
    ///
    /// # Safety
    /// Called by the executor with its own initialized `css` and `estate`, on the backend thread.
    unsafe fn begin(
        css: *mut pg_sys::CustomScanState,
        estate: *mut pg_sys::EState,
        eflags: i32,
        config: PipelineConfig,
    ) -> Self;

    /// ExecCustomScan.
    ///
    /// # Safety
    /// `css` is this node's executor state; backend thread.
    unsafe fn exec(&mut self, css: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot;

    /// ReScanCustomScan: the next epoch.
    ///
    /// # Safety
    /// Backend thread, between two passes of the executor over this node.
    unsafe fn rescan(&mut self);

    /// EndCustomScan.
    ///
    /// # Safety
    /// Backend thread, once, when the executor ends.
    unsafe fn end(&mut self);

    /// ExplainCustomScan: the node's own properties.
    ///
    /// # Safety
    /// `es` is the ExplainState of the EXPLAIN in progress.
    unsafe fn explain(&self, es: *mut pg_sys::ExplainState);
}

/// C-side node state: the CustomScanState PostgreSQL knows, plus our Rust state.
#[repr(C)]
struct NodeState<N> {
    css: pg_sys::CustomScanState,
    rust: *mut N,
}

/// The execution callbacks of node `N`, to be kept in static memory.
pub fn exec_methods<N: Node>() -> pg_sys::CustomExecMethods {
    pg_sys::CustomExecMethods {
        CustomName: N::NAME.as_ptr(),
        BeginCustomScan: Some(begin::<N>),
        ExecCustomScan: Some(exec::<N>),
        EndCustomScan: Some(end::<N>),
        ReScanCustomScan: Some(rescan::<N>),
        ExplainCustomScan: Some(explain::<N>),
        ..Default::default()
    }
}

/// The plan-level methods of node `N` (CreateCustomScanState).
pub fn scan_methods<N: Node>() -> pg_sys::CustomScanMethods {
    pg_sys::CustomScanMethods {
        CustomName: N::NAME.as_ptr(),
        CreateCustomScanState: Some(create::<N>),
    }
}

/// The Rust state of `css`, which must be a node of type `N`: checked against its methods, so a
/// node of another type is an ERROR, never a wrong cast.
///
/// # Safety
/// `css` is null or a live CustomScanState of a running query (not yet ended), and no other
/// reference to its Rust state is in use while the returned one is (`'a` is the caller's to
/// bound).
pub unsafe fn state_of<'a, N: Node>(css: *mut pg_sys::CustomScanState) -> &'a mut N {
    if css.is_null() || !std::ptr::eq((*css).methods, N::exec_methods()) {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("corgipile: expected a {} node", N::NAME.to_string_lossy()),
            None,
        );
    }
    // SAFETY: the methods say this node was made by create::<N>; begin::<N> set `rust`.
    let ptr = (*css.cast::<NodeState<N>>()).rust;
    if ptr.is_null() {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            "corgipile node used before BeginCustomScan",
            None,
        );
    }
    &mut *ptr
}

/// The pipeline config carried by this node's plan.
unsafe fn config_of(css: *mut pg_sys::CustomScanState) -> PipelineConfig {
    let cscan = (*css).ss.ps.plan.cast::<pg_sys::CustomScan>();
    PipelineConfig::from_list((*cscan).custom_private)
}

/// Whether `plan` is a CustomScan with these methods.
///
/// # Safety
/// `plan` is null or a valid Plan node.
pub unsafe fn is_node(plan: *mut pg_sys::Plan, scan_methods: &pg_sys::CustomScanMethods) -> bool {
    !plan.is_null()
        && (*plan).type_ == pg_sys::NodeTag::T_CustomScan
        && std::ptr::eq((*plan.cast::<pg_sys::CustomScan>()).methods, scan_methods)
}

/// Init the single child plan of a scanrelid = 0 node (kept in custom_ps so EXPLAIN shows it).
///
/// # Safety
/// Called from `begin` of a node whose plan has exactly one custom_plans entry: `css` and
/// `estate` are the node's and its executor's, as `begin` received them.
pub unsafe fn init_child(
    css: *mut pg_sys::CustomScanState,
    estate: *mut pg_sys::EState,
    eflags: i32,
) -> *mut pg_sys::PlanState {
    let cscan = (*css).ss.ps.plan.cast::<pg_sys::CustomScan>();
    let child_plan = (*(*(*cscan).custom_plans).elements)
        .ptr_value
        .cast::<pg_sys::Plan>();
    let child = pg_sys::ExecInitNode(child_plan, estate, eflags);
    (*css).custom_ps = pg_sys::lappend(std::ptr::null_mut(), child.cast());
    child
}

#[pg_guard]
unsafe extern "C-unwind" fn create<N: Node>(cscan: *mut pg_sys::CustomScan) -> *mut pg_sys::Node {
    // SAFETY: palloc0 gives zeroed memory of the right size in the executor's context; the
    // executor fills in the rest of the ScanState in ExecInitCustomScan.
    let node = pg_sys::palloc0(std::mem::size_of::<NodeState<N>>()).cast::<NodeState<N>>();
    (*node).css.ss.ps.type_ = pg_sys::NodeTag::T_CustomScanState;
    (*node).css.flags = (*cscan).flags;
    (*node).css.methods = N::exec_methods();
    node.cast()
}

#[pg_guard]
unsafe extern "C-unwind" fn begin<N: Node>(
    css: *mut pg_sys::CustomScanState,
    estate: *mut pg_sys::EState,
    eflags: i32,
) {
    let state = N::begin(css, estate, eflags, config_of(css));
    // SAFETY: `css` was made by create::<N>; BeginCustomScan runs in es_query_cxt, whose
    // deletion (end of query, or abort) drops the state.
    let ptr = PgMemoryContexts::CurrentMemoryContext.leak_and_drop_on_delete(state);
    (*css.cast::<NodeState<N>>()).rust = ptr;
}

#[pg_guard]
unsafe extern "C-unwind" fn exec<N: Node>(
    css: *mut pg_sys::CustomScanState,
) -> *mut pg_sys::TupleTableSlot {
    state_of::<N>(css).exec(css)
}

#[pg_guard]
unsafe extern "C-unwind" fn rescan<N: Node>(css: *mut pg_sys::CustomScanState) {
    state_of::<N>(css).rescan()
}

#[pg_guard]
unsafe extern "C-unwind" fn end<N: Node>(css: *mut pg_sys::CustomScanState) {
    state_of::<N>(css).end()
}

#[pg_guard]
unsafe extern "C-unwind" fn explain<N: Node>(
    css: *mut pg_sys::CustomScanState,
    _ancestors: *mut pg_sys::List,
    es: *mut pg_sys::ExplainState,
) {
    state_of::<N>(css).explain(es)
}
