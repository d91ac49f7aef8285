//! Memory sizes with units ("64MB", powers of 1024) and percentages: parsing, and
//! formatting that parses back to the same value.

const UNITS: [(&str, u64); 5] = [
    ("TB", 1 << 40),
    ("GB", 1 << 30),
    ("MB", 1 << 20),
    ("kB", 1 << 10),
    ("B", 1),
];

/// Parses a memory size such as "10MB", "10 MB", "512kB", "2.5MB", "8192B":
/// a non-negative decimal number, optional spaces, and a unit (B, kB, MB, GB,
/// TB; case-insensitive; powers of 1024). Fractional bytes round to nearest.
/// The result must be at least 1 byte.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    if t.starts_with('-') {
        return Err("a size must be positive".to_string());
    }
    let not_a_size = || {
        format!("\"{s}\" is not a size; expected a number and a unit (B, kB, MB, GB, TB) such as \"64MB\"")
    };
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    if int_part.is_empty() && frac_part.is_empty() || frac_part.contains('.') {
        return Err(not_a_size());
    }
    if unit.is_empty() {
        return Err(format!(
            "\"{s}\" has no unit; use B, kB, MB, GB or TB, e.g. \"{num}MB\""
        ));
    }
    let mult = UNITS
        .iter()
        .find(|(u, _)| u.eq_ignore_ascii_case(unit))
        .map(|(_, m)| u128::from(*m))
        .ok_or_else(|| {
            format!("unknown unit \"{unit}\" in \"{s}\"; valid units are B, kB, MB, GB, TB")
        })?;
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    // ≤ 20 significant digits keeps digits · 2^40 well inside u128.
    if digits.len() > 20 {
        return Err(format!("\"{s}\" is too large"));
    }
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| not_a_size())?
    };
    let frac_len = u32::try_from(frac_part.len()).unwrap_or(u32::MAX);
    let scale = 10u128
        .checked_pow(frac_len)
        .ok_or_else(|| format!("\"{s}\" has too many decimals"))?;
    let bytes = (mantissa * mult + scale / 2) / scale;
    if bytes == 0 {
        return Err("a size must be at least 1 byte".to_string());
    }
    u64::try_from(bytes).map_err(|_| format!("\"{s}\" is too large"))
}

/// "64MB" style with the largest unit that divides exactly (so it parses back
/// to the same number of bytes).
pub(super) fn format_bytes_exact(b: u64) -> String {
    let (unit, m) = UNITS
        .iter()
        .find(|(_, m)| b.is_multiple_of(*m) && b >= *m)
        .copied()
        .unwrap_or(("B", 1));
    format!("{}{unit}", b / m)
}

/// Approximate "1.5GB" style for messages.
pub fn format_bytes_human(b: u128) -> String {
    let (unit, m) = UNITS
        .iter()
        .find(|(_, m)| b >= u128::from(*m))
        .copied()
        .unwrap_or(("B", 1));
    let v = b as f64 / m as f64;
    let s = format!("{v:.1}");
    format!("{}{unit}", s.strip_suffix(".0").unwrap_or(&s))
}

/// Shortest "12.5%" string that parses back to exactly `f`.
pub(super) fn format_percent(f: f64) -> String {
    let pct = f * 100.0;
    let back = |s: &str| s.parse::<f64>().map(|p| p / 100.0) == Ok(f);
    for decimals in 0..=20 {
        let s = format!("{pct:.decimals$}");
        if back(&s) {
            return format!("{s}%");
        }
    }
    format!("{pct}%")
}
