//! A trained network as a model: what `corgipile_predict` and the evaluation use, row by row,
//! on the table's raw units (the training's feature standardization is folded into the first
//! layer and a regression target's into the last, as a linear model folds its standardizer into
//! its weights), and its catalog form (every layer's weights, then every layer's biases).

use super::{Activation, Network, NetworkError};

use crate::model::{ModelKind, Predictor};
use crate::row::Row;
use crate::standardize::Standardizer;
use std::cell::Cell;

/// A trained `mlp` or `mlp_regression`.
///
/// A row's prediction runs every layer as a matrix-vector product on slices, allocation-free
/// (the layers' outputs live in a per-thread scratch buffer). Layers read input-major (the
/// catalog's layout: a sparse row or the non-zeros of a ReLU layer read only their weight
/// rows, and each block of outputs stays in registers); a layer narrower than
/// [`NARROW`] outputs (a classifier's few scores, a regression's one value) would leave such
/// blocks nearly empty, so it is read from an output-major copy of its weights (`by_output`,
/// made whenever the parameters change) as one dot product per output.
#[derive(Clone, Debug)]
pub struct NetworkModel {
    pub kind: ModelKind,
    net: Network,
    /// The narrow layers' weights output-major, one after another: layer `l`'s
    /// `sizes[l + 1]` rows of `sizes[l]` weights.
    by_output: Vec<f64>,
    /// The widest vector instructions this CPU has, for the row kernels.
    isa: Isa,
}

/// A layer with fewer outputs than this is read output-major (see [`NetworkModel`]).
const NARROW: usize = 8;

impl PartialEq for NetworkModel {
    /// The same kind and network (the rest is derived from them).
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.net == other.net
    }
}

/// A row's intermediate values: every layer's outputs one after another, and the current
/// layer's non-zero inputs.
#[derive(Default)]
struct Scratch {
    outputs: Vec<f64>,
    nz_index: Vec<usize>,
    nz_value: Vec<f64>,
}

thread_local! {
    /// The scratch of the rows predicted on this thread: grown to the widest network the
    /// thread predicts with, then reused (a backend keeps it, a few widths of f64, to its end).
    static SCRATCH: Cell<Scratch> = const {
        Cell::new(Scratch {
            outputs: Vec::new(),
            nz_index: Vec::new(),
            nz_value: Vec::new(),
        })
    };
}

impl NetworkModel {
    pub fn new(kind: ModelKind, net: Network) -> NetworkModel {
        let mut model = NetworkModel {
            kind,
            net,
            by_output: Vec::new(),
            isa: Isa::detect(),
        };
        model.transpose();
        model
    }

    pub fn net(&self) -> &Network {
        &self.net
    }

    pub fn into_network(self) -> Network {
        self.net
    }

    /// Whether layer `l` is read output-major: not the first (a sparse row's non-zeros must
    /// read weight rows) and narrower than [`NARROW`].
    fn reads_by_output(&self, l: usize) -> bool {
        l > 0 && self.net.sizes[l + 1] < NARROW
    }

    /// Rebuilds `by_output` from the network's parameters.
    fn transpose(&mut self) {
        let mut t = Vec::new();
        for l in (1..self.net.n_layers()).filter(|&l| self.reads_by_output(l)) {
            let (n_in, n_out) = (self.net.sizes[l], self.net.sizes[l + 1]);
            let (w_at, b_at) = self.net.offsets(l);
            let w = &self.net.params[w_at..b_at];
            for k in 0..n_out {
                t.extend((0..n_in).map(|j| w[j * n_out + k]));
            }
        }
        self.by_output = t;
    }

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

    /// `f` of the last layer's raw outputs for one row: class scores (before softmax) or the
    /// prediction. One row is too little for a batch: a matrix-vector product per layer, in
    /// this thread's scratch, so a prediction allocates nothing once warm.
    fn with_outputs<R>(&self, row: Row, f: impl FnOnce(&[f64]) -> R) -> R {
        SCRATCH.with(|cell| {
            let mut scratch = cell.take();
            let r = f(self.forward_row(row, &mut scratch));
            cell.set(scratch);
            r
        })
    }

