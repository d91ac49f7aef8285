//! Parallel training with PostgreSQL parallel workers, the way parallel CREATE INDEX does it: a
//! `ParallelContext` whose workers call `corgipile_parallel_main` (exported by this library:
//! `crate::exec::worker`, which joins the team with `Team::join`), each a full backend with the
//! leader's snapshot, user and settings. Every worker plans and runs the same three-node pipeline
//! as the leader over its share of every epoch's blocks (see `BlockShare`), with its own buffers
//! (the buffer memory is split between the processes) and its own SGD; the processes' trainers
//! exchange with one model in shared memory (see `corgipile_ml::trainer::SharedModel`) every few
//! thousand tuples and at every epoch's end, and meet at the end of every epoch
//! (`Team::end_epoch`), where each learns the whole epoch's statistics, so that all of them take
//! the same decisions (early stop) and the leader reports the whole training once.
//!
//! Two shared memory segments: the parallel context's (this module's `Control` and the worker
//! plan, sized before the workers start) and the model's, created by the leader once the first
//! rows tell the model's width, and attached by the workers through the handle in `Control`.
//! The backend thread of each process is the only one to touch `Control`; SGD threads touch the
//! model only, through the trainer's exchange, behind `MODEL_GATE`.

use crate::pg::error::raise;
use crate::pipeline::{BlockShare, EpochCounts, LearnedStatistics, PipelineConfig, PreprocessSpec};
use corgipile_ml::preprocess::Preprocessor;
use corgipile_ml::trainer::{EpochPart, EpochStats, EpochTotals, Gate, SharedModel};
use pgrx::{check_for_interrupts, pg_guard, pg_sys, PgSqlErrorCode};
use serde::{Deserialize, Serialize};
use std::ffi::CStr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The toc key of `Control`.
const KEY_CONTROL: u64 = 0xC0A6_1E00_0000_0001;

/// The leader and at most 64 workers (the `workers` param's limit).
const MAX_PROCESSES: usize = 65;

/// `Control::model_state`.
const MODEL_PENDING: u32 = 0;
const MODEL_READY: u32 = 1;
/// No process has a row: the leader raises the ERROR, the workers stop quietly.
const MODEL_NO_ROWS: u32 = 2;

/// Guards this process's mapping of the shared model (see `Gate`): closed when the segment is
/// detached, which an exiting process does on its backend thread while its SGD thread may still
/// be inside an exchange.
static MODEL_GATE: Gate = Gate::new();

/// What a worker needs to build and run its own pipeline (JSON after `Control`).
#[derive(Serialize, Deserialize)]
pub struct WorkerPlan {
    pub relid: u32,
    pub sql: String,
    pub config: PipelineConfig,
    pub extras: LearnedStatistics,
    /// The epoch number of the leader's block order at the first training epoch (a statistics
    /// pass counts as one).
    pub block_epoch: u32,
}

/// One process's rows of one epoch.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct EpochReport {
    counts: EpochCounts,
    /// Binary kinds: the distinct label values this process has seen (0, 1 or 2).
    n_seen: u64,
    seen: [f64; 2],
}

/// One process's statistics of one epoch of one learner (a search's configuration, a fold's or
/// a group's model): in the model segment, after `Team::shared_models`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct LearnerReport {
    /// 0: the learner stopped or was set aside in this process.
    going: u64,
    tuples: u64,
    loss: f64,
    accuracy: f64,
    r2: f64,
}

#[repr(C)]
struct Slot {
    /// The last epoch this process finished (its report is in `reports[epoch % 2]`: a process
    /// may write epoch e+1's report while a slower one still reads epoch e's, never e+2's).
    epoch_done: AtomicU32,
    /// After the first buffer: 1 = no rows in this process's share, w + 2 = rows w features wide.
    first_width: AtomicU64,
    reports: [EpochReport; 2],
    /// `Team::gather`: the round this process published its bytes for (their segment and
    /// length), and the last round it has read every process's.
    gather_round: AtomicU32,
    gather_handle: AtomicU32,
    gather_len: AtomicU64,
    gather_read: AtomicU32,
}

