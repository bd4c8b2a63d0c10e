//! Finding where to authorize: the server's `WWW-Authenticate` challenge, its protected
//! resource metadata (RFC 9728) and its authorization server's metadata (RFC 8414 and
//! OpenID Connect discovery), with the 2025-03-26 revision's fallbacks.

use reqwest::Url;
use serde::Deserialize;

use super::OAuthError;

/// The parameters of a `Bearer` challenge.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Challenge {
    pub(crate) resource_metadata: Option<String>,
    pub(crate) scope: Option<String>,
    pub(crate) error: Option<String>,
}

impl Challenge {
    /// Reads the `Bearer` challenge of a `WWW-Authenticate` value; other schemes' parameters
    /// are skipped. A value that cannot be read gives an empty challenge: discovery then
    /// goes by the well-known locations.
    pub(crate) fn parse(header: &str) -> Challenge {
        let mut challenge = Challenge::default();
        let mut in_bearer = false;
        let mut rest = header.trim();
        while !rest.is_empty() {
            rest = rest.trim_start_matches([',', ' ', '\t']);
            let token_end = rest.find(['=', ' ', ',', '\t']).unwrap_or(rest.len());
            let token = &rest[..token_end];
            let after = rest[token_end..].trim_start_matches([' ', '\t']);
            if let Some(value_part) = after.strip_prefix('=') {
                // `name=value`: a parameter of the current scheme (or token68 padding).
                let value_part = value_part.trim_start_matches([' ', '\t']);
                let (value, remaining) = read_value(value_part);
                if in_bearer {
                    match token.to_ascii_lowercase().as_str() {
                        "resource_metadata" => challenge.resource_metadata = Some(value),
                        "scope" => challenge.scope = Some(value),
                        "error" => challenge.error = Some(value),
                        _ => {}
                    }
                }
                rest = remaining;
            } else if token.is_empty() {
                // A stray character: skip it.
                rest = &rest[rest.chars().next().map_or(0, char::len_utf8)..];
            } else {
                // A scheme name starts a new challenge; DPoP's carries the same parameters.
                in_bearer =
                    token.eq_ignore_ascii_case("bearer") || token.eq_ignore_ascii_case("dpop");
                rest = after;
            }
        }
        challenge
    }

    /// The scopes the challenge asks for, split on spaces.
    pub(crate) fn scopes(&self) -> Option<Vec<String>> {
        let scopes = split_scopes(self.scope.as_deref()?);
        (!scopes.is_empty()).then_some(scopes)
    }
}

/// A quoted string (with `\` escapes) or a token, and what follows it.
fn read_value(input: &str) -> (String, &str) {
    if let Some(quoted) = input.strip_prefix('"') {
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, escaped)) = chars.next() {
                        value.push(escaped);
                    }
                }
                '"' => return (value, &quoted[i + 1..]),
                c => value.push(c),
            }
        }
        (value, "")
    } else {
        let end = input.find([',', ' ', '\t']).unwrap_or(input.len());
        (input[..end].to_owned(), &input[end..])
    }
}

/// Scopes in a space-separated list.
pub(crate) fn split_scopes(scopes: &str) -> Vec<String> {
    scopes.split_whitespace().map(str::to_owned).collect()
}

/// Protected resource metadata (RFC 9728): which authorization servers issue tokens for
/// the server.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ResourceMetadata {
    pub(crate) resource: String,
    #[serde(default)]
    pub(crate) authorization_servers: Vec<String>,
    #[serde(default)]
    pub(crate) scopes_supported: Option<Vec<String>>,
}

/// Authorization server metadata (RFC 8414, or an OpenID provider's configuration).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ServerMetadata {
    #[serde(default)]
    pub(crate) issuer: Option<String>,
    #[serde(default)]
    pub(crate) authorization_endpoint: Option<String>,
    pub(crate) token_endpoint: String,
    #[serde(default)]
    pub(crate) registration_endpoint: Option<String>,
    #[serde(default)]
    pub(crate) scopes_supported: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) grant_types_supported: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) token_endpoint_auth_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) code_challenge_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) client_id_metadata_document_supported: Option<bool>,
    #[serde(default)]
    pub(crate) authorization_response_iss_parameter_supported: Option<bool>,
    #[serde(default)]
    pub(crate) dpop_signing_alg_values_supported: Option<Vec<String>>,
}

