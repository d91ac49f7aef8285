//! What a training reports while it runs, in one place: the per-epoch NOTICE lines (a table
//! for a training in one server, one line per epoch for a sharded one) and the progress line
//! shown in pg_stat_activity.query (which the corgipile.progress view parses).

use super::run::EpochRecord;
use crate::params::search::{best_of, SelectBy};
use crate::params::Configuration;
use crate::scoring::ValidationStats;

/// The per-epoch NOTICEs of a training in one server form a table: this header before
/// epoch 1, then one [`table_line`] per epoch. `metric` is the kind's
/// [`metric_name`](crate::model::ModelKind::metric_name).
pub fn table_header(metric: &str, validation: bool) -> String {
    let mut line = format!("corgipile {:>9} {:>12} {:>9}", "epoch", "loss", metric);
    if validation {
        let short = if metric == "accuracy" { "acc" } else { metric };
        line.push_str(&format!(
            " {:>12} {:>9}",
            "valid loss",
            format!("valid {short}")
        ));
    }
    line.push_str(&format!(" {:>10} {:>9} {:>9}", "tuples", "lr", "seconds"));
    line
}

/// One epoch's row of the table under [`table_header`].
pub fn table_line(epochs: u32, record: &EpochRecord) -> String {
    let stats = &record.stats;
    let metric = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
    let mut line = format!(
        "corgipile {:>9} {:>12.6} {:>9}",
        format!("{}/{epochs}", stats.epoch),
        stats.loss,
        metric(stats.accuracy.or(stats.r2))
    );
    if let Some(v) = &record.validation {
        line.push_str(&format!(
            " {:>12.6} {:>9}",
            v.loss,
            metric(v.accuracy.or(v.r2))
        ));
    }
    line.push_str(&format!(
        " {:>10} {:>9.2e} {:>9.3}",
        stats.tuples, stats.learning_rate, record.seconds
    ));
    line
}

/// A search's NOTICE for one epoch: how many configurations train, and the best validation
/// score so far with its configuration.
pub fn search_line(
    epoch: u32,
    epochs: u32,
    scored: &[(usize, Option<ValidationStats>)],
    configurations: &[Configuration],
    select_by: SelectBy,
) -> String {
    let score = |v: &ValidationStats| select_by.score(v);
    let scores: Vec<Option<f64>> = scored
        .iter()
        .map(|(_, v)| v.as_ref().and_then(score))
        .collect();
    let best = best_of(select_by, &scores).map(|b| {
        let (i, _) = scored[b];
        format!(
            "; best validation {} {:.4}: {}",
            select_by.name(),
            scores[b].unwrap_or(f64::NAN),
            serde_json::Value::Object(configurations[i].0.clone())
        )
    });
    format!(
        "epoch {epoch}/{epochs}: {} of {} configurations trained{}",
        scored.len(),
        configurations.len(),
        best.unwrap_or_default()
    )
}

/// One epoch of a sharded training: `per_shard` names each shard server with its tuples.
pub fn shard_line(
    epochs: u32,
    record: &EpochRecord,
    per_shard: &[String],
    rounds: u32,
    bytes: u64,
) -> String {
    let stats = &record.stats;
    format!(
        "corgipile epoch {}/{epochs}: loss {:.6}{}, {} tuples ({}), {rounds} round(s), {:.3} s, {bytes} bytes to and from shard servers",
        stats.epoch,
        stats.loss,
        stats.accuracy.or(stats.r2).map_or(String::new(), |m| format!(", metric {m:.4}")),
        stats.tuples,
        per_shard.join(", "),
        record.seconds,
    )
}

/// The progress line of a running training (see [`ProgressLine::render`]).
pub struct ProgressLine<'a> {
    pub relation: &'a str,
    pub model: &'a str,
    pub phase: &'a str,
    pub epoch: u32,
    pub epochs: u32,
    /// Fraction of the current epoch's blocks started.
    pub epoch_fraction: f64,
    pub tuples: u64,
    /// The last finished epoch's loss.
    pub last_loss: Option<f64>,
    pub elapsed_seconds: f64,
    pub remaining_seconds: Option<f64>,
    /// Sharded tables: the round and each shard's state.
    pub shards: Option<&'a str>,
    pub query: &'a str,
}

