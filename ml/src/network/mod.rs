//! A multilayer perceptron trained on mini-batches: dense layers whose forward and backward
//! passes over a batch are matrix products (ndarray's `general_mat_mul` into buffers allocated
//! up front, fallibly), a first layer that reads sparse rows as a gather-and-add over their
//! non-zeros, and a softmax (classes) or linear (regression) output.
//!
//! What the `mlp` and `mlp_regression` kinds train (`train`) and predict with (`model`).
//!
//! Layout: layer `l` maps `sizes[l]` inputs to `sizes[l + 1]` outputs as `Z = A·W + b`, with
//! `W` stored input-major (`sizes[l]` rows of `sizes[l + 1]`), so that a sparse row's non-zero
//! `j` reads row `j` of the first layer's weights, contiguous. All parameters are one flat
//! vector (every layer's W, then its b), so averaging and combining copies (parallel workers,
//! shards) work on it as on a linear model's weights.

mod attribution;
#[cfg(test)]
mod exchange_tests;
mod model;
mod optimizer;
#[cfg(test)]
mod shard_tests;
#[cfg(test)]
mod tests;
mod train;

pub use attribution::{PathAttribution, WORK_BUDGET};
pub use model::NetworkModel;
pub use optimizer::{Optimizer, OptimizerKind};
pub use train::{Differentiable, GradientTrainer, NetworkTrainer, Target};

use crate::model::Head;
use crate::row::Row;
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

/// The hidden layers' non-linearity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    Relu,
    Tanh,
}

/// Why a network cannot be built.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum NetworkError {
    #[error("out of memory for a network of {bytes} bytes")]
    OutOfMemory { bytes: u64 },
    #[error("a network needs at least an input and an output layer, each at least 1 wide")]
    BadShape,
}

/// A vector of `n` zeros, or an error instead of an abort when there is no memory for it.
pub(crate) fn try_zeros(n: usize) -> Result<Vec<f64>, NetworkError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| NetworkError::OutOfMemory {
            bytes: (n as u64).saturating_mul(8),
        })?;
    v.resize(n, 0.0);
    Ok(v)
}

#[derive(Clone, Debug, PartialEq)]
pub struct Network {
    /// Layer widths, input first: `[n_features, hidden..., outputs]`.
    pub sizes: Vec<usize>,
    pub activation: Activation,
    pub head: Head,
    /// Every layer's weights (input-major) then its biases, layer after layer.
    pub params: Vec<f64>,
}

impl Network {
    /// Parameters of a network of these widths.
    pub fn n_params(sizes: &[usize]) -> usize {
        sizes
            .windows(2)
            .map(|w| w[0].saturating_mul(w[1]).saturating_add(w[1]))
            .fold(0usize, usize::saturating_add)
    }

    /// A network with weights drawn from `seed`'s ChaCha stream: He-uniform for ReLU layers,
    /// Glorot-uniform for tanh layers and the output layer; biases 0. Same seed and sizes, same
    /// network, bit for bit.
    pub fn new(
        sizes: &[usize],
        activation: Activation,
        head: Head,
        seed: u64,
    ) -> Result<Network, NetworkError> {
        if sizes.len() < 2 || sizes.contains(&0) {
            return Err(NetworkError::BadShape);
        }
        let mut params = try_zeros(Self::n_params(sizes))?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut at = 0;
        for (l, w) in sizes.windows(2).enumerate() {
            let (fan_in, fan_out) = (w[0] as f64, w[1] as f64);
            let last = l + 2 == sizes.len();
            let limit = if activation == Activation::Relu && !last {
                (6.0 / fan_in).sqrt()
            } else {
                (6.0 / (fan_in + fan_out)).sqrt()
            };
            for p in &mut params[at..at + w[0] * w[1]] {
                // A uniform draw in [-limit, limit) from the top 53 bits.
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                *p = (2.0 * u - 1.0) * limit;
            }
            at += w[0] * w[1] + w[1];
        }
        Ok(Network {
            sizes: sizes.to_vec(),
            activation,
            head,
            params,
        })
    }