/// Where to authorize, as discovered.
#[derive(Debug, Clone)]
pub(crate) struct Discovered {
    /// The resource indicator (RFC 8707) tokens are requested for.
    pub(crate) resource: String,
    pub(crate) resource_metadata: Option<ResourceMetadata>,
    /// The authorization server's metadata; `None` when it publishes none and the
    /// 2025-03-26 default endpoints are used.
    pub(crate) metadata: Option<ServerMetadata>,
    pub(crate) authorization_endpoint: String,
    pub(crate) token_endpoint: String,
    pub(crate) registration_endpoint: Option<String>,
    /// The issuer, or the authorization server's URL when it publishes no metadata.
    pub(crate) issuer: String,
}

/// Runs discovery for the MCP endpoint `server_url` after `challenge`.
pub(crate) async fn discover(
    http: &reqwest::Client,
    server_url: &Url,
    challenge: &Challenge,
) -> Result<Discovered, OAuthError> {
    let resource_metadata = resource_metadata(http, server_url, challenge).await?;
    let resource = match &resource_metadata {
        Some(prm) => {
            check_resource(server_url, &prm.resource)?;
            prm.resource.clone()
        }
        None => canonical_resource(server_url),
    };
    let authorization_server = match resource_metadata
        .as_ref()
        .and_then(|prm| prm.authorization_servers.first())
    {
        Some(url) => Url::parse(url).map_err(|e| {
            OAuthError::failed(format!(
                "the protected resource metadata names the authorization server `{url}`, which is not a URL ({e})"
            ))
        })?,
        // 2025-03-26: the MCP server's origin is its authorization server.
        None => origin(server_url),
    };
    check_secure(&authorization_server, "the authorization server")?;
    let metadata = server_metadata(http, &authorization_server).await?;
    // Metadata must be about the issuer it was looked up for (RFC 8414 §3.3), or another
    // server's endpoints could be slipped in. A server without protected resource metadata
    // (2025-03-26) names no issuer to compare with.
    if let (Some(metadata), Some(named)) =
        (&metadata, resource_metadata.as_ref().and_then(|prm| prm.authorization_servers.first()))
    {
        let issuer = metadata.issuer.as_deref().unwrap_or_default();
        if issuer.trim_end_matches('/') != named.trim_end_matches('/') {
            return Err(OAuthError::failed(format!(
                "the authorization server metadata found for `{named}` names the issuer `{issuer}`; \
                 refusing to use it (RFC 8414 requires them to be the same)"
            )));
        }
    }
    let base = origin(&authorization_server);
    let at_base = |path: &str| base.join(path).map(String::from).unwrap_or_default();
    let discovered = match metadata {
        Some(metadata) => Discovered {
            resource,
            resource_metadata,
            authorization_endpoint: metadata
                .authorization_endpoint
                .clone()
                .unwrap_or_else(|| at_base("/authorize")),
            token_endpoint: metadata.token_endpoint.clone(),
            registration_endpoint: metadata.registration_endpoint.clone(),
            issuer: metadata
                .issuer
                .clone()
                .unwrap_or_else(|| authorization_server.as_str().trim_end_matches('/').to_owned()),
            metadata: Some(metadata),
        },
        // 2025-03-26's defaults for a server without metadata.
        None => Discovered {
            resource,
            resource_metadata,
            metadata: None,
            authorization_endpoint: at_base("/authorize"),
            token_endpoint: at_base("/token"),
            registration_endpoint: Some(at_base("/register")),
            issuer: authorization_server.as_str().trim_end_matches('/').to_owned(),
        },
    };
    for (what, url) in [
        ("authorization endpoint", Some(&discovered.authorization_endpoint)),
        ("token endpoint", Some(&discovered.token_endpoint)),
        ("registration endpoint", discovered.registration_endpoint.as_ref()),
    ] {
        if let Some(url) = url {
            let parsed = Url::parse(url).map_err(|e| {
                OAuthError::failed(format!("the {what} `{url}` is not a URL ({e})"))
            })?;
            check_secure(&parsed, &format!("the {what}"))?;
        }
    }
    Ok(discovered)
}

