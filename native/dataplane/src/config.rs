//! The dataplane's configuration, as the TypeScript layer hands it over (JSON, camelCase).
//! TS owns parsing of env vars and flags; this is the validated result, so it only checks ranges.

use serde::Deserialize;
use std::time::Duration;

/// Ports that ztunnel-node itself listens on. A connection to one of them through the proxy would loop.
pub use mesh::HBONE_PORT;
pub const OUTBOUND_CAPTURE_PORT: u16 = 15001;
pub const INBOUND_PLAINTEXT_PORT: u16 = 15006;
pub const SOCKS5_PORT: u16 = 15080;
pub const DNS_PORT: u16 = 15053;

/// The DNS proxy (15053).
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DnsConfig {
    /// ISTIO_META_DNS_CAPTURE: a server per local workload.
    pub enabled: bool,
    /// Where each pod's server listens inside its namespace (ISTIO_META_DNS_PROXY_ADDR / DNS_PROXY_ADDR):
    /// `localhost:<port>` (127.0.0.1, and ::1 when the pod has it) or an `ip:port`.
    pub addr: String,
    /// CLUSTER_DOMAIN
    pub cluster_domain: String,
    /// IPV6_ENABLED: AAAA questions are answered from the mesh (else they get no records).
    pub ipv6_enabled: bool,
    /// The daemon's resolv.conf nameservers, port 53 unless given.
    pub upstreams: Vec<std::net::SocketAddr>,
    /// The daemon's resolv.conf search list (dedicated mode strips these; shared mode uses each pod's
    /// Kubernetes defaults).
    pub search_domains: Vec<String>,
    /// PREFERED_SERVICE_NAMESPACE (sic, as ztunnel): the tie-breaker among same-hostname services.
    pub prefered_service_namespace: String,
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
            enabled: false,
            addr: format!("localhost:{DNS_PORT}"),
            cluster_domain: "cluster.local".into(),
            ipv6_enabled: true,
            upstreams: Vec::new(),
            search_domains: Vec::new(),
            prefered_service_namespace: String::new(),
        }
    }
}

impl DnsConfig {
    /// The addresses `addr` names: `localhost:<port>` is both loopbacks (the caller skips ::1 where it cannot bind).
    pub fn listen_addrs(&self) -> Result<Vec<std::net::SocketAddr>, String> {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
        if let Some(port) = self.addr.strip_prefix("localhost:") {
            let port: u16 = port.parse().map_err(|_| format!("dns.addr {:?}: bad port", self.addr))?;
            return Ok(vec![
                SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
                SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), port),
            ]);
        }
        self.addr
            .parse::<SocketAddr>()
            .map(|a| vec![a])
            .map_err(|_| format!("dns.addr {:?}: want localhost:<port> or <ip>:<port>", self.addr))
    }
}

#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Http2Config {
    pub stream_window_size: u32,
    pub connection_window_size: u32,
    pub frame_size: u32,
}

impl Default for Http2Config {
    fn default() -> Self {
        // Istio's defaults (ztunnel #1539): the connection window is 4x the stream window so one slow stream
        // cannot starve the others; 1 MiB frames keep the per-frame overhead low for bulk transfers.
        Http2Config {
            stream_window_size: 4 * 1024 * 1024,
            connection_window_size: 16 * 1024 * 1024,
            frame_size: 1024 * 1024,
        }
    }
}

/// TCP keepalive and user timeout on every proxied socket, the connections the proxies accept and the
/// upstream connections alike: ztunnel's `SocketConfig`, with its defaults.
#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SocketConfig {
    pub keepalive_enabled: bool,
    #[cfg_attr(test, ts(type = "number"))]
    pub keepalive_time_ms: u64,
    #[cfg_attr(test, ts(type = "number"))]
    pub keepalive_interval_ms: u64,
    pub keepalive_retries: u32,
    /// TCP_USER_TIMEOUT = time + interval × retries (ztunnel's rule), whether keepalive is on or not.
    pub user_timeout_enabled: bool,
}

impl Default for SocketConfig {
    fn default() -> Self {
        SocketConfig {
            keepalive_enabled: true,
            keepalive_time_ms: 180_000,
            keepalive_interval_ms: 180_000,
            keepalive_retries: 9,
            user_timeout_enabled: false,
        }
    }
}

