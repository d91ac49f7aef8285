//! corgipile_evaluate of a family of per-group models on a sharded table: the evaluation
//! request carries every group's model (with its key, in the order of the groups' numbers) and
//! the family's own model for the rows of other groups; each shard numbers its rows' groups by
//! those keys, scores every row with its group's model, and returns the mergeable metrics of
//! every row, of each group's rows and of the other rows; the coordinator merges each and
//! reports as one server does (`exec::sgd::groups_report`).

use super::leaves::Leaf;
use crate::catalog::{load_group_model, StoredModel};
use crate::exec::sgd::{binary_labels, check_group_counts, groups_report, EvaluateGroupsShard};
use crate::pg::error::raise;
use crate::pipeline::protocol::{EvaluateRequest, Phase, RoundReply, RoundRequest};
use crate::pipeline::protocol_parts::FamilyModels;
use crate::pipeline::PipelineConfig;
use crate::request::Prepared;
use corgipile_ml::model::ModelKind;
use corgipile_ml::scoring::Evaluation;
use corgipile_ml::trained::ModelParts;
use pgrx::PgSqlErrorCode;

/// A training round of per-group models (the coordinator's params have `"group_by"`): this
/// shard's reader numbers its rows' groups by the coordinator's keys (a row of another group,
/// or with a NULL group column, trains the model of every row only, as one server's small
/// groups' rows do). Groups sent for a training without group columns are a protocol
/// violation.
pub(super) fn number_as_sent(config: &mut PipelineConfig, request: &RoundRequest) {
    if request.phase != Phase::Train {
        return;
    }
    match config.groups.as_mut() {
        Some(groups) => {
            groups.known = Some(request.groups.iter().map(|k| k.0.clone()).collect());
        }
        None if !request.groups.is_empty()
            || request.learners.iter().any(|l| l.group.is_some()) =>
        {
            raise(
                PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
                "corgipile shard round: per-group learners for a training without \"group_by\"",
                None,
            )
        }
        None => {}
    }
}

/// A shard's part of the evaluation of a family (`evaluate.groups`): every row scored by its
/// group's model. `prepared`: the evaluation's plan of this shard's table, whose reader must
/// number groups (the family's group columns, in the coordinator's params).
pub(super) fn evaluate_family_here(
    mut prepared: Prepared,
    kind: ModelKind,
    model: corgipile_ml::trained::Model,
    evaluate: &EvaluateRequest,
    family: &FamilyModels,
) -> RoundReply {
    let violation = |why: String| -> ! {
        raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            format!("corgipile shard round: {why}"),
            None,
        )
    };
    let Some(groups) = prepared.config.groups.as_mut() else {
        violation("per-group models without the columns of their groups".into())
    };
    groups.known = Some(family.keys.clone());
    // Bounded before any model is built: the request may be anyone's.
    check_group_counts(
        kind,
        evaluate.classes.len(),
        family.keys.len(),
        true,
        "the coordinator's model",
    );
    let members = family
        .models
        .iter()
        .map(|m| {
            m.clone()
                .into_model()
                .unwrap_or_else(|why| violation(why.to_string()))
        })
        .collect();
    let (whole, parts, rows_skipped) = prepared.run(EvaluateGroupsShard {
        model,
        members,
        classes: evaluate.classes.clone(),
    });
    RoundReply {
        rows: whole.rows_scored(),
        rows_skipped,
        evaluation: Some(whole),
        group_evaluations: Some(parts),
        ..RoundReply::default()
    }
}

/// corgipile_evaluate of the family `stored` (`members`: each group's key and model id, in
/// the order of their numbers) on a sharded table: its report as one server's, with ROC AUC
/// from merged histograms.
pub(crate) fn evaluate_family_sharded(
    prepared: &Prepared,
    leaves: Vec<Leaf>,
    stored: &StoredModel,
    members: &[(String, i64)],
) -> serde_json::Value {
    let config = &prepared.config;
    let what = format!("model {}", stored.id);
    let n_classes = stored.classes.len();
    check_group_counts(stored.kind(), n_classes, members.len(), true, &what);
    // Every group's model goes to every shard in one request: within what a shard reads.
    let models: Vec<ModelParts> = members
        .iter()
        .map(|(key, id)| load_group_model(stored, key, *id).model.to_parts())
        .collect();
    let parameters: u64 = models
        .iter()
        .map(|m| (m.weights.len() + m.bias.len()) as u64)
        .sum();
    let limit = crate::pg::guc::max_model_bytes();
    if parameters.saturating_mul(8) > limit {
        raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "the {} groups' models of {what} need {} to send to the shards, more than corgipile.max_model_memory ({})",
                members.len(),
                corgipile_ml::limits::pretty_bytes(parameters.saturating_mul(8)),
                corgipile_ml::limits::pretty_bytes(limit),
            ),
            Some("Evaluate one group's model by its id (corgipile.group_models), or ask a superuser to raise corgipile.max_model_memory (on every server).".into()),
        );
    }
    let family = FamilyModels {
        columns: stored
            .groups
            .as_ref()
            .map_or_else(Vec::new, |g| g.columns.clone()),
        keys: members.iter().map(|(k, _)| k.clone()).collect(),
        models,
    };
    let binary = binary_labels(config.label.uses_classes(), &stored.classes);
    let part = || Evaluation::mergeable(stored.kind(), n_classes, binary);
    let mut whole = part();
    let mut per_group: Vec<Evaluation> = members.iter().map(|_| part()).collect();
    per_group.push(part());
    let rows_skipped = super::evaluate_with(
        prepared,
        leaves,
        stored,
        None,
        Some(family),
        &mut whole,
        &mut per_group,
    );
    let others = per_group.pop().expect("the other rows' evaluation");
    groups_report(stored.id, members, whole, per_group, others, rows_skipped)
}
