//! Why a param is refused: the ERROR's message and hint, and whether it is a combination the
//! capability table refuses (0A000) or a bad value (22023).

/// Why a param is refused: the message (the ERROR's text) and a hint (its HINT).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ParamError {
    pub message: String,
    pub hint: Option<String>,
}

impl ParamError {
    /// A combination the capability table refuses.
    pub fn refused(r: &crate::capabilities::Refused) -> ParamError {
        ParamError {
            message: r.message.into(),
            hint: Some(r.hint.into()),
        }
    }

    /// Whether it is a combination the capability table refuses (not built yet: 0A000),
    /// rather than a bad value (22023).
    pub fn not_supported(&self) -> bool {
        crate::capabilities::REFUSED
            .iter()
            .any(|r| r.message == self.message)
    }
}