/// What HBONE's TLS allows beyond TLS 1.3 with classical key exchange: ztunnel's TLS12_ENABLED and
/// COMPLIANCE_POLICY=pqc (`tls::provider_for`).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsPolicy {
    /// TLS 1.2 too, with the ECDHE AES-GCM suites (a TLS 1.2 connection is not handed over: it drains).
    pub tls12: bool,
    /// X25519MLKEM768 the only key exchange.
    pub pqc: bool,
    /// COMPLIANCE_POLICY=fips-140-2: the FIPS build's validated module, asserted at start, with P-256 the one key
    /// exchange (Istio's fips-140-2 curve); refused by a build without it.
    #[serde(default)]
    pub fips: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "DataplaneConfig"))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Config {
    pub node_name: String,
    pub cluster_id: String,
    pub network: String,
    pub trust_domain: String,
    /// TRUST_DOMAINS: trust domains accepted as aliases of each workload's own, in handshakes both ways and in
    /// policy principals (`identity::TrustDomains`); empty (the default) is ztunnel's behaviour.
    pub trust_domain_aliases: Vec<String>,
    pub worker_threads: usize,
    /// The port dialed on HBONE peers.
    pub hbone_port: u16,
    pub pool_max_streams_per_connection: u32,
    #[cfg_attr(test, ts(type = "number"))]
    pub pool_unused_release_timeout_ms: u64,
    pub http2: Http2Config,
    #[cfg_attr(test, ts(type = "number"))]
    pub connect_timeout_ms: u64,
    pub socks5_enabled: bool,
    /// The proxies (outbound capture, inbound plaintext, inbound HBONE, SOCKS5) of each in-pod workload; false is
    /// ztunnel's DNS-only mode (ENABLE_PROXY=false): its DNS proxy alone.
    pub proxy_enabled: bool,
    /// How long an inbound peer may take to finish the TLS handshake and the HTTP/2 preface. ztunnel has no such
    /// deadline on its 15008 listener; without one a peer can hold sockets open for free.
    #[cfg_attr(test, ts(type = "number"))]
    pub handshake_timeout_ms: u64,
    /// Bind outbound sockets to the source workload's IP. Local mode sets it, so peers (and their policies) see
    /// the workload's address rather than 127.0.0.1; in a pod's netns the pod IP is the only address anyway.
    pub bind_source_ip: bool,
    /// How long a live inbound connection is left unjudged while its workload names an authorization policy that
    /// has not arrived (istiod pushes the reference just before the policy). New connections are refused meanwhile.
    #[cfg_attr(test, ts(type = "number"))]
    pub missing_policy_grace_ms: u64,
    /// Reach a PROXY application tunnel on loopback, from loopback (LOCALHOST_APP_TUNNEL).
    pub localhost_app_tunnel: bool,
    /// The 200 of an inbound CONNECT carries the destination's baggage (ENABLE_RESPONSE_BAGGAGE).
    pub enable_response_baggage: bool,
    /// Authorization decisions and dry-run matches are logged at info, not debug (AUTHZ_POLICY_INFO_LOGGING, ztunnel's
    /// `authpol_log!`).
    pub authz_policy_info_logging: bool,
    /// The control side's own listening ports (admin, stats, readiness): never a tunnel destination either.
    pub own_ports: Vec<u16>,
    pub dns: DnsConfig,
    /// The node's budget for stream data buffered toward HBONE peers, in bytes (STREAM_BUFFER_BUDGET; `budget.rs`).
    pub stream_buffer_budget: usize,
    /// KEEPALIVE_* and USER_TIMEOUT_ENABLED.
    pub socket: SocketConfig,
    /// TLS12_ENABLED and COMPLIANCE_POLICY.
    pub tls: TlsPolicy,
    /// Connect retry and passive outlier ejection (beyond ztunnel).
    pub resilience: ResilienceConfig,
}

