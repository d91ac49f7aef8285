//! `"inference": true`: after the epochs, Newton passes over the table polish the SGD model
//! to the maximum-likelihood estimate, and its information matrix gives each coefficient's
//! standard error, test statistic, p-value and interval (the math is
//! `corgipile_ml::inference`). Each pass reads every training row once, on the backend.
//! With an intercept, the first pass's counts choose the reference level each categorical
//! column drops from the design. On a sharded table, a shard server's round sums its rows'
//! part of one pass (`shard_newton_pass`), and the coordinator runs the passes through the
//! same functions (`polish`, `store`: see `shard::training::inference`).

use super::SgdNode;
use crate::exec::tuple_shuffle::{ShuffledBuffer, TupleShuffle};
use crate::pg::error::{raise, refuse_combination};
use crate::pipeline::protocol::{RoundReply, RoundRequest};
use crate::pipeline::{FeatureLayout, TrainOutcome, Trial};
use corgipile_ml::capabilities::{used, Use};
use corgipile_ml::inference::MAX_PASSES;
use corgipile_ml::inference::{newton_passes, Inference, InferenceError, Information};
use corgipile_ml::limits::pretty_pair;
use corgipile_ml::model::Likelihood;
use corgipile_ml::model::{LinearModel, ModelKind, Predictor};
use corgipile_ml::params::{ShuffleMode, TrainParams};
use corgipile_ml::preprocess::{Encoding, Preprocessor};
use corgipile_ml::trained::Model;
use pgrx::{check_for_interrupts, pg_sys, PgSqlErrorCode};
use std::time::Instant;

/// What `"inference"` does not do (the capability table): an ERROR before any work. (The kind, `l1` and
/// `class_weight` are checked with the params; workers and shards by `check_distributed`.)
pub fn check_inference_params(params: &TrainParams, layout: FeatureLayout) {
    if !params.inference {
        return;
    }
    let uses = used(&[
        (Use::Search, params.search.is_some()),
        (Use::GroupBy, params.group_by.is_some()),
        (Use::Folds, params.folds.is_some()),
        (Use::Since, params.since.is_some()),
        (Use::Validation, params.validation.is_some()),
        (
            Use::SparseFeatures,
            matches!(layout, FeatureLayout::Sparse { .. }),
        ),
        (
            Use::StreamingShuffle,
            matches!(
                params.shuffle,
                ShuffleMode::SlidingWindow | ShuffleMode::Mrs
            ),
        ),
    ]);
    refuse_combination(Use::Inference, &uses);
}

/// Multiply-adds between interrupt checks in a pass (a row costs about p²/2 of them).
const WORK_BETWEEN_CHECKS: usize = 1 << 20;

impl SgdNode {
    /// Before the epochs: the information matrix ((p+1)² values) must fit
    /// corgipile.max_model_memory.
    pub(super) fn check_inference_size(&self, n_features: usize) {
        let params = &self.config.params;
        if params.inference {
            check_information_size(
                n_features,
                params.fit_intercept,
                self.config.max_model_bytes,
            );
        }
    }

    /// Polishes the stored model of `trials` (one: "inference" trains no search) and adds its
    /// tests. Reads the table once per Newton pass.
    ///
    /// Called inside the executor of the training's plan, after the epochs.
    pub(super) fn infer(&mut self, trials: &mut [Trial]) {
        if !self.config.params.inference {
            return;
        }
        let Some(Ok(outcome)) = trials.first_mut().map(|t| t.outcome.as_mut()) else {
            return; // the training failed: its ERROR or report says why
        };
        let started = Instant::now();
        let (family, labels) = family_of(self.config.model, self.binary_labels);
        let mut info = start_information(outcome, family, self.config.params.fit_intercept);
        // A column list's encoding: its categorical columns, the names of its features.
        // SAFETY: the child's TupleShuffle state lives as long as this node (see `shuffle`); no
        // other reference to it is in use here.
        let preprocessor = unsafe { self.shuffle() }.rows().preprocessor().cloned();
        let relation = self.config.relation.clone();
        let first = self.first_epoch;
        let params = self.config.params.clone();
        let polished = polish(
            &mut info,
            &params,
            preprocessor.as_ref(),
            &relation,
            &mut |info, pass| {
                // SAFETY: a private method of this node that needs only what every method of a
                // live SgdNode has (its child initialized, inside the executor run).
                unsafe { self.information_pass(info, family, labels) };
                // SAFETY: the child's TupleShuffle state lives as long as this node (see
                // `shuffle`); no other reference to it is in use here.
                let read = unsafe { self.shuffle() }.counts();
                match &first {
                    Some(first) if !read.same_rows(first) => self.rows_changed(
                        &format!("Newton pass {pass} of \"inference\""),
                        &read,
                        first,
                    ),
                    _ => {}
                }
            },
        );
        store(outcome, &info, polished, &params, started);
    }

