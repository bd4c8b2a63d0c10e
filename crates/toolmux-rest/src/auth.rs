//! Security schemes applied from configured credentials: API keys in a header, query or
//! cookie, HTTP bearer and basic, and OAuth2 client credentials with a token cache.

use crate::http::excerpt;
use crate::openapi::{Location, SecurityScheme};
use crate::request::PreparedRequest;
use crate::secrets::Secrets;
use crate::{Credentials, RestError, TokenAuthMethod};
use futures::StreamExt as _;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// Tokens are refreshed this long before they expire.
const REFRESH_MARGIN: Duration = Duration::from_secs(30);
/// Lifetime assumed when a token response names none.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);
/// The longest a token request may take, its response read whole. A caller waiting for
/// another's request (see [`Auth::token`]) is bounded by its own call's timeout.
const TOKEN_TIMEOUT: Duration = Duration::from_secs(30);
/// The most bytes of a token response read: a token endpoint answers with a small JSON
/// object, and one answering without end would otherwise be read into memory whole.
const MAX_TOKEN_RESPONSE: usize = 256 * 1024;
/// The longest a token is cached, whatever its response says: endpoints write "never
/// expires" as a huge `expires_in` (Java's `Long.MAX_VALUE`), which as an `Instant` would
/// overflow, and a token kept for a day is asked for again after one.
const MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// The schemes of one document with their credentials and cached tokens.
#[derive(Debug)]
pub(crate) struct Auth {
    schemes: BTreeMap<String, SecurityScheme>,
    credentials: BTreeMap<String, Credentials>,
    /// Tokens by scheme and the scopes they were asked with (space-separated).
    tokens: std::sync::Mutex<HashMap<TokenKey, (String, Instant)>>,
    /// One lock per token key, held while that token is fetched: concurrent calls needing
    /// the same token share one request, and a call needing another token (or one already
    /// cached) never waits behind it.
    fetching: std::sync::Mutex<HashMap<TokenKey, Arc<Mutex<()>>>>,
    /// The tokens fetched, newest last (at most [`FETCHED_KEPT`]): no configuration names
    /// them, so neither the loader's secrets nor the orchestrator's redactor know them,
    /// and the provider keeps them out of everything it returns itself.
    fetched: std::sync::Mutex<Vec<String>>,
}

/// A cached token's scheme and the scopes it was asked with (space-separated).
type TokenKey = (String, String);

/// How many fetched tokens are kept for redaction: a token outlives its replacement in
/// the caches of other clients and in echoes of earlier requests, but not by hundreds.
const FETCHED_KEPT: usize = 32;

impl Auth {
    pub(crate) fn new(
        schemes: BTreeMap<String, SecurityScheme>,
        credentials: BTreeMap<String, Credentials>,
    ) -> Self {
        Auth {
            schemes,
            credentials,
            tokens: std::sync::Mutex::default(),
            fetching: std::sync::Mutex::default(),
            fetched: std::sync::Mutex::default(),
        }
    }

    /// The OAuth2 tokens fetched so far in every form they take on the wire (see
    /// [`crate::secrets::forms_of`]), to be redacted from what the provider returns.
    pub(crate) fn fetched_secrets(&self) -> Vec<String> {
        let fetched = self.fetched.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        crate::secrets::forms_of(fetched.iter())
    }

    /// Why a configured credential that goes into a header as it is (an API key in a
    /// header, a bearer token) cannot be sent, for the first such credential.
    pub(crate) fn unsendable(&self) -> Option<String> {
        self.credentials.iter().find_map(|(scheme, c)| {
            let (field, header, value) = match self.schemes.get(scheme)? {
                // A key in a query or cookie goes percent-encoded.
                SecurityScheme::ApiKey { name, location }
                    if !matches!(location, Location::Query | Location::Cookie) =>
                {
                    ("apiKey", name.as_str(), c.api_key.clone()?)
                }
                SecurityScheme::Bearer => {
                    ("token", "Authorization", format!("Bearer {}", c.token.as_deref()?))
                }
                _ => return None,
            };
            crate::http::unsendable_header(&format!("auth.{scheme}.{field}"), header, &value)
        })
    }