    /// Every layer's outputs into the scratch, one after another; the last layer's returned.
    /// Each output is its bias plus its inputs' terms added in input order (an axpy per
    /// input, a hidden layer's zeros skipped); a narrow layer's dot product adds them in lanes
    /// ([`dot`]) instead, which differs from that order by rounding only.
    fn forward_row<'s>(&self, row: Row, scratch: &'s mut Scratch) -> &'s [f64] {
        let net = &self.net;
        let total: usize = net.sizes[1..].iter().sum();
        let widest = net.sizes[1..].iter().copied().max().unwrap_or(0);
        scratch.outputs.resize(total, 0.0);
        scratch.nz_index.resize(widest, 0);
        scratch.nz_value.resize(widest, 0.0);
        let (n_in, n_hidden) = (net.sizes[0], net.sizes[1]);
        let (w, bias) = (net.weights_slice(0), net.bias(0));
        let (mut current, mut rest) = scratch.outputs.split_at_mut(n_hidden);
        match row {
            Row::Dense(x) => {
                let x = &x[..x.len().min(n_in)];
                self.isa
                    .input_major(w, bias, x.iter().copied().enumerate(), current);
            }
            Row::Sparse { indices, values } => {
                let nz = indices
                    .iter()
                    .zip(values)
                    .filter(|&(&j, _)| (j as usize) < n_in)
                    .map(|(&j, &v)| (j as usize, v));
                self.isa.input_major(w, bias, nz, current);
            }
        }
        let mut t_at = 0;
        for l in 1..net.n_layers() {
            net.activation.apply(current);
            let n_out = net.sizes[l + 1];
            let (next, after) = rest.split_at_mut(n_out);
            if self.reads_by_output(l) {
                let w = &self.by_output[t_at..t_at + current.len() * n_out];
                t_at += w.len();
                self.isa.output_major(w, net.bias(l), current, next);
            } else {
                // The non-zero inputs, gathered without a branch per input.
                let mut n = 0;
                for (j, &a) in current.iter().enumerate() {
                    scratch.nz_index[n] = j;
                    scratch.nz_value[n] = a;
                    n += usize::from(a != 0.0);
                }
                let nz = scratch.nz_index[..n]
                    .iter()
                    .copied()
                    .zip(scratch.nz_value[..n].iter().copied());
                self.isa
                    .input_major(net.weights_slice(l), net.bias(l), nz, next);
            }
            (current, rest) = (next, after);
        }
        current
    }

    /// The last layer's raw outputs for one row into `out`: class scores (before softmax) or
    /// the prediction.
    pub fn scores(&self, row: Row, out: &mut Vec<f64>) {
        self.with_outputs(row, |z| {
            out.clear();
            out.extend_from_slice(z);
        })
    }

    /// Output 0: the prediction of a regression network; for classes, the first class's score.
    pub fn decision(&self, row: Row) -> f64 {
        self.with_outputs(row, |z| z.first().copied().unwrap_or(f64::NAN))
    }

    /// The prediction: the value (regression) or the most probable class index.
    pub fn predict(&self, row: Row) -> f64 {
        self.with_outputs(row, |z| self.net.head.predict(z))
    }

    /// One probability per class (softmax head); false and `out` empty for regression.
    pub fn predict_proba(&self, row: Row, out: &mut Vec<f64>) -> bool {
        self.scores(row, out);
        self.net.head.probabilities(out)
    }

    /// The same function of the raw features for a network trained on `x'_j = (x_j -
    /// mean_j)·scale_j`: the first layer's weight row j is multiplied by `scale_j`, and its
    /// biases lose `Σ_j w'_j·mean_j` (centered only). Features beyond the standardizer's
    /// length keep their weights.
    /// (Only the first layer changes: it has no output-major copy.)
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

    /// The inverse of [`fold_standardizer`](Self::fold_standardizer): the network on rows
    /// standardized by `s` that computes what this one computes on the table's units (a warm
    /// start): the first layer's biases gain `Σ_j w_j·mean_j` (centered only), then its weight
    /// row j is divided by `scale_j` (never 0: 1 for a constant feature).
    pub fn unfold_standardizer(&mut self, s: &Standardizer) {
        let n_out = self.net.sizes[1];
        let (w_at, b_at) = self.net.offsets(0);
        let (weights, rest) = self.net.params[w_at..].split_at_mut(b_at - w_at);
        let bias = &mut rest[..n_out];
        for (j, row) in weights.chunks_exact_mut(n_out).enumerate() {
            let Some(&scale) = s.scale.get(j) else { break };
            for (w, b) in row.iter_mut().zip(bias.iter_mut()) {
                if s.center {
                    *b += *w * s.mean[j];
                }
                *w /= scale;
            }
        }
    }

    /// The inverse of [`fold_target`](Self::fold_target): the network on the standardized
    /// target `(y - mean) / scale` (`scale` > 0) of one in the label's units.
    pub fn unfold_target(&mut self, mean: f64, scale: f64) {
        let last = self.net.n_layers() - 1;
        let (w_at, b_at) = self.net.offsets(last);
        let n_out = self.n_outputs();
        self.net.params[b_at..b_at + n_out]
            .iter_mut()
            .for_each(|b| *b -= mean);
        self.net.params[w_at..b_at + n_out]
            .iter_mut()
            .for_each(|p| *p /= scale);
        self.transpose();
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
        self.transpose();
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
        let head = kind.head();
        Ok(NetworkModel::new(
            kind,
            Network {
                sizes,
                activation,
                head,
                params,
            },
        ))
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

impl Activation {
    /// The hidden non-linearity in place, as the batch forward pass applies it.
    fn apply(self, z: &mut [f64]) {
        match self {
            Activation::Relu => z.iter_mut().for_each(|v| *v = v.max(0.0)),
            Activation::Tanh => z.iter_mut().for_each(|v| *v = v.tanh()),
        }
    }
}

/// Partial sums per dot product of the output-major kernel (independent lanes, so they
/// vectorize without reordering any lane's sum).
const LANES: usize = 16;

/// `z = bias + Σ_j v_j·W[j]` over the `(j, v_j)` of `x`, `W` input-major (row `j` holds the
/// weights from input `j` to every output). Each output sums in the order of `x`, as the
/// batch forward pass's gather does: the same arithmetic as an axpy per input, with each
/// block of `B` outputs kept in registers instead of loaded and stored per input.
#[inline(always)]
fn input_major_body<const B: usize, I>(w: &[f64], bias: &[f64], x: I, z: &mut [f64])
where
    I: Iterator<Item = (usize, f64)> + Clone,
{
    let n_out = bias.len();
    let (bias_blocks, bias_tail) = bias.as_chunks::<B>();
    let (z_blocks, z_tail) = z[..n_out].as_chunks_mut::<B>();
    for (blk, (zb, bb)) in z_blocks.iter_mut().zip(bias_blocks).enumerate() {
        let mut acc = *bb;
        for (j, v) in x.clone() {
            let at = j * n_out + blk * B;
            let wj: &[f64; B] = w[at..at + B].try_into().expect("a block");
            for t in 0..B {
                acc[t] += v * wj[t];
            }
        }
        *zb = acc;
    }
    if !z_tail.is_empty() {
        let from = n_out - z_tail.len();
        z_tail.copy_from_slice(bias_tail);
        for (j, v) in x {
            let wj = &w[j * n_out + from..(j + 1) * n_out];
            z_tail.iter_mut().zip(wj).for_each(|(zk, wk)| *zk += v * wk);
        }
    }
}

/// Outputs per block of the input-major kernel without wide vectors: 8 SSE2 registers of
/// accumulators (with AVX2 32, in 8 registers; with AVX-512 64).
const BASE_BLOCK: usize = 16;

/// `z_k = bias_k + W_k·a` with `W` output-major (row `k` holds the weights into output `k`).
#[inline(always)]
fn output_major_body(w: &[f64], bias: &[f64], a: &[f64], z: &mut [f64]) {
    for ((zk, &bk), wk) in z.iter_mut().zip(bias).zip(w.chunks_exact(a.len())) {
        *zk = bk + dot(wk, a);
    }
}

/// `a·b` in `LANES` partial sums (lane `t` adds the products `t, t + LANES, …`), summed
/// pairwise, then the tail in order: one fixed order whatever the vector width.
#[inline(always)]
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let (ca, ta) = a.as_chunks::<LANES>();
    let (cb, tb) = b.as_chunks::<LANES>();
    let mut acc = [0.0; LANES];
    for (x, y) in ca.iter().zip(cb) {
        for t in 0..LANES {
            acc[t] += x[t] * y[t];
        }
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for t in 0..width {
            acc[t] += acc[t + width];
        }
    }
    let mut sum = acc[0];
    for (x, y) in ta.iter().zip(tb) {
        sum += x * y;
    }
    sum
}

