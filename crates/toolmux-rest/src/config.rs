//! The configuration of inline REST tools (`restTools`) and OpenAPI imports (`openapi`), as
//! they appear in toolmux's configuration file.
//!
//! Strings here have already had `${VAR}` expanded from the environment by the facade;
//! `${parameters.x}` placeholders survive that expansion and are filled per call.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

/// Default time limit of one request, in milliseconds.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// Default limit of a response body, in bytes.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 10 * 1024 * 1024;
/// Default number of redirects followed.
pub const DEFAULT_MAX_REDIRECTS: usize = 5;
/// Default tool count above which an import warns.
pub const DEFAULT_MAX_TOOLS: usize = 128;

/// One inline REST tool (`restTools.<name>`).
///
/// `url`, header values, query values and string leaves of `body` may hold
/// `${parameters.x}` placeholders, filled from the call's arguments: URL-encoded as a path
/// segment in the URL's path, as a query component in its query, verbatim in headers. A
/// body string that is exactly one placeholder takes the argument's JSON value (number,
/// object) rather than its text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestToolConfig {
    /// What the tool does, for the model. Optional: without one, the model sees the method
    /// and the URL template, such as `GET https://api.example.com/items/{id}` (without the
    /// URL's query and user info, values from the environment redacted); a sentence saying
    /// what the call is for serves the model better.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// HTTP method (default `GET`).
    #[serde(default = "default_method")]
    pub method: String,
    /// The URL template.
    pub url: String,
    /// Request headers (templates).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Query parameters appended to the URL (templates); a parameter whose template is one
    /// placeholder of an absent argument is left out.
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    /// The JSON body template. Without one, `POST`, `PUT` and `PATCH` send the arguments no
    /// template used as a JSON object, and other methods send them as query parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
    /// The JSON Schema of the arguments; without one, each placeholder becomes a property:
    /// any JSON value for one that stands alone as a value of the body, a string, number or
    /// boolean for one put in text; those of the URL's path are required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters_schema: Option<Value>,
    /// The named queue calls wait in (applied by the orchestrator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Response cache time-to-live in milliseconds (applied by the orchestrator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<u64>,
    /// Time limit of one request in milliseconds (default 30000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Reads the response as newline-delimited JSON, reporting each item as progress,
    /// whatever its content type says.
    #[serde(default)]
    pub stream: bool,
    /// Largest response body read, in bytes (default 10 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_response_bytes: Option<usize>,
    /// Headers of an MCP client's own request to `toolmux serve --http` sent on with this
    /// tool's requests, such as `X-Tenant-Id` (names, any letter case). The header the
    /// client authenticated to toolmux with is never among them, and a header the tool
    /// sets itself wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passthrough_headers: Vec<String>,
    /// Redirects followed within the URL's origin (default 5; 0 follows none). A redirect to
    /// another scheme, host or port is never followed, so that credentials stay with the
    /// API: its 3xx response is the result, with the target in the `location` extra.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_redirects: Option<usize>,
    /// What of a JSON response the tool returns, so that a large answer does not fill the
    /// model's context: a JSON Pointer (`/data/items`), or an object of them
    /// (`{name: /full_name, stars: /stargazers_count}`) for the parts it names. A part the
    /// response lacks is `null`; a response that is not JSON is returned whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select: Option<Select>,
}

/// `restTools.*.select`: one JSON Pointer, or named pointers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Select {
    /// The part at this pointer.
    Pointer(String),
    /// An object of the parts at these pointers, by name.
    Fields(BTreeMap<String, String>),
}

impl Select {
    /// The first pointer that is not one (not empty and not starting with `/`).
    pub(crate) fn check(&self) -> Result<(), String> {
        let pointers: Vec<&String> = match self {
            Select::Pointer(p) => vec![p],
            Select::Fields(fields) => fields.values().collect(),
        };
        match pointers.into_iter().find(|p| !p.is_empty() && !p.starts_with('/')) {
            Some(bad) => Err(format!(
                "`select` has `{bad}`, which is not a JSON Pointer: write `/{}` (a pointer \
                 starts with `/`, and `~1` stands for a `/` inside a key)",
                bad.trim_start_matches('.').replace('.', "/")
            )),
            None => Ok(()),
        }
    }

    /// The selected part of `value`.
    pub(crate) fn apply(&self, value: &Value) -> Value {
        let at = |pointer: &str| value.pointer(pointer).cloned().unwrap_or(Value::Null);
        match self {
            Select::Pointer(pointer) => at(pointer),
            Select::Fields(fields) => Value::Object(
                fields.iter().map(|(name, pointer)| (name.clone(), at(pointer))).collect(),
            ),
        }
    }
}

fn default_method() -> String {
    "GET".into()
}

