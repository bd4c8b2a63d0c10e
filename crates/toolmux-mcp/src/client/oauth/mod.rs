//! OAuth 2.1 to remote MCP servers, as the MCP authorization specification (2025-11-25)
//! sets it for clients: on a `401` the server's challenge leads to its protected resource
//! metadata and its authorization server; the client registers (pre-registered, a client
//! ID metadata document, or dynamic registration), a person approves in a browser (the
//! authorization code grant with PKCE, redirected to a loopback listener) or no one does
//! (the client credentials grant), and the token is sent with every request, refreshed
//! when it expires and widened when a `403` asks for more scope.
//!
//! Nothing here opens a browser on its own: a provider without an [`Opener`] (the gateway
//! serving clients, say) fails with the advice to run `toolmux mcp login NAME`, which
//! approves once and keeps the tokens in the [token store](OAuthConfig::token_store).

mod callback;
mod discovery;
mod http;
mod jwt;
mod store;

pub(crate) use http::{OAuthHttp, send};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures::future::BoxFuture;
use reqwest::Url;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use discovery::{Challenge, Discovered};
use store::{Client, Saved, Store};

/// RFC 7523's grant type.
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// The largest response read from an authorization server.
const MAX_RESPONSE: usize = 1 << 20;
/// Requests to authorization servers give up after this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A token this close to its expiry is refreshed before it is sent.
const EXPIRY_MARGIN: u64 = 30;
/// Scope step-ups tried for one request before its `403` is returned.
pub(crate) const MAX_STEP_UPS: u32 = 2;

/// Which OAuth grant toolmux uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OAuthGrant {
    /// A person approves in a browser once (`toolmux mcp login NAME`); the tokens are kept
    /// and refreshed.
    AuthorizationCode,
    /// No person: the client authenticates with `clientSecret` or `privateKey` (machine to
    /// machine, the MCP client credentials extension).
    ClientCredentials,
    /// Enterprise-managed authorization (SEP-990, cross-app access): the enterprise
    /// identity provider exchanges the person's ID token (`idpIdToken`) for an identity
    /// assertion grant, which the authorization server takes as a JWT bearer grant.
    EnterpriseManaged,
    /// Workload identity federation (SEP-1933): a JWT the platform issued to this workload
    /// (`assertion` or `assertionFile`) is the grant (RFC 7523).
    JwtBearer,
}

/// OAuth 2.1 authorization to a remote (streamable HTTP or legacy SSE) MCP server.
/// Without this section toolmux still authorizes a server that asks for it, with dynamic
/// client registration and the tokens `toolmux mcp login` kept; the keys here pre-register
/// a client, pick the grant or the scopes, or turn OAuth off.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct OAuthConfig {
    /// Whether toolmux authorizes at all when the server asks (default true; false also
    /// when `headers` carries an `Authorization` header).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// The grant (default: `clientCredentials` when the authorization server offers only
    /// that grant, else `authorizationCode`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant: Option<OAuthGrant>,
    /// A client registered with the authorization server beforehand; without it toolmux
    /// uses `clientMetadataUrl` or registers itself dynamically.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// The pre-registered client's secret (a secret: use `${VAR}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// The authorization server (its issuer) toolmux may authorize at; any other the
    /// server names is refused. Set it with a pre-registered client, whose secret is for
    /// that server only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// A PKCS#8 PEM private key for `private_key_jwt` client authentication (a secret: use
    /// `${VAR}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    /// The key's algorithm: `ES256` (default) or `RS256`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signing_algorithm: Option<String>,
    /// An `https://` URL serving toolmux's client ID metadata document, used as the client
    /// ID where the authorization server supports such documents.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_metadata_url: Option<String>,
    /// The scopes to ask for (default: the challenge's, else all the server lists).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<String>>,
    /// The loopback port of the redirect URI `http://127.0.0.1:PORT/callback` (default:
    /// any free port, kept with a dynamic registration).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect_port: Option<u16>,
    /// The client name shown on the consent page (default `toolmux`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_name: Option<String>,
    /// The directory tokens are kept in, one file per server URL, readable by its owner
    /// only (default `$TOOLMUX_STATE_DIR/oauth`, `$XDG_STATE_HOME/toolmux/oauth` or
    /// `~/.local/state/toolmux/oauth`); relative to `baseDir`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_store: Option<PathBuf>,
    /// Whether tokens are bound to a key toolmux holds (DPoP, RFC 9449), so that a stolen
    /// token is useless (default: when the authorization server supports it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dpop: Option<bool>,
    /// How long to wait for the person to approve, in ms (default 300000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authorization_timeout_ms: Option<u64>,
    /// Workload identity federation: the workload's JWT (a secret: use `${VAR}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assertion: Option<String>,
    /// Workload identity federation: a file holding the workload's JWT, read again for
    /// each token (platforms rotate it: a Kubernetes projected service account token, say);
    /// relative to `baseDir`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assertion_file: Option<PathBuf>,
    /// Enterprise-managed authorization: the identity provider's token endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idp_token_endpoint: Option<String>,
    /// Enterprise-managed authorization: toolmux's client ID at the identity provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idp_client_id: Option<String>,
    /// Enterprise-managed authorization: the person's ID token from the identity provider
    /// (a secret: use `${VAR}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idp_id_token: Option<String>,
}

/// What toolmux keeps for a server it authorizes with OAuth (never the tokens).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OAuthStatus {
    /// The file the tokens are kept in.
    pub token_file: Option<PathBuf>,
    /// Whether tokens are kept (`toolmux mcp login` was run, and no logout since).
    pub authorized: bool,
    /// The authorization server that issued them.
    pub issuer: Option<String>,
    /// The client they were issued to.
    pub client_id: Option<String>,
    /// When the access token expires, in seconds since the Unix epoch.
    pub expires_at: Option<u64>,
    /// Whether a refresh token is kept.
    pub refreshable: bool,
    /// The scopes granted.
    pub scopes: Vec<String>,
    /// Whether the tokens are DPoP-bound.
    pub dpop: bool,
}

/// Shows a person the authorization URL (a browser, a printed line, a test's HTTP GET).
/// The redirect comes back to toolmux's loopback listener, not through this.
pub trait Opener: Send + Sync + std::fmt::Debug {
    /// Opens `url` for the person approving access to `server`.
    fn open<'a>(&'a self, server: &'a str, url: &'a str) -> BoxFuture<'a, Result<(), String>>;
}

