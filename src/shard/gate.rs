//! What a sharded training holds out for its validation and for a deploy gate
//! (`"deploy": "if_better"`, `crate::sql::gate`), and where those rows stay until the gate has
//! scored both versions on them.
//!
//! - Held out by the shards (a fraction, a predicate): the rows kept on a shard are encoded for
//!   the new training (its preprocessing, its classes), not for the deployed version, so the
//!   gate does not score them: a gated training's first epoch keeps their tuple ids too
//!   (`RoundRequest::keep_held_out_ids`), the connections stay open after the training (a
//!   shard's backend keeps what it holds while its connection lives), and each version is
//!   scored by an evaluation round of only those ids (`EvaluateRequest::held_out`), with its
//!   own columns, preprocessing and classes, merged as corgipile_evaluate merges a sharded
//!   table's.
//! - A validation relation is on this server: its rows are collected after round 0 (encoded
//!   with the merged preprocessing, labels by the coordinator's numbering of classes), every
//!   epoch's combined model is scored on them here, and the gate scores by their tuple ids as
//!   one server does.

use super::coordinator::{round, shard_params, RoundProgress, Shard};
use crate::catalog::StoredModel;
use crate::exec::sgd::{forget_kept, score_rows, CollectedRows};
use crate::pg::error::raise;
use crate::pg::progress;
use crate::pipeline::protocol::{EvaluateRequest, Phase, RoundReply, RoundRequest};
use crate::pipeline::{ClassValue, HeldOutRows, PipelineConfig};
use crate::request::Prepared;
use corgipile_ml::model::{ModelKind, Predictor};
use corgipile_ml::params::Validation;
use corgipile_ml::preprocess::Preprocessor;
use corgipile_ml::scoring::{BinaryLabels, Evaluation, ValidationScore, ValidationStats};
use corgipile_ml::trained::Model;
use pgrx::{pg_sys, PgSqlErrorCode};
use std::sync::Arc;

/// The rows a gated training held out, where they are.
pub enum HeldOut {
    /// On this server, by tuple id: the rows one backend held out, or a validation relation's.
    Rows(Arc<HeldOutRows>),
    /// Every shard's own, kept there until this is dropped.
    Shards(KeptShards),
}

/// A gated sharded training's shards after it: their connections open, each keeping the ids
/// of the rows it held out (this backend keeps its local partitions') until dropped.
pub struct KeptShards {
    shards: Vec<Shard>,
    /// The training's number, under which every shard keeps them.
    training: u64,
}

impl KeptShards {
    pub(super) fn new(shards: Vec<Shard>, training: u64) -> KeptShards {
        KeptShards { shards, training }
    }

    /// `stored` scored on only the held-out rows of every shard of `prepared`'s sharded table
    /// (its evaluation, prepared as corgipile_evaluate prepares one): the merged metrics and
    /// the rows the shards' readers skipped.
    pub fn evaluate(&mut self, prepared: &Prepared, stored: &StoredModel) -> (Evaluation, u64) {
        let config = &prepared.config;
        let kind = config.model;
        let _progress = progress::start(&config.relation, kind.name(), 1);
        progress::phase("deploy gate");
        let request = RoundRequest {
            n_features: stored.model.n_features(),
            evaluate: Some(EvaluateRequest {
                model: stored.model.to_parts(),
                classes: stored.classes.clone(),
                preprocessing: stored.preprocessing.clone(),
                tables: None,
                groups: None,
                held_out: true,
            }),
            ..RoundRequest::new(Phase::Evaluate, self.training)
        };
        let parent = prepared.relid;
        let run_local = |leaf: pg_sys::Oid, request: &RoundRequest| {
            super::serve::evaluate_shard_here(
                parent,
                Some(leaf),
                kind,
                config.params.clone(),
                request,
            )
        };
        let at = RoundProgress {
            label: "deploy gate".into(),
            fraction: 0.0,
            tuples: 0,
        };
        let replies = round(
            &mut self.shards,
            &request,
            kind,
            &shard_params(&config.params),
            &run_local,
            &mut 0,
            &at,
        );
        let binary = crate::exec::sgd::binary_labels(config.label.uses_classes(), &stored.classes);
        let mut evaluation = Evaluation::mergeable(kind, stored.classes.len(), binary);
        let rows_skipped = merge(&mut evaluation, &replies);
        progress::finish();
        (evaluation, rows_skipped)
    }
}

/// The shards' evaluations (each checked as it came) merged into `evaluation`; returns the
/// rows their readers skipped.
fn merge(evaluation: &mut Evaluation, replies: &[RoundReply]) -> u64 {
    let mut rows_skipped = 0u64;
    for reply in replies {
        evaluation.merge(reply.evaluation.as_ref().expect("checked: an evaluation"));
        rows_skipped = rows_skipped.saturating_add(reply.rows_skipped);
    }
    rows_skipped
}

impl Drop for KeptShards {
    fn drop(&mut self) {
        // The remote shards forget with their connections; the local partitions' are here.
        forget_kept();
    }
}

/// Checked before any work: a validation relation of a sharded training exists (it is read
/// after round 0, which numbers the classes and merges the preprocessing its rows take).
pub(crate) fn check_validation_relation(config: &PipelineConfig) {
    if let Some(Validation::Relation(name)) = &config.params.validation {
        crate::request::validation_relation::validation_relid(name);
    }
}

/// The rows of the training's validation relation, if it has one: read here after round 0,
/// encoded with the merged `preprocessing`, labels numbered as `numbered` numbers classes.
pub(super) fn relation_rows(
    config: &PipelineConfig,
    preprocessing: Option<&Preprocessor>,
    numbered: &[ClassValue],
) -> Option<CollectedRows> {
    let Some(Validation::Relation(name)) = &config.params.validation else {
        return None;
    };
    // SAFETY: runs a plan on the backend thread, in the SQL call's transaction.
    let rows = unsafe {
        crate::request::validation_relation::collect_relation(
            name,
            config.model,
            &config.params,
            preprocessing,
            numbered.to_vec(),
        )
    };
    // A class no shard has would have no output (a softmax's, a network's) or no sign.
    if config.label.uses_classes() && rows.classes.len() > numbered.len() {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            format!(
                "validation relation \"{name}\" has a label value that no shard of {} has",
                config.relation
            ),
            Some("Validate on rows of the classes the sharded table has, or hold out rows of the sharded table instead ({\"fraction\": 0.1}).".into()),
        );
    }
    Some(rows)
}

/// `model` (an epoch's combined model, in the table's units) scored on a validation
/// relation's rows; `label_values`: a binary kind's two labels as its trainer sees them.
pub(super) fn score_relation(
    kind: ModelKind,
    label_values: Option<(f64, f64)>,
    model: &Model,
    rows: &CollectedRows,
) -> ValidationStats {
    let binary =
        label_values.map(|(negative, positive)| BinaryLabels::Values { negative, positive });
    let mut score = ValidationScore::new(kind, binary);
    score_rows(&mut score, model, &rows.rows.arena);
    score.finish()
}

/// What the gate scores a sharded training's versions on: the validation relation's rows by
/// tuple id, or (`keep`) every shard's own, kept there with the connections open; None
/// otherwise (the shards forget what they kept).
pub(super) fn held_out(
    relation: Option<CollectedRows>,
    keep: Option<KeptShards>,
) -> Option<HeldOut> {
    match (relation, keep) {
        (Some(mut rows), _) => rows.held_out.take().map(|r| HeldOut::Rows(Arc::new(r))),
        (None, Some(kept)) => Some(HeldOut::Shards(kept)),
        (None, None) => None,
    }
}