/// One OpenAPI import (`openapi.<name>`): every selected operation becomes a tool under the
/// namespace `<name>` (or `namespace`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OpenApiConfig {
    /// Path of the document (JSON or YAML), relative to the configuration file's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PathBuf>,
    /// URL of the document, when not read from a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Folders, relative to the configuration file's folder, whose files the document's
    /// external `$ref`s may read besides those in its own folder (a document read from a
    /// file reads no others, and one read from a URL only URLs of its own origin).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ref_dirs: Vec<PathBuf>,
    /// The namespace of the tools (default: the import's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Overrides the document's `servers` (or Swagger `host`/`basePath`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// Values of server variables, overriding their defaults. A value must be one of the
    /// variable's `enum` values, and a variable without a `default` needs one here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub server_variables: BTreeMap<String, String>,
    /// Operations to keep (all when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<Selector>,
    /// Operations to drop, applied after `include`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude: Option<Selector>,
    /// Keeps operations marked `deprecated`.
    #[serde(default)]
    pub include_deprecated: bool,
    /// Tool names by `operationId` (or `METHOD /path`); wins over `x-mcp-name`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rename: BTreeMap<String, String>,
    /// Credentials by security scheme name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub auth: BTreeMap<String, Credentials>,
    /// Warns when more tools than this are imported (default 128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tools: Option<usize>,
    /// Time limit of one request in milliseconds (default 30000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Headers sent with every request, replacing what an operation would send under the
    /// same name (its JSON body's `Content-Type`; a form's or multipart body's own type
    /// stays). A header parameter the document declares under one of these names is no
    /// argument: a model never overrides a configured header. Credentials from `auth`
    /// replace these in turn. A `Cookie` here joins the operation's cookie parameters in
    /// one `Cookie` header, its cookies winning over parameters of the same name (and a
    /// cookie parameter it sets is no argument).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Largest response body read, in bytes (default 10 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_response_bytes: Option<usize>,
    /// Headers of an MCP client's own request to `toolmux serve --http` sent on with the
    /// requests of this document's tools, such as `X-Tenant-Id` (names, any letter case).
    /// The header the client authenticated to toolmux with is never among them, and a
    /// header the document's `headers` or its auth set wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passthrough_headers: Vec<String>,
    /// Redirects followed within the server's origin (default 5; 0 follows none). A redirect
    /// to another scheme, host or port is never followed, so that credentials stay with the
    /// API: its 3xx response is the result, with the target in the `location` extra.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_redirects: Option<usize>,
    /// Gives operations output schemas derived from their success responses (default
    /// true): when every `2xx` response documents a JSON body, the tool declares its schema
    /// (an object schema; any other body is wrapped as `{"result": …}`) and a successful
    /// call returns the parsed body as structured content. A success whose body is not JSON
    /// or does not match the schema is then an error result saying so (the request itself
    /// succeeded), since MCP clients refuse results without conforming structured content;
    /// `false` takes responses as they come, for APIs whose documents are loose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schemas: Option<bool>,
    /// The named queue every tool of the import waits in (applied by the orchestrator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Response cache time-to-live in milliseconds for read-only operations (applied by
    /// the orchestrator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<u64>,
    /// The folder relative `spec` paths are resolved against; set by whoever loads the
    /// configuration file (libraries never use the process's current directory).
    #[serde(skip)]
    pub base_dir: Option<PathBuf>,
}

impl OpenApiConfig {
    /// An import of the document at `path`.
    pub fn from_file(path: impl Into<PathBuf>) -> Self {
        OpenApiConfig { spec: Some(path.into()), ..OpenApiConfig::default() }
    }

    /// An import of the document at `url`.
    pub fn from_url(url: impl Into<String>) -> Self {
        OpenApiConfig { url: Some(url.into()), ..OpenApiConfig::default() }
    }

    /// Sets the folder relative `spec` paths are resolved against.
    pub fn with_base_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.base_dir = Some(dir.into());
        self
    }

    /// Sets the base URL override.
    pub fn with_base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = Some(url.into());
        self
    }
}

/// Which operations a selector matches: every field given must match (fields combine with
/// AND), and a field matches when any of its entries does (entries combine with OR).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Selector {
    /// Tags of the operation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// `operationId`s.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operation_ids: Vec<String>,
    /// Path globs: `*` matches within one segment, `**` across segments
    /// (`/repos/*/*/issues/**`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// HTTP methods, any case.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
}

/// Credentials for one security scheme; which fields apply depends on the scheme's type:
/// `apiKey` (API key in a header, query parameter or cookie), `token` (HTTP bearer),
/// `username`/`password` (HTTP basic), `clientId`/`clientSecret`/`scopes`/`tokenUrl`/
/// `tokenAuthMethod` (OAuth2 client credentials). Values come from the environment through `${VAR}` and are never logged.
#[derive(Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Credentials {
    /// The API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// The bearer token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The basic-auth user name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// The basic-auth password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// The OAuth2 client id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// The OAuth2 client secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// OAuth2 scopes to request (default: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// Overrides the scheme's token URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_url: Option<String>,
    /// How the OAuth2 client's id and secret go to the token endpoint (default
    /// `client_secret_basic`).
    #[serde(default, skip_serializing_if = "TokenAuthMethod::is_default")]
    pub token_auth_method: TokenAuthMethod,
}

