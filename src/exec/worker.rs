//! A parallel worker's entry point: PostgreSQL's ParallelWorkerMain calls
//! `corgipile_parallel_main` (named in `Team::launch`), which joins the leader's team
//! (`crate::parallel`) and plans and runs the worker's share of the training as a pipeline of
//! its own.

use crate::exec::sgd::{SgdNode, SgdTask};
use crate::parallel::{Member, Team};
use pgrx::prelude::*;
use std::ffi::CString;

/// The parallel worker's entry point (named in `Team::launch`): plans and runs this worker's
/// share of the training. ParallelWorkerMain has restored the leader's transaction, snapshot,
/// user and settings.
///
/// # Safety
/// Called by PostgreSQL's ParallelWorkerMain with the context's segment and table of contents.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn corgipile_parallel_main(
    _seg: *mut pg_sys::dsm_segment,
    toc: *mut pg_sys::shm_toc,
) {
    let (plan, team) = Team::join(toc);
    let sql = CString::new(plan.sql).expect("the query has no NUL");
    crate::exec::run::run(
        pg_sys::Oid::from(plan.relid),
        &sql,
        &plan.config,
        Member {
            team,
            extras: plan.extras,
            block_epoch: plan.block_epoch,
        },
    );
}

impl SgdTask for Member {
    type Output = ();
    const MODE: crate::pipeline::Mode = crate::pipeline::Mode::Train;

    unsafe fn run(self, node: &mut SgdNode) {
        node.train_in_team(self);
    }
}
