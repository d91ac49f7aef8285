//! Evaluate mode (corgipile_evaluate): score a stored model on every row of a relation — the
//! whole report here, or a shard's mergeable part of it (see `crate::shard`).

use super::{SgdNode, SgdTask};
use crate::catalog::StoredModel;
use crate::pg::error::raise;
use crate::pipeline::Mode;
use crate::pipeline::{ClassValue, HeldOutRows};
use corgipile_ml::metrics::{BinaryMetrics, AUC_BINS};
use corgipile_ml::model::ModelKind;
use corgipile_ml::model::Predictor;
use corgipile_ml::scoring::{
    BinaryLabels, Evaluation, EvaluationPart, EvaluationTables, TableSpec,
};
use corgipile_ml::trained::Model;
use pgrx::{check_for_interrupts, PgSqlErrorCode};
use serde_json::json;
use std::rc::Rc;
use std::sync::Arc;

/// Score `model`; the output is corgipile_evaluate's JSON report.
pub struct Evaluate {
    pub model: Rc<StoredModel>,
    /// A family of per-group models: each group's key and model, in the order of their
    /// numbers (empty for any other model).
    pub members: Vec<(String, Rc<StoredModel>)>,
    /// Score these rows only (a deploy gate: the rows a training held out); None: every row.
    pub only_rows: Option<Arc<HeldOutRows>>,
}

impl SgdTask for Evaluate {
    type Output = serde_json::Value;
    const MODE: Mode = Mode::Evaluate;

    unsafe fn run(self, node: &mut SgdNode) -> serde_json::Value {
        if let Some(rows) = self.only_rows {
            node.shuffle().rows_mut().score_only(rows);
        }
        if self.model.groups.is_some() {
            return node.evaluate_groups(&self.model, &self.members);
        }
        node.evaluate(&self.model)
    }
}

/// A shard's evaluation: the output is its mergeable metrics (and tables, when asked for) and
/// the rows the reader skipped.
pub struct EvaluateShard {
    pub model: Model,
    pub classes: Vec<ClassValue>,
    pub tables: Option<TableSpec>,
    /// Score these rows only (a deploy gate: the rows a training held out here).
    pub only_rows: Option<Arc<HeldOutRows>>,
}

impl SgdTask for EvaluateShard {
    type Output = (EvaluationPart, u64);
    const MODE: Mode = Mode::Evaluate;

    unsafe fn run(self, node: &mut SgdNode) -> (EvaluationPart, u64) {
        if let Some(rows) = self.only_rows {
            node.shuffle().rows_mut().score_only(rows);
        }
        let mut evaluation = mergeable_evaluation(
            self.model.kind(),
            &self.classes,
            node.config.label.uses_classes(),
            self.tables,
            "the coordinator's model",
        );
        let skipped = node.score_rows(&self.model, "the coordinator's model", &mut evaluation);
        (evaluation.part(), skipped)
    }
}

/// A shard's evaluation of a family of per-group models (`members`: each group's model, in
/// the order of the groups' numbers; `model`: the family's, for the rows of other groups): the
/// output is the mergeable parts of every row, of each group's rows and of the other rows (as
/// [`groups_report`] takes them merged), and the rows the reader skipped.
pub struct EvaluateGroupsShard {
    pub model: Model,
    pub members: Vec<Model>,
    pub classes: Vec<ClassValue>,
}

impl SgdTask for EvaluateGroupsShard {
    type Output = (EvaluationPart, Vec<EvaluationPart>, u64);
    const MODE: Mode = Mode::Evaluate;

    unsafe fn run(self, node: &mut SgdNode) -> (EvaluationPart, Vec<EvaluationPart>, u64) {
        let what = "the coordinator's model";
        check_group_counts(
            self.model.kind(),
            self.classes.len(),
            self.members.len(),
            true,
            what,
        );
        let uses_classes = node.config.label.uses_classes();
        let part =
            || mergeable_evaluation(self.model.kind(), &self.classes, uses_classes, None, what);
        let mut whole = part();
        let mut per_group: Vec<Evaluation> = self.members.iter().map(|_| part()).collect();
        let mut others = part();
        let members: Vec<&Model> = self.members.iter().collect();
        let skipped = node.score_groups(
            &self.model,
            &members,
            &mut whole,
            &mut per_group,
            &mut others,
        );
        per_group.push(others);
        (
            whole.part(),
            per_group.iter().map(Evaluation::part).collect(),
            skipped,
        )
    }
}