#[repr(C)]
struct Control {
    /// The leader plus the workers that started; 0 until the leader knows.
    processes: AtomicU32,
    model_state: AtomicU32,
    model_handle: AtomicU32,
    n_features: AtomicU64,
    /// How many learners (models) every process trains, each with its shared model.
    learners: AtomicU64,
    plan_len: u64,
    slots: [Slot; MAX_PROCESSES],
}

/// The whole epoch, as every process of the team sees it after `end_epoch`.
pub struct TeamEpoch {
    /// Per learner: None if it stopped or was set aside in any process.
    pub stats: Vec<Option<EpochStats>>,
    /// Every process's rows, together.
    pub counts: EpochCounts,
    /// Binary kinds: the distinct label values all processes have seen.
    pub labels_seen: usize,
}

/// One process's membership in a parallel training.
pub struct Team {
    control: *mut Control,
    pub share: BlockShare,
    /// Leader only: the parallel context (null in a worker).
    pcxt: *mut pg_sys::ParallelContext,
    model: *mut pg_sys::dsm_segment,
    /// The learners' reports in the model segment (null before `shared_models`), and how many
    /// learners.
    learner_reports: *mut LearnerReport,
    learners: usize,
}

/// PostgreSQL's BUFFERALIGN (shm_toc chunks are aligned so).
fn buffer_align(bytes: usize) -> usize {
    const ALIGNOF_BUFFER: usize = 32;
    bytes.div_ceil(ALIGNOF_BUFFER) * ALIGNOF_BUFFER
}

/// A cache line: the shared models are laid out a line apart, so that two processes
/// exchanging with two learners' models do not write the same line.
fn line_align(bytes: usize) -> usize {
    bytes.div_ceil(64) * 64
}

impl Team {
    /// Leader: starts up to `workers` parallel workers that will train `relid` with `config`.
    /// None when none could start (max_parallel_workers, max_worker_processes, no dynamic
    /// shared memory): the leader then trains alone, as with `"workers": 0`. Called by a
    /// training's backend before its first training epoch reads a row.
    pub fn launch(
        relid: pg_sys::Oid,
        sql: &CStr,
        config: &PipelineConfig,
        extras: LearnedStatistics,
        preprocessor: Option<Preprocessor>,
        block_epoch: u32,
        workers: u32,
    ) -> Option<Team> {
        let mut worker_config = config.clone();
        worker_config.params.verbose = false;
        // A network's output layer has one unit per class of the leader's statistics pass:
        // every process numbers the classes as the leader does.
        if let Some(classes) = &extras.classes {
            worker_config.known_classes = classes.clone();
        }
        // Per-group models: every process numbers the leader's groups alike (a group the
        // leader's statistics pass left small is no group's in any process).
        if let (Some(found), Some(columns)) = (&extras.groups, worker_config.groups.as_mut()) {
            columns.known = Some(found.kept.iter().map(|(key, _)| key.clone()).collect());
        }
        // A column list's preprocessing, learned by the leader's statistics pass.
        if let Some(p) = preprocessor {
            worker_config.preprocess = Some(PreprocessSpec::Fixed(p));
        }
        let plan = serde_json::to_vec(&WorkerPlan {
            relid: u32::from(relid),
            sql: sql.to_string_lossy().into_owned(),
            config: worker_config,
            extras,
            block_epoch,
        })
        .expect("worker plan serializes");
        let bytes = std::mem::size_of::<Control>() + plan.len();
        // SAFETY: FFI calls on the backend thread, inside the transaction of the training's SQL
        // call; the context and its table of contents are those PostgreSQL just made, and
        // `at` is the chunk of `bytes` it allocated for us (the Control block, then the plan).
        unsafe {
            pg_sys::EnterParallelMode();
            let pcxt = pg_sys::CreateParallelContext(
                c"$libdir/corgipile".as_ptr(),
                c"corgipile_parallel_main".as_ptr(),
                workers as i32,
            );
            // shm_toc_estimate_chunk and shm_toc_estimate_keys (C macros).
            (*pcxt).estimator.space_for_chunks += buffer_align(bytes);
            (*pcxt).estimator.number_of_keys += 1;
            pg_sys::InitializeParallelDSM(pcxt);
            // SAFETY: shm_toc_allocate returns `bytes` of the segment (or raises), BUFFERALIGNed.
            let at = pg_sys::shm_toc_allocate((*pcxt).toc, bytes).cast::<u8>();
            std::ptr::write_bytes(at, 0, std::mem::size_of::<Control>());
            let control = at.cast::<Control>();
            (*control).plan_len = plan.len() as u64;
            std::ptr::copy_nonoverlapping(
                plan.as_ptr(),
                at.add(std::mem::size_of::<Control>()),
                plan.len(),
            );
            pg_sys::shm_toc_insert((*pcxt).toc, KEY_CONTROL, at.cast());
            pg_sys::LaunchParallelWorkers(pcxt);
            let launched = (*pcxt).nworkers_launched;
            if launched <= 0 {
                pg_sys::DestroyParallelContext(pcxt);
                pg_sys::ExitParallelMode();
                return None;
            }
            // Raises if a launched worker failed to start.
            pg_sys::WaitForParallelWorkersToAttach(pcxt);
            let processes = launched as u32 + 1;
            (*control).processes.store(processes, Ordering::Release);
            Some(Team {
                control,
                share: BlockShare { rank: 0, processes },
                pcxt,
                model: std::ptr::null_mut(),
                learner_reports: std::ptr::null_mut(),
                learners: 0,
            })
        }
    }

