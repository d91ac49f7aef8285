//! A trained model as the text of a `CREATE FUNCTION` statement: a PL/pgSQL function (no
//! extension, no other language) that scores a row exactly as the model does. Its arguments
//! are the model's columns in order (a column-list model) or one `float8[]` (an array model);
//! its body applies the stored preprocessing (imputation, one-hot categories with their
//! `(other)` and `(null)` slots, piecewise-linear bins, date/time parts) into a feature array,
//! then the model's arithmetic in the order corgipile adds its terms (so that linear models
//! agree to the last bit or nearly), then the head: a class (by the stored label values), a
//! value, the decision value or the probabilities.
//!
//! Not exportable: hashed text columns (the hash is 64-bit wrapping arithmetic plain SQL does
//! not have), sparse (indices, values) models, per-group models (the caller refuses those).
//! Files: `quote` (identifiers, literals, numbers, the dollar quote), `columns` (the
//! preprocessing of each argument), `arithmetic` (linear, fm and network outputs); `onnx` (the
//! same model as the bytes of an ONNX model, from the same [`Inputs`] and [`Classes`]).

use std::fmt::Write as _;

use crate::model::{Labels, Predictor};
use crate::network::Activation;
use crate::preprocess::{Encoding, Impute, Preprocessor, Source, TimeKind, TimePart};
use crate::trained::{Layer, Model};

mod arithmetic;
mod columns;
pub mod onnx;
pub mod quote;

/// What the model reads.
pub enum Inputs<'a> {
    /// A column list: one argument per column.
    Columns(&'a Preprocessor),
    /// One array column (`n_features` elements), one `float8[]` argument named after it.
    Array { column: &'a str },
}

/// The label values of a classifier's classes, by class index (two classes: negative,
/// positive).
pub enum Classes<'a> {
    /// A regression.
    None,
    Numbers(&'a [f64]),
    Texts(&'a [String]),
}

/// What the exported function returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// What `corgipile_predict` returns: the class (its label value, a number or text) or the
    /// value.
    Predict,
    /// What `corgipile_decision_function` returns (kinds with one output).
    Decision,
    /// What `corgipile_predict_proba` returns (logistic and the kinds with one output per
    /// class).
    Proba,
}

impl Output {
    pub const NAMES: [&'static str; 3] = ["predict", "decision", "proba"];

    pub fn parse(name: &str) -> Option<Output> {
        match name {
            "predict" => Some(Output::Predict),
            "decision" => Some(Output::Decision),
            "proba" => Some(Output::Proba),
            _ => None,
        }
    }
}

/// An export to write.
pub struct Export<'a> {
    /// The function's name (quoted as one identifier).
    pub function: &'a str,
    pub model: &'a Model,
    pub inputs: Inputs<'a>,
    pub classes: Classes<'a>,
    pub output: Output,
    /// The most bytes the text may have (checked on an estimate before anything is written,
    /// and on the text).
    pub max_bytes: u64,
}

/// Why a model cannot be exported.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ExportError {
    #[error(
        "column \"{column}\" is hashed into buckets, which a plain SQL function cannot reproduce"
    )]
    Hashed { column: String },
    #[error("column \"{column}\" is hashed into buckets, which no ONNX operator reproduces")]
    HashedOnnx { column: String },
    #[error("column \"{column}\" is a date/time column, and ONNX has no date or time type")]
    TimeOnnx { column: String },
    #[error("the export would take {bytes} bytes, more than the limit of {limit}")]
    TooLarge { bytes: u64, limit: u64 },
    #[error("the model holds a parameter that is NaN or Infinity")]
    NotFinite,
    #[error("the function name is empty")]
    EmptyName,
    #[error("a {kind} model has no {output} output")]
    NoSuchOutput {
        kind: &'static str,
        output: &'static str,
    },
    #[error("the model's {classes} stored classes do not match its {outputs} outputs")]
    Classes { classes: usize, outputs: usize },
    #[error("out of memory listing the model's weights")]
    OutOfMemory,
}

/// Terms added in one statement (a longer chain of `+` would make a deep expression tree).
const CHAIN: usize = 64;

/// Bytes a weight's term may take in the text (`+ '<25 chars>'::float8 * _x[<7 digits>]`),
/// with the statements' overhead: the estimate's unit.
const TERM_BYTES: u64 = 64;

