//! JSON from another process or server (a shard's reply, a coordinator's request), parsed
//! without trusting its sizes: before anything is materialised, one pass over the text (which
//! allocates nothing) adds up what the parsed value could hold at its peak, and the text is
//! refused if that exceeds the caller's memory bound. A reply that says "1e8 weights" in 200 MB
//! of text is then an error, not a multi-gigabyte allocation (Rust aborts the whole server
//! process when an allocation fails).
//!
//! Written by hand because serde_json has no allocation limit, and a counting visitor is a few
//! lines: the estimate is deliberately generous (every value as if it were a Vec element at
//! the moment its Vec doubles), so a value that passes can be materialised.

use serde::de::{DeserializeOwned, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// Bytes charged for each JSON value (number, bool, null, or the header of an array or
/// object). A number in a Vec<f64> takes 8 bytes, but serde first buffers the values of an
/// untagged enum or a flattened struct as 32-byte `Content` values; with a Vec's growth (its
/// old and new buffers live together while it doubles) that is 80 bytes at the peak.
pub const BYTES_PER_VALUE: u64 = 80;
/// Bytes charged for each string, besides its length: a String header in a Vec, its heap
/// block, and a buffered copy (as for numbers).
pub const BYTES_PER_STRING: u64 = 160;
/// Extra bytes per object member (the map or struct entry around a key and value).
pub const BYTES_PER_MEMBER: u64 = 80;

/// Why a JSON text was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    /// Parsing it could take more than `limit` bytes (at least `bytes`; the count stops there).
    #[error(
        "it would need more than {} of memory to read (at least {}), over the limit",
        crate::limits::pretty_bytes(*.limit),
        crate::limits::pretty_bytes(*.bytes)
    )]
    TooLarge { bytes: u64, limit: u64 },
    /// Not JSON, or not the expected shape.
    #[error("{0}")]
    Invalid(String),
}

/// Parses `text` as a `T` unless materialising it could take more than `limit` bytes (text
/// length included).
pub fn parse_bounded<T: DeserializeOwned>(text: &[u8], limit: u64) -> Result<T, WireError> {
    let bytes = measure(text, limit)?;
    debug_assert!(bytes <= limit);
    serde_json::from_slice(text).map_err(|e| WireError::Invalid(e.to_string()))
}

/// What parsing `text` could take at its peak, at most `limit` (else `TooLarge`); invalid
/// JSON is `Invalid`. Allocates nothing beyond serde_json's scratch for one escaped string.
pub fn measure(text: &[u8], limit: u64) -> Result<u64, WireError> {
    let mut meter = Meter {
        bytes: text.len() as u64,
        limit,
    };
    if meter.bytes > limit {
        return Err(WireError::TooLarge {
            bytes: meter.bytes,
            limit,
        });
    }
    let mut de = serde_json::Deserializer::from_slice(text);
    let measured = Measure(&mut meter).deserialize(&mut de);
    let outcome = measured.and_then(|()| de.end());
    match outcome {
        Ok(()) => Ok(meter.bytes),
        Err(_) if meter.bytes > limit => Err(WireError::TooLarge {
            bytes: meter.bytes,
            limit,
        }),
        Err(e) => Err(WireError::Invalid(e.to_string())),
    }
}

struct Meter {
    bytes: u64,
    limit: u64,
}

impl Meter {
    fn charge<E: serde::de::Error>(&mut self, bytes: u64) -> Result<(), E> {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > self.limit {
            // Stops the walk; `measure` reports TooLarge from the meter.
            return Err(E::custom("over the memory limit"));
        }
        Ok(())
    }
}

struct Measure<'a>(&'a mut Meter);