#[cfg(test)]
impl NetworkModel {
    /// The same model with the kernels of `isa` (one `Isa::available` lists).
    pub(super) fn with_isa(&self, isa: Isa) -> NetworkModel {
        NetworkModel {
            isa,
            ..self.clone()
        }
    }
}

#[cfg(test)]
impl Activation {
    pub(super) fn apply_for_tests(self, z: &mut [f64]) {
        self.apply(z)
    }
}

/// The widest vector instructions the row kernels may use here, detected at run time (the
/// build targets the baseline x86-64). Every variant runs the same operations in the same
/// order per output (no fused multiply-add), so all give the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Isa {
    Baseline,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Baseline
    }

    /// Every variant this CPU runs (for the tests).
    #[cfg(test)]
    pub(super) fn available() -> Vec<Isa> {
        let mut out = vec![Isa::Baseline];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                out.push(Isa::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                out.push(Isa::Avx512);
            }
        }
        out
    }

    fn input_major<I>(self, w: &[f64], bias: &[f64], x: I, z: &mut [f64])
    where
        I: Iterator<Item = (usize, f64)> + Clone,
    {
        match self {
            Isa::Baseline => input_major_body::<BASE_BLOCK, _>(w, bias, x, z),
            // SAFETY: Isa::Avx2 and Isa::Avx512 are made only by Isa::detect, after the CPU
            // reported the feature, so the instructions these functions use exist here.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { x86::input_major_avx2(w, bias, x, z) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { x86::input_major_avx512(w, bias, x, z) },
        }
    }

    fn output_major(self, w: &[f64], bias: &[f64], a: &[f64], z: &mut [f64]) {
        match self {
            Isa::Baseline => output_major_body(w, bias, a, z),
            // SAFETY: as in input_major: the variant exists only where the CPU has the feature.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { x86::output_major_avx2(w, bias, a, z) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { x86::output_major_avx512(w, bias, a, z) },
        }
    }
}

/// The kernels compiled for wider vectors (the same source, inlined).
#[cfg(target_arch = "x86_64")]
mod x86 {
    #[target_feature(enable = "avx2")]
    pub(super) fn input_major_avx2<I>(w: &[f64], bias: &[f64], x: I, z: &mut [f64])
    where
        I: Iterator<Item = (usize, f64)> + Clone,
    {
        super::input_major_body::<32, _>(w, bias, x, z)
    }

    #[target_feature(enable = "avx512f")]
    pub(super) fn input_major_avx512<I>(w: &[f64], bias: &[f64], x: I, z: &mut [f64])
    where
        I: Iterator<Item = (usize, f64)> + Clone,
    {
        super::input_major_body::<64, _>(w, bias, x, z)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn output_major_avx2(w: &[f64], bias: &[f64], a: &[f64], z: &mut [f64]) {
        super::output_major_body(w, bias, a, z)
    }

    #[target_feature(enable = "avx512f")]
    pub(super) fn output_major_avx512(w: &[f64], bias: &[f64], a: &[f64], z: &mut [f64]) {
        super::output_major_body(w, bias, a, z)
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