    /// Worker: its side of `launch`. Reads the plan the leader wrote after `Control`, and joins
    /// the team once the leader has counted the workers that started.
    ///
    /// # Safety
    /// Called by a parallel worker's entry point (`crate::exec::worker`) with the context's
    /// table of contents; ParallelWorkerMain has restored the leader's transaction.
    pub unsafe fn join(toc: *mut pg_sys::shm_toc) -> (WorkerPlan, Team) {
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
        (plan, team)
    }

    pub fn is_leader(&self) -> bool {
        self.share.rank == 0
    }

    fn slot(&self, rank: u32) -> &Slot {
        // SAFETY: the control block lives in the parallel context's segment, mapped in every
        // process for the whole training; rank < processes <= MAX_PROCESSES.
        unsafe { &(*self.control).slots[rank as usize] }
    }

    fn control(&self) -> &Control {
        // SAFETY: as in `slot`.
        unsafe { &*self.control }
    }

    /// Waits until `done`, answering cancel and worker errors (an ERROR in a worker reaches the
    /// leader through CHECK_FOR_INTERRUPTS; one that exits without finishing is an ERROR too).
    unsafe fn wait_until(&self, mut done: impl FnMut() -> bool) {
        while !done() {
            check_for_interrupts!();
            if self.is_leader() {
                if let Some(worker) = self.stopped_worker() {
                    // Its ERROR, if it sent one, is the better message: let it arrive first.
                    pg_sys::pg_usleep(10_000);
                    check_for_interrupts!();
                    // A worker that did its last part and exited is no failure: it published
                    // that part before exiting, so `done` tells. (Testing `done` only before
                    // the exit was seen took such a worker for a failed one.)
                    if done() {
                        return;
                    }
                    raise(
                        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                        format!(
                            "corgipile parallel worker {worker} exited before the training ended"
                        ),
                        None,
                    );
                }
            }
            pg_sys::pg_usleep(100);
        }
    }

    /// Leader: the number (from 1) of a worker that has stopped, if one has.
    unsafe fn stopped_worker(&self) -> Option<usize> {
        (0..(*self.pcxt).nworkers_launched as usize)
            .find(|&i| {
                let mut pid: pg_sys::pid_t = 0;
                let status = pg_sys::GetBackgroundWorkerPid(
                    (*(*self.pcxt).worker.add(i)).bgwhandle,
                    &mut pid,
                );
                status == pg_sys::BgwHandleStatus::BGWH_STOPPED
                    || status == pg_sys::BgwHandleStatus::BGWH_POSTMASTER_DIED
            })
            .map(|i| i + 1)
    }