/// ERROR 54000 before anything is read when the evaluations of a family of `groups` groups'
/// models (one per group, one of the other rows, one of every row) would take more than
/// corgipile.max_model_memory: a classifier's per-class counts (3 numbers a class), and when
/// `mergeable` (a sharded table's) a binary kind's ROC histogram. `what` names the model.
pub fn check_group_counts(
    kind: ModelKind,
    n_classes: usize,
    groups: usize,
    mergeable: bool,
    what: &str,
) {
    let histogram = if mergeable && kind.is_binary() {
        (2 * AUC_BINS * 8) as u64
    } else {
        0
    };
    let each = histogram + 24 * n_classes.max(1) as u64;
    let bytes = (groups as u64).saturating_add(2).saturating_mul(each);
    if bytes > crate::pg::guc::max_model_bytes() {
        raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "the per-group report of {what} needs {} for its {groups} groups' counts, more than corgipile.max_model_memory",
                corgipile_ml::limits::pretty_bytes(bytes),
            ),
            Some("Evaluate one group's model by its id (corgipile.group_models), or ask a superuser to raise corgipile.max_model_memory.".into()),
        );
    }
}

/// corgipile_evaluate's report of a family of per-group models (`family_id`; `members`: each
/// group's key and model id, in the order of their numbers): the whole report, each group's
/// (`"groups"`, by key) and the other rows' (`"other_rows"`).
pub fn groups_report(
    family_id: i64,
    members: &[(String, i64)],
    whole: Evaluation,
    per_group: Vec<Evaluation>,
    others: Evaluation,
    skipped: u64,
) -> serde_json::Value {
    let mut report = whole.finish(skipped);
    report["model_id"] = json!(family_id);
    let part_report = |e: Evaluation, id: i64| {
        let mut r = e.finish(0);
        r["model_id"] = json!(id);
        r
    };
    let mut groups = serde_json::Map::new();
    for ((key, id), e) in members.iter().zip(per_group) {
        groups.insert(key.clone(), part_report(e, *id));
    }
    report["groups"] = serde_json::Value::Object(groups);
    report["other_rows"] = part_report(others, family_id);
    report
}

/// corgipile_confusion_matrix, corgipile_roc_curve, corgipile_calibration: the stored model
/// scored on every row with its tables filled; the output is the evaluation and the rows the
/// reader skipped.
pub struct EvaluateTables {
    pub model: Rc<StoredModel>,
    pub spec: TableSpec,
}

impl SgdTask for EvaluateTables {
    type Output = (Evaluation, u64);
    const MODE: Mode = Mode::Evaluate;

    unsafe fn run(self, node: &mut SgdNode) -> (Evaluation, u64) {
        let what = format!("model {}", self.model.id);
        let mut evaluation = mergeable_evaluation(
            self.model.kind(),
            &self.model.classes,
            node.config.label.uses_classes(),
            Some(self.spec),
            &what,
        );
        let skipped = node.score_rows(&self.model.model, &what, &mut evaluation);
        (evaluation, skipped)
    }
}

/// An evaluation whose parts merge (ROC AUC from a histogram), with `tables` if asked for:
/// an ERROR, before anything is read, when they would take more than
/// corgipile.max_buffer_memory (`what` names the model).
pub fn mergeable_evaluation(
    kind: ModelKind,
    classes: &[ClassValue],
    uses_classes: bool,
    tables: Option<TableSpec>,
    what: &str,
) -> Evaluation {
    let evaluation =
        Evaluation::mergeable(kind, classes.len(), binary_labels(uses_classes, classes));
    let Some(spec) = tables else {
        return evaluation;
    };
    let bytes = EvaluationTables::bytes_needed(kind, classes.len(), spec);
    if bytes > crate::pg::guc::max_buffer_bytes() {
        raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "the evaluation tables of {what} ({} classes) need {}, more than corgipile.max_buffer_memory ({})",
                classes.len(),
                corgipile_ml::limits::pretty_bytes(bytes),
                corgipile_ml::limits::pretty_bytes(crate::pg::guc::max_buffer_bytes()),
            ),
            Some("A table of k classes holds a k x k confusion matrix and k ROC curves of 256 kB each: ask a superuser to raise corgipile.max_buffer_memory.".into()),
        );
    }
    evaluation.with_tables(spec)
}

/// How a model's binary labels arrive: as class indices (text labels, pre-seeded with the
/// model's classes, so index 1 is the positive class) or as the values of `classes`.
pub fn binary_labels(uses_classes: bool, classes: &[ClassValue]) -> BinaryLabels {
    if uses_classes {
        return BinaryLabels::ClassIndices;
    }
    let value = |k: usize| classes.get(k).and_then(|c| c.as_f64()).unwrap_or(f64::NAN);
    BinaryLabels::Values {
        negative: value(0),
        positive: value(1),
    }
}

