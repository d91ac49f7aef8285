//! The distances between a training distribution and today's, both given as shares of the same
//! bins (a number's training quantile bins and NULL, or a column's kept categories, "(other)"
//! and NULL), each list summing to 1 (or all 0: no rows).

/// The share an empty bin is given in the population stability index (whose terms divide by
/// and take the logarithm of shares): 1e-4, the usual floor (a bin with no row on one side
/// then adds about `share · ln(share / 1e-4)`, never infinity). The other shares are not
/// renormalized.
pub const PSI_EPSILON: f64 = 1e-4;

/// The population stability index, `Σ (today − training) · ln(today / training)` over the bins,
/// each share floored at [`PSI_EPSILON`]. 0 for equal distributions; conventionally below 0.1
/// is stable and above 0.25 a significant shift.
pub fn psi(training: &[f64], today: &[f64]) -> f64 {
    debug_assert_eq!(training.len(), today.len());
    training
        .iter()
        .zip(today)
        .map(|(&e, &a)| {
            let (e, a) = (e.max(PSI_EPSILON), a.max(PSI_EPSILON));
            (a - e) * (a / e).ln()
        })
        .sum()
}

/// The Jensen–Shannon divergence in bits (base-2 logarithms, so from 0 for equal distributions
/// to 1 for distributions without a common bin): `½ KL(P‖M) + ½ KL(Q‖M)`, `M = ½ (P + Q)`,
/// empty bins adding nothing. Not the Jensen–Shannon *distance* (its square root).
pub fn jensen_shannon(training: &[f64], today: &[f64]) -> f64 {
    debug_assert_eq!(training.len(), today.len());
    let kl_half = |p: f64, m: f64| if p > 0.0 { p * (p / m).log2() } else { 0.0 };
    let js: f64 = training
        .iter()
        .zip(today)
        .map(|(&p, &q)| {
            let m = 0.5 * (p + q);
            0.5 * kl_half(p, m) + 0.5 * kl_half(q, m)
        })
        .sum();
    js.clamp(0.0, 1.0)
}

/// The L-infinity distance: the largest difference of a bin's shares.
pub fn l_infinity(training: &[f64], today: &[f64]) -> f64 {
    training
        .iter()
        .zip(today)
        .map(|(&p, &q)| (p - q).abs())
        .fold(0.0, f64::max)
}
