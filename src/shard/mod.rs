//! Training over a sharded table: a partitioned table whose partitions are postgres_fdw foreign
//! tables on other servers (and maybe local tables). Rows never cross the network: every shard
//! runs corgipile's own pipeline over its local table (`corgipile_shard_round` in `serve`,
//! which runs the `exec::sgd::shard_round` task) and returns a model; the coordinator adds
//! every shard's change to the model the round started from, once per round, and sends the sum
//! back for the next round. A round is one epoch of every shard, or with `"sync": K` a K-th of it (blocks
//! `r`, `r + K`, … of the epoch's order), for shards that hold different label mixes.
//!
//! Round 0 is a statistics pass on every shard: the merged statistics give the features'
//! scales (`normalize`), the two label values of a binary model (so every shard maps labels
//! alike), the class weights and the dense width every shard must have. A label numbered by
//! class (softmax, a network's classes, a text label) comes back with each shard's classes;
//! the coordinator merges them into one sorted numbering (`protocol::merge_classes`) and sends
//! it with every training round, so that every shard's decoder numbers classes alike.
//!
//! Every message carries its sender's corgipile version and `protocol::PROTOCOL`: servers of
//! different versions stop with an ERROR naming both (see `protocol`).

pub mod coordinator;
pub mod gate;
pub(crate) mod groups;
pub(crate) mod importance;
mod network;
mod plan;
pub mod remote;
pub mod serve;
pub mod since;
mod training;
mod warm;
use crate::exec::explain;
use crate::exec::sgd::binary_labels;
use crate::pg::error::raise;
use crate::pipeline::protocol::{EvaluateRequest, RoundRequest};
use crate::pipeline::PipelineConfig;
use crate::request::Prepared;
use corgipile_ml::model::ModelKind;
use corgipile_ml::scoring::{Evaluation, TableSpec};

use pgrx::{pg_sys, PgSqlErrorCode};
use std::ffi::CStr;

pub mod leaves;
pub use leaves::{describe, sharded_leaves, Leaf};

/// What a sharded training does not do yet: an ERROR before any work.
pub fn check_supported(kind: ModelKind, config: &PipelineConfig) {
    crate::pipeline::check_distributed(
        crate::pipeline::Distributed::Shards,
        kind,
        config.label,
        config.layout,
        &config.params,
    );
}

/// A training over a sharded table (postgres_fdw partitions): the shards train, this backend
/// combines (see `crate::shard`); from `warm`'s model with a warm start (see `warm.rs`). Every
/// configuration's trial (one without a search), and what a deploy gate scores on (`gate`).
pub(crate) fn train_sharded(
    prepared: &Prepared,
    leaves: Vec<crate::shard::Leaf>,
    warm: Option<&crate::catalog::warm_start::WarmStart>,
) -> (
    Vec<crate::pipeline::Trial>,
    coordinator::ShardSummary,
    Option<gate::HeldOut>,
) {
    let config = &prepared.config;
    crate::shard::check_supported(config.model, config);
    check_sharded_access(prepared.relid, &config.relation, "train on");
    gate::check_validation_relation(config);
    let kind = config.model;
    let params = config.params.clone();
    let parent = prepared.relid;
    let run_local = |leaf: pg_sys::Oid, request: &RoundRequest| {
        serve::shard_round_here(parent, Some(leaf), kind, &params, request)
    };
    training::train(parent, leaves, config, warm, &run_local)
}