impl ProgressLine<'_> {
    /// `corgipile: relation R model M | phase | epoch k/n | p% | tuples t | loss L | elapsed E s |
    /// remaining R s [| shards S] | query: <the statement>` (`-` for what is not known yet).
    pub fn render(&self) -> String {
        let loss = self.last_loss.map_or("-".to_owned(), |l| format!("{l:.6}"));
        let remaining = self
            .remaining_seconds
            .map_or("-".to_owned(), |r| format!("{r:.1}"));
        format!(
            "corgipile: relation {} model {} | {} | epoch {}/{} | {:.1}% | tuples {} | loss {} | elapsed {:.1} s | remaining {} s{} | query: {}",
            self.relation,
            self.model,
            self.phase,
            self.epoch,
            self.epochs,
            100.0 * self.epoch_fraction,
            self.tuples,
            loss,
            self.elapsed_seconds,
            remaining,
            self.shards.map_or(String::new(), |s| format!(" | shards {s}")),
            self.query
        )
    }
}

/// Seconds left, from the mean time per epoch so far (an upper bound with early stopping):
/// `epochs_done` finished epochs took `epoch_seconds`; the current one (`epoch`) is
/// `epoch_fraction` done after `in_epoch_seconds`. None before 2% of the training is done.
pub fn remaining_seconds(
    epochs: u32,
    epochs_done: u32,
    epoch: u32,
    epoch_fraction: f64,
    epoch_seconds: f64,
    in_epoch_seconds: f64,
) -> Option<f64> {
    let in_epoch = if epochs_done < epoch {
        epoch_fraction
    } else {
        0.0
    };
    let done = epochs_done as f64 + in_epoch;
    if done < 0.02 {
        return None;
    }
    let spent = epoch_seconds
        + if in_epoch > 0.0 {
            in_epoch_seconds
        } else {
            0.0
        };
    Some(spent / done * (epochs as f64 - done).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scoring::ValidationStats;
    use crate::trainer::run::tests::record;

    #[test]
    fn report_lines_keep_their_columns() {
        assert_eq!(
            table_header("accuracy", false),
            "corgipile     epoch         loss  accuracy     tuples        lr   seconds"
        );
        assert_eq!(
            table_header("r2", true),
            "corgipile     epoch         loss        r2   valid loss  valid r2     tuples        lr   seconds"
        );
        assert_eq!(
            table_header("accuracy", true),
            "corgipile     epoch         loss  accuracy   valid loss valid acc     tuples        lr   seconds"
        );
        let mut r = record(2, 0.25);
        assert_eq!(
            table_line(5, &r),
            "corgipile       2/5     0.250000    0.7500       1000   1.00e-2     1.500"
        );
        r.validation = Some(ValidationStats {
            loss: 0.5,
            rows: 10,
            ..ValidationStats::empty()
        });
        assert_eq!(
            table_line(5, &r),
            "corgipile       2/5     0.250000    0.7500     0.500000         -       1000   1.00e-2     1.500"
        );
        assert_eq!(
            shard_line(3, &record(1, 0.125), &["s1 600".into(), "s2 400".into()], 2, 4096),
            "corgipile epoch 1/3: loss 0.125000, metric 0.7500, 1000 tuples (s1 600, s2 400), 2 round(s), 1.500 s, 4096 bytes to and from shard servers"
        );
    }

    #[test]
    fn the_progress_line_keeps_its_fields() {
        let mut line = ProgressLine {
            relation: "public.t",
            model: "svm",
            phase: "training",
            epoch: 2,
            epochs: 5,
            epoch_fraction: 0.25,
            tuples: 1234,
            last_loss: Some(0.5),
            elapsed_seconds: 3.04,
            remaining_seconds: Some(7.0),
            shards: None,
            query: "SELECT 1",
        };
        assert_eq!(
            line.render(),
            "corgipile: relation public.t model svm | training | epoch 2/5 | 25.0% | tuples 1234 | loss 0.500000 | elapsed 3.0 s | remaining 7.0 s | query: SELECT 1"
        );
        line.last_loss = None;
        line.remaining_seconds = None;
        line.shards = Some("round 1/2");
        assert!(line
            .render()
            .contains("| loss - | elapsed 3.0 s | remaining - s | shards round 1/2 | query"));
    }

    #[test]
    fn remaining_time_is_the_mean_epoch_times_the_epochs_left() {
        assert_eq!(remaining_seconds(10, 0, 1, 0.01, 0.0, 1.0), None);
        // Two epochs of 4 s done, the third a quarter done after 1 s: 9 s per 2.25 epochs.
        assert_eq!(
            remaining_seconds(4, 2, 3, 0.25, 8.0, 1.0),
            Some(9.0 / 2.25 * 1.75)
        );
        // Between epochs: the in-epoch part does not count.
        assert_eq!(remaining_seconds(4, 2, 2, 0.9, 8.0, 5.0), Some(8.0));
    }
}