/// The bytes the text of `e` may take, from the model's parameters and the preprocessing's
/// categories and bins: what the limit is checked on before anything is built.
pub fn estimate(e: &Export) -> u64 {
    let model = e.model;
    // A factorization machine's factor appears twice (in its sum and in the squares).
    let per_param = match arithmetic(model) {
        Arithmetic::Fm => 2 * TERM_BYTES + 16,
        _ => TERM_BYTES,
    };
    let mut bytes = 4096u64.saturating_add((model.n_params() as u64).saturating_mul(per_param));
    if let Inputs::Columns(p) = &e.inputs {
        for c in &p.columns {
            bytes = bytes.saturating_add(1024 + 4 * c.name.len() as u64);
            bytes = bytes.saturating_add(match &c.encoding {
                Encoding::OneHot { categories, .. } => categories
                    .iter()
                    .map(|k| 4 * k.len() as u64 + 8)
                    .sum::<u64>(),
                Encoding::Ple { edges, .. } => 256 * edges.len() as u64,
                Encoding::Array { fill, .. } => 32 * fill.len() as u64,
                _ => 0,
            });
        }
    }
    if let Classes::Texts(t) = &e.classes {
        bytes = bytes.saturating_add(t.iter().map(|k| 4 * k.len() as u64 + 8).sum::<u64>());
    }
    bytes
}

/// Which arithmetic a model does, from the shape its stored form has (no second table of
/// kinds): layers and a hidden activation, a network; layers alone (`[n, factors, outputs]`), a
/// factorization machine; neither, a linear model.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Arithmetic {
    Linear,
    Fm,
    Network(Activation),
}

fn arithmetic(model: &Model) -> Arithmetic {
    match model.shape() {
        (_, Some(activation)) => Arithmetic::Network(activation),
        (Some(_), None) => Arithmetic::Fm,
        (None, None) => Arithmetic::Linear,
    }
}

/// Internal variables of the body (parameters are read as `$n`; their names are left out when
/// one would clash with these).
const VARIABLES: [&str; 20] = [
    "_x", "_z", "_v", "_s", "_r", "_t", "_q", "_a", "_h", "_g", "_p", "_e", "_k", "_i", "_d", "_m",
    "_l0", "_l1", "_l2", "_l3",
];

