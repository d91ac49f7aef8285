//! Quoting for generated SQL: every identifier double-quoted, every text an `E''` literal,
//! every number a `'…'::float8` literal that reads back to the same float8, and the dollar
//! quote of a body chosen so that nothing inside can end it.

/// `name` as a quoted identifier (what `quote_ident` gives for a name that needs quotes, and
/// quoted always): its double quotes doubled. Any text is then one identifier, whatever it holds
/// (quotes, backslashes, `$`, newlines, a keyword); only an empty name is no identifier.
pub fn ident(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        if c == '"' {
            out.push('"');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// `text` as an escape-string literal (`E'…'`), read the same whatever
/// `standard_conforming_strings` is: backslashes and quotes escaped, control characters as
/// `\n`, `\r`, `\t` or `\xHH`; the rest (`$`, any Unicode) as it is.
pub fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 3);
    out.push_str("E'");
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("''"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// A finite `v` as a float8 literal that reads back to exactly `v`: Rust's `{:?}` is the
/// shortest decimal that round-trips, and float8's input is correctly rounded. None for NaN
/// and the infinities (a stored model has none; refused, never written).
pub fn float(v: f64) -> Option<String> {
    v.is_finite().then(|| format!("'{v:?}'::float8"))
}

/// A dollar-quote tag that `body` does not contain, so that nothing in the body (a category or
/// a column name holding `$$` or the tag) can end it: `$corgipile$`, or else `$corgipile_0…0$`
/// with more zeros than any run of digits after a `$corgipile_` in the body has (one pass).
pub fn dollar_tag(body: &str) -> String {
    const STEM: &str = "$corgipile_";
    if !body.contains("$corgipile$") && !body.contains(STEM) {
        return "$corgipile$".to_owned();
    }
    let longest = body
        .match_indices(STEM)
        .map(|(at, _)| {
            body[at + STEM.len()..]
                .bytes()
                .take_while(u8::is_ascii_digit)
                .count()
        })
        .max()
        .unwrap_or(0);
    format!("{STEM}{}$", "0".repeat(longest + 1))
}
