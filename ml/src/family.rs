//! Which family each kind belongs to: the one place a kind is mapped to its [`Family`], and what
//! follows from it (the params only another family takes). The families: linear
//! (`learner/linear.rs`), network (`learner/network.rs`), factorization machine (`fm/`).
//!
//! Nothing names this module: the rest of the crate asks `kind.family()`.

use crate::fm::FmFamily;
use crate::learner::{Family, LinearFamily, NetworkFamily};
use crate::model::{ModelKind, Predictor};
use crate::params::TrainParams;
use crate::trained::Model;
use serde_json::Value;

impl ModelKind {
    /// The family that trains and stores the kind's models.
    pub fn family(self) -> &'static dyn Family {
        match self {
            ModelKind::Svm | ModelKind::Logistic | ModelKind::Linear | ModelKind::Softmax => {
                &LinearFamily
            }
            ModelKind::Mlp | ModelKind::MlpRegression => &NetworkFamily,
            ModelKind::Fm | ModelKind::FmRegression => &FmFamily,
        }
    }

    /// A warm start of a model of this kind from `stored`: the first param of `params` that
    /// asks for another shape than the stored model's (see [`Family::shape_params`]), as (the
    /// key, the value asked for, the stored model's); a stored model of another kind is a
    /// mismatch of `"model"`.
    pub fn shape_mismatch(
        self,
        params: &TrainParams,
        stored: &Model,
    ) -> Option<(&'static str, Value, Value)> {
        if stored.kind() != self {
            return Some((
                "model",
                Value::from(self.name()),
                Value::from(stored.kind().name()),
            ));
        }
        let asked = params.to_json();
        self.family()
            .shape_params(stored)
            .into_iter()
            .find_map(|(key, value)| {
                let given = asked.get(key).cloned().unwrap_or(Value::Null);
                (given != value).then_some((key, given, value))
            })
    }

    /// The keys some family takes that `kind`'s does not: (the key, the kinds that take it).
    pub fn foreign_key(self, given: &dyn Fn(&str) -> bool) -> Option<(&'static str, String)> {
        let own = self.family().own_keys();
        let key = ModelKind::ALL
            .iter()
            .flat_map(|k| k.family().own_keys())
            .find(|key| given(key) && !own.contains(key))?;
        let takers: Vec<&str> = ModelKind::ALL
            .iter()
            .filter(|k| k.family().own_keys().contains(key))
            .map(|k| k.name())
            .collect();
        let takers = match takers.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
            None => String::new(),
        };
        Some((key, takers))
    }
}