/// The protected resource metadata: at the challenge's `resource_metadata`, else at the
/// path-based well-known location, else at the root one; `None` when the server has none
/// (a 2025-03-26 server).
async fn resource_metadata(
    http: &reqwest::Client,
    server_url: &Url,
    challenge: &Challenge,
) -> Result<Option<ResourceMetadata>, OAuthError> {
    let mut candidates = Vec::new();
    if let Some(url) = &challenge.resource_metadata {
        let url = Url::parse(url).map_err(|e| {
            OAuthError::failed(format!(
                "the server's challenge names resource metadata at `{url}`, which is not a URL ({e})"
            ))
        })?;
        candidates.push(url);
    } else {
        let path = server_url.path().trim_end_matches('/');
        if !path.is_empty() {
            candidates.push(well_known(server_url, "oauth-protected-resource", path));
        }
        candidates.push(well_known(server_url, "oauth-protected-resource", ""));
    }
    for url in candidates {
        check_secure(&url, "the protected resource metadata")?;
        if let Some(metadata) = fetch_json::<ResourceMetadata>(http, &url).await? {
            return Ok(Some(metadata));
        }
    }
    Ok(None)
}

/// The authorization server's metadata from the locations RFC 8414 and OpenID Connect
/// discovery give, in the order the MCP specification sets.
async fn server_metadata(
    http: &reqwest::Client,
    authorization_server: &Url,
) -> Result<Option<ServerMetadata>, OAuthError> {
    let path = authorization_server.path().trim_end_matches('/');
    let candidates = if path.is_empty() {
        vec![
            well_known(authorization_server, "oauth-authorization-server", ""),
            well_known(authorization_server, "openid-configuration", ""),
        ]
    } else {
        let mut appended = origin(authorization_server);
        appended.set_path(&format!("{path}/.well-known/openid-configuration"));
        vec![
            well_known(authorization_server, "oauth-authorization-server", path),
            well_known(authorization_server, "openid-configuration", path),
            appended,
        ]
    };
    for url in candidates {
        if let Some(metadata) = fetch_json::<ServerMetadata>(http, &url).await? {
            return Ok(Some(metadata));
        }
    }
    Ok(None)
}

/// `{origin}/.well-known/{name}{path}`.
fn well_known(url: &Url, name: &str, path: &str) -> Url {
    let mut url = origin(url);
    url.set_path(&format!("/.well-known/{name}{path}"));
    url
}

/// The URL's scheme, host and port.
fn origin(url: &Url) -> Url {
    let mut origin = url.clone();
    origin.set_path("/");
    origin.set_query(None);
    origin.set_fragment(None);
    origin
}

/// The server's URL as a resource indicator: no fragment (RFC 8707).
pub(crate) fn canonical_resource(url: &Url) -> String {
    let mut url = url.clone();
    url.set_fragment(None);
    url.to_string()
}

/// The protected resource metadata must be about this server: same origin, and the
/// server's path at or under the resource's path. Anything else is refused before any
/// authorization request, so a server cannot have tokens for another resource sent to it.
fn check_resource(server_url: &Url, resource: &str) -> Result<(), OAuthError> {
    let mismatch = || {
        OAuthError::failed(format!(
            "the server's protected resource metadata is for `{resource}`, not for this server \
             (`{}`); refusing to authorize: check the server's `url`",
            canonical_resource(server_url)
        ))
    };
    let parsed = Url::parse(resource).map_err(|_| mismatch())?;
    if parsed.origin() != server_url.origin() {
        return Err(mismatch());
    }
    let wanted = parsed.path().trim_end_matches('/');
    let actual = server_url.path().trim_end_matches('/');
    let under =
        actual == wanted || actual.strip_prefix(wanted).is_some_and(|rest| rest.starts_with('/'));
    if under { Ok(()) } else { Err(mismatch()) }
}