    /// After this process's first buffer (`width`: its rows' number of features, None if its
    /// share had no rows): the model's number of features every process uses, the leader's if
    /// it has rows, else a worker's. None: no process has a row.
    pub fn agree_on_width(&self, width: Option<usize>) -> Option<usize> {
        let me = self.slot(self.share.rank);
        me.first_width
            .store(width.map_or(1, |w| w as u64 + 2), Ordering::Release);
        let control = self.control();
        if !self.is_leader() {
            // SAFETY: waits on the team's control block (mapped for the whole training) on
            // the backend thread, checking for interrupts.
            unsafe {
                self.wait_until(|| control.model_state.load(Ordering::Acquire) != MODEL_PENDING)
            };
            return match control.model_state.load(Ordering::Acquire) {
                MODEL_READY => Some(control.n_features.load(Ordering::Acquire) as usize),
                _ => None,
            };
        }
        if let Some(w) = width {
            return Some(w);
        }
        let mut found = None;
        // SAFETY: as above.
        unsafe {
            self.wait_until(|| {
                let widths: Vec<u64> = (1..self.share.processes)
                    .map(|r| self.slot(r).first_width.load(Ordering::Acquire))
                    .collect();
                found = widths.iter().find(|&&w| w >= 2).map(|&w| (w - 2) as usize);
                found.is_some() || widths.iter().all(|&w| w == 1)
            })
        };
        if found.is_none() {
            control.model_state.store(MODEL_NO_ROWS, Ordering::Release);
        }
        found
    }

    /// One shared model per learner, learner k's of `starts[k].len()` weights and biases,
    /// holding `starts[k]` (every process's initial values), for `n_features` features; and,
    /// before them, every process's per-learner reports of the last two epochs. The leader
    /// creates the segment (after `agree_on_width`), a worker attaches the leader's: both lay
    /// it out from the same learners.
    ///
    /// # Safety
    /// Once per team, after `agree_on_width` returned Some in this process (a worker's wait
    /// there is what makes the leader's layout visible before the worker reads it), with the
    /// same `starts` lengths in every process.
    pub unsafe fn shared_models(
        &mut self,
        n_features: usize,
        starts: &[Vec<f64>],
    ) -> Vec<SharedModel> {
        let control = &*self.control;
        let learners = starts.len();
        let processes = self.share.processes as usize;
        let reports_bytes =
            line_align(processes * 2 * learners * std::mem::size_of::<LearnerReport>());
        let mut offsets = Vec::with_capacity(learners);
        let mut bytes = reports_bytes;
        for start in starts {
            offsets.push(bytes);
            bytes += line_align(SharedModel::bytes(start.len()));
        }
        if self.is_leader() {
            self.model = pg_sys::dsm_create(bytes, 0);
            pg_sys::on_dsm_detach(
                self.model,
                Some(close_model_gate),
                pg_sys::Datum::from(0usize),
            );
            MODEL_GATE.open();
            let base = pg_sys::dsm_segment_address(self.model).cast::<u8>();
            std::ptr::write_bytes(base, 0, reports_bytes);
            let models = starts
                .iter()
                .zip(&offsets)
                .map(|(start, &at)| {
                    // SAFETY: a fresh segment of `bytes`, page-aligned, mapped until detached
                    // (which closes the gate first); each model at its own cache line.
                    let mut shared = SharedModel::create(base.add(at), start.len(), &MODEL_GATE);
                    // Every process starts from these values (no worker has attached yet).
                    shared.set_values(start);
                    shared
                })
                .collect();
            self.learner_reports = base.cast();
            self.learners = learners;
            control.learners.store(learners as u64, Ordering::Relaxed);
            control
                .model_handle
                .store(pg_sys::dsm_segment_handle(self.model), Ordering::Relaxed);
            control
                .n_features
                .store(n_features as u64, Ordering::Relaxed);
            control.model_state.store(MODEL_READY, Ordering::Release);
            return models;
        }
        let other_shape = || -> ! {
            raise(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                "corgipile parallel worker found a shared model of another shape",
                None,
            )
        };
        if control.learners.load(Ordering::Acquire) != learners as u64 {
            other_shape();
        }
        let handle = control.model_handle.load(Ordering::Acquire);
        self.model = pg_sys::dsm_attach(handle);
        if self.model.is_null() {
            raise(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                "corgipile parallel worker could not attach the shared model",
                None,
            );
        }
        pg_sys::on_dsm_detach(
            self.model,
            Some(close_model_gate),
            pg_sys::Datum::from(0usize),
        );
        MODEL_GATE.open();
        let base = pg_sys::dsm_segment_address(self.model).cast::<u8>();
        self.learner_reports = base.cast();
        self.learners = learners;
        starts
            .iter()
            .zip(&offsets)
            .map(|(start, &at)| {
                // SAFETY: the leader laid them out (MODEL_READY was published after `create`),
                // at the offsets this process computed from the same learners.
                SharedModel::attach(base.add(at), start.len(), &MODEL_GATE)
                    .unwrap_or_else(|| other_shape())
            })
            .collect()
    }

