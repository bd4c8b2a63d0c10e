//! `toolmux serve --http` as an OAuth 2.1 protected resource (the MCP authorization
//! specification's server side): clients present access tokens an authorization server of
//! the operator's issued. JWTs are verified here against its published keys (JWKS):
//! signature (RS256 or ES256), issuer, audience (this server), expiry and the scopes
//! required. With `introspection`, every token (opaque ones too) is asked about at the
//! authorization server's introspection endpoint instead (RFC 7662), so that a revoked
//! token is refused; answers are kept briefly. The protected resource metadata (RFC 9728)
//! tells clients where to get tokens; a refusal's `WWW-Authenticate` points to it.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How much clock difference the time claims are allowed.
const LEEWAY: u64 = 60;
/// The key set is fetched again for an unknown key id at most this often.
const REFETCH: Duration = Duration::from_secs(30);

/// Access tokens from an authorization server (`serve.oauth`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceServerConfig {
    /// The authorization server's issuer identifier (its tokens' `iss`).
    pub issuer: String,
    /// This server as a resource (its tokens' `aud`, and the metadata's `resource`), such
    /// as `https://tools.example.com/mcp`.
    pub resource: String,
    /// Where the authorization server publishes its keys (default: the `jwks_uri` of its
    /// metadata).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_uri: Option<String>,
    /// Scopes every token must carry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// Ask the authorization server about every token (RFC 7662 token introspection)
    /// instead of verifying JWTs here: for opaque tokens, and for tokens that may be
    /// revoked before they expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub introspection: Option<IntrospectionConfig>,
}

/// `serve.oauth.introspection`: how this server asks the authorization server about a
/// token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IntrospectionConfig {
    /// The introspection endpoint (default: the `introspection_endpoint` of the
    /// authorization server's metadata).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// This server's client id at the authorization server (HTTP Basic authentication).
    pub client_id: String,
    /// Its client secret (`${VAR}`).
    pub client_secret: String,
    /// How long an answer is kept, in milliseconds (default 60000; an active token's never
    /// past its `exp`; `0` asks about every request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_ms: Option<u64>,
}

/// Why a token was refused: a bad token (401), too little scope (403), or no answer from
/// the authorization server about it (503).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The token is not one of the authorization server's for this resource, or expired.
    Invalid(String),
    /// The token lacks scopes (listed).
    InsufficientScope(Vec<String>),
    /// The introspection endpoint could not be asked or did not answer properly.
    Unavailable(String),
}

/// Introspection answers kept at most; past it, expired ones go, then all.
const CACHE_MAX: usize = 10_000;
/// How long a refusal from the introspection endpoint is kept (a flood of bad tokens
/// must not become a flood of introspection requests).
const REFUSAL_TTL: Duration = Duration::from_secs(10);

/// Why a token naming no subject is refused: its holder would be everyone's.
const NO_SUBJECT: &str = "the token names no subject (`sub`, `client_id`): the authorization server must name whom it was issued to";
/// An introspection answer, and until when it holds.
type Kept = (Instant, Result<String, Refusal>);

/// What `application/x-www-form-urlencoded` escapes: all but alphanumerics and `*-._`.
const FORM: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'*').remove(b'-').remove(b'.').remove(b'_');
/// The default time an answer is kept.
const DEFAULT_INTROSPECTION_CACHE: Duration = Duration::from_secs(60);

/// Verifies access tokens; one per served endpoint.
#[derive(Debug)]
pub struct TokenVerifier {
    config: ResourceServerConfig,
    http: reqwest::Client,
    keys: RwLock<Keys>,
    refetch: tokio::sync::Mutex<Option<Instant>>,
    /// The introspection endpoint, when tokens are introspected.
    introspection_url: Option<String>,
    /// Introspection answers by the token's SHA-256, until when they hold.
    answers: std::sync::Mutex<HashMap<[u8; 32], Kept>>,
}

#[derive(Debug, Default)]
struct Keys {
    by_id: HashMap<String, Key>,
    /// Keys without a `kid`, tried in turn.
    anonymous: Vec<Key>,
}

#[derive(Debug, Clone)]
enum Key {
    Rsa { n: Vec<u8>, e: Vec<u8> },
    P256(Vec<u8>),
}

