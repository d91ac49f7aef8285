//! Regression metrics: MSE, RMSE, MAE and R² (SST from [`Welford`]); [`RegressionMetrics`] is
//! also the part a shard sends.

use serde::{Deserialize, Serialize};

use crate::moments::Welford;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RegressionReport {
    pub mse: f64,
    pub rmse: f64,
    pub mae: f64,
    /// 1 - SSE/SST; if SST == 0: 1 for a perfect fit, else 0 (scikit-learn).
    pub r2: f64,
    pub n: u64,
}

/// 1 - SSE/SST; if SST == 0 (constant actual values): 1 for a perfect fit (SSE == 0), else 0,
/// like scikit-learn.
#[inline]
pub fn r2_score(sse: f64, sst: f64) -> f64 {
    if sst > 0.0 {
        1.0 - sse / sst
    } else if sse == 0.0 {
        1.0
    } else {
        0.0
    }
}

/// Serializes as the part a shard sends.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RegressionMetrics {
    #[serde(with = "crate::nonfinite")]
    sse: f64,
    #[serde(with = "crate::nonfinite")]
    sae: f64,
    /// Count, mean and M2 of the actual values (SST = M2).
    actual: Welford,
}

impl RegressionMetrics {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, predicted: f64, actual: f64) {
        let e = predicted - actual;
        self.sse += e * e;
        self.sae += e.abs();
        self.actual.push(actual);
    }

    /// Rows counted.
    pub fn rows(&self) -> u64 {
        self.actual.n()
    }

    /// The squared errors' sum, and the actual values' moments.
    pub fn sse_and_actual(&self) -> (f64, Welford) {
        (self.sse, self.actual)
    }

    /// Adds another part's rows.
    pub fn merge(&mut self, other: &RegressionMetrics) {
        self.sse += other.sse;
        self.sae += other.sae;
        self.actual.merge(&other.actual);
    }

    pub fn finish(self) -> RegressionReport {
        let count = self.actual.n();
        if count == 0 {
            return RegressionReport {
                mse: 0.0,
                rmse: 0.0,
                mae: 0.0,
                r2: 0.0,
                n: 0,
            };
        }
        let n = count as f64;
        let mse = self.sse / n;
        let r2 = r2_score(self.sse, self.actual.m2());
        RegressionReport {
            mse,
            rmse: mse.sqrt(),
            mae: self.sae / n,
            r2,
            n: count,
        }
    }
}
