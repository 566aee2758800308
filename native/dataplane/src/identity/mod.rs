//! Workload identities: SPIFFE IDs, the keys and CSRs behind them, and the per-identity certificate store.
//!
//! Invariant: a private key is generated here and never leaves this crate. TS receives CSRs and hands back
//! certificate chains; it never sees key material.

mod keys;
mod store;

pub use keys::{create_csr, PendingKey};
pub use mesh::identity::*;
pub use store::{CertStore, InstalledCert, StoreError};
