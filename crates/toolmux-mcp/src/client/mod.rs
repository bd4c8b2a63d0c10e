//! The client half: each configured MCP server becomes a [`McpProvider`].

mod config;
pub(crate) mod connection;
pub(crate) mod content;
mod failure;
mod filter;
mod handler;
mod interaction;
pub(crate) mod oauth;
pub(crate) mod passthrough;
mod provider;
mod sessions;
mod supply;
pub(crate) mod wire;

pub use config::{DeclaredTool, EnvInherit, McpServerConfig, ProtocolMode, TransportKind};
pub use oauth::{OAuthConfig, OAuthGrant, OAuthStatus, Opener};
pub use provider::McpProvider;
pub use sessions::{DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_IDLE, PerSessionProvider};

/// Installs ring as rustls's process-wide crypto provider unless one is installed, so
/// `https://` and `wss://` work without pulling in a second provider.
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race against another installer is fine: a provider is then installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