/// Why authorization failed. Never carries a token or a secret.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum OAuthError {
    #[error(
        "the server requires OAuth authorization and no one can approve it here: run \
         `toolmux mcp login {server}` once (the tokens are kept in {store})"
    )]
    LoginRequired { server: String, store: String },
    #[error(
        "the server asks for authorization and publishes no OAuth metadata: give its token in \
         `headers` (for example `Authorization: Bearer ${{TOKEN}}`), or, if it follows the \
         2025-03-26 OAuth defaults, run `toolmux mcp login {server}`"
    )]
    TokenOrLogin { server: String },
    #[error("{0}")]
    Failed(String),
}

impl OAuthError {
    pub(crate) fn failed(message: impl Into<String>) -> OAuthError {
        OAuthError::Failed(message.into())
    }

    /// An HTTP failure, with its causes but not its URL (it may carry a secret).
    pub(crate) fn http(what: &str, error: &reqwest::Error) -> OAuthError {
        let why = if error.is_timeout() {
            "the request timed out".to_owned()
        } else {
            std::error::Error::source(error)
                .map_or_else(|| "the request failed".to_owned(), toolmux_core::error_report)
        };
        OAuthError::Failed(format!("{what}: {why}"))
    }
}

/// One server's authorization state, shared by its connections.
#[derive(Debug)]
pub(crate) struct OAuth {
    server: String,
    url: Url,
    config: OAuthConfig,
    base_dir: Option<PathBuf>,
    store: Option<Store>,
    http: reqwest::Client,
    opener: Mutex<Option<Arc<dyn Opener>>>,
    /// The token sent with requests, and its generation (bumped with each new token).
    token: Mutex<Option<Token>>,
    generation: AtomicU64,
    /// Serializes loading, refreshing and authorizing.
    flow: tokio::sync::Mutex<Flow>,
    /// Why the last authorization failed, for the error the caller sees.
    failure: Mutex<Option<OAuthError>>,
    /// Whether the store has been read (and had nothing, or its token is in `token`).
    settled: std::sync::atomic::AtomicBool,
    /// The DPoP key of the current token, and the nonces the servers gave.
    dpop: Mutex<Option<Arc<jwt::DpopKey>>>,
    as_nonce: Mutex<Option<String>>,
    rs_nonce: Mutex<Option<String>>,
}

#[derive(Debug, Clone)]
struct Token {
    access: String,
    expires_at: Option<u64>,
    dpop: Option<Arc<jwt::DpopKey>>,
}

/// What a request presents: the token, and the key it is bound to when it is DPoP-bound.
#[derive(Debug, Clone)]
pub(crate) struct Credential {
    pub(crate) token: String,
    pub(crate) dpop: Option<Arc<jwt::DpopKey>>,
}

impl Credential {
    /// The `Authorization` value and, for DPoP, the proof for `method` on `url`.
    pub(crate) fn headers(
        &self,
        method: &str,
        url: &str,
        nonce: Option<&str>,
    ) -> Result<(String, Option<String>), OAuthError> {
        match &self.dpop {
            Some(key) => Ok((
                format!("DPoP {}", self.token),
                Some(key.proof(method, url, Some(&self.token), nonce)?),
            )),
            None => Ok((format!("Bearer {}", self.token), None)),
        }
    }
}

impl Token {
    fn fresh(&self, now: u64) -> bool {
        self.expires_at.is_none_or(|at| now + EXPIRY_MARGIN < at)
    }
}

#[derive(Debug, Default)]
struct Flow {
    loaded: bool,
    /// What the current token came from.
    saved: Option<Saved>,
}

/// The outcome of a challenge.
pub(crate) enum Challenged {
    /// A new token is in place: send the request again.
    Retry,
    /// Give up: the request's own error stands, and `failure` says why.
    GiveUp,
}

impl OAuth {
    /// OAuth for the server `server` at `url`, or `None` when it is turned off.
    pub(crate) fn new(
        server: &str,
        url: &str,
        config: Option<&OAuthConfig>,
        base_dir: Option<&Path>,
        headers: &std::collections::BTreeMap<String, String>,
    ) -> Option<OAuth> {
        let config = config.cloned().unwrap_or_default();
        let has_authorization = headers.keys().any(|k| k.eq_ignore_ascii_case("authorization"));
        if config.enabled == Some(false) || (has_authorization && config.enabled.is_none()) {
            return None;
        }
        let url = Url::parse(url).ok()?;
        let dir = match &config.token_store {
            Some(dir) if dir.is_relative() => {
                base_dir.map(|base| base.join(dir)).or(Some(dir.clone()))
            }
            Some(dir) => Some(dir.clone()),
            None => store::default_dir(),
        };
        let store = dir.map(|dir| Store::new(&dir, &discovery::canonical_resource(&url)));
        super::ensure_crypto_provider();
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            // A token request is never sent on to where a redirect points.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .ok()?;
        Some(OAuth {
            server: server.to_owned(),
            url,
            config,
            base_dir: base_dir.map(Path::to_path_buf),
            store,
            http,
            opener: Mutex::new(None),
            token: Mutex::new(None),
            generation: AtomicU64::new(0),
            flow: tokio::sync::Mutex::new(Flow::default()),
            failure: Mutex::new(None),
            settled: std::sync::atomic::AtomicBool::new(false),
            dpop: Mutex::new(None),
            as_nonce: Mutex::new(None),
            rs_nonce: Mutex::new(None),
        })
    }

    /// Lets authorization code grants run: `opener` shows the person the URL.
    pub(crate) fn set_opener(&self, opener: Option<Arc<dyn Opener>>) {
        *lock(&self.opener) = opener;
    }

    /// How long a person may take to approve: zero without an opener (nobody approves).
    pub(crate) fn approval_time(&self) -> Duration {
        if lock(&self.opener).is_some() {
            Duration::from_millis(self.config.authorization_timeout_ms.unwrap_or(300_000))
        } else {
            Duration::ZERO
        }
    }