    /// One pass over the training rows into `info`: the child rescanned (a new block order,
    /// the same rows: one snapshot), every buffer's rows pushed.
    ///
    /// # Safety
    /// As [`infer`](Self::infer): the child plan is initialized and this is the backend.
    unsafe fn information_pass(
        &mut self,
        info: &mut Information,
        family: Likelihood,
        labels: (f64, f64),
    ) {
        // SAFETY: the child is this node's initialized TupleShuffle (see `# Safety`); a rescan
        // between passes is what the epochs do.
        pg_sys::ExecReScan(self.child);
        // SAFETY: as above.
        push_rows(self.shuffle(), info, family, labels, &mut |_| {});
    }

    /// A shard's part of a sharded training's Newton pass (`Phase::Inference`): every row of
    /// its table, by block, pushed at the coordinator's coefficients, decoded as the training
    /// rounds decode them (the coordinator's classes, preprocessing and label values), and
    /// what the pass summed.
    ///
    /// # Safety
    /// As [`SgdNode::shuffle`]: called while this node's plan runs, on the backend.
    pub(super) unsafe fn shard_newton_pass(&mut self, request: &RoundRequest) -> RoundReply {
        let ask = request
            .inference
            .as_ref()
            .expect("checked with the request");
        let (family, labels) = family_of(self.config.model, request.extras.label_values);
        let intercept = ask.bias.is_some();
        let bias = ask.bias.unwrap_or(0.0);
        let mut info = new_information(family, &ask.weights, bias, intercept);
        info.start_pass();
        let dense = matches!(self.config.layout, FeatureLayout::Dense { .. });
        let relation = self.config.relation.clone();
        let shuffle = self.shuffle();
        push_rows(shuffle, &mut info, family, labels, &mut |b| {
            if dense && b.arena.n_features() != request.n_features {
                raise_other_width(&relation, b.arena.n_features(), request.n_features);
            }
        });
        RoundReply {
            rows: shuffle.counts().rows,
            rows_skipped: shuffle.counts().rows_skipped,
            information: Some(info.part()),
            ..RoundReply::default()
        }
    }
}

/// Rows of a shard's table of another width than the other shards'.
pub(super) fn raise_other_width(relation: &str, width: usize, others: usize) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_ARRAY_ELEMENT_ERROR,
        format!("rows of {relation} have {width} features, other shards' {others}"),
        Some("Every row's feature array must have the same length.".into()),
    )
}

/// Every row `shuffle` reads (a pass of its epoch) pushed into `info`: the label as the
/// trainer saw it (`labels`: a binary kind's negative and positive values, mapped to 0 and 1);
/// `each` sees every buffer first. On the backend's thread (the buffers are read here).
fn push_rows(
    shuffle: &mut TupleShuffle,
    info: &mut Information,
    family: Likelihood,
    (negative, positive): (f64, f64),
    each: &mut dyn FnMut(&ShuffledBuffer),
) {
    // Every 1,024 rows of a few features, every row of a few thousand: cancel is answered
    // within about a millisecond whatever one row costs.
    let p = info.coefficients().0.len() + 1;
    let rows_between_checks = (WORK_BETWEEN_CHECKS / (p * p / 2).max(1)).clamp(1, 1024);
    shuffle.for_each_buffer(|b| {
        each(b);
        for i in 0..b.arena.len() {
            if i % rows_between_checks == 0 {
                check_for_interrupts!();
            }
            let raw = b.arena.label(i);
            let y = match family {
                Likelihood::Linear => raw,
                // The labels the trainer mapped to ±1; no third one reached the epochs.
                Likelihood::Logistic if raw == positive => 1.0,
                Likelihood::Logistic if raw == negative => 0.0,
                Likelihood::Logistic => continue,
            };
            info.push(b.arena.row(i), y);
        }
    });
}