    fn n_layers(&self) -> usize {
        self.sizes.len() - 1
    }

    /// Where layer `l`'s weights and biases start in `params`.
    fn offsets(&self, l: usize) -> (usize, usize) {
        let at: usize = self.sizes[..=l]
            .windows(2)
            .map(|w| w[0] * w[1] + w[1])
            .sum();
        let (n_in, n_out) = (self.sizes[l], self.sizes[l + 1]);
        (at, at + n_in * n_out)
    }

    fn weights(&self, l: usize) -> ArrayView2<'_, f64> {
        let (w, b) = self.offsets(l);
        ArrayView2::from_shape((self.sizes[l], self.sizes[l + 1]), &self.params[w..b])
            .expect("a layer's weights fill its shape")
    }

    /// Layer `l`'s weights, input-major (`sizes[l]` rows of `sizes[l + 1]`).
    fn weights_slice(&self, l: usize) -> &[f64] {
        let (w, b) = self.offsets(l);
        &self.params[w..b]
    }

    fn bias(&self, l: usize) -> &[f64] {
        let (_, b) = self.offsets(l);
        &self.params[b..b + self.sizes[l + 1]]
    }

    /// Whether `weights` marks a weight (true) or a bias (false), per parameter: L2 applies to
    /// weights only.
    pub fn is_weight(&self) -> Vec<bool> {
        let mut out = Vec::with_capacity(self.params.len());
        for w in self.sizes.windows(2) {
            out.extend(std::iter::repeat_n(true, w[0] * w[1]));
            out.extend(std::iter::repeat_n(false, w[1]));
        }
        out
    }
}

/// Buffers for one mini-batch of up to `batch` rows: each layer's pre-activations and
/// activations, the deltas, the gradient. Allocated once, fallibly.
pub struct Workspace {
    batch: usize,
    /// Per layer l (0 = input, dense batches only): the activations, `batch × sizes[l]`.
    activations: Vec<Vec<f64>>,
    /// Per layer l ≥ 1: the pre-activations `Z`, `batch × sizes[l]`.
    pre: Vec<Vec<f64>>,
    /// Deltas of the current and the previous layer, `batch × max width`.
    delta: Vec<f64>,
    delta_prev: Vec<f64>,
    /// d loss / d params, as `params`.
    pub gradient: Vec<f64>,
}

impl Workspace {
    pub fn new(net: &Network, batch: usize) -> Result<Workspace, NetworkError> {
        let batch = batch.max(1);
        let widest = net.sizes.iter().copied().max().unwrap_or(1);
        let mut activations = Vec::new();
        let mut pre = Vec::new();
        for (l, &n) in net.sizes.iter().enumerate() {
            activations.push(try_zeros(batch.saturating_mul(n))?);
            pre.push(if l == 0 {
                Vec::new()
            } else {
                try_zeros(batch.saturating_mul(n))?
            });
        }
        Ok(Workspace {
            batch,
            activations,
            pre,
            delta: try_zeros(batch.saturating_mul(widest))?,
            delta_prev: try_zeros(batch.saturating_mul(widest))?,
            gradient: try_zeros(net.params.len())?,
        })
    }

    /// Bytes this workspace holds for `net` and `batch` rows (for the memory check).
    pub fn bytes(sizes: &[usize], batch: usize) -> u64 {
        let widths: u64 = sizes.iter().map(|&n| n as u64).sum();
        let widest = sizes.iter().copied().max().unwrap_or(1) as u64;
        let b = batch.max(1) as u64;
        8 * (b * (2 * widths) + 2 * b * widest + Network::n_params(sizes) as u64)
    }
}