/// How an OAuth2 client proves who it is to the token endpoint, named as RFC 7591's
/// `token_endpoint_auth_method` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TokenAuthMethod {
    /// In an HTTP Basic `Authorization` header, id and secret each form-urlencoded first
    /// (RFC 6749 §2.3.1): what every conforming token endpoint accepts.
    #[default]
    ClientSecretBasic,
    /// As the `client_id` and `client_secret` fields of the token request's form, for
    /// endpoints that read them only there.
    ClientSecretPost,
}

impl TokenAuthMethod {
    fn is_default(&self) -> bool {
        *self == TokenAuthMethod::default()
    }
}

impl Credentials {
    /// The forms these credentials take on the wire that differ from their values, to be
    /// redacted with them: a basic-auth header's base64 of `user:password`, and each
    /// value as a query parameter or cookie escapes it.
    pub fn derived_secrets(&self) -> Vec<String> {
        let mut derived = Vec::new();
        if let Some(password) = self.password.as_deref().filter(|p| !p.is_empty()) {
            let user = self.username.as_deref().unwrap_or_default();
            derived.push(crate::auth::base64(format!("{user}:{password}").as_bytes()));
        }
        for value in
            [&self.api_key, &self.token, &self.password, &self.client_secret].into_iter().flatten()
        {
            let escaped = crate::template::encode(value);
            if escaped != *value {
                derived.push(escaped);
            }
        }
        derived
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn redact(v: &Option<String>) -> &'static str {
            if v.is_some() { "<redacted>" } else { "<none>" }
        }
        f.debug_struct("Credentials")
            .field("api_key", &redact(&self.api_key))
            .field("token", &redact(&self.token))
            .field("username", &self.username)
            .field("password", &redact(&self.password))
            .field("client_id", &self.client_id)
            .field("client_secret", &redact(&self.client_secret))
            .field("scopes", &self.scopes)
            .field("token_url", &self.token_url)
            .field("token_auth_method", &self.token_auth_method)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use serde_json::json;

    #[test]
    fn derived_secrets_are_the_wire_forms() {
        let basic = Credentials {
            username: Some("Aladdin".into()),
            password: Some("open sesame".into()),
            ..Credentials::default()
        };
        assert_eq!(
            basic.derived_secrets(),
            ["QWxhZGRpbjpvcGVuIHNlc2FtZQ==".to_owned(), "open%20sesame".to_owned()]
        );
        let key = Credentials { api_key: Some("k3y-plain".into()), ..Credentials::default() };
        assert!(key.derived_secrets().is_empty());
    }

    #[test]
    fn config_file_shapes_deserialize() {
        let tools: BTreeMap<String, RestToolConfig> = serde_json::from_value(json!({
            "weather": {
                "description": "Get weather data for a city",
                "method": "GET",
                "url": "https://api.weather.example/v1/${parameters.city}",
                "headers": {"Authorization": "Bearer expanded"},
                "parametersSchema": {"type": "object", "properties": {"city": {"type": "string"}}},
                "queue": "weather", "cache": 300000, "timeoutMs": 5000, "stream": false
            }
        }))
        .unwrap();
        assert_eq!(tools["weather"].cache, Some(300_000));
        let import: OpenApiConfig = serde_json::from_value(json!({
            "spec": "specs/github.json", "namespace": "gh", "baseUrl": "http://127.0.0.1:1",
            "include": {"tags": ["repos"], "methods": ["GET"], "paths": ["/repos/**"]},
            "exclude": {"operationIds": ["repos/delete"]}, "includeDeprecated": true,
            "rename": {"repos/get": "get_repo"}, "maxTools": 50, "timeoutMs": 1000,
            "auth": {"bearer": {"token": "t"}}, "headers": {"X-GitHub-Api-Version": "2022-11-28"},
            "outputSchemas": false
        }))
        .unwrap();
        assert_eq!(import.output_schemas, Some(false));
        assert_eq!(import.include.unwrap().paths, ["/repos/**"]);
        let err = serde_json::from_value::<OpenApiConfig>(json!({"spec": "a", "specs": "b"}))
            .unwrap_err();
        expect!["unknown field `specs`, expected one of `spec`, `url`, `refDirs`, `namespace`, `baseUrl`, `serverVariables`, `include`, `exclude`, `includeDeprecated`, `rename`, `auth`, `maxTools`, `timeoutMs`, `headers`, `maxResponseBytes`, `passthroughHeaders`, `maxRedirects`, `outputSchemas`, `queue`, `cache`"]
            .assert_eq(&err.to_string());
    }

    #[test]
    fn json_schemas_generate() {
        let tool = schemars::schema_for!(RestToolConfig);
        let import = schemars::schema_for!(OpenApiConfig);
        let tool = serde_json::to_value(tool).unwrap();
        let import = serde_json::to_value(import).unwrap();
        assert!(tool["properties"]["parametersSchema"].is_object());
        assert!(import["properties"].get("baseDir").is_none());
        assert!(import["properties"]["auth"].is_object());
    }
}