/// Connect retry and passive outlier ejection of service-addressed outbound connections (beyond ztunnel; README
/// "Resilience"). `connectAttempts` 1 and `consecutiveFailures` 0 are ztunnel's behaviour.
#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ResilienceConfig {
    /// Attempts of one service-addressed connect in all, each on an endpoint not tried yet, within the connect
    /// timeout (1: no retry).
    pub connect_attempts: u32,
    /// Consecutive connect failures that eject an endpoint (Envoy's `consecutive_gateway_failure`; 0: none).
    pub consecutive_failures: u32,
    /// The first ejection's length; the n-th lasts n times as long (Envoy's `base_ejection_time`).
    #[cfg_attr(test, ts(type = "number"))]
    pub base_ejection_ms: u64,
    /// The longest ejection (Envoy's `max_ejection_time`).
    #[cfg_attr(test, ts(type = "number"))]
    pub max_ejection_ms: u64,
    /// The share of a service's candidate endpoints that may be skipped for being ejected (rounded up, never all).
    pub max_ejection_percent: u32,
}

impl Default for ResilienceConfig {
    fn default() -> Self {
        ResilienceConfig {
            connect_attempts: 3,
            consecutive_failures: 5,
            base_ejection_ms: 30_000,
            max_ejection_ms: 300_000,
            max_ejection_percent: 50,
        }
    }
}

/// Outlier detection's settings (proxy/outlier.rs), from the config's `resilience`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutlierConfig {
    /// Consecutive connect failures that eject an endpoint (Envoy's `consecutive_gateway_failure`).
    pub consecutive_failures: u32,
    /// The first ejection's length; the n-th lasts n times as long (Envoy's `base_ejection_time`).
    pub base_ejection: Duration,
    /// No ejection lasts longer (Envoy's `max_ejection_time`).
    pub max_ejection: Duration,
    /// The share of a service's candidates that may be skipped for being ejected, rounded up, never all.
    pub max_ejection_percent: u32,
}

impl ResilienceConfig {
    pub fn outliers(&self) -> OutlierConfig {
        OutlierConfig {
            consecutive_failures: self.consecutive_failures,
            base_ejection: Duration::from_millis(self.base_ejection_ms),
            max_ejection: Duration::from_millis(self.max_ejection_ms),
            max_ejection_percent: self.max_ejection_percent,
        }
    }
}

