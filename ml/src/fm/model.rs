//! A trained factorization machine as a model: predictions on the table's units (the training's
//! feature standardization and a regression target's folded into its parameters), its
//! attribution (exact: the pairwise term is quadratic) and its stored form.

use super::Machine;
use crate::learner::Trainable;
use crate::model::Head;
use crate::model::{ModelKind, Predictor};
use crate::network::{Activation, Target};
use crate::row::Row;
use crate::standardize::Standardizer;
use crate::trained::{try_zeros, Layer, ModelParts, OutOfMemory, Trained};

/// A trained `fm` or `fm_regression`.
#[derive(Clone, Debug, PartialEq)]
pub struct FmModel {
    pub kind: ModelKind,
    pub machine: Machine,
}

thread_local! {
    /// The sums of the rows predicted on this thread (`factors` long), reused.
    static SUMS: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl FmModel {
    pub fn new(kind: ModelKind, machine: Machine) -> FmModel {
        FmModel { kind, machine }
    }

    /// A regression's outputs back in the label's units: `z·scale + mean` (the factors scaled
    /// by √scale, so that their products scale by `scale`).
    pub fn fold_target(&mut self, target: Target) {
        let m = &mut self.machine;
        if m.head != Head::SQUARED {
            return;
        }
        let (scale, root) = (target.scale, target.scale.sqrt());
        let bias_at = m.bias_at();
        for block in m.params[..bias_at].chunks_exact_mut(1 + m.factors) {
            block[0] *= scale;
            block[1..].iter_mut().for_each(|v| *v *= root);
        }
        for b in &mut m.params[bias_at..] {
            *b = *b * scale + target.mean;
        }
    }

    /// The inverse of [`fold_target`](Self::fold_target): the machine on the standardized
    /// target `(y - mean) / scale` of one in the label's units.
    pub fn unfold_target(&mut self, target: Target) {
        let m = &mut self.machine;
        if m.head != Head::SQUARED {
            return;
        }
        let (scale, root) = (target.scale, target.scale.sqrt());
        let bias_at = m.bias_at();
        for block in m.params[..bias_at].chunks_exact_mut(1 + m.factors) {
            block[0] /= scale;
            block[1..].iter_mut().for_each(|v| *v /= root);
        }
        for b in &mut m.params[bias_at..] {
            *b = (*b - target.mean) / scale;
        }
    }

    /// The inverse of [`Trained::fold_standardizer`]: the machine on rows `x'_j = a_j·x_j +
    /// c_j` that computes what this one computes on the table's units (a warm start). From the
    /// table's `V_j`, `W_j` and `B` (per output): `v_j = V_j / a_j`, `S = Σ_j c_j·v_j`, `w_j =
    /// W_j / a_j − <v_j, S> + |v_j|²·c_j` and `b = B − Σ_j w_j·c_j − ½(|S|² − Σ_j |v_j|²·c_j²)`.
    /// Features beyond the standardizer's length keep their parameters.
    pub fn unfold_standardizer(&mut self, s: &Standardizer) {
        let m = &mut self.machine;
        let (f, block, bias_at) = (m.factors, m.block(), m.bias_at());
        let a = |j: usize| s.scale.get(j).copied().unwrap_or(1.0);
        let c = |j: usize| match (s.center, s.scale.get(j)) {
            (true, Some(&scale)) => -scale * s.mean[j],
            _ => 0.0,
        };
        for k in 0..m.outputs {
            let at = k * (1 + f);
            let mut sum = vec![0.0; f];
            for j in 0..m.n_features {
                let (aj, cj) = (a(j), c(j));
                let p = &mut m.params[j * block + at..j * block + at + 1 + f];
                p[1..].iter_mut().for_each(|v| *v /= aj);
                if cj != 0.0 {
                    sum.iter_mut().zip(&p[1..]).for_each(|(s, v)| *s += cj * v);
                }
            }
            let (mut shift, mut squares) = (0.0, 0.0);
            for j in 0..m.n_features {
                let (aj, cj) = (a(j), c(j));
                let p = &mut m.params[j * block + at..j * block + at + 1 + f];
                let dot: f64 = p[1..].iter().zip(&sum).map(|(v, s)| v * s).sum();
                let norm: f64 = p[1..].iter().map(|v| v * v).sum();
                p[0] = p[0] / aj - dot + norm * cj;
                if cj != 0.0 {
                    shift += p[0] * cj;
                    squares += norm * cj * cj;
                }
            }
            let pairs = sum.iter().map(|s| s * s).sum::<f64>() - squares;
            m.params[bias_at + k] -= shift + 0.5 * pairs;
        }
    }

    /// Output `k` of `row`.
    fn output(&self, row: Row, k: usize) -> f64 {
        SUMS.with(|sums| {
            let mut sums = sums.borrow_mut();
            sums.resize(self.machine.factors, 0.0);
            self.machine.output(&row, k, &mut sums)
        })
    }
}

impl Predictor for FmModel {
    fn kind(&self) -> ModelKind {
        self.kind
    }
    fn n_features(&self) -> usize {
        self.machine.n_features
    }
    fn n_outputs(&self) -> usize {
        self.machine.outputs
    }
    fn decision(&self, row: Row) -> f64 {
        self.output(row, 0)
    }
    fn scores(&self, row: Row, out: &mut Vec<f64>) {
        out.clear();
        out.extend((0..self.machine.outputs).map(|k| self.output(row, k)));
    }
    fn predict(&self, row: Row) -> f64 {
        let mut scores = Vec::with_capacity(self.machine.outputs);
        self.scores(row, &mut scores);
        self.machine.head.predict(&scores)
    }
    fn predict_proba(&self, row: Row, out: &mut Vec<f64>) -> bool {
        self.scores(row, out);
        self.machine.head.probabilities(out)
    }
}

impl Trained for FmModel {
    /// The machine on the table's units for one trained on `x'_j = a_j·x_j + c_j` (`a_j` the
    /// scale, `c_j = -a_j·mean_j` when centering): `v_j ← a_j·v_j`, `w_j ← a_j·(w_j + <v_j, S> −
    /// |v_j|²·c_j)` and `b ← b + Σ_j w_j·c_j + ½(|S|² − Σ_j |v_j|²·c_j²)`, with `S = Σ_j c_j·v_j`
    /// (per output). Features beyond the standardizer's length keep their parameters.
    fn fold_standardizer(&mut self, s: &Standardizer) {
        let m = &mut self.machine;
        let (f, block, bias_at) = (m.factors, m.block(), m.bias_at());
        let a = |j: usize| s.scale.get(j).copied().unwrap_or(1.0);
        let c = |j: usize| match (s.center, s.scale.get(j)) {
            (true, Some(&scale)) => -scale * s.mean[j],
            _ => 0.0,
        };
        for k in 0..m.outputs {
            let at = k * (1 + f);
            let mut sum = vec![0.0; f];
            let (mut shift, mut squares) = (0.0, 0.0);
            for j in 0..m.n_features {
                let p = &m.params[j * block + at..j * block + at + 1 + f];
                let cj = c(j);
                if cj != 0.0 {
                    shift += p[0] * cj;
                    let norm: f64 = p[1..].iter().map(|v| v * v).sum();
                    squares += norm * cj * cj;
                    sum.iter_mut().zip(&p[1..]).for_each(|(s, v)| *s += cj * v);
                }
            }
            let pairs = sum.iter().map(|s| s * s).sum::<f64>() - squares;
            m.params[bias_at + k] += shift + 0.5 * pairs;
            for j in 0..m.n_features {
                let (aj, cj) = (a(j), c(j));
                let p = &mut m.params[j * block + at..j * block + at + 1 + f];
                let dot: f64 = p[1..].iter().zip(&sum).map(|(v, s)| v * s).sum();
                let norm: f64 = p[1..].iter().map(|v| v * v).sum();
                p[0] = aj * (p[0] + dot - norm * cj);
                p[1..].iter_mut().for_each(|v| *v *= aj);
            }
        }
    }

    fn n_params(&self) -> usize {
        self.machine.params.len()
    }

    /// Weights: every feature's block (each output's weight, then its factors), as trained;
    /// biases: one per output; layers: `[n_features, factors, outputs]`.
    fn to_parts(&self) -> ModelParts {
        let m = &self.machine;
        let (layers, activation) = m.shape();
        ModelParts {
            kind: self.kind,
            n_features: m.n_features,
            n_outputs: m.outputs,
            weights: m.params[..m.bias_at()].to_vec(),
            bias: m.bias().to_vec(),
            layers,
            activation,
        }
    }

    fn shape(&self) -> (Option<Vec<usize>>, Option<Activation>) {
        self.machine.shape()
    }

    /// Its parameters with the target's folding undone (a regression), then the
    /// standardizer's.
    fn learner_parameters(
        &self,
        s: Option<&Standardizer>,
        target: Target,
    ) -> Result<Vec<f64>, OutOfMemory> {
        let mut m = FmModel::new(self.kind, self.machine.try_copy().ok_or(OutOfMemory)?);
        m.unfold_target(target);
        if let Some(s) = s {
            m.unfold_standardizer(s);
        }
        Ok(m.machine.params)
    }

    fn clone_box(&self) -> Box<dyn Trained> {
        Box::new(self.clone())
    }

    /// Integrated gradients along the straight line from `x0` to `x`, exact: the output is
    /// quadratic in the row, so each feature's slope along the line is linear and its integral
    /// is the slope at the midpoint times the feature's change.
    fn attribute(&self, x: &[f64], x0: &[f64], output: usize) -> Result<Vec<f64>, OutOfMemory> {
        let m = &self.machine;
        let mut mid = try_zeros(m.n_features)?;
        for (p, (a, b)) in mid.iter_mut().zip(x.iter().zip(x0)) {
            *p = 0.5 * (a + b);
        }
        let mut sums = try_zeros(m.factors)?;
        m.output(&Row::Dense(&mid), output, &mut sums);
        let mut out = try_zeros(m.n_features)?;
        for (j, o) in out.iter_mut().enumerate() {
            *o = (x[j] - x0[j]) * m.slope(j, mid[j], output, &sums);
        }
        Ok(out)
    }

    fn scoring_work(&self, row_width: usize) -> usize {
        row_width * self.machine.outputs * (1 + self.machine.factors)
    }

    /// Two layers: the linear part (inputs × outputs, input-major, with the biases and the
    /// head), then the factors (inputs × outputs·factors: each input's factors of output 1,
    /// then of output 2, ...).
    fn layers(&self) -> Result<Vec<Layer>, OutOfMemory> {
        let m = &self.machine;
        let (d, k, f) = (m.n_features, m.outputs, m.factors);
        let mut linear = Vec::new();
        linear.try_reserve_exact(d * k).map_err(|_| OutOfMemory)?;
        let mut factors = Vec::new();
        factors
            .try_reserve_exact(d * k * f)
            .map_err(|_| OutOfMemory)?;
        for block in m.params[..m.bias_at()].chunks_exact(1 + f) {
            linear.push(block[0]);
            factors.extend_from_slice(&block[1..]);
        }
        Ok(vec![
            Layer {
                inputs: d,
                outputs: k,
                activation: self.kind.head().name.to_owned(),
                weights: linear,
                biases: m.bias().to_vec(),
            },
            Layer {
                inputs: d,
                outputs: k * f,
                activation: "factors".to_owned(),
                weights: factors,
                biases: Vec::new(),
            },
        ])
    }
}