    /// What is kept for this server, read from the store (no request is made).
    pub(crate) fn status(&self) -> OAuthStatus {
        let kept = self.store.as_ref().and_then(Store::load);
        OAuthStatus {
            token_file: self.store_path().map(Path::to_path_buf),
            authorized: kept.is_some(),
            issuer: kept.as_ref().map(|k| k.issuer.clone()),
            client_id: kept.as_ref().map(|k| k.client.client_id.clone()),
            expires_at: kept.as_ref().and_then(|k| k.expires_at),
            refreshable: kept.as_ref().is_some_and(|k| k.refresh_token.is_some()),
            scopes: kept.as_ref().map(|k| k.scopes.clone()).unwrap_or_default(),
            dpop: kept.as_ref().is_some_and(|k| k.dpop_key.is_some()),
        }
    }

    /// Where tokens are kept.
    pub(crate) fn store_path(&self) -> Option<&Path> {
        self.store.as_ref().map(Store::path)
    }

    /// Forgets the kept and current tokens; whether any were kept.
    pub(crate) async fn forget(&self) -> std::io::Result<bool> {
        let mut flow = self.flow.lock().await;
        flow.saved = None;
        flow.loaded = true;
        *lock(&self.token) = None;
        self.generation.fetch_add(1, Ordering::AcqRel);
        match &self.store {
            Some(store) => store.remove(),
            None => Ok(false),
        }
    }

    /// The nonce the MCP server last asked DPoP proofs to carry.
    pub(crate) fn rs_nonce(&self) -> Option<String> {
        lock(&self.rs_nonce).clone()
    }

    /// Remembers the nonce the MCP server wants in DPoP proofs.
    pub(crate) fn set_rs_nonce(&self, nonce: String) {
        *lock(&self.rs_nonce) = Some(nonce);
    }

