//! corgipile_feature_importance over a sharded table. Rows never leave a shard, so a column's
//! values are permuted among the rows of each shard's own sample (an estimate of the same
//! quantity as one server's permutation across the whole sample): the coordinator counts every
//! shard's rows (one round), splits the `rows` asked for among the shards in proportion (one
//! round: each shard samples its share through the block shuffle and scores the stored model
//! on it as it is and with each column permuted), and merges the shards' score parts
//! (`corgipile_ml::importance::pooled_importance`) into the rows one server returns.

use super::coordinator::{bad_reply, open_shards, round_each, shard_params, RoundProgress};
use super::leaves::Leaf;
use crate::catalog::StoredModel;
use crate::exec::sgd::{check_cost, score_sample, SampleRows};
use crate::pg::error::raise;
use crate::pg::progress;
use crate::pipeline::protocol::{this_version, EvaluateRequest, Phase, RoundReply, RoundRequest};
use crate::pipeline::protocol_parts::ImportanceAsk;
use crate::pipeline::Mode;
use crate::request::{prepare, Prepared};
use corgipile_ml::importance::{column_ranges, split_rows, ServerScores};
use corgipile_ml::model::{ModelKind, Predictor};
use corgipile_ml::params::{ShuffleMode, TrainParams};
use corgipile_ml::trained::Model;
use corgipile_ml::wire::WireError;
use corgipile_ml::Welford;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use std::ops::Range;

/// A shard's part of an importance round on a table of this server (`relid`, or its local
/// partition `leaf`, as `serve::shard_round_here`).
pub(super) fn importance_here(
    relid: pg_sys::Oid,
    leaf: Option<pg_sys::Oid>,
    kind: ModelKind,
    mut params: TrainParams,
    request: &RoundRequest,
    model: Model,
) -> RoundReply {
    let ask = request.importance.expect("checked: an importance round");
    if ask.count {
        return RoundReply {
            rows: match leaf {
                Some(leaf) => count_rows(leaf, true),
                None => count_rows(relid, false),
            },
            ..RoundReply::default()
        };
    }
    let evaluate = request
        .evaluate
        .as_ref()
        .expect("checked: a model to score");
    let ranges = column_ranges(evaluate.preprocessing.as_ref(), model.n_features());
    // The same bounds as the coordinator's, before any work: the request may be anyone's.
    check_cost(
        "the coordinator's model",
        ranges.len(),
        ask.repeats as u64,
        ask.rows,
        model.n_features(),
    );
    params.shuffle = ShuffleMode::Corgipile;
    params.seed = Some(ask.seed);
    let mut prepared = prepare(
        relid,
        kind,
        params,
        Mode::Evaluate,
        evaluate.classes.clone(),
        evaluate.preprocessing.as_ref(),
    );
    prepared.config.leaf = leaf.map(u32::from);
    let sample = prepared.run(SampleRows {
        rows: ask.rows as usize,
        width: model.n_features(),
        classes: evaluate.classes.clone(),
    });
    let part = score_sample(&model, evaluate.classes.len(), &sample, &ranges, ask);
    RoundReply {
        rows: sample.labels.len() as u64,
        importance: Some(part),
        ..RoundReply::default()
    }
}

/// The rows of a table of this server, counted by the current user, or `as_owner`: a local
/// partition of a sharded table is read as the table's reader reads it, with the parent's
/// privileges (checked by the caller), so it is counted as its owner.
fn count_rows(relid: pg_sys::Oid, as_owner: bool) -> u64 {
    let name = crate::pg::names::qualified_name(relid);
    if !as_owner {
        return count(&name);
    }
    let (mut user, mut context) = (pg_sys::InvalidOid, 0);
    // SAFETY: FFI calls on the backend thread inside the SQL call's transaction; the relation
    // is open while its row is read, and the previous user is restored below (and by the
    // transaction's abort if the count raises).
    unsafe {
        let rel = pg_sys::relation_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let owner = (*(*rel).rd_rel).relowner;
        pg_sys::relation_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        pg_sys::SetUserIdAndSecContext(
            owner,
            context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
        );
    }
    let n = count(&name);
    // SAFETY: as above.
    unsafe { pg_sys::SetUserIdAndSecContext(user, context) };
    n
}