impl SgdNode {
    /// corgipile_evaluate: score the stored model on every row.
    unsafe fn evaluate(&mut self, model: &StoredModel) -> serde_json::Value {
        // ROC AUC keeps one score per row: bounded by the same limit as the training buffers.
        let auc_rows = self.config.max_buffer_bytes as usize / BinaryMetrics::AUC_BYTES_PER_ROW;
        let mut evaluation = Evaluation::new(
            model.kind(),
            model.classes.len(),
            binary_labels(self.config.label.uses_classes(), &model.classes),
            auc_rows,
        );
        let skipped = self.score_rows(
            &model.model,
            &format!("model {}", model.id),
            &mut evaluation,
        );
        let mut report = evaluation.finish(skipped);
        report["model_id"] = json!(model.id);
        report
    }

    /// corgipile_evaluate of a family of per-group models: every row scored by its group's
    /// model, or by the model of every row (`model`) for a group without one; the whole
    /// report, and each group's (`"groups"`, by key) and the other rows' (`"other_rows"`).
    unsafe fn evaluate_groups(
        &mut self,
        model: &StoredModel,
        members: &[(String, Rc<StoredModel>)],
    ) -> serde_json::Value {
        let auc_rows = self.config.max_buffer_bytes as usize / BinaryMetrics::AUC_BYTES_PER_ROW;
        let binary = || binary_labels(self.config.label.uses_classes(), &model.classes);
        let n_classes = model.classes.len();
        let what = format!("model {}", model.id);
        check_group_counts(model.kind(), n_classes, members.len(), false, &what);
        let mut whole = Evaluation::new(model.kind(), n_classes, binary(), auc_rows);
        // Per group: a share of the scores kept for ROC AUC (a group with more rows has none,
        // and a note saying so).
        let share = auc_rows / (members.len() + 1);
        let part = || Evaluation::new(model.kind(), n_classes, binary(), share);
        let mut per_group: Vec<Evaluation> = members.iter().map(|_| part()).collect();
        let mut others = part();
        let models: Vec<&Model> = members.iter().map(|(_, m)| &m.model).collect();
        let skipped = self.score_groups(
            &model.model,
            &models,
            &mut whole,
            &mut per_group,
            &mut others,
        );
        let members: Vec<(String, i64)> = members.iter().map(|(k, m)| (k.clone(), m.id)).collect();
        groups_report(model.id, &members, whole, per_group, others, skipped)
    }

    /// Pushes every row into `whole` and its group's evaluation (`per_group`, by the group's
    /// number; `others` for a row of no group of `members`), scored by its group's model
    /// (`family` for the others); returns the rows the reader skipped.
    unsafe fn score_groups(
        &mut self,
        family: &Model,
        members: &[&Model],
        whole: &mut Evaluation,
        per_group: &mut [Evaluation],
        others: &mut Evaluation,
    ) -> u64 {
        let shuffle = self.shuffle();
        shuffle.for_each_buffer(|b| {
            for i in 0..b.arena.len() {
                check_for_interrupts!();
                let (row, label) = (b.arena.row(i), b.arena.label(i));
                let g = b.arena.group(i) as usize;
                match (members.get(g), per_group.get_mut(g)) {
                    (Some(m), Some(e)) => {
                        whole.push(*m, row, label);
                        e.push(*m, row, label);
                    }
                    _ => {
                        whole.push(family, row, label);
                        others.push(family, row, label);
                    }
                }
            }
        });
        shuffle.counts().rows_skipped
    }

    /// Pushes every row into `evaluation`; returns the rows the reader skipped. `what` names
    /// the model in errors.
    unsafe fn score_rows(
        &mut self,
        model: &impl Predictor,
        what: &str,
        evaluation: &mut Evaluation,
    ) -> u64 {
        let shuffle = self.shuffle();
        shuffle.for_each_buffer(|b| {
            if !b.arena.is_sparse() && b.arena.n_features() != model.n_features() {
                raise(
                    PgSqlErrorCode::ERRCODE_ARRAY_ELEMENT_ERROR,
                    format!("the rows of {} have {} features, {what} expects {}", self.config.relation, b.arena.n_features(), model.n_features()),
                    Some("Evaluate on rows with the features the model was trained on (see the features param).".into()),
                );
            }
            for i in 0..b.arena.len() {
                check_for_interrupts!();
                evaluation.push(model, b.arena.row(i), b.arena.label(i));
            }
        });
        shuffle.counts().rows_skipped
    }
}
