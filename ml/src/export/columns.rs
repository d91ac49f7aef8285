//! The exported function's preprocessing: each argument into the feature array `_x`, as
//! [`Preprocessor`](crate::preprocess::Preprocessor) encodes a row (imputation, one-hot slots,
//! piecewise-linear bins, date/time parts), and an array model's one argument.

use super::*;

impl Writer {
    /// Argument `$arg`, column `c`, into the features from `c.offset` on.
    pub(super) fn column(
        &mut self,
        arg: usize,
        c: &crate::preprocess::EncodedColumn,
        encoding: &Encoding,
    ) -> Result<(), ExportError> {
        let a = format!("${arg}");
        let o = c.offset; // feature j (0-based) is _x[j + 1]
        self.line(&format!("-- {}", comment(&c.name)));
        match c.impute {
            Impute::Skip => self.line(&format!("IF {a} IS NULL THEN RETURN NULL; END IF;")),
            Impute::Error => {
                self.line(&format!("IF {a} IS NULL THEN"));
                self.raise(
                    "22004",
                    &format!("column \"{}\" is NULL", c.name),
                    Some("The model was trained with \"impute\": \"error\" for this column."),
                );
                self.line("END IF;");
            }
            _ => {}
        }
        match encoding {
            Encoding::Number { fill, .. } => {
                self.line(&format!("_v := COALESCE({a}, {});", num(*fill)?));
                self.check_finite("_v", &c.name);
                self.line(&format!("_x[{}] := _v;", o + 1));
            }
            Encoding::Ple { fill, edges, .. } => {
                self.line(&format!("_v := COALESCE({a}, {});", num(*fill)?));
                self.check_finite("_v", &c.name);
                // quantiles::encode: bin t is 1 wholly below the value, its fraction in the
                // value's bin; the first extends below, the last above; bins above are 0.
                let bins = edges.len() - 1;
                for t in 0..bins {
                    let (lo, hi) = (num(edges[t])?, num(edges[t + 1])?);
                    let fraction = format!("(_v - {lo}) / ({hi} - {lo})");
                    let value = if t + 1 < bins {
                        format!("CASE WHEN _v >= {hi} THEN 1 ELSE {fraction} END")
                    } else {
                        fraction
                    };
                    let set = format!("_x[{}] := {value};", o + t + 1);
                    if t == 0 {
                        self.line(&set);
                    } else {
                        self.line(&format!("IF _v >= {lo} THEN {set} END IF;"));
                    }
                }
            }
            Encoding::Array { fill, .. } => {
                let fills = fill
                    .iter()
                    .map(|&v| num(v))
                    .collect::<Result<Vec<_>, _>>()?;
                let len = fill.len();
                self.line(&format!(
                    "_a := COALESCE({a}, ARRAY[{}]::float8[]);",
                    fills.join(", ")
                ));
                self.line(&format!(
                    "IF array_ndims(_a) IS DISTINCT FROM 1 OR cardinality(_a) <> {len} THEN"
                ));
                self.line(&format!(
                    "  RAISE EXCEPTION USING ERRCODE = '22000', MESSAGE = {} || COALESCE(cardinality(_a), 0) || ' elements, expected {len}';",
                    quote::literal(&format!("column \"{}\": the array has ", c.name))
                ));
                self.line("END IF;");
                self.line("_a := _a[array_lower(_a, 1):array_upper(_a, 1)];");
                self.line(&format!("FOR _i IN 1..{len} LOOP"));
                self.line("  _v := _a[_i];");
                self.line("  IF _v IS NULL THEN");
                self.raise(
                    "22000",
                    &format!("column \"{}\": the array contains NULL elements", c.name),
                    None,
                );
                self.line("  END IF;");
                self.check_finite("_v", &c.name);
                self.line(&format!("  _x[{o} + _i] := _v;"));
                self.line("END LOOP;");
            }
            Encoding::OneHot {
                categories,
                other,
                null,
            } => {
                let n = categories.len();
                let other_slot = if *other {
                    (n + 1).to_string()
                } else {
                    "0".into()
                };
                let null_slot = if *null {
                    (n + 1 + *other as usize).to_string()
                } else {
                    "0".into()
                };
                let list: Vec<String> = categories.iter().map(|k| quote::literal(k)).collect();
                self.line(&format!(
                    "_k := CASE WHEN {a} IS NULL THEN {null_slot} ELSE COALESCE(array_position(ARRAY[{}]::text[], {a} COLLATE \"C\"), {other_slot}) END;",
                    list.join(", ")
                ));
                self.line(&format!("IF _k > 0 THEN _x[{o} + _k] := 1; END IF;"));
            }
            Encoding::Hash { .. } => {
                return Err(ExportError::Hashed {
                    column: c.name.clone(),
                })
            }
            Encoding::Time {
                kind, parts, fill, ..
            } => self.time(&a, c, *kind, parts, *fill, encoding)?,
        }
        Ok(())
    }