/// A reported bug (the kind and labels are checked before): an ERROR rather than a panic.
fn bug(what: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("corgipile: \"inference\" found {what}"),
        Some("This is a bug, please report it.".into()),
    )
}

/// The likelihood of `kind`'s model and the labels its rows' values map from
/// (`binary_labels`: a logistic model's, after the epochs).
pub(crate) fn family_of(
    kind: ModelKind,
    binary_labels: Option<(f64, f64)>,
) -> (Likelihood, (f64, f64)) {
    match (kind.head().likelihood, binary_labels) {
        (Some(Likelihood::Logistic), Some(labels)) => (Likelihood::Logistic, labels),
        (Some(Likelihood::Logistic), None) => bug("no label mapping after the epochs"),
        _ => (Likelihood::Linear, (0.0, 0.0)),
    }
}

/// The passes' start: the trained model's coefficients.
pub(crate) fn start_information(
    outcome: &TrainOutcome,
    family: Likelihood,
    intercept: bool,
) -> Information {
    let Some(linear) = outcome.model.as_linear() else {
        bug("a model that is not linear")
    };
    new_information(family, &linear.weights, linear.bias[0], intercept)
}

/// An [`Information`] at these coefficients (its size was checked before the epochs:
/// `check_information_size`); ERROR when the allocation fails.
pub(crate) fn new_information(
    family: Likelihood,
    weights: &[f64],
    bias: f64,
    intercept: bool,
) -> Information {
    Information::try_new(family, weights, bias, intercept).unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
            "out of memory for the information matrix of \"inference\"",
            None,
        )
    })
}

/// ERROR 54000 unless the information matrix of `n_features` (and the intercept) fits `limit`
/// (corgipile.max_model_memory).
pub(crate) fn check_information_size(n_features: usize, intercept: bool, limit: u64) {
    let bytes = Information::bytes(n_features, intercept);
    if bytes > limit {
        let (needed, limit) = pretty_pair(bytes, limit);
        let p = n_features + intercept as usize;
        raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("\"inference\" on {n_features} features needs {needed} for its {p} x {p} information matrix, more than corgipile.max_model_memory ({limit})"),
            Some(SIZE_HINT.into()),
        );
    }
}

/// What to do about a model too large for its information matrix.
pub(crate) const SIZE_HINT: &str = "Standard errors are for models of at most a few thousand features: use fewer features (fewer one-hot categories, \"max_categories\"), or ask a superuser to raise corgipile.max_model_memory.";

/// The Newton passes (`pass` fills each: see `corgipile_ml::inference::newton_passes`) from
/// `info` to the optimum, for `params` (its `l2`) and a column list's `preprocessor` (its
/// reference levels, its features' names); ERROR (naming `relation`) when there is none.
pub(crate) fn polish(
    info: &mut Information,
    params: &TrainParams,
    preprocessor: Option<&Preprocessor>,
    relation: &str,
    pass: &mut dyn FnMut(&mut Information, u32),
) -> (Inference, u32) {
    let n_features = info.coefficients().0.len();
    let groups = preprocessor.map_or_else(Vec::new, |p| p.one_hot_groups());
    let name = |j: usize| preprocessor.map_or_else(String::new, |p| p.feature_name(j));
    newton_passes(
        info,
        params.l2,
        (&groups, &name),
        pass,
        &mut interrupt_check,
    )
    .unwrap_or_else(|e| inference_failed(e, relation, n_features, preprocessor))
}