/// Every key some family owns (the params a linear model's JSON leaves out when unset).
pub fn family_keys() -> impl Iterator<Item = &'static str> {
    ModelKind::ALL
        .into_iter()
        .flat_map(|k| k.family().own_keys().iter().copied())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learner::{Learner, Shape};
    use crate::network::Target;
    use crate::row::Row;
    use crate::standardize::Standardizer;
    use serde_json::json;

    /// The kinds of every family, with params that give each a small shape.
    fn kinds() -> Vec<(ModelKind, Value)> {
        vec![
            (ModelKind::Logistic, json!({"average": false})),
            (ModelKind::Linear, json!({"average": false})),
            (
                ModelKind::Mlp,
                json!({"hidden": [4, 3], "activation": "tanh"}),
            ),
            (ModelKind::MlpRegression, json!({"hidden": [5]})),
            (ModelKind::Fm, json!({"factors": 3})),
            (ModelKind::FmRegression, json!({"factors": 2})),
        ]
    }

    /// A learner of `kind` over 3 inputs, training on rows standardized by `s` and on the
    /// target `target`.
    fn learner(
        kind: ModelKind,
        params: &Value,
        s: Option<&Standardizer>,
        target: Target,
    ) -> Learner {
        let params = TrainParams::for_kind(params, kind).unwrap();
        let mut config = params.train_config(kind);
        config.standardizer = s.cloned();
        let outputs = if kind.is_classifier() { 3 } else { 1 };
        let shape = Shape {
            n_features: 3,
            outputs: if kind.family().sized_by_statistics() {
                outputs
            } else {
                1
            },
            target,
        };
        kind.family().learner(config, &params, &shape).unwrap()
    }

    /// A stored model of `kind`: a learner's parameters set to reproducible values, its
    /// target and standardizer folded in as a training's are.
    fn stored(
        kind: ModelKind,
        params: &Value,
        s: Option<&Standardizer>,
        target: Target,
    ) -> (Model, Vec<f64>) {
        let mut l = learner(kind, params, s, target);
        let mut seed = 11u64;
        let values: Vec<f64> = (0..l.n_params())
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5
            })
            .collect();
        assert!(l.set_parameters(&values));
        let model = l.into_model();
        (
            s.map_or(model.clone(), |s| model.fold_standardizer(s)),
            values,
        )
    }

    fn scores(m: &Model, x: &[f64]) -> Vec<f64> {
        let mut out = Vec::new();
        m.scores(Row::Dense(x), &mut out);
        out
    }

    #[test]
    fn a_stored_model_round_trips_through_a_learner_of_every_family() {
        let s = Standardizer {
            mean: vec![3.0, -20.0, 0.5],
            scale: vec![0.25, 0.01, 1.0],
            center: true,
        };
        let target = Target::new(40.0, 7.0);
        for (kind, params) in kinds() {
            // Without a standardizer or a target's scale: bit for bit.
            let plain = Target::new(0.0, 1.0);
            let (model, _) = stored(kind, &params, None, plain);
            let mut again = learner(kind, &params, None, plain);
            assert_eq!(again.start_from(&model), Ok(true), "{kind:?}");
            assert_eq!(again.into_model(), model, "{kind:?}");
            // Standardized rows and target: the learner starts from the parameters the
            // stored model was folded from, and gives back its function.
            let (model, values) = stored(kind, &params, Some(&s), target);
            let mut again = learner(kind, &params, Some(&s), target);
            assert_eq!(again.start_from(&model), Ok(true), "{kind:?}");
            for (a, b) in again.parameters().iter().zip(&values) {
                assert!(
                    (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                    "{kind:?}: {a} vs {b}"
                );
            }
            let back = again.into_model().fold_standardizer(&s);
            for x in [[0.0, 0.0, 0.0], [3.0, -20.0, 0.5], [10.0, 150.0, -2.0]] {
                for (a, b) in scores(&back, &x).iter().zip(scores(&model, &x)) {
                    assert!(
                        (a - b).abs() <= 1e-9 * b.abs().max(1.0),
                        "{kind:?} at {x:?}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_learner_of_another_shape_does_not_start_from_a_model() {
        let plain = Target::new(0.0, 1.0);
        let (mlp, _) = stored(ModelKind::Mlp, &json!({"hidden": [4]}), None, plain);
        let (fm, _) = stored(ModelKind::Fm, &json!({"factors": 2}), None, plain);
        for (kind, params, model) in [
            (ModelKind::Mlp, json!({"hidden": [5]}), &mlp),
            (
                ModelKind::Mlp,
                json!({"hidden": [4], "activation": "tanh"}),
                &mlp,
            ),
            (ModelKind::Fm, json!({"factors": 3}), &fm),
            (ModelKind::Fm, json!({"factors": 4}), &mlp),
            (ModelKind::Mlp, json!({"hidden": [4]}), &fm),
        ] {
            let mut l = learner(kind, &params, None, plain);
            assert_eq!(l.start_from(model), Ok(false), "{kind:?} {params}");
        }
    }

    #[test]
    fn a_warm_start_takes_the_stored_shape_and_refuses_another() {
        let plain = Target::new(0.0, 1.0);
        for (kind, params) in kinds() {
            let (model, _) = stored(kind, &params, None, plain);
            // The params given none of the shape's keys, filled in with the stored model's.
            let mut filled = json!({});
            for (key, value) in kind.family().shape_params(&model) {
                filled[key] = value;
            }
            let p = TrainParams::for_kind(&filled, kind).unwrap();
            assert_eq!(kind.shape_mismatch(&p, &model), None, "{kind:?}");
            assert_eq!(
                learner(kind, &filled, None, plain).start_from(&model),
                Ok(true)
            );
        }
        let (mlp, _) = stored(ModelKind::Mlp, &json!({"hidden": [4, 3]}), None, plain);
        let asked = |params: Value, kind: ModelKind| {
            let p = TrainParams::for_kind(&params, kind).unwrap();
            kind.shape_mismatch(&p, &mlp)
        };
        assert_eq!(
            asked(json!({"hidden": [4]}), ModelKind::Mlp),
            Some(("hidden", json!([4]), json!([4, 3])))
        );
        assert_eq!(
            asked(
                json!({"hidden": [4, 3], "activation": "tanh"}),
                ModelKind::Mlp
            ),
            Some(("activation", json!("tanh"), json!("relu")))
        );
        assert_eq!(
            asked(
                json!({"hidden": [4, 3], "activation": "relu"}),
                ModelKind::Mlp
            ),
            None
        );
        assert_eq!(
            asked(json!({}), ModelKind::Fm),
            Some(("model", json!("fm"), json!("mlp")))
        );
        let (fm, _) = stored(ModelKind::Fm, &json!({"factors": 3}), None, plain);
        let p = TrainParams::for_kind(&json!({"factors": 2}), ModelKind::Fm).unwrap();
        assert_eq!(
            ModelKind::Fm.shape_mismatch(&p, &fm),
            Some(("factors", json!(2), json!(3)))
        );
    }

    #[test]
    fn the_params_that_list_only_when_set_are_the_families_own() {
        let mut own: Vec<&str> = family_keys().collect();
        own.sort_unstable();
        own.dedup();
        let mut listed = crate::params::FAMILY_KEYS.to_vec();
        listed.sort_unstable();
        assert_eq!(own, listed);
    }
}