    /// Learner `k`'s report of process `rank` for epochs of `parity`.
    fn learner_report(&self, rank: u32, parity: u32, k: usize) -> *mut LearnerReport {
        debug_assert!(k < self.learners && !self.learner_reports.is_null());
        let at = (rank as usize * 2 + parity as usize) * self.learners + k;
        // SAFETY: the reports area holds processes x 2 x learners reports (`shared_models`).
        unsafe { self.learner_reports.add(at) }
    }

    /// The end of `epoch` in this process: publishes its statistics (`stats`: per learner,
    /// None if it stopped or was set aside here), waits for every process to finish the epoch,
    /// and returns the whole epoch's.
    ///
    /// # Safety
    /// After `shared_models`, with `stats` one entry per learner it laid out (the reports are
    /// written unchecked at those places); every process calls it for the same epochs in order.
    pub unsafe fn end_epoch(
        &self,
        epoch: u32,
        stats: &[Option<EpochStats>],
        counts: EpochCounts,
        labels_seen: &[f64],
    ) -> TeamEpoch {
        let rank = self.share.rank;
        let parity = epoch % 2;
        let slot = &mut (*self.control).slots[rank as usize];
        let mut seen = [0.0; 2];
        for (s, v) in seen.iter_mut().zip(labels_seen) {
            *s = *v;
        }
        slot.reports[parity as usize] = EpochReport {
            counts,
            n_seen: labels_seen.len().min(2) as u64,
            seen,
        };
        for (k, s) in stats.iter().enumerate() {
            *self.learner_report(rank, parity, k) = match s {
                Some(s) => LearnerReport {
                    going: 1,
                    tuples: s.tuples,
                    loss: s.loss,
                    accuracy: s.accuracy.unwrap_or(f64::NAN),
                    r2: s.r2.unwrap_or(f64::NAN),
                },
                None => LearnerReport::default(),
            };
        }
        slot.epoch_done.store(epoch, Ordering::Release);
        let processes = self.share.processes;
        self.wait_until(|| {
            (0..processes).all(|r| self.slot(r).epoch_done.load(Ordering::Acquire) >= epoch)
        });
        let reports: Vec<EpochReport> = (0..processes)
            .map(|r| self.slot(r).reports[parity as usize])
            .collect();
        let whole = stats
            .iter()
            .enumerate()
            .map(|(k, mine)| {
                let parts: Vec<LearnerReport> = (0..processes)
                    .map(|r| *self.learner_report(r, parity, k))
                    .collect();
                combine(mine.as_ref()?, &parts)
            })
            .collect();
        let mut seen: Vec<f64> = reports
            .iter()
            .flat_map(|r| r.seen[..r.n_seen as usize].iter().copied())
            .collect();
        seen.sort_by(f64::total_cmp);
        seen.dedup();
        TeamEpoch {
            stats: whole,
            counts: reports
                .iter()
                .fold(EpochCounts::default(), |all, r| all.add(r.counts)),
            labels_seen: seen.len(),
        }
    }