    /// Configured credentials naming no scheme of the document.
    pub(crate) fn unknown_schemes(&self) -> Vec<&str> {
        self.credentials
            .keys()
            .filter(|k| !self.schemes.contains_key(*k))
            .map(String::as_str)
            .collect()
    }

    /// The first alternative whose schemes all have usable credentials.
    pub(crate) fn choose<'a>(&self, alternatives: &'a [Vec<String>]) -> Option<&'a [String]> {
        alternatives
            .iter()
            .find(|alt| !alt.is_empty() && alt.iter().all(|s| self.usable(s)))
            .map(Vec::as_slice)
    }

    fn usable(&self, scheme: &str) -> bool {
        let (Some(kind), Some(c)) = (self.schemes.get(scheme), self.credentials.get(scheme)) else {
            return false;
        };
        // An empty value (`${TOKEN:-}` with the variable unset) is no credential: it would
        // send `Authorization: Bearer ` and hide why the API refuses.
        let given = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.is_empty());
        match kind {
            SecurityScheme::ApiKey { .. } => given(&c.api_key),
            SecurityScheme::Bearer => given(&c.token),
            SecurityScheme::Basic => given(&c.username),
            SecurityScheme::ClientCredentials { token_url, .. } => {
                given(&c.client_id)
                    && given(&c.client_secret)
                    && (c.token_url.is_some() || token_url.is_some())
            }
            SecurityScheme::Unsupported { .. } => false,
        }
    }

    /// Applies `schemes` to `request`, fetching OAuth2 tokens as needed.
    pub(crate) async fn apply(
        &self,
        schemes: &[String],
        wanted: &BTreeMap<String, Vec<String>>,
        request: &mut PreparedRequest,
        client: &reqwest::Client,
        tool: &str,
    ) -> Result<(), RestError> {
        for scheme in schemes {
            let (Some(kind), Some(c)) = (self.schemes.get(scheme), self.credentials.get(scheme))
            else {
                continue;
            };
            match kind {
                SecurityScheme::ApiKey { name, location } => {
                    let key = c.api_key.clone().unwrap_or_default();
                    // Set, not added: a value of the same name from elsewhere (the
                    // import's `headers`, a document that also declares the key as a
                    // parameter) is replaced, never sent beside the key.
                    match location {
                        Location::Query => request.set_query(name, &key),
                        Location::Cookie => request.set_cookie(name, &key),
                        _ => request.set_header(name, key),
                    }
                }
                SecurityScheme::Bearer => {
                    let token = c.token.as_deref().unwrap_or_default();
                    request.set_header("Authorization", format!("Bearer {token}"));
                }
                SecurityScheme::Basic => {
                    let user = c.username.as_deref().unwrap_or_default();
                    let password = c.password.as_deref().unwrap_or_default();
                    let encoded = base64(format!("{user}:{password}").as_bytes());
                    request.set_header("Authorization", format!("Basic {encoded}"));
                }
                SecurityScheme::ClientCredentials { token_url, scopes } => {
                    let scopes = wanted.get(scheme).unwrap_or(scopes);
                    let token =
                        self.token(scheme, c, token_url.as_deref(), scopes, client, tool).await?;
                    request.set_header("Authorization", format!("Bearer {token}"));
                }
                SecurityScheme::Unsupported { .. } => {}
            }
        }
        Ok(())
    }

    /// The parameters the configured credentials of the schemes in `alternatives` supply,
    /// as `(location, name)` (header names in lower case): an API key's header, query parameter or cookie. A document
    /// that also declares one as an operation's parameter would have the model asked for
    /// the key.
    pub(crate) fn supplied_parameters(
        &self,
        alternatives: &[Vec<String>],
    ) -> Vec<(Location, String)> {
        self.schemes
            .iter()
            .filter(|(name, _)| alternatives.iter().flatten().any(|s| s == *name))
            .filter(|(name, _)| self.usable(name))
            .filter_map(|(_, kind)| match kind {
                SecurityScheme::ApiKey { name, location } => Some((
                    *location,
                    if *location == Location::Header {
                        name.to_ascii_lowercase()
                    } else {
                        name.clone()
                    },
                )),
                _ => None,
            })
            .collect()
    }

    /// The schemes of `alternatives` that no configured credentials make usable, when none
    /// of the alternatives is usable and none is empty (an empty one makes security
    /// optional): the operation will be sent without credentials.
    pub(crate) fn missing<'a>(&self, alternatives: &'a [Vec<String>]) -> Vec<&'a str> {
        if alternatives.is_empty()
            || alternatives.iter().any(Vec::is_empty)
            || self.choose(alternatives).is_some()
        {
            return Vec::new();
        }
        let mut missing: Vec<&str> =
            alternatives.iter().flatten().map(String::as_str).filter(|s| !self.usable(s)).collect();
        missing.sort_unstable();
        missing.dedup();
        missing
    }

    /// The configured secrets of `schemes` in every form they take on the wire, longest
    /// first, to be kept out of what a response echoes back (a redirect's target).
    pub(crate) fn secrets(&self, schemes: &[String]) -> Vec<String> {
        let mut secrets: Vec<String> = schemes
            .iter()
            .filter_map(|scheme| self.credentials.get(scheme))
            .flat_map(|c| {
                [&c.api_key, &c.token, &c.password, &c.client_secret]
                    .into_iter()
                    .flatten()
                    .cloned()
                    .chain(c.derived_secrets())
            })
            .filter(|secret| !secret.is_empty())
            .collect();
        secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
        secrets.dedup();
        secrets
    }

    /// Whether `schemes` include an OAuth2 scheme (whose token a 401 may have invalidated).
    pub(crate) fn uses_tokens(&self, schemes: &[String]) -> bool {
        schemes
            .iter()
            .any(|s| matches!(self.schemes.get(s), Some(SecurityScheme::ClientCredentials { .. })))
    }

    /// Forgets cached tokens of `schemes`, after the API rejected one.
    pub(crate) fn invalidate(&self, schemes: &[String]) {
        let mut tokens = self.tokens.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        tokens.retain(|(scheme, _), _| !schemes.contains(scheme));
    }

    /// The cached token of `key`, unless it expires within [`REFRESH_MARGIN`].
    fn cached(&self, key: &TokenKey) -> Option<String> {
        let tokens = self.tokens.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (token, expires) = tokens.get(key)?;
        (Instant::now() + REFRESH_MARGIN < *expires).then(|| token.clone())
    }

    async fn token(
        &self,
        scheme: &str,
        credentials: &Credentials,
        token_url: Option<&str>,
        scopes: &[String],
        client: &reqwest::Client,
        tool: &str,
    ) -> Result<String, RestError> {
        // The configuration's scopes, else those the operation's requirement names.
        let scopes = if credentials.scopes.is_empty() { scopes } else { &credentials.scopes };
        let key = (scheme.to_owned(), scopes.join(" "));
        if let Some(token) = self.cached(&key) {
            return Ok(token);
        }
        // Holding the key's lock while fetching makes concurrent calls share one token
        // request. The request is bounded by `TOKEN_TIMEOUT` and every waiter by its own
        // call's timeout, within which the provider runs the whole call.
        let lock = {
            let mut fetching =
                self.fetching.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            fetching.entry(key.clone()).or_default().clone()
        };
        let _fetching = lock.lock().await;
        if let Some(token) = self.cached(&key) {
            return Ok(token);
        }
        let fail = |message: String| RestError::Token {
            tool: tool.to_owned(),
            scheme: scheme.to_owned(),
            message,
        };
        let url = credentials
            .token_url
            .as_deref()
            .or(token_url)
            .ok_or_else(|| fail("no token URL".into()))?;
        if !url.contains("://") {
            // The document's relative `tokenUrl` was resolved against the API's server at
            // import; a configured one has nothing to resolve against.
            return Err(fail(format!(
                "the token URL `{url}` is not absolute: set `auth.{scheme}.tokenUrl` in the \
                 import to a full URL"
            )));
        }
        let mut form = vec![("grant_type", "client_credentials".to_owned())];
        if !scopes.is_empty() {
            form.push(("scope", scopes.join(" ")));
        }
        let id = credentials.client_id.clone().unwrap_or_default();
        let secret = credentials.client_secret.clone().unwrap_or_default();
        // The forms the secret takes in the request, to be redacted from a refusal.
        let echoed = {
            let mut secrets = Secrets::default();
            secrets.value(&secret);
            secrets.value(&form_urlencode(&secret));
            let pair = format!("{}:{}", form_urlencode(&id), form_urlencode(&secret));
            secrets.value(&base64(pair.as_bytes()));
            secrets.into_forms()
        };
        let mut request = client.post(url);
        match credentials.token_auth_method {
            TokenAuthMethod::ClientSecretBasic => {
                // RFC 6749 §2.3.1: id and secret are form-urlencoded before they are
                // joined by `:`, so that a `:` in the id, or a secret beyond ASCII,
                // reaches the endpoint as it is.
                let pair = format!("{}:{}", form_urlencode(&id), form_urlencode(&secret));
                request = request.header(
                    reqwest::header::AUTHORIZATION,
                    format!("Basic {}", base64(pair.as_bytes())),
                );
            }
            TokenAuthMethod::ClientSecretPost => {
                form.push(("client_id", id));
                form.push(("client_secret", secret));
            }
        }
        let timed_out = || {
            fail(format!("the token endpoint did not answer within {} s", TOKEN_TIMEOUT.as_secs()))
        };
        let response = request.form(&form).timeout(TOKEN_TIMEOUT).send().await.map_err(|e| {
            if e.is_timeout() {
                timed_out()
            } else {
                fail(format!("token request failed: {}", e.without_url()))
            }
        })?;
        let status = response.status();
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                if e.is_timeout() {
                    timed_out()
                } else {
                    fail("reading the token response failed".into())
                }
            })?;
            let room = MAX_TOKEN_RESPONSE - body.len();
            if chunk.len() > room {
                if status.is_success() {
                    return Err(fail(format!(
                        "the token response is longer than {} KiB, the most read of one: a \
                         token endpoint answers with a small JSON object; check the token URL",
                        MAX_TOKEN_RESPONSE / 1024
                    )));
                }
                // A refusal is shown only as an excerpt: its head is enough.
                body.extend_from_slice(&chunk[..room]);
                break;
            }
            body.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            // An endpoint that echoes the request it refuses would put the client's secret
            // into the error, which is logged and shown: it is redacted in every form the
            // request gave it (the form's field, the Basic header's base64).
            let mut text = String::from_utf8_lossy(&body).into_owned();
            for secret in &echoed {
                text = text.replace(secret.as_str(), "REDACTED");
            }
            return Err(fail(format!(
                "token endpoint answered HTTP {}: {}",
                status.as_u16(),
                excerpt(text.trim(), 300)
            )));
        }
        let parsed: Value =
            serde_json::from_slice(&body).map_err(|_| fail("token response is not JSON".into()))?;
        let token = parsed
            .get("access_token")
            .and_then(Value::as_str)
            .ok_or_else(|| fail("token response has no `access_token`".into()))?
            .to_owned();
        let lifetime = parsed
            .get("expires_in")
            .and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()))
            .map_or(DEFAULT_LIFETIME, Duration::from_secs)
            .min(MAX_LIFETIME);
        {
            let mut fetched =
                self.fetched.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if !fetched.contains(&token) {
                fetched.push(token.clone());
            }
            let over = fetched.len().saturating_sub(FETCHED_KEPT);
            fetched.drain(..over);
        }
        self.tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key, (token.clone(), Instant::now() + lifetime));
        Ok(token)
    }
}

/// `text` as `application/x-www-form-urlencoded` writes it: ASCII letters, digits and
/// `*-._` as they are, a space as `+`, every other byte of its UTF-8 as `%XX`.
fn form_urlencode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' => {
                out.push(char::from(byte));
            }
            b' ' => out.push('+'),
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

/// Standard base64 with padding (twenty lines beat a dependency).
pub(crate) fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_rfc_vectors() {
        let got: Vec<String> = ["", "f", "fo", "foo", "foob", "fooba", "foobar"]
            .iter()
            .map(|s| base64(s.as_bytes()))
            .collect();
        assert_eq!(got, ["", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"]);
    }
}