    /// Finds out the nonce the MCP server wants in DPoP proofs, which rmcp's client does
    /// not pass on from its `DPoP-Nonce` header: a `ping` with a proof without a nonce,
    /// refused by such a server before it is read, gets the header.
    pub(crate) async fn learn_rs_nonce(&self, credential: &Credential, url: &str) -> bool {
        let Ok((authorization, proof)) = credential.headers("POST", url, None) else {
            return false;
        };
        let mut request = self
            .http
            .post(url)
            .header(reqwest::header::AUTHORIZATION, authorization)
            .header(reqwest::header::ACCEPT, "application/json, text/event-stream")
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(r#"{"jsonrpc":"2.0","id":"toolmux-dpop-nonce","method":"ping"}"#);
        if let Some(proof) = proof {
            request = request.header("DPoP", proof);
        }
        let Ok(response) = request.send().await else { return false };
        let nonce =
            response.headers().get("DPoP-Nonce").and_then(|v| v.to_str().ok()).map(str::to_owned);
        match nonce {
            Some(nonce) => {
                *lock(&self.rs_nonce) = Some(nonce);
                true
            }
            None => false,
        }
    }

    /// Why the last authorization failed.
    pub(crate) fn failure(&self) -> Option<OAuthError> {
        lock(&self.failure).clone()
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The token to send and its generation: the current one while fresh, else a
    /// refreshed or kept one; `None` before any authorization.
    pub(crate) async fn bearer(&self) -> (Option<Credential>, u64) {
        let now = now();
        let credential = |t: &Token| Credential { token: t.access.clone(), dpop: t.dpop.clone() };
        {
            let token = lock(&self.token);
            if let Some(token) = token.as_ref().filter(|t| t.fresh(now)) {
                return (Some(credential(token)), self.generation());
            }
            // A server that never asked for a token: nothing to wait for.
            if token.is_none() && self.settled.load(Ordering::Acquire) {
                return (None, self.generation());
            }
        }
        let mut flow = self.flow.lock().await;
        self.load(&mut flow);
        let stale = {
            let token = lock(&self.token);
            match token.as_ref() {
                Some(token) if token.fresh(now) => {
                    return (Some(credential(token)), self.generation());
                }
                Some(token) => Some(credential(token)),
                None => None,
            }
        };
        if stale.is_some() && self.refresh(&mut flow).await.is_ok() {
            let token = lock(&self.token).as_ref().map(credential);
            return (token, self.generation());
        }
        // An expired token without a refresh: the server's 401 starts authorization.
        (stale, self.generation())
    }

    /// Takes the kept tokens when they are newer than the ones in use: whether they were.
    fn reload(&self, flow: &mut Flow) -> bool {
        let Some(kept) = self.store.as_ref().and_then(Store::load) else { return false };
        let current = flow.saved.as_ref().map(|s| s.access_token.as_str());
        if current == Some(kept.access_token.as_str()) || kept.resource.is_empty() {
            return false;
        }
        flow.loaded = false;
        self.load(flow);
        true
    }

    /// The kept tokens, once.
    fn load(&self, flow: &mut Flow) {
        if flow.loaded {
            return;
        }
        flow.loaded = true;
        self.install_kept(flow);
        self.settled.store(true, Ordering::Release);
    }

    fn install_kept(&self, flow: &mut Flow) {
        let Some(saved) = self.store.as_ref().and_then(Store::load) else { return };
        if saved.resource.is_empty() {
            return;
        }
        let dpop = match saved.dpop_key.as_deref().map(jwt::DpopKey::from_kept) {
            Some(Ok(key)) => Some(Arc::new(key)),
            Some(Err(e)) => {
                tracing::warn!(server = %self.server, error = %e, "ignoring kept tokens");
                return;
            }
            None => None,
        };
        *lock(&self.dpop) = dpop.clone();
        *lock(&self.token) =
            Some(Token { access: saved.access_token.clone(), expires_at: saved.expires_at, dpop });
        self.generation.fetch_add(1, Ordering::AcqRel);
        flow.saved = Some(saved);
    }

    /// Answers a `401` (`scope_needed` false) or a `403 insufficient_scope` seen by a
    /// request that sent the token of generation `sent`.
    pub(crate) async fn challenged(
        &self,
        header: &str,
        sent: u64,
        scope_needed: bool,
    ) -> Challenged {
        let mut flow = self.flow.lock().await;
        self.load(&mut flow);
        if self.generation() != sent {
            // Another request already brought a new token.
            return Challenged::Retry;
        }
        // Another process (or another session's provider) may have refreshed or
        // re-authorized since this one read the store; a rotated refresh token would make
        // this one's refresh fail.
        if !scope_needed && self.reload(&mut flow) {
            return Challenged::Retry;
        }
        let challenge = Challenge::parse(header);
        let outcome = if scope_needed {
            self.step_up(&mut flow, &challenge).await
        } else {
            self.reauthorize(&mut flow, &challenge).await
        };
        match outcome {
            Ok(()) => {
                *lock(&self.failure) = None;
                Challenged::Retry
            }
            Err(error) => {
                tracing::warn!(server = %self.server, error = %error, "OAuth authorization failed");
                *lock(&self.failure) = Some(error);
                Challenged::GiveUp
            }
        }
    }

    /// A `401`. With a token already held, the server may have moved to another
    /// authorization server: credentials are bound to the one that issued them (SEP-2352),
    /// so they are dropped and toolmux registers anew; else a refresh, else authorization.
    async fn reauthorize(&self, flow: &mut Flow, challenge: &Challenge) -> Result<(), OAuthError> {
        let Some(held_issuer) = flow.saved.as_ref().map(|s| s.issuer.clone()) else {
            return self.authorize(flow, challenge, None).await;
        };
        let found = self.discover(challenge).await?;
        if found.issuer != held_issuer {
            tracing::info!(
                server = %self.server, from = %held_issuer, to = %found.issuer,
                "the server moved to another authorization server; registering anew"
            );
            flow.saved = None;
        } else if self.refresh(flow).await.is_ok() {
            return Ok(());
        }
        self.authorize_at(flow, challenge, None, found).await
    }

    /// A `403` asking for scope the token lacks: authorize again for the scopes held plus
    /// those asked for. Scope already held cannot be asked for again: that would loop.
    async fn step_up(&self, flow: &mut Flow, challenge: &Challenge) -> Result<(), OAuthError> {
        let held: Vec<String> = flow.saved.as_ref().map(|s| s.scopes.clone()).unwrap_or_default();
        let Some(needed) = challenge.scopes() else {
            return Err(OAuthError::failed(
                "the server refuses the token (403) without saying which scope it needs",
            ));
        };
        let missing: Vec<&String> = needed.iter().filter(|s| !held.contains(s)).collect();
        if missing.is_empty() {
            return Err(OAuthError::failed(format!(
                "the server refuses the token for insufficient scope although it was granted `{}`; \
                 asking again would not help: check the account's permissions on the server",
                held.join(" ")
            )));
        }
        let mut scopes = held;
        scopes.extend(missing.into_iter().cloned());
        self.authorize(flow, challenge, Some(scopes)).await
    }

    /// The refresh token grant, when a refresh token is kept.
    async fn refresh(&self, flow: &mut Flow) -> Result<(), OAuthError> {
        let Some(saved) = flow.saved.clone() else {
            return Err(OAuthError::failed("no refresh token"));
        };
        let Some(refresh_token) = saved.refresh_token.clone() else {
            return Err(OAuthError::failed("no refresh token"));
        };
        let mut form = vec![
            ("grant_type", "refresh_token".to_owned()),
            ("refresh_token", refresh_token),
            ("resource", saved.resource.clone()),
        ];
        let response = self
            .token_request(&saved.token_endpoint, &saved.issuer, &saved.client, &mut form)
            .await;
        match response {
            Ok(tokens) => {
                let mut saved = saved;
                saved.access_token = tokens.access_token;
                if !tokens.dpop {
                    saved.dpop_key = None;
                }
                // A server may rotate the refresh token; else the old one stays good.
                if tokens.refresh_token.is_some() {
                    saved.refresh_token = tokens.refresh_token;
                }
                saved.expires_at = tokens.expires_in.map(|s| now() + s);
                if let Some(scope) = tokens.scope {
                    saved.scopes = discovery::split_scopes(&scope);
                }
                tracing::debug!(server = %self.server, "OAuth token refreshed");
                self.install(flow, saved, true);
                Ok(())
            }
            Err(error) => {
                tracing::debug!(server = %self.server, error = %error, "OAuth refresh failed");
                // The refresh token is spent or revoked: only a new authorization helps.
                if let Some(saved) = flow.saved.as_mut() {
                    saved.refresh_token = None;
                }
                Err(error)
            }
        }
    }

    /// Discovery, registration and a grant: a new token for `scopes` (default: chosen by
    /// the specification's rules).
    async fn authorize(
        &self,
        flow: &mut Flow,
        challenge: &Challenge,
        scopes: Option<Vec<String>>,
    ) -> Result<(), OAuthError> {
        let found = self.discover(challenge).await?;
        self.authorize_at(flow, challenge, scopes, found).await
    }

    /// Discovery, held to `oauth.issuer` when it is set: a server cannot then send toolmux,
    /// and the pre-registered client's secret, to an authorization server of its choosing.
    async fn discover(&self, challenge: &Challenge) -> Result<Discovered, OAuthError> {
        let found = discovery::discover(&self.http, &self.url, challenge).await?;
        if let Some(pinned) = &self.config.issuer
            && pinned.trim_end_matches('/') != found.issuer.trim_end_matches('/')
        {
            return Err(OAuthError::failed(format!(
                "the server sends toolmux to the authorization server `{}`, not to `{pinned}` \
                 (`oauth.issuer`); refusing to authorize there",
                found.issuer
            )));
        }
        Ok(found)
    }

    /// Registration and a grant at the authorization server `found`.
    async fn authorize_at(
        &self,
        flow: &mut Flow,
        challenge: &Challenge,
        scopes: Option<Vec<String>>,
        found: Discovered,
    ) -> Result<(), OAuthError> {
        let scopes = scopes
            .or_else(|| self.config.scopes.clone())
            .or_else(|| challenge.scopes())
            .or_else(|| found.resource_metadata.as_ref().and_then(|m| m.scopes_supported.clone()))
            .unwrap_or_default();
        // DPoP where the authorization server takes ES256 proofs, unless turned off.
        let dpop_supported = found
            .metadata
            .as_ref()
            .and_then(|m| m.dpop_signing_alg_values_supported.as_ref())
            .is_some_and(|algs| algs.iter().any(|a| a == "ES256"));
        let key = match (self.config.dpop, dpop_supported) {
            (Some(false), _) | (None, false) => None,
            (Some(true), false) => {
                return Err(OAuthError::failed(
                    "`oauth.dpop` is on but the authorization server takes no ES256 DPoP proofs \
                     (`dpop_signing_alg_values_supported`)",
                ));
            }
            (_, true) => {
                let held = lock(&self.dpop).clone();
                Some(match held {
                    Some(key) => key,
                    None => Arc::new(jwt::DpopKey::generate()?),
                })
            }
        };
        *lock(&self.dpop) = key;
        let grant = self.config.grant.unwrap_or_else(|| {
            if self.config.idp_id_token.is_some() {
                return OAuthGrant::EnterpriseManaged;
            }
            if self.config.assertion.is_some() || self.config.assertion_file.is_some() {
                return OAuthGrant::JwtBearer;
            }
            let grants = found.metadata.as_ref().and_then(|m| m.grant_types_supported.as_ref());
            match grants {
                Some(g)
                    if g.iter().any(|g| g == "client_credentials")
                        && !g.iter().any(|g| g == "authorization_code") =>
                {
                    OAuthGrant::ClientCredentials
                }
                _ => OAuthGrant::AuthorizationCode,
            }
        });
        let saved = match grant {
            OAuthGrant::ClientCredentials => self.client_credentials(&found, scopes).await?,
            OAuthGrant::EnterpriseManaged => self.enterprise_managed(&found, scopes).await?,
            OAuthGrant::JwtBearer => self.jwt_bearer(&found, scopes).await?,
            OAuthGrant::AuthorizationCode => self.authorization_code(flow, &found, scopes).await?,
        };
        self.install(flow, saved, grant == OAuthGrant::AuthorizationCode);
        Ok(())
    }

    /// Puts a new token in place, and keeps it when `keep`.
    fn install(&self, flow: &mut Flow, saved: Saved, keep: bool) {
        let dpop = if saved.dpop_key.is_some() { lock(&self.dpop).clone() } else { None };
        *lock(&self.token) =
            Some(Token { access: saved.access_token.clone(), expires_at: saved.expires_at, dpop });
        self.generation.fetch_add(1, Ordering::AcqRel);
        if let Some(store) = self.store.as_ref().filter(|_| keep)
            && let Err(e) = store.save(&saved)
        {
            tracing::warn!(
                server = %self.server, path = %store.path().display(), error = %e,
                "cannot keep the OAuth tokens; the next process will authorize again"
            );
        }
        flow.saved = Some(saved);
    }

    async fn client_credentials(
        &self,
        found: &Discovered,
        scopes: Vec<String>,
    ) -> Result<Saved, OAuthError> {
        let client = self.configured_client(found)?.ok_or_else(|| {
            OAuthError::failed(
                "the client credentials grant needs `oauth.clientId` with `oauth.clientSecret` or `oauth.privateKey`",
            )
        })?;
        self.grant(found, client, "client_credentials", Vec::new(), scopes).await
    }

    /// A token request for `grant` with `params`, the resource and the scopes, as `client`.
    async fn grant(
        &self,
        found: &Discovered,
        client: Client,
        grant: &str,
        params: Vec<(&'static str, String)>,
        scopes: Vec<String>,
    ) -> Result<Saved, OAuthError> {
        let mut form = vec![("grant_type", grant.to_owned())];
        form.extend(params);
        form.push(("resource", found.resource.clone()));
        if !scopes.is_empty() {
            form.push(("scope", scopes.join(" ")));
        }
        let tokens =
            self.token_request(&found.token_endpoint, &found.issuer, &client, &mut form).await?;
        Ok(self.saved(found, client, tokens, scopes))
    }

    /// SEP-1933: the workload's JWT is the grant. A refusal is final: the same assertion
    /// would be refused again.
    async fn jwt_bearer(
        &self,
        found: &Discovered,
        scopes: Vec<String>,
    ) -> Result<Saved, OAuthError> {
        let assertion = match (&self.config.assertion, &self.config.assertion_file) {
            (Some(assertion), _) => assertion.trim().to_owned(),
            (None, Some(path)) => {
                let path = match &self.base_dir {
                    Some(base) if path.is_relative() => base.join(path),
                    _ => path.clone(),
                };
                std::fs::read_to_string(&path)
                    .map_err(|e| {
                        OAuthError::failed(format!(
                            "cannot read `oauth.assertionFile` {}: {e}",
                            path.display()
                        ))
                    })?
                    .trim()
                    .to_owned()
            }
            (None, None) => {
                return Err(OAuthError::failed(
                    "the JWT bearer grant needs `oauth.assertion` or `oauth.assertionFile`",
                ));
            }
        };
        let client = self.configured_client(found)?.unwrap_or(Client {
            client_id: String::new(),
            client_secret: None,
            auth_method: "none".into(),
            redirect_uri: None,
            registration_endpoint: None,
        });
        self.grant(found, client, JWT_BEARER, vec![("assertion", assertion)], scopes).await
    }

    /// SEP-990: the ID token becomes an identity assertion at the identity provider
    /// (RFC 8693 token exchange), and the assertion an access token at the authorization
    /// server (RFC 7523 JWT bearer grant).
    async fn enterprise_managed(
        &self,
        found: &Discovered,
        scopes: Vec<String>,
    ) -> Result<Saved, OAuthError> {
        let (Some(idp_endpoint), Some(id_token)) =
            (&self.config.idp_token_endpoint, &self.config.idp_id_token)
        else {
            return Err(OAuthError::failed(
                "enterprise-managed authorization needs `oauth.idpTokenEndpoint` and `oauth.idpIdToken`",
            ));
        };
        let client = self.configured_client(found)?.ok_or_else(|| {
            OAuthError::failed(
                "enterprise-managed authorization needs `oauth.clientId` (and its secret)",
            )
        })?;
        let endpoint = Url::parse(idp_endpoint).map_err(|e| {
            OAuthError::failed(format!("`oauth.idpTokenEndpoint` is not a URL ({e})"))
        })?;
        discovery::check_secure(&endpoint, "the identity provider's token endpoint")?;
        let mut exchange = vec![
            ("grant_type", "urn:ietf:params:oauth:grant-type:token-exchange".to_owned()),
            ("requested_token_type", "urn:ietf:params:oauth:token-type:id-jag".to_owned()),
            ("subject_token", id_token.clone()),
            ("subject_token_type", "urn:ietf:params:oauth:token-type:id_token".to_owned()),
            ("audience", found.issuer.clone()),
            ("resource", found.resource.clone()),
        ];
        if let Some(idp_client) = &self.config.idp_client_id {
            exchange.push(("client_id", idp_client.clone()));
        }
        if !scopes.is_empty() {
            exchange.push(("scope", scopes.join(" ")));
        }
        let request = self
            .http
            .post(endpoint)
            .header(reqwest::header::ACCEPT, "application/json")
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form_body(&exchange));
        let bytes = accepted(
            request,
            "the identity provider's token exchange failed",
            "the identity provider refused the token exchange",
        )
        .await?;
        #[derive(Deserialize)]
        struct Exchanged {
            access_token: String,
        }
        let assertion = serde_json::from_slice::<Exchanged>(&bytes)
            .map_err(|e| {
                OAuthError::failed(format!("the token exchange response has no assertion ({e})"))
            })?
            .access_token;
        self.grant(found, client, JWT_BEARER, vec![("assertion", assertion)], scopes).await
    }

    async fn authorization_code(
        &self,
        flow: &Flow,
        found: &Discovered,
        mut scopes: Vec<String>,
    ) -> Result<Saved, OAuthError> {
        let opener = lock(&self.opener).clone().ok_or_else(|| {
            if found.metadata.is_none() && found.resource_metadata.is_none() {
                // Likely a server that wants a static token, not OAuth.
                return OAuthError::TokenOrLogin { server: self.server.clone() };
            }
            OAuthError::LoginRequired {
                server: self.server.clone(),
                store: self
                    .store_path()
                    .and_then(Path::parent)
                    .map_or_else(|| "memory only".to_owned(), |p| p.display().to_string()),
            }
        })?;
        if let Some(metadata) = &found.metadata {
            let pkce = metadata
                .code_challenge_methods_supported
                .as_ref()
                .is_some_and(|m| m.iter().any(|m| m == "S256"));
            if !pkce {
                return Err(OAuthError::failed(
                    "the authorization server does not list PKCE with S256 (`code_challenge_methods_supported`); \
                     MCP clients must not authorize without it",
                ));
            }
            // Ask for a refresh token where the server offers one (SEP-2207).
            let offline = metadata
                .scopes_supported
                .as_ref()
                .is_some_and(|s| s.iter().any(|s| s == "offline_access"));
            if offline && !scopes.is_empty() && !scopes.iter().any(|s| s == "offline_access") {
                scopes.push("offline_access".to_owned());
            }
        }
        // A dynamic registration is reused with its redirect port; else any free port.
        let kept = flow.saved.as_ref().map(|s| &s.client).filter(|c| {
            c.registration_endpoint.is_some()
                && c.registration_endpoint == found.registration_endpoint
        });
        let kept_port = kept
            .and_then(|c| c.redirect_uri.as_deref())
            .and_then(|uri| Url::parse(uri).ok())
            .and_then(|uri| uri.port());
        let port = self.config.redirect_port.or(kept_port).unwrap_or(0);
        let callback = match callback::Callback::bind(port).await {
            Ok(callback) => callback,
            Err(_) if self.config.redirect_port.is_none() && port != 0 => {
                callback::Callback::bind(0).await.map_err(listener_error)?
            }
            Err(e) => return Err(listener_error(e)),
        };
        let redirect_uri = callback.redirect_uri();
        let client = match self.configured_client(found)? {
            Some(client) => client,
            None => match kept.filter(|c| c.redirect_uri.as_deref() == Some(&redirect_uri)) {
                Some(client) => client.clone(),
                None => self.register(found, &redirect_uri).await?,
            },
        };
        let verifier = random_token()?;
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
        let state = random_token()?;
        let mut url = Url::parse(&found.authorization_endpoint).map_err(|e| {
            OAuthError::failed(format!("the authorization endpoint is not a URL ({e})"))
        })?;
        {
            let mut query = url.query_pairs_mut();
            query
                .append_pair("response_type", "code")
                .append_pair("client_id", &client.client_id)
                .append_pair("redirect_uri", &redirect_uri)
                .append_pair("code_challenge", &challenge)
                .append_pair("code_challenge_method", "S256")
                .append_pair("state", &state)
                .append_pair("resource", &found.resource);
            if !scopes.is_empty() {
                query.append_pair("scope", &scopes.join(" "));
            }
        }
        tracing::info!(server = %self.server, "waiting for OAuth approval in the browser");
        let timeout =
            Duration::from_millis(self.config.authorization_timeout_ms.unwrap_or(300_000));
        let wait = async {
            let opened = opener.open(&self.server, url.as_str());
            let redirected = callback.wait(&state);
            tokio::pin!(redirected);
            tokio::select! {
                biased;
                redirect = &mut redirected => redirect,
                opened = opened => match opened {
                    Ok(()) => redirected.await,
                    Err(why) => Err(OAuthError::failed(format!("cannot open the authorization URL: {why}"))),
                },
            }
        };
        let redirect = tokio::time::timeout(timeout, wait).await.map_err(|_| {
            OAuthError::failed(format!(
                "no approval within {} s; run the authorization again",
                timeout.as_secs()
            ))
        })??;
        // RFC 9207: a response carrying another issuer's `iss` is a mix-up attack; one
        // without it, from a server that promised it, is refused too. Compared exactly.
        let promised = found
            .metadata
            .as_ref()
            .and_then(|m| m.authorization_response_iss_parameter_supported)
            .unwrap_or(false);
        match &redirect.iss {
            Some(iss) if iss != &found.issuer => {
                return Err(OAuthError::failed(format!(
                    "the authorization response comes from the issuer `{iss}`, not `{}`; refusing it \
                     (a mix-up attack, or a misconfigured server)",
                    found.issuer
                )));
            }
            None if promised => {
                return Err(OAuthError::failed(
                    "the authorization response has no `iss` although the server promised one \
                     (`authorization_response_iss_parameter_supported`); refusing it",
                ));
            }
            _ => {}
        }
        let mut form = vec![
            ("grant_type", "authorization_code".to_owned()),
            ("code", redirect.code),
            ("redirect_uri", redirect_uri),
            ("code_verifier", verifier),
            ("resource", found.resource.clone()),
        ];
        let tokens =
            self.token_request(&found.token_endpoint, &found.issuer, &client, &mut form).await?;
        Ok(self.saved(found, client, tokens, scopes))
    }

    fn saved(
        &self,
        found: &Discovered,
        client: Client,
        tokens: TokenResponse,
        asked: Vec<String>,
    ) -> Saved {
        Saved {
            server_url: self.url.to_string(),
            resource: found.resource.clone(),
            issuer: found.issuer.clone(),
            token_endpoint: found.token_endpoint.clone(),
            client,
            access_token: tokens.access_token,
            refresh_token: tokens.refresh_token,
            expires_at: tokens.expires_in.map(|s| now() + s),
            scopes: tokens.scope.map_or(asked, |s| discovery::split_scopes(&s)),
            dpop_key: tokens.dpop.then(|| lock(&self.dpop).as_ref().map(|k| k.kept())).flatten(),
        }
    }

    /// A client from the configuration: pre-registered, or a metadata document URL the
    /// server supports; `None` when toolmux must register itself.
    fn configured_client(&self, found: &Discovered) -> Result<Option<Client>, OAuthError> {
        let supported =
            found.metadata.as_ref().and_then(|m| m.token_endpoint_auth_methods_supported.clone());
        let supports =
            |method: &str| supported.as_ref().is_none_or(|s| s.iter().any(|m| m == method));
        if let Some(client_id) = &self.config.client_id {
            let auth_method = if self.config.private_key.is_some() {
                "private_key_jwt"
            } else if self.config.client_secret.is_some() {
                // RFC 8414's default is client_secret_basic.
                if supports("client_secret_basic") || !supports("client_secret_post") {
                    "client_secret_basic"
                } else {
                    "client_secret_post"
                }
            } else {
                "none"
            };
            return Ok(Some(Client {
                client_id: client_id.clone(),
                client_secret: self.config.client_secret.clone(),
                auth_method: auth_method.to_owned(),
                redirect_uri: None,
                registration_endpoint: None,
            }));
        }
        let cimd = found.metadata.as_ref().and_then(|m| m.client_id_metadata_document_supported);
        if let (Some(url), Some(true)) = (&self.config.client_metadata_url, cimd) {
            return Ok(Some(Client {
                client_id: url.clone(),
                client_secret: None,
                auth_method: "none".into(),
                redirect_uri: None,
                registration_endpoint: None,
            }));
        }
        Ok(None)
    }

    /// Dynamic client registration (RFC 7591).
    async fn register(&self, found: &Discovered, redirect_uri: &str) -> Result<Client, OAuthError> {
        let Some(endpoint) = &found.registration_endpoint else {
            return Err(OAuthError::failed(
                "the authorization server offers no dynamic client registration: register a client \
                 with it and give `oauth.clientId` (and `oauth.clientSecret`), or `oauth.clientMetadataUrl`",
            ));
        };
        let supported =
            found.metadata.as_ref().and_then(|m| m.token_endpoint_auth_methods_supported.clone());
        // A public client where allowed: toolmux keeps no secret it need not.
        let wanted = match &supported {
            Some(methods) if methods.iter().any(|m| m == "none") => "none",
            Some(methods) if methods.iter().any(|m| m == "client_secret_basic") => {
                "client_secret_basic"
            }
            Some(methods) if methods.iter().any(|m| m == "client_secret_post") => {
                "client_secret_post"
            }
            _ => "none",
        };
        let body = serde_json::json!({
            "client_name": self.config.client_name.as_deref().unwrap_or("toolmux"),
            "redirect_uris": [redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": wanted,
            // A loopback redirect is a native application's (SEP-837).
            "application_type": "native",
        });
        let bytes = accepted(
            self.http.post(endpoint).json(&body),
            "dynamic client registration failed",
            "dynamic client registration was refused",
        )
        .await?;
        #[derive(Deserialize)]
        struct Registered {
            client_id: String,
            #[serde(default)]
            client_secret: Option<String>,
            #[serde(default)]
            token_endpoint_auth_method: Option<String>,
        }
        let registered: Registered = serde_json::from_slice(&bytes).map_err(|e| {
            OAuthError::failed(format!(
                "the registration response is not a client registration ({e})"
            ))
        })?;
        let auth_method = match (&registered.token_endpoint_auth_method, &registered.client_secret)
        {
            (Some(method), _) => method.clone(),
            (None, Some(_)) if wanted == "none" => "client_secret_basic".to_owned(),
            (None, Some(_)) => wanted.to_owned(),
            (None, None) => "none".to_owned(),
        };
        tracing::debug!(server = %self.server, auth_method, "registered an OAuth client");
        Ok(Client {
            client_id: registered.client_id,
            client_secret: registered.client_secret,
            auth_method,
            redirect_uri: Some(redirect_uri.to_owned()),
            registration_endpoint: Some(endpoint.clone()),
        })
    }

    /// A token endpoint request with the client's authentication.
    async fn token_request(
        &self,
        endpoint: &str,
        issuer: &str,
        client: &Client,
        form: &mut Vec<(&'static str, String)>,
    ) -> Result<TokenResponse, OAuthError> {
        let mut request =
            self.http.post(endpoint).header(reqwest::header::ACCEPT, "application/json");
        match client.auth_method.as_str() {
            "client_secret_basic" => {
                let secret = client.client_secret.as_deref().unwrap_or("");
                let encode = |s: &str| form_encode(s);
                let credentials = format!("{}:{}", encode(&client.client_id), encode(secret));
                let value = base64::engine::general_purpose::STANDARD.encode(credentials);
                let mut header = reqwest::header::HeaderValue::from_str(&format!("Basic {value}"))
                    .map_err(|_| {
                        OAuthError::failed("the client credentials cannot be sent in a header")
                    })?;
                header.set_sensitive(true);
                request = request.header(reqwest::header::AUTHORIZATION, header);
            }
            "client_secret_post" => {
                form.push(("client_id", client.client_id.clone()));
                form.push(("client_secret", client.client_secret.clone().unwrap_or_default()));
            }
            "private_key_jwt" => {
                let pem = self.config.private_key.as_deref().unwrap_or_default();
                let key = jwt::SigningKey::from_pem(
                    pem,
                    self.config.signing_algorithm.as_deref().unwrap_or("ES256"),
                )?;
                form.push(("client_id", client.client_id.clone()));
                form.push((
                    "client_assertion_type",
                    "urn:ietf:params:oauth:client-assertion-type:jwt-bearer".to_owned(),
                ));
                form.push(("client_assertion", key.assertion(&client.client_id, issuer)?));
            }
            _ if client.client_id.is_empty() => {}
            _ => form.push(("client_id", client.client_id.clone())),
        }
        let request = request
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form_body(form));
        let key = lock(&self.dpop).clone();
        // With DPoP, a server that wants a nonce says so once (RFC 9449 §8).
        let mut nonce_retried = false;
        let (status, bytes) = loop {
            let mut attempt = request
                .try_clone()
                .ok_or_else(|| OAuthError::failed("the token request cannot be sent again"))?;
            if let Some(key) = &key {
                let nonce = lock(&self.as_nonce).clone();
                attempt =
                    attempt.header("DPoP", key.proof("POST", endpoint, None, nonce.as_deref())?);
            }
            let response = attempt
                .send()
                .await
                .map_err(|e| OAuthError::http("the token request failed", &e))?;
            let status = response.status();
            let nonce = response
                .headers()
                .get("DPoP-Nonce")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            if let Some(nonce) = &nonce {
                *lock(&self.as_nonce) = Some(nonce.clone());
            }
            let bytes = read_limited(response).await?;
            let wants_nonce = status == reqwest::StatusCode::BAD_REQUEST
                && oauth_error_text(&bytes).starts_with(": use_dpop_nonce");
            if wants_nonce && key.is_some() && nonce.is_some() && !nonce_retried {
                nonce_retried = true;
                continue;
            }
            break (status, bytes);
        };
        if !status.is_success() {
            return Err(OAuthError::failed(format!(
                "the token endpoint refused ({status}){}",
                oauth_error_text(&bytes)
            )));
        }
        let mut tokens: TokenResponse = serde_json::from_slice(&bytes).map_err(|e| {
            OAuthError::failed(format!("the token response is not an OAuth token response ({e})"))
        })?;
        if tokens.token_type.eq_ignore_ascii_case("dpop") && key.is_some() {
            tokens.dpop = true;
        } else if !tokens.token_type.eq_ignore_ascii_case("bearer") {
            return Err(OAuthError::failed(format!(
                "the token endpoint issued a `{}` token; MCP uses bearer (or DPoP) tokens",
                tokens.token_type
            )));
        }
        Ok(tokens)
    }
}

fn listener_error(e: std::io::Error) -> OAuthError {
    OAuthError::failed(format!(
        "cannot listen for the authorization redirect on 127.0.0.1: {e}; free the port or set `oauth.redirectPort`"
    ))
}

#[derive(Debug, Deserialize)]
struct TokenResponse {
    access_token: String,
    token_type: String,
    /// Whether the token is DPoP-bound (set from `token_type`).
    #[serde(skip)]
    dpop: bool,
    #[serde(default)]
    expires_in: Option<u64>,
    #[serde(default)]
    refresh_token: Option<String>,
    #[serde(default)]
    scope: Option<String>,
}

/// `: error: description` from an OAuth error response, when the body is one.
fn oauth_error_text(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct ErrorResponse {
        error: String,
        #[serde(default)]
        error_description: Option<String>,
    }
    match serde_json::from_slice::<ErrorResponse>(body) {
        Ok(e) => match e.error_description {
            Some(description) => format!(": {}: {description}", e.error),
            None => format!(": {}", e.error),
        },
        Err(_) => String::new(),
    }
}

/// Sends `request` and reads its body; a failure to send says `failed`, a refusal (not 2xx)
/// `refused` with the status and the OAuth error the server gave.
async fn accepted(
    request: reqwest::RequestBuilder,
    failed: &str,
    refused: &str,
) -> Result<Vec<u8>, OAuthError> {
    let response = request.send().await.map_err(|e| OAuthError::http(failed, &e))?;
    let status = response.status();
    let bytes = read_limited(response).await?;
    if !status.is_success() {
        return Err(OAuthError::failed(format!(
            "{refused} ({status}){}",
            oauth_error_text(&bytes)
        )));
    }
    Ok(bytes)
}

/// Reads a response body up to [`MAX_RESPONSE`].
pub(crate) async fn read_limited(mut response: reqwest::Response) -> Result<Vec<u8>, OAuthError> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| OAuthError::http("reading the authorization server's response failed", &e))?
    {
        if body.len() + chunk.len() > MAX_RESPONSE {
            return Err(OAuthError::failed(
                "the authorization server's response is larger than 1 MiB",
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An `application/x-www-form-urlencoded` body.
fn form_body(form: &[(&str, String)]) -> String {
    form.iter()
        .map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// `application/x-www-form-urlencoded` encoding of one name or value.
fn form_encode(s: &str) -> String {
    const SET: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'*');
    percent_encoding::utf8_percent_encode(s, SET).to_string().replace("%20", "+")
}

/// 32 random bytes, base64url: PKCE verifiers, states, JWT ids.
pub(crate) fn random_token() -> Result<String, OAuthError> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes)
        .map_err(|e| OAuthError::failed(format!("no randomness from the OS for OAuth ({e})")))?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_encoding() {
        assert_eq!(form_encode("a b+c/d:é"), "a+b%2Bc%2Fd%3A%C3%A9");
        assert_eq!(form_encode("test-client_1.x*"), "test-client_1.x*");
    }

    #[test]
    fn error_bodies() {
        assert_eq!(
            oauth_error_text(br#"{"error":"invalid_client","error_description":"bad"}"#),
            ": invalid_client: bad"
        );
        assert_eq!(oauth_error_text(b"<html>"), "");
    }

    #[test]
    fn authorization_header_turns_oauth_off() {
        let mut headers = std::collections::BTreeMap::new();
        assert!(OAuth::new("s", "http://127.0.0.1:1/mcp", None, None, &headers).is_some());
        headers.insert("authorization".to_owned(), "Bearer x".to_owned());
        assert!(OAuth::new("s", "http://127.0.0.1:1/mcp", None, None, &headers).is_none());
        let on = OAuthConfig { enabled: Some(true), ..OAuthConfig::default() };
        assert!(OAuth::new("s", "http://127.0.0.1:1/mcp", Some(&on), None, &headers).is_some());
        let off = OAuthConfig { enabled: Some(false), ..OAuthConfig::default() };
        assert!(
            OAuth::new("s", "http://127.0.0.1:1/mcp", Some(&off), None, &Default::default())
                .is_none()
        );
    }

    #[test]
    fn random_tokens_differ() {
        let a = random_token().expect("random");
        assert_eq!(a.len(), 43);
        assert_ne!(a, random_token().expect("random"));
    }
}