impl TokenVerifier {
    /// A verifier for `config`; the keys (or, with `introspection`, the introspection
    /// endpoint) are found now, so a wrong `issuer` or `jwksUri` fails the start.
    pub async fn new(config: ResourceServerConfig) -> Result<TokenVerifier, String> {
        crate::client::ensure_crypto_provider();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        let mut verifier = TokenVerifier {
            config,
            http,
            keys: RwLock::new(Keys::default()),
            refetch: tokio::sync::Mutex::new(None),
            introspection_url: None,
            answers: std::sync::Mutex::new(HashMap::new()),
        };
        match &verifier.config.introspection {
            Some(introspection) => {
                if introspection.client_id.is_empty() {
                    return Err("introspection.clientId is empty".to_owned());
                }
                let url = match &introspection.url {
                    Some(url) => url.clone(),
                    None => {
                        verifier.discover("introspection_endpoint", "introspection.url").await?
                    }
                };
                reqwest::Url::parse(&url)
                    .map_err(|e| format!("introspection endpoint `{url}` is not a URL ({e})"))?;
                verifier.introspection_url = Some(url);
            }
            None => verifier.fetch_keys().await?,
        }
        Ok(verifier)
    }

    /// The protected resource metadata document.
    pub fn metadata(&self) -> Value {
        let mut metadata = serde_json::json!({
            "resource": self.config.resource,
            "authorization_servers": [self.config.issuer],
            "bearer_methods_supported": ["header"],
        });
        if !self.config.scopes.is_empty() {
            metadata["scopes_supported"] = serde_json::json!(self.config.scopes);
        }
        metadata
    }

    /// The scopes every token must carry.
    pub fn required_scopes(&self) -> &[String] {
        &self.config.scopes
    }

