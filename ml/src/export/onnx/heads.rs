//! The model's arithmetic on the features (linear, factorization machine, network: its outputs
//! `double [N, K]`) and the graph's outputs from them: `predict`, and `decision` and `proba`
//! where the kind has them.

use super::graph::{copy, int, Graph};
use super::proto::{tensor_type, ValueInfoProto, FLOAT64, INT64, STRING};
use super::{DECISION, PREDICT, PROBA};
use crate::export::ExportError;
use crate::model::{Labels, ModelKind};
use crate::network::Activation;
use crate::trained::Layer;

/// The label values of the classes, by class index.
pub enum ClassValues<'a> {
    None,
    Numbers(&'a [f64]),
    Texts(&'a [String]),
}

/// The outputs a kind has, in order.
pub fn outputs(kind: ModelKind) -> Vec<&'static str> {
    let mut out = vec![PREDICT];
    if kind.has_decision_value() {
        out.push(DECISION);
    }
    if kind.has_proba() {
        out.push(PROBA);
    }
    out
}

/// The model's outputs on `x` (`double [N, n_features]`), from its layers and its stored shape
/// (as `export::arithmetic` tells the families apart).
pub fn arithmetic(
    g: &mut Graph,
    x: &str,
    layers: Vec<crate::trained::Layer>,
    shape: (Option<Vec<usize>>, Option<Activation>),
) -> Result<String, ExportError> {
    match shape {
        (_, Some(activation)) => network(g, x, layers, activation),
        (Some(_), None) => {
            let mut layers = layers.into_iter();
            match (layers.next(), layers.next()) {
                (Some(linear), Some(factors)) => fm(g, x, linear, factors),
                _ => Err(ExportError::NotFinite),
            }
        }
        (None, None) => match layers.into_iter().next() {
            Some(layer) => Ok(affine(g, x, layer, "outputs")),
            None => Err(ExportError::NotFinite),
        },
    }
}

/// `x · W + b` of a layer (weights input-major: `[inputs, outputs]` row-major, as ONNX's
/// `MatMul` reads its second operand).
fn affine(g: &mut Graph, x: &str, layer: Layer, what: &str) -> String {
    let (d, k) = (layer.inputs, layer.outputs);
    let w = g.doubles(&format!("{what}.weights"), &[d, k], layer.weights);
    let b = g.doubles(&format!("{what}.biases"), &[k], layer.biases);
    let xw = g.op("MatMul", &[x, &w], &format!("{what}.product"));
    g.op("Add", &[&xw, &b], what)
}

/// A network's layers, the hidden activation between them.
fn network(
    g: &mut Graph,
    x: &str,
    layers: Vec<Layer>,
    activation: Activation,
) -> Result<String, ExportError> {
    let last = layers.len().saturating_sub(1);
    let mut h = x.to_owned();
    for (l, layer) in layers.into_iter().enumerate() {
        if l == last {
            return Ok(affine(g, &h, layer, "outputs"));
        }
        let z = affine(g, &h, layer, &format!("layer{}", l + 1));
        let op = match activation {
            Activation::Relu => "Relu",
            Activation::Tanh => "Tanh",
        };
        h = g.op(op, &[&z], &format!("layer{}.{}", l + 1, op.to_lowercase()));
    }
    Err(ExportError::NotFinite)
}

