//! The factorization machine family: its params, its trainer (the networks'
//! [`GradientLearner`](crate::learner::GradientLearner) of a [`Machine`]) and its stored form.

use super::{FmModel, Machine, Workspace};

use crate::learner::{
    optimizer_name, out_of_memory, Family, GradientLearner, Learner, Shape, TrainingSize,
};
use crate::network::Optimizer;
use crate::params::MAX_FACTORS;
use crate::params::{ParamError, TrainParams};
use crate::trained::{Model, ModelParts, PartsError};
use crate::trainer::{TrainConfig, TrainError};

/// The factors unless `"factors"` says otherwise.
pub const DEFAULT_FACTORS: usize = 8;

/// The factorization machine family (see [`Family`]).
pub struct FmFamily;

fn factors(params: &TrainParams) -> usize {
    params.factors.map_or(DEFAULT_FACTORS, |f| f as usize)
}

impl Family for FmFamily {
    fn noun(&self) -> &'static str {
        "a factorization machine"
    }

    fn sized_by_statistics(&self) -> bool {
        true
    }

    fn default_buffer_floor(&self) -> u64 {
        crate::params::GRADIENT_BUFFER_FLOOR
    }

    /// Piecewise-linear bins: on `make bench-quality`'s seven tables they were more accurate on
    /// five (up to +9.5 points for an mlp, +39 for an fm on 22 classes of 3 columns).
    fn default_number_encoding(&self) -> crate::preprocess::Encode {
        crate::preprocess::Encode::Ple
    }

    fn own_keys(&self) -> &'static [&'static str] {
        &["factors", "optimizer", "momentum"]
    }

    fn defaults(
        &self,
        params: &mut TrainParams,
        given: &dyn Fn(&str) -> bool,
    ) -> Result<(), ParamError> {
        params.factors.get_or_insert(DEFAULT_FACTORS as u32);
        params.gradient_defaults(given, "fm and fm_regression")
    }

    /// Its factors.
    fn shape_params(&self, stored: &Model) -> Vec<(&'static str, serde_json::Value)> {
        match stored.shape() {
            (Some(layers), _) if layers.len() == 3 => {
                vec![("factors", serde_json::json!(layers[1]))]
            }
            _ => Vec::new(),
        }
    }

    fn explain_params(&self, params: &TrainParams) -> Vec<(&'static str, String)> {
        vec![
            ("Factors", factors(params).to_string()),
            ("Optimizer", optimizer_name(params)),
        ]
    }

    fn training_size(&self, params: &TrainParams, shape: &Shape) -> Option<TrainingSize> {
        let f = factors(params);
        let n = Machine::n_params(shape.n_features, f, shape.outputs).unwrap_or(usize::MAX);
        let per_param = 8 + Optimizer::bytes_per_param(params.network_optimizer());
        let bytes = (n as u64)
            .saturating_mul(per_param)
            .saturating_add(Workspace::bytes(
                n,
                f,
                shape.outputs,
                params.batch_size as usize,
            ));
        Some(TrainingSize {
            what: format!(
                "a factorization machine of {} features x {f} factors x {} outputs",
                shape.n_features, shape.outputs
            ),
            n_params: n as u64,
            bytes,
            hint: "Use fewer \"factors\"",
            shown: ("Factors", f.to_string()),
        })
    }

    fn learner(
        &self,
        config: TrainConfig,
        params: &TrainParams,
        shape: &Shape,
    ) -> Result<Learner, TrainError> {
        let head = config.kind.head();
        let machine = Machine::new(
            shape.n_features,
            factors(params),
            shape.outputs,
            head,
            params.seed.unwrap_or(0),
        )
        .map_err(out_of_memory)?;
        GradientLearner::try_new(config, machine, params.network_optimizer(), shape.target)
            .map(|l| Learner(Box::new(l)))
    }

    fn model_from(&self, parts: ModelParts) -> Result<Model, PartsError> {
        let bad = PartsError::BadShape("a factorization machine of another shape than it says");
        let ModelParts {
            kind,
            n_features,
            n_outputs,
            weights,
            bias,
            layers,
            activation,
        } = parts;
        let Some([d, f, k]) = layers
            .as_deref()
            .and_then(|l| <[usize; 3]>::try_from(l).ok())
        else {
            return Err(bad);
        };
        let n = Machine::n_params(d, f, k);
        if activation.is_some()
            || d != n_features
            || k != n_outputs
            || !(1..=MAX_FACTORS).contains(&f)
            || k == 0
            || (kind.is_classifier() && k < 2)
            || (!kind.is_classifier() && k != 1)
            || bias.len() != k
            || n != Some(weights.len() + k)
        {
            return Err(bad);
        }
        let mut params = Vec::new();
        params
            .try_reserve_exact(weights.len() + k)
            .map_err(|_| PartsError::OutOfMemory {
                bytes: (weights.len() as u64 + k as u64).saturating_mul(8),
            })?;
        params.extend_from_slice(&weights);
        params.extend_from_slice(&bias);
        let head = kind.head();
        Ok(Model::new(FmModel::new(
            kind,
            Machine {
                n_features: d,
                factors: f,
                outputs: k,
                head,
                params,
            },
        )))
    }
}
