//! Security schemes applied from configured credentials: API keys in a header, query or
//! cookie, HTTP bearer and basic, and OAuth2 client credentials with a token cache.

use crate::http::excerpt;
use crate::openapi::{Location, SecurityScheme};
use crate::request::PreparedRequest;
use crate::{Credentials, RestError};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// Tokens are refreshed this long before they expire.
const REFRESH_MARGIN: Duration = Duration::from_secs(30);
/// Lifetime assumed when a token response names none.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);

/// The schemes of one document with their credentials and cached tokens.
#[derive(Debug)]
pub(crate) struct Auth {
    schemes: BTreeMap<String, SecurityScheme>,
    credentials: BTreeMap<String, Credentials>,
    tokens: Mutex<HashMap<String, (String, Instant)>>,
}

impl Auth {
    pub(crate) fn new(
        schemes: BTreeMap<String, SecurityScheme>,
        credentials: BTreeMap<String, Credentials>,
    ) -> Self {
        Auth { schemes, credentials, tokens: Mutex::new(HashMap::new()) }
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
        match kind {
            SecurityScheme::ApiKey { .. } => c.api_key.is_some(),
            SecurityScheme::Bearer => c.token.is_some(),
            SecurityScheme::Basic => c.username.is_some(),
            SecurityScheme::ClientCredentials { token_url, .. } => {
                c.client_id.is_some()
                    && c.client_secret.is_some()
                    && (c.token_url.is_some() || token_url.is_some())
            }
            SecurityScheme::Unsupported { .. } => false,
        }
    }

    /// Applies `schemes` to `request`, fetching OAuth2 tokens as needed.
    pub(crate) async fn apply(
        &self,
        schemes: &[String],
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
                    match location {
                        Location::Query => request.add_query(name, &key),
                        Location::Cookie => request
                            .cookies
                            .push(format!("{name}={}", crate::template::encode(&key))),
                        _ => request.headers.push((name.clone(), key)),
                    }
                }
                SecurityScheme::Bearer => {
                    let token = c.token.as_deref().unwrap_or_default();
                    request.headers.push(("Authorization".into(), format!("Bearer {token}")));
                }
                SecurityScheme::Basic => {
                    let user = c.username.as_deref().unwrap_or_default();
                    let password = c.password.as_deref().unwrap_or_default();
                    let encoded = base64(format!("{user}:{password}").as_bytes());
                    request.headers.push(("Authorization".into(), format!("Basic {encoded}")));
                }
                SecurityScheme::ClientCredentials { token_url, scopes } => {
                    let token =
                        self.token(scheme, c, token_url.as_deref(), scopes, client, tool).await?;
                    request.headers.push(("Authorization".into(), format!("Bearer {token}")));
                }
                SecurityScheme::Unsupported { .. } => {}
            }
        }
        Ok(())
    }

    /// Whether `schemes` include an OAuth2 scheme (whose token a 401 may have invalidated).
    pub(crate) fn uses_tokens(&self, schemes: &[String]) -> bool {
        schemes
            .iter()
            .any(|s| matches!(self.schemes.get(s), Some(SecurityScheme::ClientCredentials { .. })))
    }

    /// Forgets cached tokens of `schemes`, after the API rejected one.
    pub(crate) async fn invalidate(&self, schemes: &[String]) {
        let mut tokens = self.tokens.lock().await;
        for scheme in schemes {
            tokens.remove(scheme);
        }
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
        // Holding the lock while fetching makes concurrent calls share one token request.
        let mut tokens = self.tokens.lock().await;
        if let Some((token, expires)) = tokens.get(scheme)
            && Instant::now() + REFRESH_MARGIN < *expires
        {
            return Ok(token.clone());
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
        let scopes = if credentials.scopes.is_empty() { scopes } else { &credentials.scopes };
        let mut form = vec![("grant_type", "client_credentials".to_owned())];
        if !scopes.is_empty() {
            form.push(("scope", scopes.join(" ")));
        }
        let response = client
            .post(url)
            .basic_auth(
                credentials.client_id.as_deref().unwrap_or_default(),
                credentials.client_secret.as_deref(),
            )
            .form(&form)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|e| fail(format!("token request failed: {}", e.without_url())))?;
        let status = response.status();
        let body =
            response.bytes().await.map_err(|_| fail("reading the token response failed".into()))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
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
            .map_or(DEFAULT_LIFETIME, Duration::from_secs);
        tokens.insert(scheme.to_owned(), (token.clone(), Instant::now() + lifetime));
        Ok(token)
    }
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
