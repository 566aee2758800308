//! The boundary's error codes are the mesh crate's (`mesh::error_code`, generated as `NativeErrorCode`); this checks
//! that every error the dataplane itself returns starts with one.

pub use mesh::error_code::*;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every error the dataplane returns across the boundary starts with a code of this table.
    #[test]
    fn dataplane_errors_start_with_a_code() {
        use crate::DataplaneError;
        let errors: Vec<DataplaneError> = vec![
            DataplaneError::Spec("x".into()),
            DataplaneError::Runtime("x".into()),
            DataplaneError::Crl("x".into()),
            DataplaneError::Bind("127.0.0.1:1".parse().unwrap(), std::io::Error::other("x")),
            crate::config::ConfigError::Range { field: "x", problem: "y".into() }.into(),
            crate::state::StateError::Invalid { what: "workload", name: "x".into(), problem: "y".into() }.into(),
            crate::tls::TlsError::NoCertificate("x".into()).into(),
            crate::identity::StoreError::Missing("x".into()).into(),
            crate::preview::PreviewError::Request("x".into()).into(),
        ];
        for e in errors {
            assert!(ErrorCode::of_message(&e.to_string()).is_some(), "{e}");
        }
    }
}