    /// Every process's `mine`, in rank order (this process's too): each publishes its bytes in
    /// a dynamic shared memory segment of its own, reads the others', and keeps its segment
    /// until every process has read it. `round`: the same increasing number in every process,
    /// one call per round (validation scores, parts of every epoch and of the folds).
    ///
    /// # Safety
    /// Every process of the team calls it with the same increasing `round`, once per round:
    /// the protocol that keeps each process's segment mapped, and its published length
    /// matching it, while the others read it.
    pub unsafe fn gather(&self, round: u32, mine: &[u8]) -> Vec<Vec<u8>> {
        let rank = self.share.rank;
        let processes = self.share.processes;
        let own = pg_sys::dsm_create(mine.len().max(1), 0);
        // SAFETY: a fresh segment of at least mine.len() bytes, mapped until detached below.
        std::ptr::copy_nonoverlapping(
            mine.as_ptr(),
            pg_sys::dsm_segment_address(own).cast::<u8>(),
            mine.len(),
        );
        let slot = self.slot(rank);
        slot.gather_handle
            .store(pg_sys::dsm_segment_handle(own), Ordering::Relaxed);
        slot.gather_len.store(mine.len() as u64, Ordering::Relaxed);
        slot.gather_round.store(round, Ordering::Release);
        self.wait_until(|| {
            (0..processes).all(|r| self.slot(r).gather_round.load(Ordering::Acquire) >= round)
        });
        let mut all = Vec::with_capacity(processes as usize);
        for r in 0..processes {
            if r == rank {
                all.push(mine.to_vec());
                continue;
            }
            let other = self.slot(r);
            let len = other.gather_len.load(Ordering::Relaxed) as usize;
            let seg = pg_sys::dsm_attach(other.gather_handle.load(Ordering::Relaxed));
            if seg.is_null() {
                raise(
                    PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                    "corgipile parallel training could not attach another process's scores",
                    None,
                );
            }
            // SAFETY: process r wrote `len` bytes there before publishing the round, and keeps
            // the segment until every process has read it (the second wait below).
            let bytes =
                std::slice::from_raw_parts(pg_sys::dsm_segment_address(seg).cast::<u8>(), len);
            all.push(bytes.to_vec());
            pg_sys::dsm_detach(seg);
        }
        slot.gather_read.store(round, Ordering::Release);
        self.wait_until(|| {
            (0..processes).all(|r| self.slot(r).gather_read.load(Ordering::Acquire) >= round)
        });
        pg_sys::dsm_detach(own);
        all
    }

    /// Per-worker rows of the last finished epoch (EXPLAIN ANALYZE), the leader's first.
    pub fn rows_per_process(&self, epoch: u32) -> Vec<u64> {
        (0..self.share.processes)
            .map(|r| self.slot(r).reports[(epoch % 2) as usize].counts.rows)
            .collect()
    }

    /// Leader, after its last epoch: waits for the workers to finish (they have added their
    /// averages to the shared model when they do).
    ///
    /// # Safety
    /// The leader's team only (a worker's has no parallel context to wait on).
    pub unsafe fn wait_for_workers(&self) {
        pg_sys::WaitForParallelWorkersToFinish(self.pcxt);
    }

    /// At the very end: detaches the model; the leader also ends the parallel context.
    pub fn finish(self) {
        if !self.model.is_null() {
            // SAFETY: an FFI call on the backend thread on the segment this process created or
            // attached, once (`self` is consumed); detaching closes MODEL_GATE first, so a
            // shared model still held fails its exchanges rather than touching the unmapped
            // segment.
            unsafe { pg_sys::dsm_detach(self.model) };
        }
        if self.is_leader() {
            // SAFETY: the leader's parallel context from `launch` (a team's only constructor
            // for rank 0), ended once, inside the parallel mode `launch` entered.
            unsafe {
                pg_sys::DestroyParallelContext(self.pcxt);
                pg_sys::ExitParallelMode();
            }
        }
    }
}

/// One learner's whole epoch from every process's: tuples add up; loss, accuracy and R² are
/// means weighted by tuples. None if it stopped or was set aside in any process.
fn combine(mine: &EpochStats, parts: &[LearnerReport]) -> Option<EpochStats> {
    let mut totals = EpochTotals::default();
    for p in parts {
        if p.going == 0 {
            return None;
        }
        totals.add(&EpochPart {
            tuples: p.tuples,
            rows: 0,
            rows_skipped: 0,
            loss: p.loss,
            accuracy: p.accuracy,
            r2: p.r2,
        });
    }
    Some(totals.stats(
        mine.epoch,
        mine.accuracy.is_some(),
        mine.r2.is_some(),
        mine.learning_rate,
    ))
}

/// on_dsm_detach callback of the model segment: no exchange may touch it from now on.
#[pg_guard]
unsafe extern "C-unwind" fn close_model_gate(_seg: *mut pg_sys::dsm_segment, _arg: pg_sys::Datum) {
    MODEL_GATE.close();
}

/// A parallel worker's part in a training: its team, what the leader's statistics pass
/// learned, and the epoch whose block order it starts from. As an SGD task (see
/// `crate::exec::worker`), it trains its share of the blocks with the team.
pub struct Member {
    pub team: Team,
    pub extras: LearnedStatistics,
    pub block_epoch: u32,
}
