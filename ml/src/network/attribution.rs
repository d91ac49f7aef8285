//! Integrated gradients of one raw output of a network (a class's score before the softmax,
//! or a regression's prediction) along the straight path from a baseline `x0` to a row `x`:
//! feature i gets `(x_i - x0_i) · ∫₀¹ ∂f/∂x_i(x0 + t·(x - x0)) dt`, and the features' shares
//! add up to `f(x) - f(x0)` (completeness). For a linear model the integrand is constant and
//! the shares are exactly `w_i·(x_i - x0_i)`.
//!
//! How the integral is taken, and why: with ReLU hidden layers `f` is piecewise linear along
//! the path, so the integral is computed **exactly** — the path is walked from one kink (a
//! hidden unit changing sign) to the next, and on each piece the gradient is constant (the
//! sum rule then holds to rounding, not to a step count). With tanh `f` is smooth (analytic),
//! and the integral is composite 8-point Gauss–Legendre quadrature, its panels doubled until
//! the shares add up to `f(x) - f(x0)` within 1e-12 relative. Both stop at a work budget
//! ([`WORK_BUDGET`] multiply-adds); what is then left over is [`PathAttribution::residual`].

use super::{try_zeros, Activation, Network, NetworkError};

/// Most multiply-adds one explanation may spend on forward and backward passes (about a
/// second of one core): bounds a statement's time whatever the network.
pub const WORK_BUDGET: u64 = 400_000_000;

/// The shares of one output, per input feature.
#[derive(Clone, Debug)]
pub struct PathAttribution {
    pub per_feature: Vec<f64>,
    /// `f(x) - f(x0) - Σ per_feature` as this network's own forward pass computes `f`.
    pub residual: f64,
    /// Linear pieces walked (ReLU) or gradient evaluations (tanh).
    pub evaluations: usize,
}

/// 8-point Gauss–Legendre nodes on [-1, 1] (±) and their weights.
const GL_NODES: [f64; 4] = [
    0.183_434_642_495_649_8,
    0.525_532_409_916_329,
    0.796_666_477_413_626_7,
    0.960_289_856_497_536_3,
];
const GL_WEIGHTS: [f64; 4] = [
    0.362_683_783_378_362,
    0.313_706_645_877_887_3,
    0.222_381_034_453_374_5,
    0.101_228_536_290_376_3,
];

/// Buffers of one attribution, allocated once (fallibly).
struct Scratch {
    /// Per hidden layer, each unit's slope (the activation's derivative) at the current point.
    slopes: Vec<Vec<f64>>,
    a: Vec<f64>,
    da: Vec<f64>,
    z: Vec<f64>,
    dz: Vec<f64>,
    delta: Vec<f64>,
    delta_prev: Vec<f64>,
}

impl Network {
    fn scratch(&self) -> Result<Scratch, NetworkError> {
        let widest = self.sizes.iter().copied().max().unwrap_or(1);
        let mut slopes = Vec::new();
        for &n in &self.sizes[1..self.sizes.len() - 1] {
            slopes.push(try_zeros(n)?);
        }
        Ok(Scratch {
            slopes,
            a: try_zeros(widest)?,
            da: try_zeros(widest)?,
            z: try_zeros(widest)?,
            dz: try_zeros(widest)?,
            delta: try_zeros(widest)?,
            delta_prev: try_zeros(widest)?,
        })
    }

    /// `z = Wₗᵀ·a (+ bₗ)` for dense `a` (layer `l`'s inputs).
    fn layer_into(&self, l: usize, a: &[f64], bias: bool, z: &mut [f64]) {
        let n_out = self.sizes[l + 1];
        let w = self.weights_slice(l);
        if bias {
            z[..n_out].copy_from_slice(self.bias(l));
        } else {
            z[..n_out].iter_mut().for_each(|v| *v = 0.0);
        }
        for (i, &v) in a.iter().enumerate() {
            if v != 0.0 {
                let row = &w[i * n_out..(i + 1) * n_out];
                z[..n_out]
                    .iter_mut()
                    .zip(row)
                    .for_each(|(zj, wj)| *zj += v * wj);
            }
        }
    }

    /// d output `k` / d input under the slopes in `s.slopes`, into `g` (input width).
    fn input_gradient(&self, k: usize, s: &mut Scratch, g: &mut [f64]) {
        let last = self.n_layers() - 1;
        let (n_in, n_out) = (self.sizes[last], self.sizes[last + 1]);
        let w = self.weights_slice(last);
        for i in 0..n_in {
            s.delta[i] = w[i * n_out + k];
        }
        for l in (0..last).rev() {
            let (n_in, n_out) = (self.sizes[l], self.sizes[l + 1]);
            s.delta[..n_out]
                .iter_mut()
                .zip(&s.slopes[l])
                .for_each(|(d, slope)| *d *= slope);
            let w = self.weights_slice(l);
            for i in 0..n_in {
                let row = &w[i * n_out..(i + 1) * n_out];
                s.delta_prev[i] = row.iter().zip(&s.delta[..n_out]).map(|(w, d)| w * d).sum();
            }
            std::mem::swap(&mut s.delta, &mut s.delta_prev);
        }
        g.copy_from_slice(&s.delta[..self.sizes[0]]);
    }