/// The shards read their tables as the user mappings' roles; here the caller must be allowed to
/// read the partitioned table, and its row-level security (which the shards cannot apply) must
/// not be in force. `what`: "train on" or "evaluate on", for the message.
pub(crate) fn check_sharded_access(relid: pg_sys::Oid, relation: &str, what: &str) {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        if pg_sys::pg_class_aclcheck(
            relid,
            pg_sys::GetUserId(),
            pg_sys::ACL_SELECT as pg_sys::AclMode,
        ) != pg_sys::AclResult::ACLCHECK_OK
        {
            raise(
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                format!("permission denied for table {relation}"),
                None,
            );
        }
        if pg_sys::check_enable_rls(relid, pg_sys::InvalidOid, true)
            == pg_sys::CheckEnableRlsResult::RLS_ENABLED as i32
        {
            raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("cannot {what} the sharded table {relation}: its row-level security would not apply on the shards"),
            Some("Define the policies on the shards' tables, for the roles the user mappings name.".into()),
        );
        }
    }
}

/// EXPLAIN of a training over a sharded table: no executor plan runs here, so the output is the
/// training's properties and its shards; with `analyze`, after training (the model is not
/// stored), each shard's tuples in the last epoch and time, and the bytes exchanged per epoch.
pub(crate) fn explain_sharded(
    prepared: &Prepared,
    leaves: Vec<crate::shard::Leaf>,
    warm: Option<&crate::catalog::warm_start::WarmStart>,
    analyze: bool,
    format: pg_sys::ExplainFormat::Type,
) -> String {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        crate::shard::check_supported(prepared.config.model, &prepared.config);
        let described = crate::shard::describe(&leaves);
        let params = &prepared.config.params;
        let started = std::time::Instant::now();
        let trained = analyze.then(|| train_sharded(prepared, leaves, warm));
        let es = pg_sys::NewExplainState();
        (*es).analyze = analyze;
        (*es).format = format;
        pg_sys::ExplainBeginOutput(es);
        pg_sys::ExplainOpenGroup(c"Query".as_ptr(), std::ptr::null(), true, es);
        explain::text(es, "Sharded Training", &prepared.config.relation);
        explain::text(es, "Model", prepared.config.model.name());
        explain::int(es, "Epochs", params.epochs as i64);
        explain::text(
            es,
            "Sync",
            &match params.sync {
                Some(n) => format!("{n} rounds per epoch"),
                None => "auto (64 rounds per epoch, fewer for a model of more than 16384 weights)"
                    .into(),
            },
        );
        crate::exec::sgd::explain_family(es, prepared.config.model, params);
        if let Some(since) = since::load(&prepared.config, prepared.relid) {
            explain::text(es, "Since", &since.describe(params.replay));
        }
        if prepared.config.model.family().sized_by_statistics() {
            explain::text(es, "Combine", "mean of the shards' changes");
        }
        explain::int(es, "Shards", described.len() as i64);
        match &trained {
            None => {
                for (i, d) in described.iter().enumerate() {
                    explain::text(es, &format!("Shard {}", i + 1), d);
                }
            }
            // A search's: its first configuration's (every one ran the same rounds).
            Some((trials, summary, _)) => {
                let outcome = match trials.first().map(|t| &t.outcome) {
                    Some(Ok(outcome)) => outcome,
                    _ => raise(
                        PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                        "the first configuration of the search was set aside: it diverged",
                        None,
                    ),
                };
                for (i, (line, d)) in summary.shards.iter().zip(&described).enumerate() {
                    explain::text(
                        es,
                        &format!("Shard {}", i + 1),
                        &format!(
                            "{d}: {} tuples in the last epoch, {:.3} s in rounds",
                            line.tuples_last_epoch, line.seconds
                        ),
                    );
                }
                explain::int(es, "Rounds Per Epoch", summary.rounds_per_epoch as i64);
                explain::int(es, "Epochs Run", outcome.epochs.len() as i64);
                if let Some(last) = outcome.epochs.last() {
                    explain::float(es, "Final Loss", None, last.stats.loss, 6);
                    explain::int(es, "Tuples Per Epoch", last.stats.tuples as i64);
                }
                explain::int(es, "Bytes Per Epoch", summary.bytes_per_epoch as i64);
                let times: Vec<String> = outcome
                    .epochs
                    .iter()
                    .map(|e| format!("{:.3}", e.seconds * 1000.0))
                    .collect();
                explain::text(es, "Epoch Times (ms)", &times.join(", "));
                explain::float(
                    es,
                    "Training Time",
                    Some("ms"),
                    started.elapsed().as_secs_f64() * 1000.0,
                    3,
                );
            }
        }
        pg_sys::ExplainCloseGroup(c"Query".as_ptr(), std::ptr::null(), true, es);
        pg_sys::ExplainEndOutput(es);
        CStr::from_ptr((*(*es).str_).data)
            .to_string_lossy()
            .into_owned()
    }
}

