//! A trained model as an ONNX model (the bytes of a `ModelProto`): standard ONNX operators
//! (opset 17) and ONNX-ML's `LabelEncoder` (ai.onnx.ml opset 3), every number a double, so
//! that onnxruntime (or any ONNX runtime) scores a row as `corgipile_predict` does.
//!
//! - **Inputs**: a column-list model has one input per column, in the training's order, named
//!   after the column: a number (or boolean, as 0/1) is `double [N, 1]`, NaN standing for
//!   NULL; a text column `string [N, 1]`, the empty string standing for NULL (unless the empty
//!   string is one of the column's categories: then it is that category); an array column
//!   `double [N, len]`, a NaN element imputed with its stored fill. An array model has one
//!   input `double [N, n_features]` named after its column. An input named like an output
//!   gets `:input` appended.
//! - **Preprocessing** ([`inputs`]): imputation as `IsNaN`/`Where` with the stored fill,
//!   one-hot categories as `LabelEncoder` (category → slot, unseen → `(other)`, NULL →
//!   `(null)`) then `Equal` and `Cast`, piecewise-linear bins as `Sub`/`Div`/`Max`/`Min`.
//!   No scaling: the stored weights are in the table's units (standardization is folded into
//!   them). ONNX-ML's `Imputer`, `Scaler` and `OneHotEncoder` compute in float32 (or output
//!   it), which would lose the agreement with corgipile: standard operators on doubles do
//!   their work; the features are then the very doubles corgipile computes.
//! - **Model** ([`heads`]): `MatMul`/`Add` for a linear model; for a factorization machine
//!   the same plus `½(Σ_f (x·V_f)² − x²·V_f²)` (`MatMul`, `Mul`, `Sub`, `Reshape`,
//!   `ReduceSum`); a network's layers as `MatMul`/`Add` and `Relu` or `Tanh`.
//! - **Outputs**: `predict` `[N]` (the class as its label value, `double` for numbers and
//!   booleans, `string` for text; a regression's value), `decision` `[N]` (the kinds with one
//!   output: what `corgipile_decision_function` returns) and `proba` `[N, classes]` (what
//!   `corgipile_predict_proba` returns: `logistic` and the kinds with one output per class).
//!   A row with a NULL (NaN, empty string) in a column trained with `"impute": "skip"` or
//!   `"error"` gets NaN in `decision` and `proba` and NaN or the empty string in `predict`
//!   (where `corgipile_predict` returns NULL or raises).
//!
//! Not exportable ([`ExportError`]): hashed text columns (the FNV-1a hash has no ONNX
//! operator), date/time columns (ONNX has no date or time type), and, refused by the caller,
//! sparse (indices, values) models and per-group families.
//!
//! Files: `proto` (the ONNX messages, prost), `graph` (a graph under construction), `inputs`
//! (the preprocessing), `heads` (the model's arithmetic and its outputs).

use prost::Message as _;

use super::{Classes, ExportError, Inputs};
use crate::model::{Labels, Predictor};
use crate::preprocess::{Encoding, Impute, Source};
use crate::trained::Model;

mod graph;
mod heads;
mod inputs;
pub mod proto;

use graph::Graph;
use proto::{
    tensor_type, GraphProto, ModelProto, OperatorSetIdProto, StringStringEntryProto,
    ValueInfoProto, FLOAT64, STRING,
};

/// The standard opset and the ONNX-ML opset the graph is written for, and the IR version of
/// that opset (onnxruntime 1.14 and later read them).
pub const OPSET: i64 = 17;
pub const ML_OPSET: i64 = 3;
pub const IR_VERSION: i64 = 8;

/// The names of the outputs.
pub const PREDICT: &str = "predict";
pub const DECISION: &str = "decision";
pub const PROBA: &str = "proba";

/// An ONNX export to build.
pub struct OnnxExport<'a> {
    pub model: &'a Model,
    pub inputs: Inputs<'a>,
    pub classes: Classes<'a>,
    /// The graph's name (the model's name or id).
    pub name: &'a str,
    /// corgipile's version, written as the producer's.
    pub producer_version: &'a str,
    /// The most bytes the model may have (checked on an estimate before anything is built,
    /// then on the exact size before it is written).
    pub max_bytes: u64,
}

