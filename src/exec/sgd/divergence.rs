//! A trained model that diverged while its loss stayed finite (a regression far worse than a
//! zero model, see `corgipile_ml::divergence`): never stored. The trainers catch a loss or a
//! weight that is NaN or infinite themselves; the same rule decides for a sharded table's
//! coordinator (`crate::shard::coordinator`).

use super::SgdNode;
use crate::pg::error::{raise, raise_train_error};
use corgipile_ml::divergence::{diverged, zero_model_loss, DIVERGED_FACTOR};
use corgipile_ml::trainer::{EpochRecord, TrainError};
use pgrx::PgSqlErrorCode;

/// The ERROR of a training that diverged in `epoch` with the loss `loss`: 22003, as for a loss
/// that became NaN or infinite, with the zero model's loss it was compared to.
pub(crate) fn raise_diverged(epoch: u32, loss: f64, zero: Option<f64>, normalized: bool) -> ! {
    let Some(zero) = zero.filter(|_| loss.is_finite()) else {
        raise_train_error(
            TrainError::Diverged { epoch },
            &|v| v.to_string(),
            normalized,
        )
    };
    raise(
        PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
        format!(
            "training diverged in epoch {epoch}: its loss {loss:.3e} is more than {DIVERGED_FACTOR} times the loss of a model predicting 0 for every row ({zero:.3e})"
        ),
        Some(if normalized {
            "Use a smaller learning_rate (the features are already normalized), or a larger l2.".into()
        } else {
            "Use a smaller learning_rate, or \"normalize\": true to scale the features.".into()
        }),
    )
}

impl SgdNode {
    /// The zero model's loss on the rows this training read (see
    /// `corgipile_ml::divergence::zero_model_loss`): from the statistics pass's label
    /// moments, else from the labels of the rows the first pass trained on (a parallel
    /// leader's: its share); None for a classifier, or when no label was seen here.
    unsafe fn zero_model_loss(&self) -> Option<f64> {
        let label_square_mean = match self.label_moments {
            Some((mean, variance)) => variance + mean * mean,
            None => self.shuffle().rows().label_square_mean()?,
        };
        zero_model_loss(self.config.model, label_square_mean)
    }

    /// `result` (a learner that trained), unless the loss of the epoch whose model is stored
    /// (`stored_epoch`, with early stopping; else the last of `epochs`) says it diverged. Then
    /// a search's configuration (`searching`) is `TrainError::Diverged` (set aside, as one
    /// whose loss became NaN), and any other model the ERROR. A group's model
    /// (`group_model`) is judged by its trainer alone (NaN or infinite): its rows' labels are
    /// not counted apart from the others'.
    ///
    /// Called after the training's epochs.
    pub(super) fn check_diverged<T>(
        &self,
        result: Result<T, TrainError>,
        epochs: &[EpochRecord],
        stored_epoch: Option<u32>,
        searching: bool,
        group_model: bool,
    ) -> Result<T, TrainError> {
        if result.is_err() || group_model {
            return result;
        }
        let record = match stored_epoch {
            Some(epoch) => epochs.iter().find(|r| r.stats.epoch == epoch),
            None => epochs.last(),
        };
        let Some(record) = record else {
            return result;
        };
        let (epoch, loss) = (record.stats.epoch, record.stats.loss);
        // SAFETY: a private method of this node that needs only what every method of a live SgdNode
        // has (its child initialized, inside the executor run).
        let zero = unsafe { self.zero_model_loss() };
        if !diverged(loss, zero) {
            return result;
        }
        if !searching {
            raise_diverged(epoch, loss, zero, self.config.params.normalize);
        }
        Err(TrainError::Diverged { epoch })
    }
}
