//! What a training's new version does to its name's deployment, and the quality gate
//! (`"deploy": "if_better"`).
//!
//! A name means its pinned version, else its newest (`catalog::find_name`): without a gate, a
//! new version silently becomes the deployed one unless a version is pinned, and that change is
//! a `train` row of corgipile.deployments. With the gate, the new version is stored, then it and
//! the version deployed before are scored on exactly the rows the training held out — the tuple
//! ids its decoder kept as validation rows (a fraction, a predicate, the replay sample of
//! `since`), or every row it collected from a validation relation — by corgipile_evaluate's
//! code, with the metric corgipile_deploy(name, 'best') ranks by: accuracy for classifiers, R²
//! for regression. The new version is deployed only if it scores more than `margin` higher;
//! else the old one stays deployed, pinned if it was the newest (the only way to keep a name
//! from meaning its newest version). Either way the verdict is a `gated` row, written in the
//! training's transaction (an ERROR after it rolls back the version, the pin and the row).
//!
//! Decided and why:
//! - Which rows: the tuple ids, not the rule that chose them. A fraction's rows are a hash of
//!   the tuple id, but `since` holds out the rows of the pages it reads — the new ones and the
//!   first epoch's random replay sample of the old ones — which no rule run later can find
//!   again; the ids are exact for every input one backend reads (tables, partitions, simple
//!   views, a spilled query while its temporary table lives).
//! - Both versions are scored by the same evaluation pass (not the new one's stored validation
//!   score against an evaluation of the old one): the same code, the same rows. For a
//!   classifier every held-out row counts: a row the old version cannot score (a class it
//!   never saw, a NULL it skips) is a wrong answer, not a row left out.
//! - A different kind of label (a classifier against a regression: accuracy against R²) or
//!   another label column is an ERROR before any work, as is a deployed version that cannot
//!   read the held-out relation (its evaluation is prepared first; for a query's rows, once
//!   they are spilled, the one thing read before).
//! - The first version of a name (nothing deployed) is deployed, and scored for the record.
//! - When the old version is pinned and the new one wins, the pin moves to it: the gate
//!   changes which version is deployed, not how the name is deployed.
//! - Refused (capability table): `"workers"` (each process may hold a share of the held-out
//!   rows), `"group_by"` and `"folds"` (no held-out rows).
//! - On a sharded table the decision is this one; only where the scores come from differs
//!   (`crate::shard::gate`): every shard kept the ids of the rows it held out, and each version
//!   is scored by an evaluation round of only those rows on every shard, with its own columns
//!   and preprocessing (the rows a shard kept for validation are encoded for the new version
//!   only), merged as corgipile_evaluate merges a sharded table's; a validation relation is
//!   this server's, scored by tuple id as above.
//! - The caller may manage the name: training a version of another owner's name needs
//!   `manage` (before training and again when storing); the gate checks it a third time with
//!   the name's deploy lock held, before it pins anything.

use super::evaluate::evaluate_rows;
use crate::catalog::deployments::{self, Decision, Deployed, How, Scores};
use crate::catalog::grants::{self, ModelName};
use crate::catalog::locks::{wait_for, Purpose};
use crate::catalog::{load_model, StoredModel};
use crate::pg::error::{notice, raise};
use crate::pipeline::Mode;
use crate::request::args::ParamsArg;
use crate::request::prepare;
use crate::shard::gate::HeldOut;
use corgipile_ml::model::ModelKind;
use corgipile_ml::params::{TrainParams, Validation};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use serde_json::json;
use std::rc::Rc;
use std::sync::Arc;

/// The version a name meant when a training was about to store its new one, read with the
/// name's deploy lock held (deploys and drops of the name wait until the training's
/// transaction ends), the caller's right to manage the name checked again.
pub(super) fn before_storing(n: &ModelName) -> Option<Deployed> {
    wait_for(Purpose::Deploy, &n.owner, &n.name);
    if !n.is_own() {
        grants::check_manage_name(
            n,
            &format!("{}.{}", n.owner, n.name),
            "train a new version of",
        );
    }
    deployments::deployed(n)
}

/// A training without a gate stored `stored`: when the name means another version than
/// `before` now (the new one, the newest, nothing pinned), a `train` row says so.
pub(super) fn record_training(n: &ModelName, before: Option<Deployed>, stored: i64) {
    let after = deployments::deployed(n);
    if after.map(|d| d.id) == before.map(|d| d.id) {
        return;
    }
    let reason = match before {
        None => format!(
            "a training stored {}, the first version of the name",
            deployments::describe(after)
        ),
        Some(_) => format!(
            "a training stored {}, the newest version, and no version is pinned",
            deployments::describe(after)
        ),
    };
    deployments::record(&Decision {
        name: n,
        how: How::Train,
        from: before.map(|d| d.id),
        to: after.map(|d| d.id).or(Some(stored)),
        candidate: None,
        scores: Scores::default(),
        reason,
    });
}

