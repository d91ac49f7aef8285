//! The exported function's model arithmetic: a linear model's, a factorization machine's or a
//! network's outputs into `_z`, adding the terms in the order corgipile adds them.

use super::*;

impl Writer {
    /// A linear model's outputs into `_z`: weights input-major (`layer.weights[j * K + k]`).
    /// A dense row adds its terms in four lanes and a tail (`row::dot`); a column list's
    /// (sparse) row one by one; then the bias.
    pub(super) fn linear(&mut self, layer: &Layer, dense: bool) -> Result<(), ExportError> {
        let (d, k_out) = (layer.inputs, layer.outputs);
        for k in 0..k_out {
            let term = |j: usize| -> Option<Result<String, ExportError>> {
                let w = layer.weights[j * k_out + k];
                (w != 0.0).then(|| num(w).map(|w| format!("{w} * _x[{}]", j + 1)))
            };
            let bias = num(layer.biases[k])?;
            if dense {
                let full = d - d % 4;
                for lane in 0..4 {
                    let terms = (lane..full)
                        .step_by(4)
                        .filter_map(term)
                        .collect::<Result<Vec<_>, _>>()?;
                    self.sum(&format!("_l{lane}"), "0", terms.into_iter());
                }
                let rest = (full..d).filter_map(term).collect::<Result<Vec<_>, _>>()?;
                self.sum("_t", "0", rest.into_iter());
                self.line(&format!(
                    "_z[{}] := ((_l0 + _l1) + (_l2 + _l3)) + _t + {bias};",
                    k + 1
                ));
            } else {
                let terms = (0..d).filter_map(term).collect::<Result<Vec<_>, _>>()?;
                self.sum("_t", "0", terms.into_iter());
                self.line(&format!("_z[{}] := _t + {bias};", k + 1));
            }
        }
        Ok(())
    }

    /// A factorization machine's outputs (`fm::Machine::output`): per output, the linear
    /// terms, each factor's sum, the squares (input by input, factor by factor), then
    /// `bias + linear + ½(Σ sums² − squares)`.
    pub(super) fn fm(&mut self, linear: &Layer, factors: &Layer) -> Result<(), ExportError> {
        let (d, k_out) = (linear.inputs, linear.outputs);
        let f = factors.outputs / k_out.max(1);
        let v = |j: usize, k: usize, q: usize| factors.weights[j * k_out * f + k * f + q];
        for k in 0..k_out {
            let terms = (0..d)
                .filter(|&j| linear.weights[j * k_out + k] != 0.0)
                .map(|j| num(linear.weights[j * k_out + k]).map(|w| format!("{w} * _x[{}]", j + 1)))
                .collect::<Result<Vec<_>, _>>()?;
            self.sum("_t", "0", terms.into_iter());
            self.line(&format!(
                "_p := array_fill(0::float8, ARRAY[{}]);",
                f.max(1)
            ));
            let mut squares = Vec::new();
            for q in 0..f {
                let mut terms = Vec::new();
                for j in 0..d {
                    if v(j, k, q) != 0.0 {
                        terms.push(format!("{} * _x[{}]", num(v(j, k, q))?, j + 1));
                    }
                }
                self.sum(&format!("_p[{}]", q + 1), "0", terms.into_iter());
            }
            for j in 0..d {
                for q in 0..f {
                    if v(j, k, q) != 0.0 {
                        let vx = format!("({} * _x[{}])", num(v(j, k, q))?, j + 1);
                        squares.push(format!("{vx} * {vx}"));
                    }
                }
            }
            self.sum("_q", "0", squares.into_iter());
            let pairs: Vec<String> = (1..=f).map(|q| format!("_p[{q}] * _p[{q}]")).collect();
            self.sum("_r", "0", pairs.into_iter());
            self.line(&format!(
                "_z[{}] := ({} + _t) + 0.5 * (_r - _q);",
                k + 1,
                num(linear.biases[k])?
            ));
        }
        Ok(())
    }

    /// A network's layers (`network::NetworkModel::forward_row`): each output its bias plus
    /// its inputs' terms in input order, the hidden activation between layers.
    pub(super) fn network(
        &mut self,
        layers: &[Layer],
        activation: Activation,
    ) -> Result<(), ExportError> {
        let last = layers.len() - 1;
        for (l, layer) in layers.iter().enumerate() {
            let input = if l == 0 { "_x" } else { "_h" };
            let output = if l == last { "_z" } else { "_g" };
            if l != last {
                self.line(&format!(
                    "_g := array_fill(0::float8, ARRAY[{}]);",
                    layer.outputs
                ));
            }
            for o in 0..layer.outputs {
                let terms = (0..layer.inputs)
                    .filter(|&j| layer.weights[j * layer.outputs + o] != 0.0)
                    .map(|j| {
                        num(layer.weights[j * layer.outputs + o])
                            .map(|w| format!("{w} * {input}[{}]", j + 1))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                self.sum("_t", &num(layer.biases[o])?, terms.into_iter());
                let value = match (l == last, activation) {
                    (true, _) => "_t",
                    (false, Activation::Relu) => "GREATEST(_t, 0)",
                    (false, Activation::Tanh) => "tanh(_t)",
                };
                self.line(&format!("{output}[{}] := {value};", o + 1));
            }
            if l != last {
                self.line("_h := _g;");
            }
        }
        Ok(())
    }
}
