//! A parallel worker's entry point: PostgreSQL's ParallelWorkerMain calls
//! `corgipile_parallel_main` (named in `Team::launch`), which plans and runs the worker's share
//! of the training as a pipeline of its own.

use super::{Control, Member, Team, WorkerPlan, KEY_CONTROL};
use crate::exec::sgd::{SgdNode, SgdTask};
use crate::pipeline::BlockShare;
use pgrx::prelude::*;
use std::ffi::CString;
use std::sync::atomic::Ordering;

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
    let control = pg_sys::shm_toc_lookup(toc, KEY_CONTROL, false).cast::<Control>();
    let plan_at = control.cast::<u8>().add(std::mem::size_of::<Control>());
    let plan_bytes = std::slice::from_raw_parts(plan_at, (*control).plan_len as usize);
    let plan: WorkerPlan = serde_json::from_slice(plan_bytes).expect("worker plan round-trips");
    let mut team = Team {
        control,
        share: BlockShare {
            rank: pg_sys::ParallelWorkerNumber as u32 + 1,
            processes: 0,
        },
        pcxt: std::ptr::null_mut(),
        model: std::ptr::null_mut(),
        learner_reports: std::ptr::null_mut(),
        learners: 0,
    };
    // The leader counts the workers that started before any of them may read.
    team.wait_until(|| (*control).processes.load(Ordering::Acquire) != 0);
    team.share.processes = (*control).processes.load(Ordering::Acquire);
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