/// A factorization machine (`fm::Machine::output`): per output `k`, `b_k + Σ_j w_jk·x_j +
/// ½·Σ_f ((Σ_j v_jkf·x_j)² − Σ_j v_jkf²·x_j²)`.
fn fm(g: &mut Graph, x: &str, linear: Layer, factors: Layer) -> Result<String, ExportError> {
    let (d, k) = (linear.inputs, linear.outputs);
    let f = factors.outputs / k.max(1);
    let biases = copy(&linear.biases).map_err(|_| ExportError::OutOfMemory)?;
    let w = g.doubles("linear.weights", &[d, k], linear.weights);
    let b = g.doubles("biases", &[1, k], biases);
    let xw = g.op("MatMul", &[x, &w], "linear.product");
    let lin = g.op("Add", &[&b, &xw], "linear");
    if f == 0 {
        return Ok(lin);
    }
    let mut squares = Vec::new();
    squares
        .try_reserve_exact(factors.weights.len())
        .map_err(|_| ExportError::OutOfMemory)?;
    squares.extend(factors.weights.iter().map(|v| v * v));
    // Factors `[inputs, outputs · factors]`: input j's factors of output 1, then of output 2...
    let v = g.doubles("factors", &[d, k * f], factors.weights);
    let v2 = g.doubles("factors.squared", &[d, k * f], squares);
    let s = g.op("MatMul", &[x, &v], "factor_sums");
    let s2 = g.op("Mul", &[&s, &s], "factor_sums.squared");
    let x2 = g.op("Mul", &[x, x], "features.squared");
    let q = g.op("MatMul", &[&x2, &v2], "factor_squares");
    let pairs = g.op("Sub", &[&s2, &q], "pairs");
    let shape = g.int64s("shape", &[3], vec![0, k as i64, f as i64]);
    let per_output = g.op("Reshape", &[&pairs, &shape], "pairs.by_output");
    let axes = g.int64s("axes", &[1], vec![2]);
    let sum = g.op_with(
        "ReduceSum",
        &[&per_output, &axes],
        vec![int("keepdims", 0)],
        "pairs.sum",
    );
    let half = g.scalar("half", 0.5);
    let half_sum = g.op("Mul", &[&half, &sum], "pairs.half");
    Ok(g.op("Add", &[&lin, &half_sum], "outputs"))
}