impl<'de> DeserializeSeed<'de> for Measure<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Measure<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        self.0.charge(BYTES_PER_VALUE)
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        self.0.charge(BYTES_PER_VALUE)
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        self.0.charge(BYTES_PER_VALUE)
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        self.0.charge(BYTES_PER_VALUE)
    }
    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<(), E> {
        self.0
            .charge(BYTES_PER_STRING.saturating_add(s.len() as u64))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.0.charge(BYTES_PER_VALUE)
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        self.0.charge(BYTES_PER_VALUE)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.charge(BYTES_PER_VALUE)?;
        while seq.next_element_seed(Measure(&mut *self.0))?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.0.charge(BYTES_PER_VALUE)?;
        while map.next_key_seed(Measure(&mut *self.0))?.is_some() {
            self.0.charge(BYTES_PER_MEMBER)?;
            map.next_value_seed(Measure(&mut *self.0))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_parse() {
        let v: Vec<f64> = parse_bounded(b"[1, 2.5, -3]", 1 << 20).unwrap();
        assert_eq!(v, vec![1.0, 2.5, -3.0]);
        // text + array header + 3 numbers
        assert_eq!(
            measure(b"[1, 2.5, -3]", 1 << 20),
            Ok(12 + 4 * BYTES_PER_VALUE)
        );
    }

    #[test]
    fn a_long_array_is_refused_before_it_is_built() {
        // 1M zeros: 2 MB of text, charged 80 MB; a 4 MB limit refuses it.
        let text = format!("[{}0]", "0,".repeat(999_999));
        match measure(text.as_bytes(), 4 << 20) {
            Err(WireError::TooLarge { bytes, limit }) => {
                assert_eq!(limit, 4 << 20);
                assert!(bytes > limit);
            }
            other => panic!("{other:?}"),
        }
        assert!(parse_bounded::<Vec<f64>>(text.as_bytes(), 4 << 20).is_err());
        assert_eq!(
            parse_bounded::<Vec<f64>>(text.as_bytes(), 128 << 20)
                .unwrap()
                .len(),
            1_000_000
        );
    }

    #[test]
    fn the_text_itself_counts() {
        let text = format!("\"{}\"", "x".repeat(1000));
        assert!(matches!(
            measure(text.as_bytes(), 1100),
            Err(WireError::TooLarge { .. })
        ));
        assert!(measure(text.as_bytes(), 4096).is_ok());
    }

    #[test]
    fn nested_maps_and_members_are_charged() {
        let text = br#"{"a": {"b": [1, 2]}, "c": null}"#;
        let bytes = measure(text, 1 << 20).unwrap();
        // 2 objects, 1 array, 2 numbers, null, 3 keys (strings), 3 members
        let expected = text.len() as u64
            + 6 * BYTES_PER_VALUE
            + 3 * (BYTES_PER_STRING + 1)
            + 3 * BYTES_PER_MEMBER;
        assert_eq!(bytes, expected);
    }

    #[test]
    fn invalid_json_and_deep_nesting_are_errors_not_crashes() {
        assert!(matches!(
            measure(b"[1, 2", 1 << 20),
            Err(WireError::Invalid(_))
        ));
        assert!(matches!(
            measure(b"[1] x", 1 << 20),
            Err(WireError::Invalid(_))
        ));
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(matches!(
            measure(deep.as_bytes(), 1 << 30),
            Err(WireError::Invalid(_))
        ));
        // Valid JSON of the wrong shape.
        assert!(matches!(
            parse_bounded::<Vec<f64>>(b"{\"a\": 1}", 1 << 20),
            Err(WireError::Invalid(_))
        ));
    }
}

/// A JSON array as a Vec of at most `max` elements: the count is checked as elements arrive,
/// so a list that is too long is refused before it is built (for lists whose elements are
/// large next to their text, or whose length has a documented bound).
pub fn seq_at_most<'de, D, T>(d: D, max: usize) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    struct AtMost<T> {
        max: usize,
        element: std::marker::PhantomData<T>,
    }
    impl<'de, T: serde::Deserialize<'de>> Visitor<'de> for AtMost<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "an array of at most {} elements", self.max)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::new();
            while let Some(x) = seq.next_element()? {
                if out.len() == self.max {
                    return Err(serde::de::Error::custom(format!(
                        "more than {} elements",
                        self.max
                    )));
                }
                out.push(x);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(AtMost {
        max,
        element: std::marker::PhantomData,
    })
}

#[cfg(test)]
mod seq_tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Few {
        #[serde(deserialize_with = "three_at_most")]
        v: Vec<u8>,
    }
    fn three_at_most<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        seq_at_most(d, 3)
    }

    #[test]
    fn lists_beyond_their_bound_are_refused() {
        assert_eq!(
            serde_json::from_str::<Few>(r#"{"v": [1, 2, 3]}"#)
                .unwrap()
                .v,
            [1, 2, 3]
        );
        let err = serde_json::from_str::<Few>(r#"{"v": [1, 2, 3, 4]}"#)
            .err()
            .unwrap();
        assert!(err.to_string().contains("more than 3 elements"), "{err}");
    }

    #[test]
    fn error_texts_are_pinned() {
        assert_eq!(
            WireError::TooLarge {
                bytes: 3 << 20,
                limit: 1 << 20
            }
            .to_string(),
            format!(
                "it would need more than {} of memory to read (at least {}), over the limit",
                crate::limits::pretty_bytes(1 << 20),
                crate::limits::pretty_bytes(3 << 20)
            )
        );
        assert_eq!(
            WireError::Invalid("expected `,`".into()).to_string(),
            "expected `,`"
        );
    }
}