/// A model without standard errors (one server's, or a sharded training's): why, and what to
/// do. `relation`: the training's; `preprocessor`: a column list's (names the feature, tells a
/// hashed column).
pub(crate) fn inference_failed(
    e: InferenceError,
    relation: &str,
    n_features: usize,
    preprocessor: Option<&Preprocessor>,
) -> ! {
    let feature = |column: usize| match (column, preprocessor) {
        (c, _) if c >= n_features => "the intercept".to_string(),
        (c, Some(p)) => format!(
            "feature {} ({}, in corgipile_model_coefficients order)",
            c + 1,
            p.feature_name(c)
        ),
        (c, None) => format!("feature {} (in corgipile_model_coefficients order)", c + 1),
    };
    // A hashed column's buckets add up to the intercept as categories do, but no bucket is
    // a level to drop.
    let hashed = |column: usize| {
        preprocessor
            .filter(|_| column < n_features)
            .map(|p| p.column_of(column))
            .filter(|c| matches!(c.encoding, Encoding::Hash { .. }))
            .map(|c| c.name.clone())
    };
    let (message, hint) = match e {
            InferenceError::Singular { column } => (
                format!("\"inference\": the information matrix of {} is singular at {}", relation, feature(column)),
                match hashed(column) {
                    Some(name) => format!("Column \"{name}\" is hashed into buckets: with an intercept, its buckets add up to it (and an empty bucket is a constant 0), and no bucket is a reference level to drop. Encode it one-hot (\"preprocess\": {{\"{name}\": {{\"encode\": \"one_hot\"}}}}; \"inference\" then drops a reference category), set \"fit_intercept\": false, or add a little \"l2\"."),
                    None => "A feature is constant (e.g. a category, day or month no training row has), or a combination of others (collinear columns; a hashed column's buckets with an intercept), or the classes are separated: drop the redundant features, or add a little \"l2\". (A one-hot column's reference category is dropped already.)".to_string(),
                },
            ),
            InferenceError::NotConverged { step } => (
                format!("\"inference\": the Newton passes over {} did not converge in {MAX_PASSES} passes (last relative step {step:.3e})", relation),
                "The maximum-likelihood estimate may not exist: the classes may be (nearly) separable by the features (a category whose rows all have one class, such as a category seen once, separates them). Add a little \"l2\", drop the separating features, or pool rare categories (\"max_categories\").".to_string(),
            ),
            InferenceError::TooFewRows { rows, coefficients } => (
                format!("\"inference\": {rows} rows cannot test {coefficients} coefficients"),
                "A t test needs more rows than coefficients (intercept included).".to_string(),
            ),
            InferenceError::NonFinite => (
                format!("\"inference\": the Newton passes over {} overflowed", relation),
                "A feature may hold huge values, or the classes may be separable: scale the features, or add a little \"l2\".".to_string(),
            ),
        };
    raise(PgSqlErrorCode::ERRCODE_DATA_EXCEPTION, message, Some(hint))
}

/// The backend's interrupt check, between columns of the factorisation.
fn interrupt_check() {
    check_for_interrupts!();
}

/// The polished model (`info`'s coefficients) in `outcome`, its training time with the
/// passes', and its tests as `metrics->'inference'` holds them (arrays: the weights in feature
/// order, then the intercept when fitted; null for a reference level; `reference`: each
/// categorical column's reference level, when one was dropped).
pub(crate) fn store(
    outcome: &mut TrainOutcome,
    info: &Information,
    (tests, passes): (Inference, u32),
    params: &TrainParams,
    started: Instant,
) {
    let (weights, bias) = info.coefficients();
    outcome.model = Model::new(LinearModel::single(
        outcome.model.kind(),
        weights.to_vec(),
        bias,
    ));
    let seconds = started.elapsed().as_secs_f64();
    // The model's training time includes its passes.
    outcome.seconds += seconds;
    let l2 = params.l2;
    let mut value = serde_json::to_value(&tests).expect("inference serializes");
    value["newton_passes"] = passes.into();
    value["seconds"] = seconds.into();
    value["penalty"] = if l2 > 0.0 {
        format!("l2 {l2}: n·l2/2·‖w‖² on the weights in the table's units, its Hessian in the covariance").into()
    } else {
        serde_json::Value::Null
    };
    outcome.inference = Some(value);
}
