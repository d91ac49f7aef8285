//! [`TrainParams`] from and to JSON: every key parsed by its entry in the params table, the
//! checks that span several keys (networks, folds, groups, search, since, patience), and the
//! trainer configuration the params describe.

use serde_json::{Map, Value};

use super::*;
use crate::capabilities::{refusal, used, Use};

impl Default for TrainParams {
    fn default() -> Self {
        Self::defaults()
    }
}

impl TrainParams {
    /// Parses and validates a JSON object of parameters; absent keys take
    /// their defaults. A block_size/buffer_size equal to its default counts as
    /// not explicit (this keeps `from_json(&p.to_json()) == p`).
    pub fn from_json(value: &Value) -> Result<TrainParams, ParamError> {
        let obj = value.as_object().ok_or_else(|| ParamError {
            message: format!("params must be a JSON object, got {}", json_type(value)),
            hint: Some("pass e.g. '{\"epochs\": 10, \"learning_rate\": 0.05}'::jsonb".to_string()),
        })?;
        // Report typos before any value error: they explain the most.
        if let Some(key) = obj.keys().find(|k| !Self::KEYS.contains(&k.as_str())) {
            return Err(unknown_key(key));
        }

        let mut p = Self::defaults();
        for (key, v) in obj {
            let spec = PARAMS
                .iter()
                .find(|s| s.name == key)
                .expect("unknown keys were rejected above");
            (spec.parse)(&mut p, key, v)?;
        }
        p.buffer_size_explicit = p.buffer_size != DEFAULT_BUFFER;
        Ok(p)
    }

    /// [`from_json`](Self::from_json) for a model of `kind`: the keys that only networks take
    /// are refused for the other kinds, and the keys a network's defaults differ for (its
    /// hidden layers, Adam's learning rate 0.001 and constant schedule, batches of 32, the
    /// last iterate rather than an average) are filled in when absent.
    pub fn for_kind(value: &Value, kind: ModelKind) -> Result<TrainParams, ParamError> {
        let mut p = Self::from_json(value)?;
        let given = |key: &str| value.get(key).is_some();
        if let Some((key, takers)) = kind.foreign_key(&given) {
            return Err(ParamError {
                message: format!("\"{key}\" applies to {takers} only"),
                hint: Some(format!(
                    "{} is {}: leave \"{key}\" out, or train one of {takers}.",
                    kind.name(),
                    kind.family().noun()
                )),
            });
        }
        kind.family().defaults(&mut p, &given)?;
        // A gate's refusals first: "group_by" and "folds" would be refused for the held-out
        // rows it needs, which is not what stops it.
        p.check_deploy_uses()?;
        p.check_inference(kind)?;
        p.check_folds()?;
        p.check_groups()?;
        p.check_search(value, kind)?;
        p.check_since()?;
        if p.warm_start.is_some() {
            let uses = used(&[
                (Use::Folds, p.folds.is_some()),
                (Use::GroupBy, p.group_by.is_some()),
                (
                    Use::ValidationRelation,
                    matches!(p.validation, Some(Validation::Relation(_))),
                ),
            ]);
            // "since" continues its model as a warm start does: refused in its own words.
            let subject = if p.since.is_some() {
                Use::Since
            } else {
                Use::WarmStart
            };
            if let Some(r) = refusal(subject, &uses) {
                return Err(ParamError::refused(r));
            }
        }
        p.check_deploy()?;
        if p.patience.is_some() && p.validation.is_none() {
            return Err(ParamError {
                message: "\"patience\" needs \"validation\"".into(),
                hint: Some("Early stopping watches the loss on held-out rows: add e.g. \"validation\": {\"fraction\": 0.1}.".into()),
            });
        }
        Ok(p)
    }

    /// `inference`: the models with a likelihood whose maximum is unpenalized, or l2-penalized
    /// (the Newton passes add its Hessian); an L1 or class-weighted optimum has no such tests.
    fn check_inference(&self, kind: ModelKind) -> Result<(), ParamError> {
        if !self.inference {
            return Ok(());
        }
        if !matches!(kind, ModelKind::Logistic | ModelKind::Linear) {
            return Err(ParamError {
                message: format!("\"inference\" applies to logistic and linear only, not {}", kind.name()),
                hint: Some("Standard errors and p-values come from a likelihood: train a logistic (two classes) or linear model.".into()),
            });
        }
        for (key, set) in [
            ("l1", self.l1 > 0.0),
            ("class_weight", self.class_weight.is_some()),
        ] {
            if set {
                return Err(ParamError {
                    message: format!("\"inference\" cannot be used with \"{key}\""),
                    hint: Some(format!("Standard errors are those of the (unweighted) maximum-likelihood estimate: leave \"{key}\" out (\"l2\" is allowed).")),
                });
            }
        }
        Ok(())
    }