/// The graph's outputs from the model's outputs `z` (`double [N, n_out]`): rows marked
/// `missing` (`bool [N, 1]`) get NaN (and, for text classes, the empty string).
pub fn head(
    g: &mut Graph,
    kind: ModelKind,
    n_out: usize,
    z: &str,
    missing: Option<String>,
    classes: &ClassValues,
) -> Result<Vec<ValueInfoProto>, ExportError> {
    let mut out = Vec::new();
    let labels = kind.labels();
    let flat = match (labels, &missing) {
        (Labels::Classes, None) => String::new(),
        _ => g.int64s("flat", &[1], vec![-1]),
    };
    let nan = match missing {
        Some(_) => g.scalar("nan", f64::NAN),
        None => String::new(),
    };
    let missing_rows = missing
        .as_ref()
        .map(|m| g.op("Reshape", &[m, &flat], "missing.rows"));
    let value = |g: &mut Graph, name: &str, v: &str| -> String {
        match &missing_rows {
            Some(m) => g.node_to("", "Where", &[m, &nan, v], Vec::new(), name.to_owned()),
            None => g.node_to("", "Identity", &[v], Vec::new(), name.to_owned()),
        }
    };
    // The decision value (one output).
    if labels != Labels::Classes {
        let z1 = g.op("Reshape", &[z, &flat], "decision.value");
        if labels == Labels::Number {
            value(g, PREDICT, &z1);
            out.push(info(
                PREDICT,
                FLOAT64,
                None,
                "the predicted value (corgipile_predict)",
            ));
        }
        value(g, DECISION, &z1);
        out.push(info(
            DECISION,
            FLOAT64,
            None,
            "the decision value (corgipile_decision_function)",
        ));
    }
    // The class.
    if labels != Labels::Number {
        let index = if labels == Labels::TwoClasses {
            let z1 = g.op("Reshape", &[z, &flat], "decision.value");
            let zero = g.scalar("zero", 0.0);
            let positive = g.op("GreaterOrEqual", &[&z1, &zero], "positive");
            g.cast(&positive, INT64, "class")
        } else {
            g.op_with(
                "ArgMax",
                &[z],
                vec![
                    int("axis", 1),
                    int("keepdims", 0),
                    int("select_last_index", 0),
                ],
                "class",
            )
        };
        // A missing row's class is one past the last: NaN or the empty string.
        let n = if labels == Labels::TwoClasses {
            2
        } else {
            n_out
        };
        let index = match &missing_rows {
            Some(m) => {
                let past = g.int64s("no_class", &[], vec![n as i64]);
                g.select(m, &past, &index, "class")
            }
            None => index,
        };
        let (values, elem_type) = match classes {
            ClassValues::Numbers(v) => {
                let mut values = copy(v).map_err(|_| ExportError::OutOfMemory)?;
                values.push(f64::NAN);
                (g.doubles("classes", &[n + 1], values), FLOAT64)
            }
            ClassValues::Texts(t) => {
                let mut values = Vec::new();
                values
                    .try_reserve_exact(n + 1)
                    .map_err(|_| ExportError::OutOfMemory)?;
                values.extend(t.iter().map(|k| k.as_bytes().to_vec()));
                values.push(Vec::new());
                (g.texts("classes", &[n + 1], values), STRING)
            }
            ClassValues::None => {
                return Err(ExportError::Classes {
                    classes: 0,
                    outputs: n,
                })
            }
        };
        g.node_to(
            "",
            "Gather",
            &[&values, &index],
            vec![int("axis", 0)],
            PREDICT.to_owned(),
        );
        out.insert(
            0,
            info(
                PREDICT,
                elem_type,
                None,
                "the predicted class, as its label value (corgipile_predict; text labels: corgipile_predict_class)",
            ),
        );
    }
    // The probabilities.
    if kind.has_proba() {
        let p = if labels == Labels::TwoClasses {
            // corgipile's sigmoid (exp only of values <= 0), not ONNX's `Sigmoid`, which
            // onnxruntime computes to an absolute, not a relative, precision: 0 for
            // sigmoid(-40) = 4.2e-18.
            let negative = g.op("Neg", &[z], "negative");
            let magnitude = g.op("Abs", &[z], "magnitude");
            let minus = g.op("Neg", &[&magnitude], "minus_magnitude");
            let tail = g.op("Exp", &[&minus], "tail");
            let one = g.scalar("one", 1.0);
            let denominator = g.op("Add", &[&one, &tail], "denominator");
            let zero = g.scalar("zero", 0.0);
            let mut p = Vec::new();
            for (t, what) in [(negative.as_str(), "proba.negative"), (z, "proba.positive")] {
                let below = g.op("Min", &[t, &zero], what);
                let numerator = g.op("Exp", &[&below], what);
                p.push(g.op("Div", &[&numerator, &denominator], what));
            }
            g.op_with("Concat", &[&p[0], &p[1]], vec![int("axis", 1)], "proba")
        } else {
            g.op_with("Softmax", &[z], vec![int("axis", 1)], "proba")
        };
        match &missing {
            Some(m) => g.node_to("", "Where", &[m, &nan, &p], Vec::new(), PROBA.to_owned()),
            None => g.node_to("", "Identity", &[&p], Vec::new(), PROBA.to_owned()),
        };
        out.push(info(
            PROBA,
            FLOAT64,
            Some(if labels == Labels::TwoClasses {
                2
            } else {
                n_out
            }),
            "the probability of each class, in the classes' order (corgipile_predict_proba)",
        ));
    }
    Ok(out)
}

/// An output's value info: `[N]`, or `[N, classes]`.
fn info(name: &str, elem_type: i32, classes: Option<usize>, doc: &str) -> ValueInfoProto {
    ValueInfoProto {
        name: name.to_owned(),
        r#type: Some(match classes {
            Some(k) => tensor_type(elem_type, &[None, Some(k)]),
            None => tensor_type(elem_type, &[None]),
        }),
        doc_string: doc.to_owned(),
    }
}
