//! ztunnel-node's mesh model, with no sockets and no runtime: what istiod (WDS) and the local config file say the mesh
//! is, decoded and validated with Istio's defaults (`state`), held once with its indexes (`state::State`), and the L4
//! authorization decisions made against it (`rbac`). The dataplane crate serves connections from it; the napi binding
//! hands it TypeScript's batches. ARCHITECTURE.md draws the whole.

pub mod error_code;
pub mod identity;
pub mod rbac;
pub mod state;
pub mod yaml;

pub use error_code::ErrorCode;

/// The HBONE port (15008): inbound HBONE listens on it, and a workload's HBONE address is its IP and this port
/// unless its record says otherwise.
pub const HBONE_PORT: u16 = 15008;