/// Authorization traffic goes over HTTPS, except to this machine.
pub(crate) fn check_secure(url: &Url, what: &str) -> Result<(), OAuthError> {
    if url.scheme() == "https" {
        return Ok(());
    }
    let loopback = url.host_str().is_some_and(|host| {
        host.eq_ignore_ascii_case("localhost")
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    });
    if url.scheme() == "http" && loopback {
        Ok(())
    } else {
        Err(OAuthError::failed(format!(
            "{what} is at `{}`; OAuth needs https:// (plain http:// only on this machine)",
            origin(url)
        )))
    }
}

/// GETs `url` as JSON: `None` when there is nothing there (4xx, or not JSON of this shape).
async fn fetch_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &Url,
) -> Result<Option<T>, OAuthError> {
    let response = http
        .get(url.clone())
        .header(reqwest::header::ACCEPT, "application/json")
        .header("MCP-Protocol-Version", "2025-11-25")
        .send()
        .await
        .map_err(|e| OAuthError::http(&format!("cannot fetch {}", origin(url)), &e))?;
    if !response.status().is_success() {
        return Ok(None);
    }
    let body = super::read_limited(response).await?;
    Ok(serde_json::from_slice(&body).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges() {
        let c = Challenge::parse(
            r#"Bearer error="insufficient_scope", scope="mcp:basic mcp:write", resource_metadata="http://localhost:1/.well-known/oauth-protected-resource/mcp""#,
        );
        assert_eq!(c.error.as_deref(), Some("insufficient_scope"));
        assert_eq!(c.scopes(), Some(vec!["mcp:basic".to_owned(), "mcp:write".to_owned()]));
        assert_eq!(
            c.resource_metadata.as_deref(),
            Some("http://localhost:1/.well-known/oauth-protected-resource/mcp")
        );
        // Another scheme's parameters are not the bearer's; escapes and tokens are read.
        let c =
            Challenge::parse(r#"Basic realm="x", scope="no", Bearer scope=a, error="say \"hi\"""#);
        assert_eq!(c.scope.as_deref(), Some("a"));
        assert_eq!(c.error.as_deref(), Some("say \"hi\""));
        assert_eq!(Challenge::parse("Bearer"), Challenge::default());
        assert_eq!(Challenge::parse("garbage ,,, ="), Challenge::default());
        assert_eq!(
            Challenge::parse(r#"Bearer scope="unterminated"#).scope.as_deref(),
            Some("unterminated")
        );
    }

    #[test]
    fn resources() {
        let server = Url::parse("http://localhost:3000/mcp").expect("url");
        check_resource(&server, "http://localhost:3000/mcp").expect("same");
        check_resource(&server, "http://localhost:3000/").expect("parent");
        check_resource(&server, "http://localhost:3000").expect("origin");
        check_resource(&server, "https://evil.example.com/mcp").expect_err("other origin");
        check_resource(&server, "http://localhost:3000/mc").expect_err("not a path prefix");
        check_resource(&server, "http://localhost:3000/mcp/deeper").expect_err("deeper");
        assert_eq!(canonical_resource(&Url::parse("http://h/mcp#x").expect("url")), "http://h/mcp");
    }

    #[test]
    fn transport_security() {
        for ok in
            ["https://as.example.com/", "http://localhost:1/", "http://127.0.0.1/", "http://[::1]/"]
        {
            check_secure(&Url::parse(ok).expect("url"), "it").expect(ok);
        }
        let error = check_secure(
            &Url::parse("http://as.example.com/x").expect("url"),
            "the token endpoint",
        )
        .expect_err("plain http");
        assert!(error.to_string().contains("needs https://"), "{error}");
    }

    #[test]
    fn well_known_locations() {
        let url = Url::parse("https://as.example.com/tenant1?q#f").expect("url");
        assert_eq!(
            well_known(&url, "oauth-authorization-server", "/tenant1").as_str(),
            "https://as.example.com/.well-known/oauth-authorization-server/tenant1"
        );
        assert_eq!(origin(&url).as_str(), "https://as.example.com/");
    }
}