/// The text of `CREATE FUNCTION` for `e` (see the module).
pub fn export_sql(e: &Export) -> Result<String, ExportError> {
    if e.function.is_empty() {
        return Err(ExportError::EmptyName);
    }
    let estimated = estimate(e);
    if estimated > e.max_bytes {
        return Err(ExportError::TooLarge {
            bytes: estimated,
            limit: e.max_bytes,
        });
    }
    let model = e.model;
    let kind = model.kind();
    let labels = kind.labels();
    let n_out = model.n_outputs();
    // What the function returns, and the classes' literals.
    let (returns, classes) = match (e.output, labels) {
        (Output::Decision, Labels::Classes) => {
            return Err(ExportError::NoSuchOutput {
                kind: kind.name(),
                output: "decision",
            })
        }
        (Output::Proba, _) if !kind.has_proba() => {
            return Err(ExportError::NoSuchOutput {
                kind: kind.name(),
                output: "proba",
            })
        }
        (Output::Decision, _) => ("float8", Vec::new()),
        (Output::Proba, _) => ("float8[]", Vec::new()),
        (Output::Predict, Labels::Number) => ("float8", Vec::new()),
        (Output::Predict, _) => {
            let wanted = if labels == Labels::TwoClasses {
                2
            } else {
                n_out
            };
            let (returns, literals) = match &e.classes {
                Classes::Numbers(v) => (
                    "float8",
                    v.iter()
                        .map(|&c| quote::float(c).ok_or(ExportError::NotFinite))
                        .collect::<Result<Vec<_>, _>>()?,
                ),
                Classes::Texts(t) => ("text", t.iter().map(|k| quote::literal(k)).collect()),
                Classes::None => ("float8", Vec::new()),
            };
            if literals.len() != wanted {
                return Err(ExportError::Classes {
                    classes: literals.len(),
                    outputs: wanted,
                });
            }
            (returns, literals)
        }
    };
    let layers = model.layers().map_err(|_| ExportError::OutOfMemory)?;
    if layers
        .iter()
        .any(|l| !l.weights.iter().chain(&l.biases).all(|v| v.is_finite()))
    {
        return Err(ExportError::NotFinite);
    }
    let n = model.n_features();

    let mut w = Writer::default();
    // The arguments and the features.
    let (arguments, strict) = match &e.inputs {
        Inputs::Columns(p) => {
            let clash = p
                .columns
                .iter()
                .any(|c| VARIABLES.contains(&c.name.as_str()));
            let mut args = Vec::new();
            for (i, c) in p.columns.iter().enumerate() {
                let t = argument_type(c.source, &c.encoding);
                args.push(if clash {
                    t.to_owned()
                } else {
                    format!("{} {t}", quote::ident(&c.name))
                });
                w.column(i + 1, c, &c.encoding)?;
            }
            (args, false)
        }
        Inputs::Array { column } => {
            let name = if VARIABLES.contains(column) {
                String::new()
            } else {
                format!("{} ", quote::ident(column))
            };
            w.array(n);
            (vec![format!("{name}float8[]")], true)
        }
    };
    // The model.
    let dense = matches!(e.inputs, Inputs::Array { .. });
    match arithmetic(model) {
        Arithmetic::Linear => w.linear(&layers[0], dense)?,
        Arithmetic::Fm => w.fm(&layers[0], &layers[1])?,
        Arithmetic::Network(activation) => w.network(&layers, activation)?,
    }
    // The head.
    match e.output {
        Output::Decision => w.line("RETURN _z[1];"),
        Output::Proba if labels == Labels::TwoClasses => {
            w.line("_t := _z[1];");
            w.line(&format!(
                "RETURN ARRAY[{}, {}];",
                sigmoid("(-_t)"),
                sigmoid("_t")
            ));
        }
        Output::Proba => {
            w.line("_t := _z[1];");
            w.line(&format!("FOR _i IN 2..{n_out} LOOP"));
            w.line("  _t := GREATEST(_t, _z[_i]);");
            w.line("END LOOP;");
            w.line(&format!("_e := array_fill(0::float8, ARRAY[{n_out}]);"));
            w.line("_s := 0;");
            w.line(&format!("FOR _i IN 1..{n_out} LOOP"));
            w.line("  _v := _z[_i] - _t;");
            w.line(&format!("  _e[_i] := {};", exp("_v")));
            w.line("  _s := _s + _e[_i];");
            w.line("END LOOP;");
            w.line("_s := 1 / _s;");
            w.line(&format!("FOR _i IN 1..{n_out} LOOP"));
            w.line("  _e[_i] := _e[_i] * _s;");
            w.line("END LOOP;");
            w.line("RETURN _e;");
        }
        Output::Predict => match labels {
            Labels::Number => w.line("RETURN _z[1];"),
            Labels::TwoClasses => {
                w.line(&format!(
                    "IF _z[1] >= 0 THEN RETURN {}; ELSE RETURN {}; END IF;",
                    classes[1], classes[0]
                ));
            }
            Labels::Classes => {
                // The first largest score, as corgipile's argmax.
                w.line("_k := 1;");
                w.line(&format!("FOR _i IN 2..{n_out} LOOP"));
                w.line("  IF _z[_i] > _z[_k] THEN _k := _i; END IF;");
                w.line("END LOOP;");
                w.line(&format!(
                    "RETURN (ARRAY[{}]::{returns}[])[_k];",
                    classes.join(", ")
                ));
            }
        },
    }

    let mut body = String::new();
    body.push_str("\nDECLARE\n");
    let _ = writeln!(body, "  _x float8[] := array_fill(0::float8, ARRAY[{n}]);");
    let _ = writeln!(
        body,
        "  _z float8[] := array_fill(0::float8, ARRAY[{n_out}]);"
    );
    body.push_str("  _v float8; _s float8; _r float8; _t float8; _q float8;\n");
    body.push_str("  _l0 float8; _l1 float8; _l2 float8; _l3 float8;\n");
    body.push_str("  _a float8[]; _h float8[]; _g float8[]; _p float8[]; _e float8[];\n");
    body.push_str("  _k int4; _i int4; _d int8; _m int8;\n");
    body.push_str("BEGIN\n");
    body.push_str(&w.out);
    body.push_str("END\n");
    let tag = quote::dollar_tag(&body);
    let mut sql = String::new();
    let _ = write!(
        sql,
        "CREATE FUNCTION {}({}) RETURNS {returns}\nLANGUAGE plpgsql IMMUTABLE PARALLEL SAFE{}\nSET search_path = pg_catalog, pg_temp\nAS {tag}{body}{tag};\n",
        quote::ident(e.function),
        arguments.join(", "),
        if strict { " STRICT" } else { "" },
    );
    if sql.len() as u64 > e.max_bytes {
        return Err(ExportError::TooLarge {
            bytes: sql.len() as u64,
            limit: e.max_bytes,
        });
    }
    Ok(sql)
}

