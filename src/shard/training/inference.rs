//! `"inference"` on a sharded table: after the epochs, the Newton passes one server makes
//! (`corgipile_ml::inference::newton_passes`, through `exec::sgd::polish`), each pass a round
//! in which every shard reads its whole table at the coordinator's coefficients and sends
//! what it summed (an `InformationPart`: H's lower triangle, the gradient, rows, loss,
//! counts), merged here; the tests are stored where one server stores them.

use super::Conversation;
use crate::exec::sgd::{check_information_size, family_of, polish, start_information};
use crate::exec::sgd::{store_inference, INFERENCE_SIZE_HINT};
use crate::pg::error::raise;
use crate::pg::guc::max_wire_bytes;
use crate::pg::progress;
use crate::pipeline::protocol::{Phase, RoundRequest};
use crate::pipeline::protocol_parts::InferenceAsk;
use crate::pipeline::{PipelineConfig, Trial};
use crate::shard::coordinator::RoundProgress;
use corgipile_ml::inference::InformationPart;
use corgipile_ml::limits::pretty_pair;
use pgrx::PgSqlErrorCode;
use std::time::Instant;

/// Before the epochs (once round 0 has told the features): the information matrix must fit
/// corgipile.max_model_memory here as on one server, and each shard's part of it must be
/// readable within four times that (corgipile.max_model_memory bounds what a reply may take
/// to parse): ERROR 54000 otherwise, before any training round.
pub(super) fn check_size(config: &PipelineConfig, n_features: usize) {
    let params = &config.params;
    if !params.inference {
        return;
    }
    check_information_size(n_features, params.fit_intercept, config.max_model_bytes);
    let bytes = InformationPart::wire_bytes(n_features, params.fit_intercept);
    let limit = max_wire_bytes();
    if bytes > limit {
        let (needed, limit) = pretty_pair(bytes, limit);
        let p = n_features + params.fit_intercept as usize;
        raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("\"inference\" on {n_features} features over shards: each shard's part of the {p} x {p} information matrix needs {needed} to read, more than four times corgipile.max_model_memory ({limit})"),
            Some(INFERENCE_SIZE_HINT.into()),
        );
    }
}

/// Polishes the model of `trials` (one: "inference" trains no search) by Newton passes over
/// every shard's rows and adds its tests, as one server's `infer` does. `train`: the training
/// rounds' request (classes, preprocessing, label values: how the shards decode their rows);
/// `rows_trained`: the last epoch's rows, which every pass must read again.
pub(super) fn infer(
    conv: &mut Conversation,
    train: &RoundRequest,
    config: &PipelineConfig,
    trials: &mut [Trial],
    rows_trained: u64,
) {
    let params = &config.params;
    if !params.inference {
        return;
    }
    let Some(Ok(outcome)) = trials.first_mut().map(|t| t.outcome.as_mut()) else {
        return; // the training failed: its ERROR or report says why
    };
    let started = Instant::now();
    progress::phase("inference");
    // What EXPLAIN ANALYZE and the NOTICEs report is the last epoch's traffic, not the passes'.
    let epoch_bytes = conv.bytes;
    let (family, _) = family_of(config.model, train.extras.label_values);
    let mut info = start_information(outcome, family, params.fit_intercept);
    let mut request = RoundRequest {
        n_features: train.n_features,
        extras: train.extras.clone(),
        classes: train.classes.clone(),
        preprocessing: train.preprocessing.clone(),
        ..RoundRequest::new(Phase::Inference, train.training)
    };
    let polished = polish(
        &mut info,
        params,
        train.preprocessing.as_ref(),
        &config.relation,
        &mut |info, pass| {
            let (weights, bias) = info.coefficients();
            request.inference = Some(InferenceAsk {
                weights: weights.to_vec(),
                bias: params.fit_intercept.then_some(bias),
            });
            let at = RoundProgress {
                label: format!("Newton pass {pass} of \"inference\""),
                fraction: 0.0,
                tuples: 0,
            };
            let replies = conv.round(&request, &at);
            let rows: u64 = replies.iter().map(|r| r.rows).sum();
            if rows != rows_trained {
                raise(
                    PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                    format!("Newton pass {pass} of \"inference\" read {rows} rows of the shards of {}, the last epoch {rows_trained}: the shards' rows changed during the training", config.relation),
                    Some("Every pass must read the rows the epochs trained on: train again while the shards' tables are not being written, or on copies of them.".into()),
                );
            }
            for reply in &replies {
                // A remote shard's was checked as it came; a local partition's is this
                // backend's own.
                let part = reply.information.as_ref().expect("checked");
                info.add_part(part);
            }
        },
    );
    conv.bytes = epoch_bytes;
    store_inference(outcome, &info, polished, params, started);
}
