//! A trained network as a model: what `corgipile_predict` and the evaluation use, row by row,
//! on the table's raw units (the training's feature standardization is folded into the first
//! layer and a regression target's into the last, as a linear model folds its standardizer into
//! its weights), and its catalog form (every layer's weights, then every layer's biases).

use super::{Activation, Head, Network, NetworkError};
use crate::model::{argmax, softmax_loss, ModelKind, Predictor};
use crate::row::Row;
use crate::standardize::Standardizer;

/// A trained `mlp` or `mlp_regression`.
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkModel {
    pub kind: ModelKind,
    pub net: Network,
}

impl NetworkModel {
    pub fn n_features(&self) -> usize {
        self.net.sizes[0]
    }

    pub fn n_outputs(&self) -> usize {
        *self
            .net
            .sizes
            .last()
            .expect("a network has an output layer")
    }

    /// The last layer's raw outputs for one row into `out`: class scores (before softmax) or
    /// the prediction. A per-row matrix-vector product: one row is too little for a batch.
    pub fn scores(&self, row: Row, out: &mut Vec<f64>) {
        let net = &self.net;
        let mut current: Vec<f64> = Vec::new();
        for l in 0..net.n_layers() {
            let (n_in, n_out) = (net.sizes[l], net.sizes[l + 1]);
            let w = net.weights(l);
            let mut next = net.bias(l).to_vec();
            if l == 0 {
                super::for_each_value(&row, n_in, |j, v| {
                    next.iter_mut()
                        .zip(w.row(j))
                        .for_each(|(z, wk)| *z += v * wk);
                });
            } else {
                for (j, &a) in current.iter().enumerate() {
                    if a != 0.0 {
                        next.iter_mut()
                            .zip(w.row(j))
                            .for_each(|(z, wk)| *z += a * wk);
                    }
                }
            }
            if l + 1 < net.n_layers() {
                match net.activation {
                    Activation::Relu => next.iter_mut().for_each(|z| *z = z.max(0.0)),
                    Activation::Tanh => next.iter_mut().for_each(|z| *z = z.tanh()),
                }
            }
            debug_assert_eq!(next.len(), n_out);
            current = next;
        }
        *out = current;
    }

    /// Output 0: the prediction of a regression network; for classes, the first class's score.
    pub fn decision(&self, row: Row) -> f64 {
        let mut out = Vec::new();
        self.scores(row, &mut out);
        out.first().copied().unwrap_or(f64::NAN)
    }

    /// The prediction: the value (regression) or the most probable class index.
    pub fn predict(&self, row: Row) -> f64 {
        let mut out = Vec::new();
        self.scores(row, &mut out);
        match self.net.head {
            Head::Linear => out[0],
            Head::Softmax => argmax(&out).map_or(f64::NAN, |k| k as f64),
        }
    }

    /// One probability per class (softmax head); false and `out` empty for regression.
    pub fn predict_proba(&self, row: Row, out: &mut Vec<f64>) -> bool {
        if self.net.head != Head::Softmax {
            out.clear();
            return false;
        }
        self.scores(row, out);
        softmax_loss(out, 0);
        true
    }

    /// The same function of the raw features for a network trained on `x'_j = (x_j -
    /// mean_j)·scale_j`: the first layer's weight row j is multiplied by `scale_j`, and its
    /// biases lose `Σ_j w'_j·mean_j` (centered only). Features beyond the standardizer's
    /// length keep their weights.
    pub fn fold_standardizer(&mut self, s: &Standardizer) {
        let n_out = self.net.sizes[1];
        let (w_at, b_at) = self.net.offsets(0);
        let (weights, rest) = self.net.params[w_at..].split_at_mut(b_at - w_at);
        let bias = &mut rest[..n_out];
        for (j, row) in weights.chunks_exact_mut(n_out).enumerate() {
            let Some(&scale) = s.scale.get(j) else { break };
            for (w, b) in row.iter_mut().zip(bias.iter_mut()) {
                *w *= scale;
                if s.center {
                    *b -= *w * s.mean[j];
                }
            }
        }
    }