    /// Output `k` at `x`, the hidden slopes at `x` left in `s.slopes`.
    fn forward_slopes(&self, x: &[f64], k: usize, s: &mut Scratch) -> f64 {
        let n0 = self.sizes[0];
        s.a[..n0].copy_from_slice(x);
        let last = self.n_layers() - 1;
        for l in 0..=last {
            let (n_in, n_out) = (self.sizes[l], self.sizes[l + 1]);
            self.layer_into(l, &s.a[..n_in], true, &mut s.z);
            if l == last {
                return s.z[k];
            }
            for j in 0..n_out {
                let z = s.z[j];
                let (a, slope) = match self.activation {
                    Activation::Relu => (z.max(0.0), f64::from(u8::from(z > 0.0))),
                    Activation::Tanh => {
                        let a = z.tanh();
                        (a, 1.0 - a * a)
                    }
                };
                s.a[j] = a;
                s.slopes[l][j] = slope;
            }
        }
        unreachable!("the last layer returns")
    }

    /// Multiply-adds of one forward plus one backward pass.
    fn pass_cost(&self) -> u64 {
        2 * self.params.len() as u64 + 1
    }

    /// Integrated gradients of output `k` from `x0` to `x` (both dense, input width).
    pub fn integrated_gradients(
        &self,
        x0: &[f64],
        x: &[f64],
        k: usize,
    ) -> Result<PathAttribution, NetworkError> {
        assert!(k < *self.sizes.last().expect("an output layer"));
        assert!(x0.len() == self.sizes[0] && x.len() == self.sizes[0]);
        let mut s = self.scratch()?;
        let mut dx = try_zeros(x.len())?;
        dx.iter_mut()
            .zip(x.iter().zip(x0))
            .for_each(|(d, (a, b))| *d = a - b);
        let mut out = try_zeros(x.len())?;
        let mut g = try_zeros(x.len())?;
        let mut point = try_zeros(x.len())?;
        let target = self.forward_slopes(x, k, &mut s) - self.forward_slopes(x0, k, &mut s);
        let evaluations = match self.activation {
            Activation::Relu => self.walk_pieces(x0, &dx, k, &mut s, &mut g, &mut out),
            Activation::Tanh => {
                let scale = target.abs().max(f64::MIN_POSITIVE);
                let mut panels = 4usize;
                loop {
                    out.iter_mut().for_each(|v| *v = 0.0);
                    let h = 1.0 / panels as f64;
                    for p in 0..panels {
                        let mid = (p as f64 + 0.5) * h;
                        for (node, weight) in GL_NODES.iter().zip(GL_WEIGHTS) {
                            for t in [mid - node * h / 2.0, mid + node * h / 2.0] {
                                point
                                    .iter_mut()
                                    .zip(x0.iter().zip(&dx))
                                    .for_each(|(p, (a, d))| *p = a + t * d);
                                self.forward_slopes(&point, k, &mut s);
                                self.input_gradient(k, &mut s, &mut g);
                                let w = weight * h / 2.0;
                                out.iter_mut()
                                    .zip(g.iter().zip(&dx))
                                    .for_each(|(o, (g, d))| *o += w * g * d);
                            }
                        }
                    }
                    let gap = target - out.iter().sum::<f64>();
                    let next_cost = (16 * panels as u64).saturating_mul(self.pass_cost());
                    if gap.abs() <= 1e-12 * scale || next_cost > WORK_BUDGET {
                        break 8 * panels;
                    }
                    panels *= 2;
                }
            }
        };
        let residual = target - out.iter().sum::<f64>();
        Ok(PathAttribution {
            per_feature: out,
            residual,
            evaluations,
        })
    }

    /// The ReLU path, piece by piece: at `t`, every unit's pre-activation and its derivative
    /// along the path are carried through the layers under the activation pattern just after
    /// `t`; the next kink is the nearest `t` where one of them changes sign; on `[t, next]`
    /// the gradient is that pattern's. Returns the pieces walked.
    fn walk_pieces(
        &self,
        x0: &[f64],
        dx: &[f64],
        k: usize,
        s: &mut Scratch,
        g: &mut [f64],
        out: &mut [f64],
    ) -> usize {
        let max_pieces = (WORK_BUDGET / (2 * self.pass_cost())).clamp(16, 1 << 20) as usize;
        let n0 = self.sizes[0];
        let last = self.n_layers() - 1;
        let (mut t, mut pieces) = (0.0f64, 0usize);
        while t < 1.0 {
            s.a[..n0]
                .iter_mut()
                .zip(x0.iter().zip(dx))
                .for_each(|(a, (b, d))| *a = b + t * d);
            s.da[..n0].copy_from_slice(dx);
            let mut step = 1.0 - t;
            for l in 0..last {
                let (n_in, n_out) = (self.sizes[l], self.sizes[l + 1]);
                self.layer_into(l, &s.a[..n_in], true, &mut s.z);
                self.layer_into(l, &s.da[..n_in], false, &mut s.dz);
                for j in 0..n_out {
                    let (p, q) = (s.z[j], s.dz[j]);
                    let active = p > 0.0 || (p == 0.0 && q > 0.0);
                    if (p > 0.0 && q < 0.0) || (p < 0.0 && q > 0.0) {
                        step = step.min(-p / q);
                    }
                    s.slopes[l][j] = f64::from(u8::from(active));
                    s.a[j] = if active { p } else { 0.0 };
                    s.da[j] = if active { q } else { 0.0 };
                }
            }
            pieces += 1;
            // The last piece allowed runs to the end under its pattern (the residual says
            // what that costs); a step below t's precision still moves on.
            let end = if pieces >= max_pieces {
                1.0
            } else {
                (t + step).min(1.0).max(t.next_up())
            };
            self.input_gradient(k, s, g);
            let len = end - t;
            out.iter_mut()
                .zip(g.iter().zip(dx))
                .for_each(|(o, (g, d))| *o += g * d * len);
            t = end;
        }
        pieces
    }
}
