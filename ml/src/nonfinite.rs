//! Serde for the f64 sums a shard sends: serde_json writes a non-finite f64 (an overflowed sum) as
//! null, which it cannot read back as f64; these are written as the strings "inf", "-inf" and
//! "NaN" instead, so that a merged report says what one server's would.
//!
//! A leaf: imports nothing from the crate.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Repr {
    Number(f64),
    Text(String),
}

pub(crate) fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    match *v {
        v if v.is_finite() => s.serialize_f64(v),
        v if v.is_nan() => s.serialize_str("NaN"),
        v if v > 0.0 => s.serialize_str("inf"),
        _ => s.serialize_str("-inf"),
    }
}

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    match Repr::deserialize(d)? {
        Repr::Number(v) => Ok(v),
        Repr::Text(t) => match t.as_str() {
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            "NaN" => Ok(f64::NAN),
            _ => Err(serde::de::Error::custom(format!("not a number: {t}"))),
        },
    }
}
