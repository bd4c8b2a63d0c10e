//! Where tokens outlive the process: one JSON file per server URL, readable by its owner
//! only, replaced atomically. Only what a person approved is kept (an authorization code
//! grant's tokens and the client registration they were issued to); client-credentials
//! tokens are fetched again by each process.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// A client registration: pre-registered, a metadata document URL, or dynamic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Client {
    pub(crate) client_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) client_secret: Option<String>,
    /// `none`, `client_secret_basic`, `client_secret_post` or `private_key_jwt`.
    pub(crate) auth_method: String,
    /// The redirect URI it was registered with (dynamic registration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) redirect_uri: Option<String>,
    /// Where it was registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) registration_endpoint: Option<String>,
}

/// What is kept for one server.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Saved {
    /// The MCP endpoint, for people reading the directory.
    pub(crate) server_url: String,
    pub(crate) resource: String,
    pub(crate) issuer: String,
    pub(crate) token_endpoint: String,
    pub(crate) client: Client,
    pub(crate) access_token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) refresh_token: Option<String>,
    /// Seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expires_at: Option<u64>,
    /// The scopes granted (or requested, when the server did not say).
    #[serde(default)]
    pub(crate) scopes: Vec<String>,
    /// Whether the token is DPoP-bound (RFC 9449), and to which key (base64 PKCS#8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) dpop_key: Option<String>,
}

/// The token file of one server.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    path: PathBuf,
}

impl Store {
    /// The file for `server_url` in `dir`.
    pub(crate) fn new(dir: &Path, server_url: &str) -> Store {
        let digest = Sha256::digest(server_url.as_bytes());
        let name: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        Store { path: dir.join(format!("{name}.json")) }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The kept tokens; `None` when there are none. An unreadable file is reported once
    /// and treated as absent (a new authorization replaces it).
    pub(crate) fn load(&self) -> Option<Saved> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read the OAuth token file");
                return None;
            }
        };
        match serde_json::from_slice(&bytes) {
            Ok(saved) => Some(saved),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "ignoring an unreadable OAuth token file");
                None
            }
        }
    }

    /// Writes `saved` through a temporary file renamed over the old one, so a crash never
    /// leaves half a file; both are created readable by their owner only.
    pub(crate) fn save(&self, saved: &Saved) -> std::io::Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        create_private_dir(dir)?;
        let bytes = serde_json::to_vec_pretty(saved).map_err(std::io::Error::other)?;
        toolmux_core::replace_file(
            &self.path,
            &bytes,
            toolmux_core::Replace { private: true, durable: true },
        )
    }

    /// Forgets the server's tokens; `false` when there were none.
    pub(crate) fn remove(&self) -> std::io::Result<bool> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// The default directory: `$TOOLMUX_STATE_DIR/oauth`, `$XDG_STATE_HOME/toolmux/oauth` or
/// `~/.local/state/toolmux/oauth`.
pub(crate) fn default_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var("TOOLMUX_STATE_DIR") {
        return Some(dir.join("oauth"));
    }
    if let Some(dir) = var("XDG_STATE_HOME") {
        return Some(dir.join("toolmux/oauth"));
    }
    var("HOME").map(|home| home.join(".local/state/toolmux/oauth"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn round_trip_private_and_atomic() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::new(&dir.path().join("oauth"), "https://mcp.example.com/mcp");
        assert!(store.load().is_none());
        let saved = Saved {
            server_url: "https://mcp.example.com/mcp".into(),
            resource: "https://mcp.example.com/mcp".into(),
            issuer: "https://as.example.com".into(),
            token_endpoint: "https://as.example.com/token".into(),
            client: Client {
                client_id: "id".into(),
                client_secret: None,
                auth_method: "none".into(),
                redirect_uri: Some("http://127.0.0.1:1/callback".into()),
                registration_endpoint: None,
            },
            access_token: "at".into(),
            refresh_token: Some("rt".into()),
            expires_at: Some(1),
            scopes: vec!["a".into()],
            dpop_key: None,
        };
        store.save(&saved).expect("save");
        let loaded = store.load().expect("load");
        assert_eq!(loaded.refresh_token.as_deref(), Some("rt"));
        assert_eq!(loaded.client, saved.client);
        let mode = std::fs::metadata(store.path()).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let dir_mode =
            std::fs::metadata(dir.path().join("oauth")).expect("meta").permissions().mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        // Only the file itself is left: no temporary beside it.
        assert_eq!(std::fs::read_dir(dir.path().join("oauth")).expect("dir").count(), 1);
        std::fs::write(store.path(), b"{not json").expect("corrupt");
        assert!(store.load().is_none());
        assert!(store.remove().expect("remove"));
        assert!(!store.remove().expect("remove again"));
    }
}
