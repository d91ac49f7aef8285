//! Dates and times as features. A column of a date/time type arrives as seconds — since
//! 1970-01-01 00:00 on the wall clock for a point in time (a `timestamptz` read in the model's
//! time zone), since midnight for a time of day, in all for an interval — and becomes its parts:
//! the value itself (scaled like a number), the hour of the day as a sin/cos pair, the day of the
//! week and the month as one-hot categories. Pure arithmetic on the seconds, so training,
//! evaluation and prediction from a row compute the same features.

use serde::{Deserialize, Serialize};

/// Which date/time type a column has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeKind {
    Date,
    /// `timestamp` and `timestamptz` (read on the wall clock of the model's time zone).
    Timestamp,
    /// `time` (time of day).
    Time,
    Interval,
}

/// One part of a date/time column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimePart {
    /// The value, as a number: days since 1970-01-01 (a point in time), hours (a time of day),
    /// days (an interval); standardized like a number column.
    Value,
    /// The hour of the day (with minutes and seconds) as a sin/cos pair: 23:59 is next to 00:00.
    Hour,
    /// The day of the week, one-hot (Mon … Sun).
    Dow,
    /// The month, one-hot (Jan … Dec).
    Month,
}

const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];
const SECONDS_PER_DAY: f64 = 86_400.0;

impl TimePart {
    pub const ALL: [TimePart; 4] = [
        TimePart::Value,
        TimePart::Hour,
        TimePart::Dow,
        TimePart::Month,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TimePart::Value => "value",
            TimePart::Hour => "hour",
            TimePart::Dow => "dow",
            TimePart::Month => "month",
        }
    }

    pub fn parse(s: &str) -> Option<TimePart> {
        TimePart::ALL.into_iter().find(|p| p.name() == s)
    }

    /// The features this part has.
    pub fn width(self) -> usize {
        match self {
            TimePart::Value => 1,
            TimePart::Hour => 2,
            TimePart::Dow => DAYS.len(),
            TimePart::Month => MONTHS.len(),
        }
    }
}

impl TimeKind {
    /// The parts a column of this kind has unless its options say otherwise.
    pub fn default_parts(self) -> Vec<TimePart> {
        match self {
            TimeKind::Date => vec![TimePart::Value, TimePart::Dow, TimePart::Month],
            TimeKind::Timestamp => TimePart::ALL.to_vec(),
            TimeKind::Time => vec![TimePart::Value, TimePart::Hour],
            TimeKind::Interval => vec![TimePart::Value],
        }
    }

    /// Whether a value of this kind has `part` (a date has no hour, a time of day no weekday).
    pub fn has(self, part: TimePart) -> bool {
        match self {
            TimeKind::Date => part != TimePart::Hour,
            TimeKind::Timestamp => true,
            TimeKind::Time => matches!(part, TimePart::Value | TimePart::Hour),
            TimeKind::Interval => part == TimePart::Value,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TimeKind::Date => "a date",
            TimeKind::Timestamp => "a timestamp",
            TimeKind::Time => "a time of day",
            TimeKind::Interval => "an interval",
        }
    }

    /// The value part of `seconds`.
    pub fn value(self, seconds: f64) -> f64 {
        match self {
            TimeKind::Time => seconds / 3_600.0,
            _ => seconds / SECONDS_PER_DAY,
        }
    }
}

/// The features of `parts` of `seconds`, in order from `offset` on, into `push`. `value`: what
/// the value part holds (the column's fill for a NULL, whose other parts are left out).
pub fn encode_parts(
    parts: &[TimePart],
    seconds: Option<f64>,
    value: f64,
    offset: usize,
    mut push: impl FnMut(usize, f64),
) {
    let mut at = offset;
    for &part in parts {
        match (part, seconds) {
            (TimePart::Value, _) => push(at, value),
            (TimePart::Hour, Some(s)) => {
                let angle = std::f64::consts::TAU * s.rem_euclid(SECONDS_PER_DAY) / SECONDS_PER_DAY;
                push(at, angle.sin());
                push(at + 1, angle.cos());
            }
            (TimePart::Dow, Some(s)) => push(at + weekday(days(s)), 1.0),
            (TimePart::Month, Some(s)) => push(at + month(days(s)) - 1, 1.0),
            (_, None) => {}
        }
        at += part.width();
    }
}