    /// The subject (`sub`) of a valid token, or why it is refused.
    pub async fn verify(&self, token: &str) -> Result<String, Refusal> {
        if let Some(url) = &self.introspection_url {
            return self.introspected(url, token).await;
        }
        let invalid = |why: &str| Refusal::Invalid(why.to_owned());
        let mut parts = token.split('.');
        let (Some(header), Some(claims), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid("not a JWT"));
        };
        let decode = |part: &str| URL_SAFE_NO_PAD.decode(part).map_err(|_| invalid("not a JWT"));
        let header: Value =
            serde_json::from_slice(&decode(header)?).map_err(|_| invalid("not a JWT"))?;
        let alg = header["alg"].as_str().unwrap_or_default().to_owned();
        let kid = header["kid"].as_str().map(str::to_owned);
        let signed = &token[..token.len() - signature.len() - 1];
        let signature = decode(signature)?;
        let candidates = self.keys_for(kid.as_deref()).await;
        let verified =
            candidates.iter().any(|key| verifies(key, &alg, signed.as_bytes(), &signature));
        if !verified {
            return Err(invalid("the signature is not the authorization server's"));
        }
        let claims: Value =
            serde_json::from_slice(&decode(claims)?).map_err(|_| invalid("not a JWT"))?;
        if claims["iss"].as_str() != Some(self.config.issuer.as_str()) {
            return Err(invalid("issued by another authorization server"));
        }
        let audience = &self.config.resource;
        let for_us = match &claims["aud"] {
            Value::String(aud) => aud == audience,
            Value::Array(auds) => auds.iter().any(|a| a.as_str() == Some(audience)),
            _ => false,
        };
        if !for_us {
            return Err(invalid("issued for another resource (`aud`)"));
        }
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        match claims["exp"].as_u64() {
            Some(exp) if exp + LEEWAY > now => {}
            _ => return Err(invalid("expired")),
        }
        if claims["nbf"].as_u64().is_some_and(|nbf| nbf > now + LEEWAY) {
            return Err(invalid("not valid yet"));
        }
        self.scoped(&claims)?;
        // The subject names the token's holder, which keeps tenants apart: a token naming
        // no one would share one holder with every other such token.
        claims["sub"]
            .as_str()
            .or_else(|| claims["client_id"].as_str())
            .filter(|subject| !subject.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| invalid(NO_SUBJECT))
    }

    /// Refuses claims (a JWT's, or an introspection answer's) without every required scope.
    fn scoped(&self, claims: &Value) -> Result<(), Refusal> {
        let granted: Vec<&str> = match (&claims["scope"], &claims["scp"]) {
            (Value::String(scope), _) => scope.split_whitespace().collect(),
            (_, Value::Array(scp)) => scp.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let missing: Vec<String> =
            self.config.scopes.iter().filter(|s| !granted.contains(&s.as_str())).cloned().collect();
        if missing.is_empty() { Ok(()) } else { Err(Refusal::InsufficientScope(missing)) }
    }

    /// [`TokenVerifier::verify`] by introspection at `url`, answers kept a while.
    async fn introspected(&self, url: &str, token: &str) -> Result<String, Refusal> {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        let now = Instant::now();
        {
            let answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((until, answer)) = answers.get(&key)
                && *until > now
            {
                return answer.clone();
            }
        }
        let (answer, kept) = self.introspect(url, token).await;
        if !kept.is_zero() && !matches!(answer, Err(Refusal::Unavailable(_))) {
            let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
            if answers.len() >= CACHE_MAX {
                answers.retain(|_, (until, _)| *until > now);
                if answers.len() >= CACHE_MAX {
                    answers.clear();
                }
            }
            answers.insert(key, (now + kept, answer.clone()));
        }
        answer
    }

    /// One introspection request: the answer, and how long it may be kept.
    async fn introspect(&self, url: &str, token: &str) -> (Result<String, Refusal>, Duration) {
        let Some(config) = &self.config.introspection else {
            return (
                Err(Refusal::Unavailable("no introspection configured".into())),
                Duration::ZERO,
            );
        };
        let cache = config.cache_ms.map_or(DEFAULT_INTROSPECTION_CACHE, Duration::from_millis);
        let refused = |why: &str| (Err(Refusal::Invalid(why.to_owned())), cache.min(REFUSAL_TTL));
        let unavailable = |why: String| (Err(Refusal::Unavailable(why)), Duration::ZERO);
        let form = |value: &str| percent_encoding::utf8_percent_encode(value, FORM).to_string();
        // RFC 6749 §2.3.1: the client id and secret are form-encoded before Basic.
        let basic = base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            form(&config.client_id),
            form(&config.client_secret)
        ));
        let response = self
            .http
            .post(url)
            .header(reqwest::header::AUTHORIZATION, format!("Basic {basic}"))
            .header(reqwest::header::ACCEPT, "application/json")
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(format!("token={}&token_type_hint=access_token", form(token)))
            .send()
            .await;
        let response = match response {
            Ok(response) => response,
            Err(e) => {
                let why = std::error::Error::source(&e)
                    .map_or_else(|| e.to_string(), toolmux_core::error_report);
                tracing::warn!(target: "toolmux::serve", "token introspection at {url} failed: {why}");
                return unavailable(
                    "the authorization server could not be asked about the token".into(),
                );
            }
        };
        let status = response.status();
        if !status.is_success() {
            tracing::warn!(target: "toolmux::serve", "token introspection at {url} answered {status}");
            return unavailable(format!(
                "the authorization server answered {} when asked about the token",
                status.as_u16()
            ));
        }
        let Ok(answer) = response.json::<Value>().await else {
            return unavailable(
                "the authorization server's answer about the token is not JSON".into(),
            );
        };
        if answer["active"] != Value::Bool(true) {
            return refused("not active (revoked, expired or unknown to the authorization server)");
        }
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let exp = answer["exp"].as_u64();
        if exp.is_some_and(|exp| exp + LEEWAY <= now) {
            return refused("expired");
        }
        if answer["nbf"].as_u64().is_some_and(|nbf| nbf > now + LEEWAY) {
            return refused("not valid yet");
        }
        if answer["iss"].as_str().is_some_and(|iss| iss != self.config.issuer) {
            return refused("issued by another authorization server");
        }
        let audience = &self.config.resource;
        let for_us = match &answer["aud"] {
            Value::Null => true,
            Value::String(aud) => aud == audience,
            Value::Array(auds) => auds.iter().any(|a| a.as_str() == Some(audience)),
            _ => false,
        };
        if !for_us {
            return refused("issued for another resource (`aud`)");
        }
        if answer["token_type"].as_str().is_some_and(|t| t.eq_ignore_ascii_case("refresh_token")) {
            return refused("a refresh token, not an access token");
        }
        if let Err(refusal) = self.scoped(&answer) {
            return (Err(refusal), cache.min(REFUSAL_TTL));
        }
        let subject = answer["sub"]
            .as_str()
            .or_else(|| answer["username"].as_str())
            .or_else(|| answer["client_id"].as_str())
            .filter(|subject| !subject.is_empty());
        let Some(subject) = subject.map(str::to_owned) else {
            return refused(NO_SUBJECT);
        };
        // Never kept past the token's own end.
        let left = exp.map_or(cache, |exp| Duration::from_secs(exp.saturating_sub(now)));
        (Ok(subject), cache.min(left))
    }

    /// The keys that may have signed a token with `kid`; an unknown id fetches the key
    /// set again (keys rotate), at most every [`REFETCH`].
    async fn keys_for(&self, kid: Option<&str>) -> Vec<Key> {
        let find = |keys: &Keys| match kid {
            Some(kid) => keys.by_id.get(kid).cloned().into_iter().collect::<Vec<_>>(),
            None => keys.by_id.values().chain(&keys.anonymous).cloned().collect(),
        };
        let found = find(&self.keys.read().unwrap_or_else(|e| e.into_inner()));
        if !found.is_empty() {
            return found;
        }
        let mut last = self.refetch.lock().await;
        if last.is_none_or(|at| at.elapsed() >= REFETCH) {
            *last = Some(Instant::now());
            if let Err(e) = self.fetch_keys().await {
                tracing::warn!(target: "toolmux::serve", "cannot fetch the authorization server's keys: {e}");
            }
        }
        find(&self.keys.read().unwrap_or_else(|e| e.into_inner()))
    }

    async fn fetch_keys(&self) -> Result<(), String> {
        let jwks_uri = match &self.config.jwks_uri {
            Some(uri) => uri.clone(),
            None => self.discover("jwks_uri", "jwksUri").await?,
        };
        let jwks: Value = self.get_json(&jwks_uri).await?;
        let mut keys = Keys::default();
        for jwk in jwks["keys"].as_array().into_iter().flatten() {
            let b64 =
                |field: &str| jwk[field].as_str().and_then(|v| URL_SAFE_NO_PAD.decode(v).ok());
            let key = match (jwk["kty"].as_str(), jwk["crv"].as_str()) {
                (Some("RSA"), _) => match (b64("n"), b64("e")) {
                    (Some(n), Some(e)) => Key::Rsa { n, e },
                    _ => continue,
                },
                (Some("EC"), Some("P-256")) => match (b64("x"), b64("y")) {
                    (Some(x), Some(y)) => Key::P256([&[4u8][..], &x, &y].concat()),
                    _ => continue,
                },
                _ => continue,
            };
            match jwk["kid"].as_str() {
                Some(kid) => {
                    keys.by_id.insert(kid.to_owned(), key);
                }
                None => keys.anonymous.push(key),
            }
        }
        if keys.by_id.is_empty() && keys.anonymous.is_empty() {
            return Err(format!("the key set at {jwks_uri} has no RSA or P-256 key"));
        }
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = keys;
        Ok(())
    }

    /// The address `field` (`jwks_uri`, `introspection_endpoint`) of the issuer's metadata
    /// (RFC 8414, then OpenID Connect discovery); `setting` names the key that gives it
    /// instead.
    async fn discover(&self, field: &str, setting: &str) -> Result<String, String> {
        let issuer = self.config.issuer.trim_end_matches('/');
        let parsed =
            reqwest::Url::parse(issuer).map_err(|e| format!("`issuer` is not a URL ({e})"))?;
        let origin = parsed.origin().ascii_serialization();
        let path = parsed.path().trim_end_matches('/');
        let candidates = [
            format!("{origin}/.well-known/oauth-authorization-server{path}"),
            format!("{origin}/.well-known/openid-configuration{path}"),
            format!("{issuer}/.well-known/openid-configuration"),
        ];
        let mut unreachable = None;
        for url in &candidates {
            match self.get_json(url).await {
                Ok(metadata) => {
                    if let Some(uri) = metadata[field].as_str() {
                        return Ok(uri.to_owned());
                    }
                }
                Err(e) if e.starts_with("cannot fetch") => unreachable = Some(e),
                Err(_) => {}
            }
        }
        match unreachable {
            Some(e) => Err(format!("cannot reach the authorization server: {e}")),
            None => Err(format!(
                "the authorization server {issuer} publishes no `{field}` in its metadata; set `serve.oauth.{setting}`"
            )),
        }
    }

    async fn get_json(&self, url: &str) -> Result<Value, String> {
        let response = self.http.get(url).send().await.map_err(|e| {
            format!(
                "cannot fetch {url}: {}",
                std::error::Error::source(&e)
                    .map_or_else(|| e.to_string(), toolmux_core::error_report)
            )
        })?;
        if !response.status().is_success() {
            return Err(format!("{url} answered {}", response.status()));
        }
        response.json().await.map_err(|e| format!("{url} is not JSON ({e})"))
    }
}

fn verifies(key: &Key, alg: &str, message: &[u8], sig: &[u8]) -> bool {
    match (key, alg) {
        (Key::Rsa { n, e }, "RS256") => signature::RsaPublicKeyComponents { n, e }
            .verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, sig)
            .is_ok(),
        (Key::P256(point), "ES256") => {
            signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(message, sig)
                .is_ok()
        }
        _ => false,
    }
}