/// corgipile_feature_importance of `stored` on a sharded table (see `importance`): every
/// shard's scores, the columns' merged moments and the rows sampled.
pub(crate) fn importance_sharded(
    prepared: &Prepared,
    leaves: Vec<crate::shard::Leaf>,
    stored: &crate::catalog::StoredModel,
    ask: crate::pipeline::protocol_parts::ImportanceAsk,
    ranges: &[std::ops::Range<usize>],
) -> (
    Vec<corgipile_ml::importance::ServerScores>,
    Vec<corgipile_ml::Welford>,
    u64,
) {
    let (parent, kind) = (prepared.relid, prepared.config.model);
    let params = prepared.config.params.clone();
    let run_local = |leaf: pg_sys::Oid, request: &RoundRequest| {
        serve::shard_round_here(parent, Some(leaf), kind, &params, request)
    };
    importance::importance_sharded(prepared, leaves, stored, ask, ranges, &run_local)
}

/// corgipile_evaluate (and its tables, when `tables` asks for them) on a sharded table: every
/// shard scores the model on its rows; the metrics are merged here. Returns them and the rows
/// the shards' readers skipped.
pub(crate) fn evaluate_sharded(
    prepared: &Prepared,
    leaves: Vec<crate::shard::Leaf>,
    stored: &crate::catalog::StoredModel,
    tables: Option<TableSpec>,
) -> (Evaluation, u64) {
    let binary = binary_labels(prepared.config.label.uses_classes(), &stored.classes);
    let mut evaluation = Evaluation::mergeable(prepared.config.model, stored.classes.len(), binary);
    if let Some(spec) = tables {
        evaluation = evaluation.with_tables(spec);
    }
    let rows_skipped = evaluate_with(
        prepared,
        leaves,
        stored,
        tables,
        None,
        &mut evaluation,
        &mut [],
    );
    (evaluation, rows_skipped)
}

/// Scores `stored` (or with `family`, its groups' models) on every shard and merges the
/// shards' metrics into `evaluation` (and each group's, then the other rows', into
/// `per_group`); returns the rows the shards' readers skipped.
fn evaluate_with(
    prepared: &Prepared,
    leaves: Vec<crate::shard::Leaf>,
    stored: &crate::catalog::StoredModel,
    tables: Option<TableSpec>,
    family: Option<crate::pipeline::protocol_parts::FamilyModels>,
    evaluation: &mut Evaluation,
    per_group: &mut [Evaluation],
) -> u64 {
    let config = &prepared.config;
    check_sharded_access(prepared.relid, &config.relation, "evaluate on");
    let request = EvaluateRequest {
        model: stored.model.to_parts(),
        classes: stored.classes.clone(),
        preprocessing: stored.preprocessing.clone(),
        tables,
        groups: family,
        held_out: false,
    };
    let kind = config.model;
    let parent = prepared.relid;
    let run_local = |leaf: pg_sys::Oid, request: &RoundRequest| {
        serve::evaluate_shard_here(parent, Some(leaf), kind, config.params.clone(), request)
    };
    // A family's group columns go in its request: a shard's params name no groups (a
    // "group_by" there is a training's, which needs a name).
    let mut sent = config.clone();
    sent.params.group_by = None;
    coordinator::evaluate(leaves, &sent, request, &run_local, evaluation, per_group)
}