/// The name of feature `k` of a column's parts: `col`, `col.hour_sin`, `col.dow=Mon`, ...
pub fn part_feature_name(column: &str, parts: &[TimePart], mut k: usize) -> String {
    for &part in parts {
        if k < part.width() {
            return match part {
                TimePart::Value => column.to_owned(),
                TimePart::Hour => format!("{column}.hour_{}", ["sin", "cos"][k]),
                TimePart::Dow => format!("{column}.dow={}", DAYS[k]),
                TimePart::Month => format!("{column}.month={}", MONTHS[k]),
            };
        }
        k -= part.width();
    }
    format!("{column}.?")
}

fn days(seconds: f64) -> i64 {
    (seconds / SECONDS_PER_DAY).floor() as i64
}

/// Monday = 0 for days since 1970-01-01 (a Thursday).
fn weekday(days: i64) -> usize {
    (days + 3).rem_euclid(7) as usize
}

/// The month (1 … 12) of days since 1970-01-01, proleptic Gregorian (H. Hinnant's
/// civil_from_days; written out here: it is a dozen lines, and no crate we use has it).
fn month(days: i64) -> usize {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    (if mp < 10 { mp + 3 } else { mp - 9 }) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(y: i64, m: i64, d: i64) -> f64 {
        // Days from civil (the inverse), to test against known dates.
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (m + 9) % 12;
        let doy = (153 * mp + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        (era * 146_097 + doe - 719_468) as f64 * SECONDS_PER_DAY
    }

    #[test]
    fn weekdays_and_months_of_known_dates() {
        // 1970-01-01 Thu; 2000-02-29 Tue; 2026-11-27 Fri; 1969-12-31 Wed; 1900-03-01 Thu.
        for (s, dow, mon) in [
            (0.0, "Thu", "Jan"),
            (at(2000, 2, 29), "Tue", "Feb"),
            (at(2026, 11, 27) + 23.0 * 3600.0, "Fri", "Nov"),
            (-1.0, "Wed", "Dec"),
            (at(1900, 3, 1), "Thu", "Mar"),
        ] {
            let mut features = Vec::new();
            encode_parts(
                &[TimePart::Dow, TimePart::Month],
                Some(s),
                0.0,
                0,
                |j, v| features.push((j, v)),
            );
            let names: Vec<String> = features
                .iter()
                .map(|&(j, _)| part_feature_name("t", &[TimePart::Dow, TimePart::Month], j))
                .collect();
            assert_eq!(
                names,
                [format!("t.dow={dow}"), format!("t.month={mon}")],
                "{s}"
            );
        }
    }

    #[test]
    fn hours_are_a_circle_and_nulls_keep_only_the_value() {
        let mut f = Vec::new();
        encode_parts(
            &[TimePart::Value, TimePart::Hour],
            Some(6.0 * 3600.0),
            0.25,
            10,
            |j, v| f.push((j, v)),
        );
        assert_eq!(f[0], (10, 0.25));
        assert!((f[1].1 - 1.0).abs() < 1e-12 && f[2].1.abs() < 1e-12); // 06:00: sin 1, cos 0
        let mut g = Vec::new();
        encode_parts(&TimePart::ALL, None, 7.0, 0, |j, v| g.push((j, v)));
        assert_eq!(g, [(0, 7.0)]);
        assert_eq!(
            TimeKind::Timestamp
                .default_parts()
                .iter()
                .map(|p| p.width())
                .sum::<usize>(),
            22
        );
        assert!(!TimeKind::Date.has(TimePart::Hour) && !TimeKind::Interval.has(TimePart::Dow));
    }
}