/// Bytes a parameter takes (a double in a packed field), a factor of a factorization machine
/// twice (its value and its square).
const PARAM_BYTES: u64 = 8;

/// The bytes the model may take, from its parameters, the preprocessing's categories and bins
/// and the classes: what the limit is checked on before anything is built.
pub fn estimate(e: &OnnxExport) -> u64 {
    let mut bytes = 4096u64;
    let params = e.model.n_params() as u64;
    bytes = bytes.saturating_add(params.saturating_mul(PARAM_BYTES));
    if let (Some(_), None) = e.model.shape() {
        // A factorization machine's factors again, squared.
        bytes = bytes.saturating_add(params.saturating_mul(PARAM_BYTES));
    }
    if let Inputs::Columns(p) = &e.inputs {
        for c in &p.columns {
            // The input, its nodes and their names (each names its column).
            bytes = bytes.saturating_add(2048 + 24 * c.name.len() as u64);
            bytes = bytes.saturating_add(match &c.encoding {
                Encoding::OneHot { categories, .. } => {
                    categories.iter().map(|k| k.len() as u64 + 24).sum::<u64>()
                        + 16 * categories.len() as u64
                }
                Encoding::Ple { edges, .. } => 4 * PARAM_BYTES * edges.len() as u64,
                Encoding::Array { fill, .. } => PARAM_BYTES * fill.len() as u64,
                _ => 0,
            });
        }
    }
    if let Classes::Texts(t) = &e.classes {
        bytes = bytes.saturating_add(t.iter().map(|k| 2 * k.len() as u64 + 32).sum::<u64>());
    }
    if let Classes::Numbers(v) = &e.classes {
        bytes = bytes.saturating_add(32 * v.len() as u64);
    }
    bytes
}

/// What an input holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Numbers(usize),
    Text,
}