    /// `since` continues its model (the warm start, unless another is named) and reads a
    /// `replay` sample of the older blocks (default [`DEFAULT_REPLAY`]).
    fn check_since(&mut self) -> Result<(), ParamError> {
        match &self.since {
            None if self.replay.is_some() => Err(ParamError {
                message: "\"replay\" needs \"since\"".into(),
                hint: Some("replay is the share of the older blocks an incremental training reads again: add \"since\": \"<model name>\".".into()),
            }),
            None => Ok(()),
            Some(key) => {
                self.replay.get_or_insert(DEFAULT_REPLAY);
                self.warm_start.get_or_insert_with(|| key.clone());
                Ok(())
            }
        }
    }

    /// `"deploy": "if_better"`: a version of a name (given, or a warm start's or `since`'s
    /// model's, which `name` defaults to) and held-out rows to score it on (`validation`, or a
    /// network's or a search's default); `margin` defaults to 0.
    fn check_deploy(&mut self) -> Result<(), ParamError> {
        let Some(rule) = self.deploy else {
            if self.margin.is_some() {
                return Err(ParamError {
                    message: "\"margin\" needs \"deploy\": \"if_better\"".into(),
                    hint: Some("margin is how much higher a new version must score than the deployed one: add \"deploy\": \"if_better\".".into()),
                });
            }
            return Ok(());
        };
        if self.name.is_none() && self.warm_start.is_none() {
            return Err(ParamError {
                message: format!("\"deploy\": \"{}\" needs \"name\"", rule.name()),
                hint: Some("The gate decides which version of a name is deployed: add e.g. \"name\": \"churn\".".into()),
            });
        }
        if self.validation.is_none() {
            return Err(ParamError {
                message: format!("\"deploy\": \"{}\" needs held-out rows: \"validation\"", rule.name()),
                hint: Some("The new version and the deployed one are scored on the rows the training holds out: add e.g. \"validation\": {\"fraction\": 0.1}, {\"predicate\": \"...\"} or {\"relation\": \"...\"}.".into()),
            });
        }
        self.margin.get_or_insert(0.0);
        Ok(())
    }

    /// What a gate is refused with (the capability table).
    fn check_deploy_uses(&self) -> Result<(), ParamError> {
        if self.deploy.is_none() {
            return Ok(());
        }
        let uses = used(&[
            (Use::Workers, self.workers > 0),
            (Use::GroupBy, self.group_by.is_some()),
            (Use::Folds, self.folds.is_some()),
        ]);
        match refusal(Use::Gate, &uses) {
            Some(r) => Err(ParamError::refused(r)),
            None => Ok(()),
        }
    }

    /// The effective parameters as a JSON object with every key.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        for spec in PARAMS {
            let value = (spec.to_json)(self);
            // A linear model's params do not list the network's.
            // Nor do the params of a training that searched nothing list the search's.
            if value.is_null()
                && (FAMILY_KEYS.contains(&spec.name)
                    || SEARCH_KEYS.contains(&spec.name)
                    || GROUP_KEYS.contains(&spec.name)
                    || spec.name == "folds"
                    || spec.name == "where"
                    || spec.name == "warm_start"
                    || spec.name == "since"
                    || spec.name == "replay"
                    || spec.name == "deploy"
                    || spec.name == "margin")
            {
                continue;
            }
            m.insert(spec.name.into(), value);
        }
        Value::Object(m)
    }

    /// Sharded tables: rounds per epoch for a model of `weights` weights and biases. Auto: 64
    /// (enough, in our tests, for shards that each hold one class), but at most 2^20 / weights,
    /// so that a big model's exchanges stay within ~2^20 values per shard and epoch each way.
    pub fn sync_rounds(&self, weights: usize) -> u32 {
        self.sync
            .unwrap_or_else(|| (((1usize << 20) / weights.max(1)).clamp(1, 64)) as u32)
    }
}