    /// The same function in the label's units for a regression network trained on the
    /// standardized target `(y - mean) / scale`: the last layer's weights and bias times
    /// `scale`, plus `mean` on the bias.
    pub fn fold_target(&mut self, mean: f64, scale: f64) {
        let last = self.net.n_layers() - 1;
        let (w_at, b_at) = self.net.offsets(last);
        let n_out = self.n_outputs();
        self.net.params[w_at..b_at + n_out]
            .iter_mut()
            .for_each(|p| *p *= scale);
        self.net.params[b_at..b_at + n_out]
            .iter_mut()
            .for_each(|b| *b += mean);
    }

    /// The catalog's form: every layer's weights (input-major), then every layer's biases.
    pub fn weights_and_biases(&self) -> (Vec<f64>, Vec<f64>) {
        let (mut weights, mut biases) = (Vec::new(), Vec::new());
        for l in 0..self.net.n_layers() {
            let (w_at, b_at) = self.net.offsets(l);
            weights.extend_from_slice(&self.net.params[w_at..b_at]);
            biases.extend_from_slice(self.net.bias(l));
        }
        (weights, biases)
    }

    /// A network from its catalog form; None if the parts do not fit `sizes`.
    pub fn from_parts(
        kind: ModelKind,
        sizes: Vec<usize>,
        activation: Activation,
        weights: &[f64],
        biases: &[f64],
    ) -> Result<NetworkModel, NetworkError> {
        if sizes.len() < 3 || sizes.contains(&0) {
            return Err(NetworkError::BadShape);
        }
        let n_weights: usize = sizes.windows(2).map(|w| w[0] * w[1]).sum();
        let n_biases: usize = sizes[1..].iter().sum();
        if weights.len() != n_weights || biases.len() != n_biases {
            return Err(NetworkError::BadShape);
        }
        let mut params = super::try_zeros(n_weights + n_biases)?;
        params.clear();
        let (mut w_at, mut b_at) = (0, 0);
        for w in sizes.windows(2) {
            params.extend_from_slice(&weights[w_at..w_at + w[0] * w[1]]);
            params.extend_from_slice(&biases[b_at..b_at + w[1]]);
            w_at += w[0] * w[1];
            b_at += w[1];
        }
        let head = if kind.is_classifier() {
            Head::Softmax
        } else {
            Head::Linear
        };
        Ok(NetworkModel {
            kind,
            net: Network {
                sizes,
                activation,
                head,
                params,
            },
        })
    }
}

impl Activation {
    pub const NAMES: [&'static str; 2] = ["relu", "tanh"];

    pub fn name(self) -> &'static str {
        match self {
            Activation::Relu => "relu",
            Activation::Tanh => "tanh",
        }
    }

    pub fn parse(name: &str) -> Option<Activation> {
        match name {
            "relu" => Some(Activation::Relu),
            "tanh" => Some(Activation::Tanh),
            _ => None,
        }
    }
}

impl Predictor for NetworkModel {
    fn kind(&self) -> ModelKind {
        self.kind
    }
    fn n_features(&self) -> usize {
        NetworkModel::n_features(self)
    }
    fn n_outputs(&self) -> usize {
        NetworkModel::n_outputs(self)
    }
    fn decision(&self, row: Row) -> f64 {
        NetworkModel::decision(self, row)
    }
    fn scores(&self, row: Row, out: &mut Vec<f64>) {
        NetworkModel::scores(self, row, out)
    }
    fn predict(&self, row: Row) -> f64 {
        NetworkModel::predict(self, row)
    }
    fn predict_proba(&self, row: Row, out: &mut Vec<f64>) -> bool {
        NetworkModel::predict_proba(self, row, out)
    }
}
