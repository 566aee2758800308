//! The codes every native error message starts with (`<CODE>: `), in one place for both sides: the TypeScript union
//! `NativeErrorCode` is generated from this enum (ts-rs), and `ts/errors.ts` must describe each (its catalog is typed
//! by that union, so a code added here without a description does not compile there).

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "NativeErrorCode"))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// The dataplane's configuration.
    InvalidConfig,
    /// A state delta or one of its resources.
    InvalidState,
    /// A request's shape (a workload spec, a preview, a log level, a hand-over path).
    InvalidSpec,
    /// Not a SPIFFE identity the dataplane accepts.
    InvalidIdentity,
    /// Certificate revocation lists that do not parse.
    InvalidCrl,
    CsrFailed,
    CsrInvalid,
    CertMismatch,
    CertInvalid,
    NoCertificate,
    TlsConfig,
    BindFailed,
    CaError,
    Runtime,
    /// A CPU or heap profile could not be taken (one running already, cancelled, sampling off).
    Profile,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 15] = [
        ErrorCode::InvalidConfig,
        ErrorCode::InvalidState,
        ErrorCode::InvalidSpec,
        ErrorCode::InvalidIdentity,
        ErrorCode::InvalidCrl,
        ErrorCode::CsrFailed,
        ErrorCode::CsrInvalid,
        ErrorCode::CertMismatch,
        ErrorCode::CertInvalid,
        ErrorCode::NoCertificate,
        ErrorCode::TlsConfig,
        ErrorCode::BindFailed,
        ErrorCode::CaError,
        ErrorCode::Runtime,
        ErrorCode::Profile,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidConfig => "INVALID_CONFIG",
            ErrorCode::InvalidState => "INVALID_STATE",
            ErrorCode::InvalidSpec => "INVALID_SPEC",
            ErrorCode::InvalidIdentity => "INVALID_IDENTITY",
            ErrorCode::InvalidCrl => "INVALID_CRL",
            ErrorCode::CsrFailed => "CSR_FAILED",
            ErrorCode::CsrInvalid => "CSR_INVALID",
            ErrorCode::CertMismatch => "CERT_MISMATCH",
            ErrorCode::CertInvalid => "CERT_INVALID",
            ErrorCode::NoCertificate => "NO_CERTIFICATE",
            ErrorCode::TlsConfig => "TLS_CONFIG",
            ErrorCode::BindFailed => "BIND_FAILED",
            ErrorCode::CaError => "CA_ERROR",
            ErrorCode::Runtime => "RUNTIME",
            ErrorCode::Profile => "PROFILE",
        }
    }

    /// The code a native error message starts with, if any.
    pub fn of_message(message: &str) -> Option<ErrorCode> {
        let (code, _) = message.split_once(": ")?;
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == code)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_code_is_its_serde_name_and_listed_once() {
        for c in ErrorCode::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), serde_json::Value::from(c.as_str()));
            assert_eq!(ErrorCode::ALL.iter().filter(|&&o| o == c).count(), 1);
            assert_eq!(ErrorCode::of_message(&format!("{c}: x")), Some(c));
        }
        assert_eq!(ErrorCode::of_message("PANIC: x"), None);
    }
}