impl Network {
    /// The forward pass over `rows` (at most the workspace's batch): the outputs of the last
    /// layer (class probabilities for a softmax head, the prediction for a linear one) stay in
    /// the workspace's last activations.
    pub fn forward(&self, rows: &[Row], ws: &mut Workspace) {
        let b = rows.len();
        assert!(b <= ws.batch, "a batch larger than its workspace");
        let n_in = self.sizes[0];
        // Layer 0: dense rows as one matrix product; sparse rows gather their weights' rows.
        let dense = rows.iter().all(|r| matches!(r, Row::Dense(_)));
        {
            let (n_out, bias) = (self.sizes[1], self.bias(0));
            let z = &mut ws.pre[1][..b * n_out];
            for row in z.chunks_exact_mut(n_out) {
                row.copy_from_slice(bias);
            }
            if dense {
                let x = &mut ws.activations[0][..b * n_in];
                for (dst, r) in x.chunks_exact_mut(n_in).zip(rows) {
                    if let Row::Dense(v) = r {
                        dst.copy_from_slice(&v[..n_in]);
                    }
                }
                let x = ArrayView2::from_shape((b, n_in), &*x).expect("batch shape");
                let mut z = ArrayViewMut2::from_shape((b, n_out), z).expect("batch shape");
                general_mat_mul(1.0, &x, &self.weights(0), 1.0, &mut z);
            } else {
                let w = self.weights(0);
                for (zr, r) in z.chunks_exact_mut(n_out).zip(rows) {
                    for_each_value(r, n_in, |j, v| {
                        for (zk, wk) in zr.iter_mut().zip(w.row(j)) {
                            *zk += v * wk;
                        }
                    });
                }
            }
            self.activate(1, b, ws);
        }
        for l in 1..self.n_layers() {
            let (n_prev, n_out) = (self.sizes[l], self.sizes[l + 1]);
            let z = &mut ws.pre[l + 1][..b * n_out];
            for row in z.chunks_exact_mut(n_out) {
                row.copy_from_slice(self.bias(l));
            }
            let a = ArrayView2::from_shape((b, n_prev), &ws.activations[l][..b * n_prev])
                .expect("batch shape");
            let mut z = ArrayViewMut2::from_shape((b, n_out), z).expect("batch shape");
            general_mat_mul(1.0, &a, &self.weights(l), 1.0, &mut z);
            self.activate(l + 1, b, ws);
        }
    }

    /// Layer `l`'s activations from its pre-activations: the hidden non-linearity, or the head.
    fn activate(&self, l: usize, b: usize, ws: &mut Workspace) {
        let n = self.sizes[l];
        let (z, a) = (&ws.pre[l][..b * n], &mut ws.activations[l][..b * n]);
        if l < self.n_layers() {
            match self.activation {
                Activation::Relu => a.iter_mut().zip(z).for_each(|(a, &z)| *a = z.max(0.0)),
                Activation::Tanh => a.iter_mut().zip(z).for_each(|(a, &z)| *a = z.tanh()),
            }
            return;
        }
        a.copy_from_slice(z);
        if self.head == Head::SOFTMAX {
            for row in a.chunks_exact_mut(n) {
                crate::model::softmax_loss(row, 0);
            }
        }
    }

