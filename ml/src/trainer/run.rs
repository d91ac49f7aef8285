//! The loop over epochs that every training runs — one process, parallel workers, or the
//! coordinator of a sharded table: its history, when it stops (the loss stopped moving), and
//! the per-epoch report lines. The drivers (in the backend) keep only what needs PostgreSQL:
//! reading the rows, meeting the other processes, raising errors.

use super::EpochStats;
use crate::scoring::ValidationStats;

/// One finished epoch.
#[derive(Clone, Debug)]
pub struct EpochRecord {
    pub stats: EpochStats,
    /// The training pass (reading, shuffling, SGD), without validation.
    pub seconds: f64,
    pub validation: Option<ValidationStats>,
    pub validation_seconds: f64,
}

/// Epochs `1..=epochs`, stopping early once the loss changed by less than `tolerance`
/// (0 = never) from one epoch to the next.
#[derive(Clone, Debug)]
pub struct EpochLoop {
    epochs: u32,
    tolerance: f64,
    history: Vec<EpochRecord>,
}

impl EpochLoop {
    pub fn new(epochs: u32, tolerance: f64) -> EpochLoop {
        EpochLoop {
            epochs,
            tolerance,
            history: Vec::new(),
        }
    }

    /// The epochs to run, unless [`record`](Self::record) says stop first.
    pub fn epochs(&self) -> std::ops::RangeInclusive<u32> {
        1..=self.epochs
    }

    /// Records a finished epoch; true when training stops after it (converged).
    pub fn record(&mut self, record: EpochRecord) -> bool {
        let converged = converged(
            self.history.last().map(|prev| prev.stats.loss),
            record.stats.loss,
            self.tolerance,
        );
        self.history.push(record);
        converged
    }

    pub fn history(&self) -> &[EpochRecord] {
        &self.history
    }

    pub fn into_history(self) -> Vec<EpochRecord> {
        self.history
    }
}

/// Early stop: the loss moved by less than `tolerance` since the previous epoch.
pub fn converged(previous_loss: Option<f64>, loss: f64, tolerance: f64) -> bool {
    tolerance > 0.0 && previous_loss.is_some_and(|prev| (prev - loss).abs() < tolerance)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn record(epoch: u32, loss: f64) -> EpochRecord {
        EpochRecord {
            stats: EpochStats {
                epoch,
                loss,
                accuracy: Some(0.75),
                r2: None,
                tuples: 1000,
                learning_rate: 0.01,
            },
            seconds: 1.5,
            validation: None,
            validation_seconds: 0.0,
        }
    }

    #[test]
    fn stops_once_the_loss_stops_moving() {
        let mut run = EpochLoop::new(10, 0.01);
        assert_eq!(run.epochs(), 1..=10);
        assert!(!run.record(record(1, 0.5)));
        assert!(!run.record(record(2, 0.4)));
        assert!(run.record(record(3, 0.395)));
        assert_eq!(run.history().len(), 3);
        assert_eq!(run.into_history()[2].stats.loss, 0.395);
    }

    #[test]
    fn without_tolerance_it_never_stops_early() {
        let mut run = EpochLoop::new(3, 0.0);
        assert!(!run.record(record(1, 0.5)));
        assert!(!run.record(record(2, 0.5)));
        assert!(!converged(Some(1.0), 1.0, 0.0));
        assert!(!converged(None, 1.0, 1.0));
        assert!(converged(Some(1.0), 1.0, 1e-9));
    }

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
            accuracy: None,
            r2: None,
            rows: 10,
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
}