/// The bytes of the ONNX model of `e` (see the module).
pub fn export_onnx(e: &OnnxExport) -> Result<Vec<u8>, ExportError> {
    let estimated = estimate(e);
    if estimated > e.max_bytes {
        return Err(ExportError::TooLarge {
            bytes: estimated,
            limit: e.max_bytes,
        });
    }
    if let Inputs::Columns(p) = &e.inputs {
        for c in &p.columns {
            match &c.encoding {
                Encoding::Hash { .. } => {
                    return Err(ExportError::HashedOnnx {
                        column: c.name.clone(),
                    })
                }
                Encoding::Time { .. } => {
                    return Err(ExportError::TimeOnnx {
                        column: c.name.clone(),
                    })
                }
                _ => {}
            }
        }
    }
    let model = e.model;
    let kind = model.kind();
    let labels = kind.labels();
    let n_out = model.n_outputs();
    let wanted = match labels {
        Labels::Number => 0,
        Labels::TwoClasses => 2,
        Labels::Classes => n_out,
    };
    let classes = match (&e.classes, labels) {
        (_, Labels::Number) => heads::ClassValues::None,
        (Classes::Numbers(v), _) if v.len() == wanted => {
            if !v.iter().all(|c| c.is_finite()) {
                return Err(ExportError::NotFinite);
            }
            heads::ClassValues::Numbers(v)
        }
        (Classes::Texts(t), _) if t.len() == wanted => heads::ClassValues::Texts(t),
        (c, _) => {
            return Err(ExportError::Classes {
                classes: match c {
                    Classes::None => 0,
                    Classes::Numbers(v) => v.len(),
                    Classes::Texts(t) => t.len(),
                },
                outputs: wanted,
            })
        }
    };
    let layers = model.layers().map_err(|_| ExportError::OutOfMemory)?;
    if layers
        .iter()
        .any(|l| !l.weights.iter().chain(&l.biases).all(|v| v.is_finite()))
    {
        return Err(ExportError::NotFinite);
    }

    // The inputs: one per column (or the array), named after it.
    let outputs = heads::outputs(kind);
    let columns: Vec<(String, Kind, String)> = match &e.inputs {
        Inputs::Columns(p) => p
            .columns
            .iter()
            .map(|c| {
                let kind = match (&c.source, &c.encoding) {
                    (Source::Text, _) => Kind::Text,
                    (_, Encoding::Array { fill, .. }) => Kind::Numbers(fill.len()),
                    _ => Kind::Numbers(1),
                };
                (c.name.clone(), kind, inputs::describe(c))
            })
            .collect(),
        Inputs::Array { column } => vec![(
            (*column).to_owned(),
            Kind::Numbers(model.n_features()),
            format!(
                "column \"{column}\": the {} features of a row (float8[]); NaN or Infinity gives NaN or Infinity",
                model.n_features()
            ),
        )],
    };
    let names = input_names(columns.iter().map(|c| c.0.as_str()), &outputs);
    let mut g = Graph::new(names.iter().map(String::as_str));
    let features = match &e.inputs {
        Inputs::Columns(p) => inputs::columns(&mut g, p, &names)?,
        Inputs::Array { .. } => inputs::Features {
            x: names[0].clone(),
            missing: None,
        },
    };
    let z = heads::arithmetic(&mut g, &features.x, layers, model.shape())?;
    let out = heads::head(&mut g, kind, n_out, &z, features.missing, &classes)?;

    let input = columns
        .iter()
        .zip(&names)
        .map(|((_, kind, doc), name)| ValueInfoProto {
            name: name.clone(),
            r#type: Some(match kind {
                Kind::Numbers(n) => tensor_type(FLOAT64, &[None, Some(*n)]),
                Kind::Text => tensor_type(STRING, &[None, Some(1)]),
            }),
            doc_string: doc.clone(),
        })
        .collect();
    let graph = GraphProto {
        node: g.nodes,
        name: e.name.to_owned(),
        initializer: g.initializers,
        doc_string: format!(
            "corgipile {} model {}: inputs {}; outputs {}",
            kind.name(),
            e.name,
            names.join(", "),
            out.iter()
                .map(|o| o.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        input,
        output: out,
    };
    let mut metadata = vec![("corgipile.kind", kind.name().to_owned())];
    match classes {
        heads::ClassValues::Numbers(v) => metadata.push((
            "corgipile.classes",
            serde_json::to_string(v).map_err(|_| ExportError::NotFinite)?,
        )),
        heads::ClassValues::Texts(t) => metadata.push((
            "corgipile.classes",
            serde_json::to_string(t).map_err(|_| ExportError::OutOfMemory)?,
        )),
        heads::ClassValues::None => {}
    }
    let m = ModelProto {
        ir_version: IR_VERSION,
        opset_import: vec![
            OperatorSetIdProto {
                domain: String::new(),
                version: OPSET,
            },
            OperatorSetIdProto {
                domain: graph::ML_DOMAIN.to_owned(),
                version: ML_OPSET,
            },
        ],
        producer_name: "corgipile".to_owned(),
        producer_version: e.producer_version.to_owned(),
        domain: String::new(),
        model_version: 1,
        doc_string: String::new(),
        graph: Some(graph),
        metadata_props: metadata
            .into_iter()
            .map(|(key, value)| StringStringEntryProto {
                key: key.to_owned(),
                value,
            })
            .collect(),
    };
    let bytes = m.encoded_len() as u64;
    if bytes > e.max_bytes {
        return Err(ExportError::TooLarge {
            bytes,
            limit: e.max_bytes,
        });
    }
    let mut buf = Vec::new();
    buf.try_reserve_exact(bytes as usize)
        .map_err(|_| ExportError::OutOfMemory)?;
    m.encode(&mut buf).map_err(|_| ExportError::OutOfMemory)?;
    Ok(buf)
}

/// The inputs' names: the columns' own, but one named like an output (or like an earlier
/// input, after that renaming) gets `:input` appended until it is unique.
fn input_names<'a>(columns: impl Iterator<Item = &'a str>, outputs: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for c in columns {
        let mut name = c.to_owned();
        while outputs.contains(&name.as_str()) || names.contains(&name) {
            name.push_str(":input");
        }
        names.push(name);
    }
    names
}

/// Whether a NULL in the column is no row (`skip`) or an error: the outputs are then NaN.
fn no_prediction(impute: Impute) -> bool {
    matches!(impute, Impute::Skip | Impute::Error)
}

#[cfg(test)]
mod tests;
