//! Streamable HTTP at `/mcp`, with DNS-rebinding protection on `Host` and `Origin`.

use super::handler::{Gateway, Shared};
use crate::McpError;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The path the MCP endpoint is served at.
pub(crate) const MCP_PATH: &str = "/mcp";

/// The axum router serving `shared` at [`MCP_PATH`], for a server bound to `bound`.
pub(crate) fn router(
    shared: Arc<Shared>,
    bound: SocketAddr,
    shutdown: CancellationToken,
) -> axum::Router {
    let hosts = allowed_hosts(&shared.options().allowed_hosts, bound);
    let origins = allowed_origins(&hosts);
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(shutdown)
        .with_allowed_hosts(hosts.clone());
    // An empty list switches rmcp's checks off; toolmux only does that when asked to by
    // an empty `allowed_hosts`.
    if !hosts.is_empty() {
        config = config.with_allowed_origins(origins).enforce_origin_validation();
    }
    let factory_shared = shared;
    let service = StreamableHttpService::new(
        move || Ok(Gateway::new(factory_shared.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    axum::Router::new().nest_service(MCP_PATH, service)
}

/// The configured hosts plus the bound address, which a client naming the server by
/// that address sends as `Host`.
fn allowed_hosts(configured: &[String], bound: SocketAddr) -> Vec<String> {
    if configured.is_empty() {
        return Vec::new();
    }
    let mut hosts = configured.to_vec();
    let ip = bound.ip();
    if !ip.is_unspecified() {
        let ip = ip.to_string();
        if !hosts.contains(&ip) {
            hosts.push(ip);
        }
    }
    hosts
}

/// Browser origins on the allowed hosts, any port, http or https.
fn allowed_origins(hosts: &[String]) -> Vec<String> {
    let mut origins = Vec::with_capacity(hosts.len() * 2);
    for host in hosts {
        // A configured `host:port` keeps only the host part: an origin's port is that of
        // the page, not of this server.
        let bare = match host.rsplit_once(':') {
            Some((h, port)) if !h.contains(':') && port.parse::<u16>().is_ok() => h,
            _ => host.as_str(),
        };
        let bracketed = if bare.contains(':') && !bare.starts_with('[') {
            format!("[{bare}]")
        } else {
            bare.to_owned()
        };
        origins.push(format!("http://{bracketed}:*"));
        origins.push(format!("https://{bracketed}:*"));
    }
    origins
}

/// Binds `addr`; the error names the server and the address.
pub(crate) async fn bind(server: &str, addr: SocketAddr) -> Result<TcpListener, McpError> {
    TcpListener::bind(addr).await.map_err(|source| McpError::Serve {
        server: server.to_owned(),
        transport: "http",
        source: format!("cannot bind {addr}: {source}").into(),
    })
}

/// Serves `router` on `listener` until `shutdown` is cancelled.
pub(crate) async fn run(
    server: String,
    listener: TcpListener,
    router: axum::Router,
    shutdown: CancellationToken,
) -> Result<(), McpError> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled_owned().await })
        .await
        .map_err(|source| McpError::Serve { server, transport: "http", source: source.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_origins() {
        let configured: Vec<String> =
            ["127.0.0.1", "localhost", "::1", "example.com:8080"].map(String::from).into();
        let hosts = allowed_hosts(&configured, "127.0.0.2:9000".parse().unwrap());
        assert_eq!(hosts.last().map(String::as_str), Some("127.0.0.2"));
        let origins = allowed_origins(&hosts);
        assert!(origins.contains(&"http://[::1]:*".to_owned()));
        assert!(origins.contains(&"https://example.com:*".to_owned()));
        assert!(allowed_hosts(&[], "127.0.0.1:1".parse().unwrap()).is_empty());
        let any = allowed_hosts(&configured, "0.0.0.0:1".parse().unwrap());
        assert_eq!(any.len(), configured.len());
    }
}