    /// The outputs of row `i` of the last forward pass.
    pub fn outputs<'w>(&self, ws: &'w Workspace, i: usize) -> &'w [f64] {
        let n = *self.sizes.last().expect("a network has an output layer");
        &ws.activations[self.n_layers()][i * n..(i + 1) * n]
    }

    /// The mean loss of the batch and its gradient into `ws.gradient` (overwritten): a forward
    /// pass, then back-propagation. `labels`: class indices (softmax) or values (linear);
    /// `weights`: each row's weight on the loss, or empty for 1.
    pub fn loss_and_gradient(
        &self,
        rows: &[Row],
        labels: &[f64],
        weights: &[f64],
        ws: &mut Workspace,
    ) -> f64 {
        self.add_loss_and_gradient(rows, labels, weights, rows.len(), true, ws)
    }

    /// Part of a batch of `of_rows` rows: adds its share of the batch's mean loss gradient to
    /// `ws.gradient` (zeroed first when `first`) and returns its share of the mean loss. The
    /// parts of a batch add up to [`loss_and_gradient`](Self::loss_and_gradient) of all of it.
    pub fn add_loss_and_gradient(
        &self,
        rows: &[Row],
        labels: &[f64],
        weights: &[f64],
        of_rows: usize,
        first: bool,
        ws: &mut Workspace,
    ) -> f64 {
        let b = rows.len();
        assert_eq!(b, labels.len());
        self.forward(rows, ws);
        let last = self.n_layers();
        let n_out = self.sizes[last];
        let inv_b = 1.0 / of_rows.max(1) as f64;
        // Output delta: d mean-loss / d Z_last.
        let loss = self.head.delta(
            &ws.activations[last][..b * n_out],
            labels,
            weights,
            inv_b,
            &mut ws.delta[..b * n_out],
        );
        if first {
            ws.gradient.iter_mut().for_each(|g| *g = 0.0);
        }
        for l in (0..last).rev() {
            let (n_in, n_out) = (self.sizes[l], self.sizes[l + 1]);
            let (w_at, b_at) = self.offsets(l);
            let delta = &ws.delta[..b * n_out];
            // d bias = column sums of the delta.
            let gb = &mut ws.gradient[b_at..b_at + n_out];
            for row in delta.chunks_exact(n_out) {
                gb.iter_mut().zip(row).for_each(|(g, d)| *g += d);
            }
            let d = ArrayView2::from_shape((b, n_out), delta).expect("batch shape");
            let gw = &mut ws.gradient[w_at..w_at + n_in * n_out];
            if l == 0 && !rows.iter().all(|r| matches!(r, Row::Dense(_))) {
                // Sparse first layer: scatter-add each non-zero's share.
                for (r, drow) in rows.iter().zip(delta.chunks_exact(n_out)) {
                    for_each_value(r, n_in, |j, v| {
                        let gj = &mut gw[j * n_out..(j + 1) * n_out];
                        gj.iter_mut().zip(drow).for_each(|(g, d)| *g += v * d);
                    });
                }
            } else {
                let a = ArrayView2::from_shape((b, n_in), &ws.activations[l][..b * n_in])
                    .expect("batch shape");
                let mut gw = ArrayViewMut2::from_shape((n_in, n_out), gw).expect("layer shape");
                general_mat_mul(1.0, &a.t(), &d, 1.0, &mut gw);
            }
            if l == 0 {
                break;
            }
            // Delta of layer l: (delta · Wᵀ) ⊙ act'(Z_l).
            let prev = &mut ws.delta_prev[..b * n_in];
            {
                let mut p = ArrayViewMut2::from_shape((b, n_in), &mut *prev).expect("batch shape");
                general_mat_mul(1.0, &d, &self.weights(l).t(), 0.0, &mut p);
            }
            let z = &ws.pre[l][..b * n_in];
            let a = &ws.activations[l][..b * n_in];
            match self.activation {
                Activation::Relu => prev
                    .iter_mut()
                    .zip(z)
                    .for_each(|(p, &z)| *p = if z > 0.0 { *p } else { 0.0 }),
                Activation::Tanh => prev.iter_mut().zip(a).for_each(|(p, &a)| *p *= 1.0 - a * a),
            }
            std::mem::swap(&mut ws.delta, &mut ws.delta_prev);
        }
        loss * inv_b
    }
}

/// Calls `f(j, value)` for each stored value of `row` whose index is below `n` (features the
/// network does not have are ignored, as a linear model ignores them).
pub(crate) fn for_each_value(row: &Row, n: usize, mut f: impl FnMut(usize, f64)) {
    match *row {
        Row::Dense(x) => x.iter().take(n).enumerate().for_each(|(j, &v)| f(j, v)),
        Row::Sparse { indices, values } => {
            for (&j, &v) in indices.iter().zip(values) {
                if (j as usize) < n {
                    f(j as usize, v);
                }
            }
        }
    }
}