/// The dataplane's defaults: the one table of them. Its Rust tests, examples and benches use it directly (and a JSON
/// that omits a field gets it); the TypeScript side reads it from `ts/native/generated/dataplaneDefaults.ts`, which
/// a test writes from this value (and `npm test` fails when the committed file differs), and sends every field.
impl Default for Config {
    fn default() -> Self {
        Config {
            node_name: String::new(),
            cluster_id: "Kubernetes".into(),
            network: String::new(),
            trust_domain: "cluster.local".into(),
            trust_domain_aliases: Vec::new(),
            worker_threads: 2,
            hbone_port: HBONE_PORT,
            pool_max_streams_per_connection: 100,
            pool_unused_release_timeout_ms: 5 * 60 * 1000,
            http2: Http2Config::default(),
            connect_timeout_ms: 10_000,
            socks5_enabled: true,
            proxy_enabled: true,
            handshake_timeout_ms: 10_000,
            bind_source_ip: false,
            missing_policy_grace_ms: 1_000,
            localhost_app_tunnel: true,
            enable_response_baggage: true,
            authz_policy_info_logging: false,
            own_ports: Vec::new(),
            dns: DnsConfig::default(),
            stream_buffer_budget: crate::budget::DEFAULT_LIMIT,
            socket: SocketConfig::default(),
            tls: TlsPolicy::default(),
            resilience: ResilienceConfig::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{code}: {0}", code = crate::ErrorCode::InvalidConfig)]
    Parse(#[from] serde_json::Error),
    #[error("{code}: {field}: {problem}", code = crate::ErrorCode::InvalidConfig)]
    Range { field: &'static str, problem: String },
}

impl Config {
    pub fn from_json(json: &str) -> Result<Config, ConfigError> {
        let cfg: Config = serde_json::from_str(json)?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let range = |field: &'static str, problem: String| Err(ConfigError::Range { field, problem });
        if self.worker_threads == 0 || self.worker_threads > 1024 {
            return range("workerThreads", format!("{} is not in 1..=1024", self.worker_threads));
        }
        let ka = &self.socket;
        if ka.keepalive_enabled && (ka.keepalive_time_ms < 1_000 || ka.keepalive_interval_ms < 1_000) {
            return range("socket", "keepalive time and interval must be at least 1s".into());
        }
        if ka.keepalive_enabled && (ka.keepalive_retries == 0 || ka.keepalive_retries > 127) {
            return range("socket.keepaliveRetries", format!("{} is not in 1..=127", ka.keepalive_retries));
        }
        let r = &self.resilience;
        if r.connect_attempts == 0 || r.connect_attempts > 10 {
            return range("resilience.connectAttempts", format!("{} is not in 1..=10", r.connect_attempts));
        }
        if r.max_ejection_percent > 100 {
            return range("resilience.maxEjectionPercent", format!("{} is over 100", r.max_ejection_percent));
        }
        if r.consecutive_failures > 0 && (r.base_ejection_ms == 0 || r.max_ejection_ms < r.base_ejection_ms) {
            return range("resilience", "the ejection times must be positive, the maximum at least the base".into());
        }
        if self.pool_max_streams_per_connection == 0 {
            return range("poolMaxStreamsPerConnection", "must be at least 1".into());
        }
        // RFC 9113 §6.5.2: SETTINGS_MAX_FRAME_SIZE must be between 2^14 and 2^24-1.
        if !(16_384..=16_777_215).contains(&self.http2.frame_size) {
            return range("http2.frameSize", format!("{} is not in 16384..=16777215", self.http2.frame_size));
        }
        if self.http2.stream_window_size == 0 || self.http2.stream_window_size > i32::MAX as u32 {
            return range("http2.streamWindowSize", "must be in 1..=2^31-1".into());
        }
        if self.http2.connection_window_size == 0 || self.http2.connection_window_size > i32::MAX as u32 {
            return range("http2.connectionWindowSize", "must be in 1..=2^31-1".into());
        }
        if self.stream_buffer_budget < crate::budget::HEAVY {
            return range("streamBufferBudget", format!("{} is below 1 MiB", self.stream_buffer_budget));
        }
        if let Err(problem) = self.dns.listen_addrs() {
            return range("dns.addr", problem);
        }
        Ok(())
    }

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    pub fn missing_policy_grace(&self) -> Duration {
        Duration::from_millis(self.missing_policy_grace_ms)
    }

    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }

    /// Ports a proxied connection may never target: they are our own listeners.
    /// The daemon's own ports, which no tunnel may reach on this node: the dataplane's listeners and the control
    /// side's servers (in every mode: in local mode they share the workloads' loopback).
    pub fn illegal_ports(&self) -> PortSet {
        let mut set = PortSet::default();
        for p in [OUTBOUND_CAPTURE_PORT, INBOUND_PLAINTEXT_PORT, HBONE_PORT] {
            set.insert(p);
        }
        if self.socks5_enabled {
            set.insert(SOCKS5_PORT);
        }
        if self.dns.enabled {
            set.insert(DNS_PORT);
        }
        for p in &self.own_ports {
            set.insert(*p);
        }
        set
    }
}

/// A few ports, on the stack (built per connection: no allocation).
#[derive(Debug, Default, Clone, Copy)]
pub struct PortSet {
    ports: [u16; 8],
    len: usize,
}

impl PortSet {
    fn insert(&mut self, p: u16) {
        if p != 0 && !self.ports[..self.len].contains(&p) && self.len < self.ports.len() {
            self.ports[self.len] = p;
            self.len += 1;
        }
    }
}

impl std::ops::Deref for PortSet {
    type Target = [u16];
    fn deref(&self) -> &[u16] {
        &self.ports[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `Config::default()` for the TypeScript side (ts/config/defaults.ts reads the dataplane's defaults from
    /// it), next to the generated types; the drift check of `npm test` compares it with the committed file.
    #[test]
    fn defaults_are_exported_for_the_control_side() {
        let json = serde_json::to_string_pretty(&Config::default()).unwrap();
        let ts = format!(
            "// Generated by `cargo test` (config::tests::defaults_are_exported_for_the_control_side) from the dataplane's\n\
             // `Default` (native/dataplane/src/config.rs). Do not edit this file manually: change the Rust value.\n\
             import type {{ DataplaneConfig }} from './DataplaneConfig.js';\n\n\
             export const DATAPLANE_DEFAULTS: DataplaneConfig = {json};\n"
        );
        let path = std::path::Path::new(env!("TS_RS_EXPORT_DIR")).join("dataplaneDefaults.ts");
        std::fs::write(&path, ts).unwrap();
        // The value written is the value read back: defaults pass their own validation.
        Config::from_json(&json).unwrap();
    }
}