/// `SELECT count(*)` of the relation `name` (quoted, qualified as needed).
fn count(name: &str) -> u64 {
    match Spi::get_one::<i64>(&format!("SELECT pg_catalog.count(*) FROM {name}")) {
        Ok(Some(n)) => n.max(0) as u64,
        Ok(None) => 0,
        Err(e) => raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("corgipile shard round: counting the rows of {name}: {e}"),
            None,
        ),
    }
}

/// corgipile_feature_importance of `stored` on a sharded table: counts every shard's rows,
/// samples each shard's share of `ask.rows`, and returns every shard's scores (as
/// `pooled_importance` takes them), the merged moments of the columns, and the rows sampled.
pub(super) fn importance_sharded(
    prepared: &Prepared,
    leaves: Vec<Leaf>,
    stored: &StoredModel,
    ask: ImportanceAsk,
    ranges: &[Range<usize>],
    run_local: &dyn Fn(pg_sys::Oid, &RoundRequest) -> RoundReply,
) -> (Vec<ServerScores>, Vec<Welford>, u64) {
    let config = &prepared.config;
    super::check_sharded_access(prepared.relid, &config.relation, "score on");
    let kind = config.model;
    let _progress = progress::start(&config.relation, kind.name(), 1);
    progress::phase("feature importance");
    let version = this_version().to_string();
    let mut shards = open_shards(leaves, &version);
    let mut request = RoundRequest {
        n_features: stored.n_features(),
        evaluate: Some(EvaluateRequest {
            model: stored.model.to_parts(),
            classes: stored.classes.clone(),
            preprocessing: stored.preprocessing.clone(),
            tables: None,
            groups: None,
            held_out: false,
        }),
        importance: Some(ImportanceAsk { count: true, ..ask }),
        ..RoundRequest::new(Phase::Importance, 0)
    };
    let params_json = shard_params(&config.params);
    let mut bytes = 0;
    let mut at = RoundProgress {
        label: "counting rows".into(),
        fraction: 0.0,
        tuples: 0,
    };
    let each = vec![&request; shards.len()];
    let counts: Vec<u64> = round_each(
        &mut shards,
        &each,
        kind,
        &params_json,
        run_local,
        &mut bytes,
        &at,
    )
    .iter()
    .map(|r| r.rows)
    .collect();
    // Every shard's own seed: its permutations are its own.
    let requests: Vec<RoundRequest> = split_rows(ask.rows, &counts)
        .into_iter()
        .enumerate()
        .map(|(i, rows)| {
            request.importance = Some(ImportanceAsk {
                count: false,
                rows,
                seed: ask.seed.wrapping_add(i as u64),
                ..ask
            });
            request.clone()
        })
        .collect();
    at.label = "sampling and scoring".into();
    at.fraction = 0.5;
    let replies = round_each(
        &mut shards,
        &requests.iter().collect::<Vec<_>>(),
        kind,
        &params_json,
        run_local,
        &mut bytes,
        &at,
    );
    progress::finish();
    let mut moments: Vec<Welford> = vec![Welford::new(); ranges.len()];
    let mut rows = 0u64;
    let mut parts = Vec::with_capacity(replies.len());
    for (reply, shard) in replies.into_iter().zip(&shards) {
        rows = rows.saturating_add(reply.rows);
        let Some(part) = reply.importance else {
            bad_reply(
                &shard.name,
                WireError::Invalid("no importance scores".into()),
            )
        };
        for (total, m) in moments.iter_mut().zip(&part.moments) {
            total.merge(m);
        }
        parts.push((part.baseline, part.permuted));
    }
    (parts, moments, rows)
}