/// The SQL type of a column's argument.
fn argument_type(source: Source, encoding: &Encoding) -> &'static str {
    match source {
        Source::Number => "float8",
        Source::Text => "text",
        Source::NumberArray => "float8[]",
        Source::Time(TimeKind::Date) => "date",
        Source::Time(TimeKind::Timestamp) => match encoding {
            Encoding::Time { zone: Some(_), .. } => "timestamptz",
            _ => "timestamp",
        },
        Source::Time(TimeKind::Time) => "time",
        Source::Time(TimeKind::Interval) => "interval",
    }
}

/// `exp(a)` of a variable `a` without PostgreSQL's underflow ERROR (its exp raises one where
/// C's returns 0 or a subnormal): 0 below where a double's exp is 0, and a subnormal's close
/// value in between.
fn exp(a: &str) -> String {
    format!(
        "CASE WHEN {a} >= -708 THEN exp({a}) WHEN {a} < -746 THEN 0 ELSE exp({a} + 64) * '1.603810890548638e-28'::float8 END"
    )
}

/// corgipile's sigmoid of `t` (exp only of a non-positive value).
fn sigmoid(t: &str) -> String {
    format!(
        "CASE WHEN {t} >= 0 THEN 1 / (1 + {}) ELSE {} / (1 + {}) END",
        exp(&format!("(-{t})")),
        exp(t),
        exp(t)
    )
}

/// The body's statements.
#[derive(Default)]
struct Writer {
    out: String,
}

/// `'v'::float8`, or the error for a non-finite number.
fn num(v: f64) -> Result<String, ExportError> {
    quote::float(v).ok_or(ExportError::NotFinite)
}

impl Writer {
    fn line(&mut self, s: &str) {
        self.out.push_str("  ");
        self.out.push_str(s);
        self.out.push('\n');
    }

    /// `var := init`, then the terms added left to right, [`CHAIN`] a statement: the sum in
    /// exactly this order, as a loop adding them one by one.
    fn sum(&mut self, var: &str, init: &str, terms: impl Iterator<Item = String>) {
        let mut statement = format!("{var} := {init}");
        let mut count = 0;
        for t in terms {
            if count == CHAIN {
                statement.push(';');
                self.line(&statement);
                statement = format!("{var} := {var}");
                count = 0;
            }
            statement.push_str(" + ");
            statement.push_str(&t);
            count += 1;
        }
        statement.push(';');
        self.line(&statement);
    }

    fn raise(&mut self, code: &str, message: &str, hint: Option<&str>) {
        let hint = hint.map_or(String::new(), |h| format!(", HINT = {}", quote::literal(h)));
        self.line(&format!(
            "RAISE EXCEPTION USING ERRCODE = '{code}', MESSAGE = {}{hint};",
            quote::literal(message)
        ));
    }

    /// `IF NOT finite(var) THEN RAISE` (NaN is larger than Infinity in PostgreSQL).
    fn check_finite(&mut self, var: &str, column: &str) {
        self.line(&format!(
            "IF NOT ({var} > '-Infinity'::float8 AND {var} < 'Infinity'::float8) THEN"
        ));
        self.raise(
            "22000",
            &format!("column \"{column}\" is NaN or Infinity"),
            None,
        );
        self.line("END IF;");
    }
}

/// A column name as an SQL comment's text: on one line, with no `*/` or `--` meaning.
fn comment(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests;
