//! The parts of the shard protocol (`protocol`) that corgipile_feature_importance, the
//! evaluation of a per-group family and `"inference"` add: what they ask of a shard, what a
//! shard answers, and the checks a coordinator makes of the answers (see `shard::importance`,
//! `shard::groups`, `shard::training::inference`; a Newton pass's answer is
//! `corgipile_ml::inference::InformationPart`).

use corgipile_ml::importance::{Metric, ScorePart, MAX_REPEATS, MAX_ROWS};
use corgipile_ml::inference::InformationPart;
use corgipile_ml::model::ModelKind;
use corgipile_ml::scoring::EvaluationPart;
use corgipile_ml::trained::ModelParts;
use corgipile_ml::Welford;
use serde::{Deserialize, Serialize};

/// What an importance round asks of a shard: with `count`, its number of rows (`reply.rows`);
/// otherwise a sample of `rows` rows, scored with each column permuted `repeats` times
/// (permutations and block order seeded by `seed`).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct ImportanceAsk {
    pub count: bool,
    pub rows: u64,
    pub repeats: u32,
    pub seed: u64,
}

impl ImportanceAsk {
    /// Why this (whoever wrote it) cannot be run: counts out of bounds.
    pub fn check(&self) -> Result<(), String> {
        if self.rows > MAX_ROWS || !(1..=MAX_REPEATS).contains(&(self.repeats as u64)) {
            return Err(format!(
                "an importance of {} rows and {} repeats",
                self.rows, self.repeats
            ));
        }
        Ok(())
    }
}

/// What a Newton pass round asks of a shard: the coefficients the pass is at (the weights in
/// feature order; the intercept, None when it is not fitted).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct InferenceAsk {
    pub weights: Vec<f64>,
    pub bias: Option<f64>,
}

impl InferenceAsk {
    /// Why these coefficients (whoever wrote them) are not a model of `n_features`: another
    /// number of weights, values that are not finite.
    pub fn check(&self, n_features: usize) -> Result<(), String> {
        if n_features == 0 || self.weights.len() != n_features {
            return Err(format!(
                "a Newton pass at {} weights for a model of {n_features} features",
                self.weights.len()
            ));
        }
        if !self.weights.iter().chain(&self.bias).all(|v| v.is_finite()) {
            return Err("a Newton pass at coefficients that are not finite".into());
        }
        Ok(())
    }

    /// Why a reply's `part` (of a reply of `rows`) does not answer this Newton pass of
    /// `n_features`: none, another shape, values that are not finite, other rows.
    pub fn check_part(
        &self,
        n_features: usize,
        part: Option<&InformationPart>,
        rows: u64,
    ) -> Result<(), String> {
        let Some(part) = part else {
            return Err("no information part".into());
        };
        part.check(n_features, self.bias.is_some())?;
        if part.rows != rows {
            return Err(format!(
                "an information part of {} rows in a reply of {rows}",
                part.rows
            ));
        }
        Ok(())
    }
}

/// A shard's scores of its sample (see `sql::importance::score_sample`): as it is, with each
/// column permuted (column by column, `repeats` each), and each column's first feature's
/// moments.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ImportancePart {
    pub baseline: ScorePart,
    pub permuted: Vec<ScorePart>,
    pub moments: Vec<Welford>,
}

impl ImportancePart {
    /// Why this part (from a shard server that sampled `rows` rows) does not answer `ask` for
    /// `columns` columns scored by `metric`: parts of another number of columns or repeats,
    /// more rows than asked for, counts that do not add up, values that are not finite.
    pub fn check(
        &self,
        ask: &ImportanceAsk,
        columns: usize,
        rows: u64,
        metric: Metric,
    ) -> Result<(), String> {
        if ask.count
            || rows > ask.rows
            || self.baseline.rows > rows
            || Some(self.permuted.len()) != columns.checked_mul(ask.repeats as usize)
            || self.moments.len() != columns
        {
            return Err(format!(
                "importance scores of {rows} rows, {} permutations and {} columns, where {} rows of {columns} columns × {} repeats were asked for",
                self.permuted.len(),
                self.moments.len(),
                ask.rows,
                ask.repeats
            ));
        }
        self.baseline.check(metric)?;
        for p in &self.permuted {
            p.check(metric)?;
            if p.rows != self.baseline.rows {
                return Err("permuted scores of other rows than the sample's".into());
            }
        }
        let moments_ok = |m: &Welford| {
            m.n() == rows && m.mean().is_finite() && m.m2().is_finite() && m.m2() >= 0.0
        };
        if !self.moments.iter().all(moments_ok) {
            return Err("moments of the columns that are not of the sample".into());
        }
        Ok(())
    }
}

/// The models of a family's groups, as an evaluation request carries them.
#[derive(Clone, Serialize, Deserialize)]
pub struct FamilyModels {
    /// The group columns (the shard reads them as the family's `"group_by"`; the params sent
    /// are an evaluation's, which name no groups).
    pub columns: Vec<String>,
    /// Each group's key, as the shard's reader reads the group columns; in the order of the
    /// groups' numbers (`models[i]` is group `keys[i]`'s).
    pub keys: Vec<String>,
    /// Shapes checked when each is built (`ModelParts::into_model`).
    pub models: Vec<ModelParts>,
}

impl FamilyModels {
    /// Why these (whoever wrote them) are not the groups of the family whose own model is
    /// `family`: a key without a model or twice, a model of another kind or shape.
    pub fn check(&self, family: &ModelParts) -> Result<(), String> {
        if self.columns.is_empty() || self.keys.len() != self.models.len() {
            return Err(format!(
                "{} group keys for {} group models",
                self.keys.len(),
                self.models.len()
            ));
        }
        let mut keys: Vec<&String> = self.keys.iter().collect();
        keys.sort();
        if keys.windows(2).any(|w| w[0] == w[1]) {
            return Err("a group key listed twice".into());
        }
        let same = |m: &ModelParts| {
            m.kind() == family.kind()
                && m.n_features() == family.n_features()
                && m.n_outputs() == family.n_outputs()
        };
        if !self.models.iter().all(same) {
            return Err("a group's model of another shape than the family's".into());
        }
        Ok(())
    }

    /// Why `parts` (a shard's per-group metrics, each group's then the other rows') are not
    /// this family's metrics of a `kind` model of `n_classes` classes, on the rows of the
    /// shard's whole metrics (`whole_rows`): another number of groups, metrics of another
    /// kind, rows that do not add up.
    pub fn check_parts(
        &self,
        parts: &[EvaluationPart],
        kind: ModelKind,
        n_classes: usize,
        whole_rows: Option<u64>,
    ) -> Result<(), String> {
        if parts.len() != self.keys.len() + 1 {
            return Err(format!(
                "metrics of {} groups, where {} were sent and the other rows",
                parts.len(),
                self.keys.len()
            ));
        }
        for part in parts {
            part.check(kind, n_classes, None)?;
        }
        let scored = parts
            .iter()
            .try_fold(0u64, |sum, p| sum.checked_add(p.rows_scored()));
        if scored.is_none() || scored != whole_rows {
            return Err("per-group metrics of other rows than the whole's".into());
        }
        Ok(())
    }
}