    /// A date/time column (see `preprocess::time`): its seconds as corgipile reads them, then
    /// its parts.
    pub(super) fn time(
        &mut self,
        a: &str,
        c: &crate::preprocess::EncodedColumn,
        kind: TimeKind,
        parts: &[TimePart],
        fill: f64,
        encoding: &Encoding,
    ) -> Result<(), ExportError> {
        let seconds = match (kind, encoding) {
            (TimeKind::Date, _) => format!(
                "CASE WHEN isfinite({a}) THEN ({a} - '1970-01-01'::date)::float8 * 86400 ELSE 'Infinity'::float8 END"
            ),
            (_, Encoding::Time { zone: Some(zone), .. }) => format!(
                "date_part('epoch', timezone({}, {a}))",
                quote::literal(zone)
            ),
            _ => format!("date_part('epoch', {a})"),
        };
        let per = if kind == TimeKind::Time {
            "3600"
        } else {
            "86400"
        };
        let value_at = parts
            .iter()
            .position(|&p| p == TimePart::Value)
            .map(|i| parts[..i].iter().map(|p| p.width()).sum::<usize>());
        self.line(&format!("IF {a} IS NULL THEN"));
        self.line(&format!("  _v := {};", num(fill)?));
        self.line("ELSE");
        self.line(&format!("  _s := {seconds};"));
        self.line(&format!("  _v := _s / {per};"));
        self.line("END IF;");
        self.check_finite("_v", &c.name);
        if let Some(at) = value_at {
            self.line(&format!("_x[{}] := _v;", c.offset + at + 1));
        }
        self.line(&format!("IF {a} IS NOT NULL THEN"));
        let mut at = c.offset; // 0-based feature of the part
        for &part in parts {
            match part {
                TimePart::Value => {}
                TimePart::Hour => {
                    // TAU * s.rem_euclid(86400) / 86400, then sin and cos.
                    self.line("  _r := _s - 86400 * floor(_s / 86400);");
                    self.line("  IF _r < 0 THEN _r := _r + 86400; END IF;");
                    self.line(&format!(
                        "  _t := {} * _r / 86400;",
                        num(std::f64::consts::TAU)?
                    ));
                    self.line(&format!("  _x[{}] := sin(_t);", at + 1));
                    self.line(&format!("  _x[{}] := cos(_t);", at + 2));
                }
                TimePart::Dow => {
                    // Monday = 0 for days since 1970-01-01 (a Thursday).
                    self.line("  _d := floor(_s / 86400)::int8;");
                    self.line(&format!("  _x[{} + ((_d + 3) % 7 + 7) % 7] := 1;", at + 1));
                }
                TimePart::Month => {
                    // civil_from_days, in int8 (division truncates, as Rust's).
                    self.line("  _d := floor(_s / 86400)::int8 + 719468;");
                    self.line("  _m := CASE WHEN _d >= 0 THEN _d / 146097 ELSE (_d - 146096) / 146097 END;");
                    self.line("  _d := _d - _m * 146097;");
                    self.line("  _m := (_d - _d / 1460 + _d / 36524 - _d / 146096) / 365;");
                    self.line("  _d := _d - (365 * _m + _m / 4 - _m / 100);");
                    self.line("  _m := (5 * _d + 2) / 153;");
                    self.line(&format!(
                        "  _x[{at} + CASE WHEN _m < 10 THEN _m + 3 ELSE _m - 9 END] := 1;"
                    ));
                }
            }
            at += part.width();
        }
        self.line("END IF;");
        Ok(())
    }

    /// The one array argument of an array model: `n` finite elements.
    pub(super) fn array(&mut self, n: usize) {
        self.line(&format!(
            "IF array_ndims($1) IS DISTINCT FROM 1 OR cardinality($1) <> {n} THEN"
        ));
        self.line(&format!(
            "  RAISE EXCEPTION USING ERRCODE = '2202E', MESSAGE = 'the model expects {n} features, got ' || COALESCE(cardinality($1), 0);"
        ));
        self.line("END IF;");
        self.line("_a := $1;");
        self.line("_x := _a[array_lower(_a, 1):array_upper(_a, 1)];");
        self.line(&format!("FOR _i IN 1..{n} LOOP"));
        self.line("  IF _x[_i] IS NULL OR NOT (_x[_i] > '-Infinity'::float8 AND _x[_i] < 'Infinity'::float8) THEN");
        self.raise("22000", "features contain NULL, NaN or Infinity", None);
        self.line("  END IF;");
        self.line("END LOOP;");
    }
}
