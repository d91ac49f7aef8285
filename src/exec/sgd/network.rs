//! A network kind's shape, from the params and what the statistics pass learned (classes, the
//! label's moments), checked against `corgipile.max_model_memory` before it is built.

use super::SgdNode;
use corgipile_ml::learner::NetworkSpec;
use corgipile_ml::model::ModelKind;
use corgipile_ml::network::{Activation, Network, Target};
use corgipile_ml::params::TrainParams;

/// The network `params` ask for over `n_features` inputs, with `outputs` output units and the
/// regression `target`, checked against `max_bytes` (ERROR 54000) before anything of it is
/// allocated.
pub fn checked_network_spec(
    params: &TrainParams,
    outputs: usize,
    target: Target,
    n_features: usize,
    max_bytes: u64,
) -> NetworkSpec {
    let spec = NetworkSpec {
        hidden: params.network_hidden(),
        activation: params.activation.unwrap_or(Activation::Relu),
        optimizer: params.network_optimizer(),
        seed: params.seed.unwrap_or(0),
        outputs,
        target,
    };
    let sizes = spec.sizes(n_features);
    crate::pg::guc::check_network_size(
        &sizes,
        Network::n_params(&sizes) as u64,
        spec.training_bytes(n_features, params.batch_size as usize),
        max_bytes,
    );
    spec
}

impl SgdNode {
    /// A network kind's shape over `n_features` inputs as `params` ask (the training's, or one
    /// configuration's of a search, of its `kind`), None for linear kinds, checked against
    /// `corgipile.max_model_memory` before anything of it is allocated.
    pub(super) unsafe fn network_spec(
        &self,
        n_features: usize,
        params: &TrainParams,
        kind: ModelKind,
    ) -> Option<NetworkSpec> {
        if !kind.is_network() {
            return None;
        }
        let outputs = if kind.is_classifier() {
            let classes = self.shuffle().rows().classes().len();
            if classes < 2 {
                self.one_class();
            }
            classes
        } else {
            1
        };
        let (mean, variance) = self.label_moments.unwrap_or((0.0, 1.0));
        Some(checked_network_spec(
            params,
            outputs,
            Target::new(mean, variance.sqrt()),
            n_features,
            self.config.max_model_bytes,
        ))
    }
}