/// A gated training's gate, checked before any work.
pub(super) struct Gate {
    margin: f64,
    kind: ModelKind,
    label: String,
    /// The relation the held-out rows are read from: the training's (a fraction, a predicate),
    /// or the validation relation; with the training's "where" and "only". None until known
    /// (a query's rows: the table they are spilled into).
    relid: Option<pg_sys::Oid>,
    filter: Option<String>,
    only: bool,
    /// The version deployed when the gate was checked (checked against the training).
    checked: Option<Deployed>,
}

impl Gate {
    /// The gate of a training of `kind` under `params`, for the name `name`, reading
    /// `relation` (None: a query's rows, spilled later); None without `"deploy"`. The version
    /// deployed now must be comparable with what the training will store (the same kind of
    /// label, the same label column) and read the held-out relation (its evaluation is
    /// prepared, reading nothing): checked before any work.
    pub(super) fn prepare(
        kind: ModelKind,
        params: &TrainParams,
        name: Option<&ModelName>,
        relation: Option<pg_sys::Oid>,
    ) -> Option<Gate> {
        params.deploy?;
        let Some(n) = name else {
            // A warm start's (or since's) model gives its name unless it has none.
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                "\"deploy\": \"if_better\" needs \"name\"",
                Some(
                    "The model this training continues has no name: add e.g. \"name\": \"churn\"."
                        .into(),
                ),
            )
        };
        let relid = match &params.validation {
            Some(Validation::Relation(relation)) => Some(
                crate::request::validation_relation::validation_relid(relation),
            ),
            Some(_) => relation,
            None => raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                "\"deploy\": \"if_better\" needs held-out rows: \"validation\"",
                Some("Add e.g. \"validation\": {\"fraction\": 0.1}.".into()),
            ),
        };
        let mut gate = Gate {
            margin: params.margin.unwrap_or(0.0),
            kind,
            label: params.label.clone(),
            relid,
            filter: params.filter.clone(),
            only: params.only,
            checked: None,
        };
        if let Some(deployed) = deployments::deployed(n) {
            gate.check_deployed(n, deployed);
        }
        Some(gate)
    }

    /// A training of a query's rows: they are held out of `relid`, the table they were
    /// spilled into (the deployed version's evaluation is prepared on it now).
    pub(super) fn held_out_in(&mut self, n: Option<&ModelName>, relid: pg_sys::Oid) {
        if self.relid.is_some() {
            return;
        }
        self.relid = Some(relid);
        if let (Some(n), Some(d)) = (n, self.checked) {
            self.check_deployed(n, d);
        }
    }

    /// Whether the deployed version `d` of `n` compares with this training's, and reads the
    /// held-out relation (ERRORs otherwise).
    fn check_deployed(&mut self, n: &ModelName, d: Deployed) {
        let old = load_model(d.id);
        let (classifier, old_classifier) = (self.kind.is_classifier(), old.kind().is_classifier());
        let what = |c: bool| {
            if c {
                "a classifier, scored by accuracy"
            } else {
                "a regression, scored by R²"
            }
        };
        if classifier != old_classifier {
            raise(
                PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                format!(
                    "\"deploy\": \"if_better\" cannot compare this {} training ({}) with the deployed version {} of \"{}\" (model {}, {}: {})",
                    self.kind.name(),
                    what(classifier),
                    d.version,
                    n.name,
                    d.id,
                    old.kind().name(),
                    what(old_classifier)
                ),
                Some("Gate versions of one kind of label: train under another name, or leave \"deploy\" out and choose with corgipile_deploy.".into()),
            );
        }
        if old.label_column != self.label {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!(
                    "\"deploy\": \"if_better\": the deployed version {} of \"{}\" (model {}) predicts \"{}\", this training \"{}\"",
                    d.version, n.name, d.id, old.label_column, self.label
                ),
                Some("The gate scores versions of one label on the same rows: train the same label, or under another name.".into()),
            );
        }
        // Its evaluation on the held-out relation, prepared (columns resolved, nothing read).
        if let Some(relid) = self.relid {
            let (params, _) = super::evaluate::evaluation_params(
                &old,
                self.evaluation_params(),
                "the deploy gate",
                &[],
            );
            prepare(
                relid,
                old.kind(),
                params,
                Mode::Evaluate,
                old.classes.clone(),
                old.preprocessing.as_ref(),
            );
            // A family evaluates a sharded table, but not yet on the rows a training kept there.
            if old.groups.is_some() && crate::shard::sharded_leaves(relid).is_some() {
                raise(
                    PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                    "the deploy gate cannot score a model per group on a sharded table's held-out rows yet",
                    Some("Train without \"deploy\", compare the versions with corgipile_evaluate, and corgipile_deploy the better.".into()),
                );
            }
        }
        self.checked = Some(d);
    }

    /// The params of either version's evaluation: the training's "where" and "only".
    fn evaluation_params(&self) -> ParamsArg {
        let mut params = json!({"only": self.only});
        if let Some(filter) = &self.filter {
            params["where"] = json!(filter);
        }
        ParamsArg(params)
    }

    /// `model`'s score on the held-out rows (accuracy or R²; None when it has none) and the
    /// rows it was scored on.
    fn score(&self, model: Rc<StoredModel>, rows: &mut HeldOut) -> (Option<f64>, u64) {
        let relid = self
            .relid
            .expect("the held-out relation is known after the training");
        let report = evaluate_rows(model, relid, self.evaluation_params(), Some(rows));
        let number = |key: &str| report.get(key).and_then(|v| v.as_f64());
        let count = |key: &str| report.get(key).and_then(|v| v.as_u64()).unwrap_or(0);
        let (scored, skipped) = (count("rows_scored"), count("rows_skipped"));
        if !self.kind.is_classifier() {
            return (number("r2").filter(|r| r.is_finite()), scored);
        }
        // Every held-out row counts: one a version cannot score is not a right answer.
        let read = scored + skipped;
        let score = number("accuracy")
            .map(|a| a * scored as f64 / read.max(1) as f64)
            .or((read > 0).then_some(0.0));
        (score, read)
    }

    /// The verdict on `stored`, the version the training stored, against `before`, the one
    /// deployed then (read with the deploy lock held): deploys the better, records why.
    pub(super) fn decide(
        mut self,
        n: &ModelName,
        before: Option<Deployed>,
        stored: i64,
        held_out: Option<HeldOut>,
    ) {
        // Another session may have deployed another version while this one trained.
        if let Some(d) = before.filter(|d| Some(d.id) != self.checked.map(|c| c.id)) {
            self.check_deployed(n, d);
        }
        let mut rows = held_out.unwrap_or_else(|| HeldOut::Rows(Arc::default()));
        let new = load_model(stored);
        let version = deployments::version_of(n, stored).unwrap_or_default();
        let metric = if self.kind.is_classifier() {
            "accuracy"
        } else {
            "r2"
        };
        let (new_score, read) = self.score(new, &mut rows);
        let show = |s: Option<f64>| s.map_or("none".to_string(), |s| format!("{s:.6}"));
        let Some(old) = before else {
            let reason = format!(
                "version {version} (model {stored}) is the first version of the name: deployed ({metric} {} on {read} held-out rows)",
                show(new_score)
            );
            notice(format!("corgipile: \"deploy\": \"if_better\": {reason}"));
            deployments::record(&Decision {
                name: n,
                how: How::Gated,
                from: None,
                to: Some(stored),
                candidate: Some(stored),
                scores: Scores {
                    metric: Some(metric),
                    new: new_score,
                    old: None,
                    margin: Some(self.margin),
                    rows: Some(read as i64),
                },
                reason,
            });
            return;
        };
        let (old_score, _) = self.score(load_model(old.id), &mut rows);
        let wins = match (new_score, old_score) {
            (Some(new), Some(old)) => new > old + self.margin,
            // The deployed version could not be scored at all (R² of no row).
            (Some(_), None) => true,
            (None, _) => false,
        };
        let scores = format!(
            "version {version} (model {stored}) scored {metric} {} on {read} held-out rows, the deployed {} {}",
            show(new_score),
            deployments::describe(Some(old)),
            show(old_score)
        );
        let (to, reason) = if wins {
            // The newest version is deployed unless one is pinned: the pin moves to it.
            if old.pinned {
                deployments::pin(n, Some(stored));
            }
            (
                stored,
                format!(
                    "{scores}: higher by more than the margin {}; version {version} is deployed",
                    self.margin
                ),
            )
        } else {
            // Keep the old one: pinned, or the name would mean the new one (the newest).
            if !old.pinned {
                deployments::pin(n, Some(old.id));
            }
            (
                old.id,
                format!(
                    "{scores}: not higher by more than the margin {}; version {} stays deployed (pinned)",
                    self.margin, old.version
                ),
            )
        };
        notice(format!("corgipile: \"deploy\": \"if_better\": {reason}"));
        deployments::record(&Decision {
            name: n,
            how: How::Gated,
            from: Some(old.id),
            to: Some(to),
            candidate: Some(stored),
            scores: Scores {
                metric: Some(metric),
                new: new_score,
                old: old_score,
                margin: Some(self.margin),
                rows: Some(read as i64),
            },
            reason,
        });
    }
}
