//! [`RestProvider`]: inline tools or an imported OpenAPI document as a `ToolProvider`.

use crate::auth::Auth;
use crate::config::{DEFAULT_MAX_REDIRECTS, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_TIMEOUT_MS};
use crate::http::{self, HttpSettings};
use crate::openapi::{self, Document, Operation};
use crate::output::OutputCheck;
use crate::request::{self, Body, PreparedRequest, unknown_argument};
use crate::secrets::Secrets;
use crate::template::{Escape, Template, UrlTemplate, body_parameters, lookup, render_body};
use crate::{OpenApiConfig, RestError, RestToolConfig, names};
use async_trait::async_trait;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use toolmux_core::{
    CallContext, PermissionClass, ToolAnnotations, ToolError, ToolKind, ToolOutput, ToolProvider,
    ToolSpec, naming,
};

/// The namespace of inline tools.
pub const INLINE_NAMESPACE: &str = "rest";

/// HTTP APIs as tools: inline tools (`restTools`) or the operations of one OpenAPI document.
pub struct RestProvider {
    namespace: String,
    tools: Vec<Arc<RestTool>>,
    by_name: HashMap<String, usize>,
    warnings: Vec<String>,
    auth: Option<Arc<Auth>>,
    /// The values the loader took from the environment ([`RestProvider::with_secrets`]),
    /// in every form they take on the wire.
    known_secrets: Arc<[String]>,
    shut_down: AtomicBool,
}

/// Names the tools, without the secrets the provider keeps.
impl std::fmt::Debug for RestProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestProvider")
            .field("namespace", &self.namespace)
            .field("tools", &self.tools)
            .field("warnings", &self.warnings)
            // Not the `Auth` itself: its cached OAuth2 tokens are secrets.
            .field("authenticated", &self.auth.is_some())
            .field("known_secrets", &self.known_secrets.len())
            .finish_non_exhaustive()
    }
}

struct RestTool {
    spec: ToolSpec,
    plan: Plan,
    settings: HttpSettings,
    client: reqwest::Client,
    /// `passthroughHeaders`: the caller's request headers sent on.
    passthrough: Arc<[String]>,
    /// What the configuration put into the request's URL and headers, in every form it
    /// takes on the wire: kept out of a redirect's target, errors and error results (see
    /// [`crate::secrets`]).
    secrets: Arc<[String]>,
}

/// Names the tool and where it sends, without its configured URL, headers and body, which
/// may hold secrets from the environment.
impl std::fmt::Debug for RestTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, method) = match &self.plan {
            Plan::Inline(plan) => ("inline", plan.method.as_str()),
            Plan::OpenApi { op, .. } => ("openapi", op.method.as_str()),
        };
        f.debug_struct("RestTool")
            .field("name", &self.spec.name)
            .field("kind", &kind)
            .field("method", &method)
            .field("settings", &self.settings)
            .field("passthrough", &self.passthrough)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
enum Plan {
    Inline(InlinePlan),
    OpenApi {
        op: Box<Operation>,
        base_url: Option<String>,
        headers: Vec<(String, String)>,
        /// Present when the operation has an output schema (boxed: a compiled validator
        /// is large, and most tools of an import are never called).
        output: Option<Box<OutputCheck>>,
    },
}

#[derive(Debug)]
struct InlinePlan {
    method: String,
    url: UrlTemplate,
    headers: Vec<(String, Template)>,
    query: Vec<(String, Template)>,
    body: Option<Value>,
    /// Arguments some template uses; the others go to the query or the body.
    used: BTreeSet<String>,
    /// What of a JSON response is returned (`select`).
    select: Option<crate::config::Select>,
}

impl RestProvider {
    /// Inline tools under the namespace `rest`.
    pub fn inline(tools: &BTreeMap<String, RestToolConfig>) -> Result<RestProvider, RestError> {
        RestProvider::inline_in(INLINE_NAMESPACE, tools)
    }

    /// Inline tools under another namespace.
    pub fn inline_in(
        namespace: &str,
        tools: &BTreeMap<String, RestToolConfig>,
    ) -> Result<RestProvider, RestError> {
        check_namespace(namespace)?;
        let default_client = http::client(DEFAULT_MAX_REDIRECTS)?;
        let mut locals = RestProvider::inline_names(namespace, tools);
        let mut built = Vec::with_capacity(tools.len());
        for (name, config) in tools {
            let client = match config.max_redirects {
                Some(n) if n != DEFAULT_MAX_REDIRECTS => http::client(n)?,
                _ => default_client.clone(),
            };
            let local = locals.remove(name).unwrap_or_else(|| names::sanitize(name));
            built.push(inline_tool(name, local, config, client)?);
        }
        Ok(RestProvider::assemble(namespace, built, Vec::new(), None))
    }

    /// The name each of `tools` has as an inline tool under `namespace`, by the name the
    /// configuration gives it, without the namespace: sanitized, fitted to the name budget,
    /// and told apart when two come out alike (`a.b` and `a_b` each get a hash of their
    /// own name). Settings kept per tool (a queue, a cache) are keyed by it, never by
    /// the sanitized name alone, which two tools may share and neither may have.
    pub fn inline_names(
        namespace: &str,
        tools: &BTreeMap<String, RestToolConfig>,
    ) -> BTreeMap<String, String> {
        let mut locals: Vec<(String, String)> = tools
            .keys()
            .map(|name| {
                let local = names::fit(namespace, &names::sanitize(name), naming::DEFAULT_BUDGET);
                (local, name.clone())
            })
            .collect();
        names::dedupe(namespace, &mut locals, naming::DEFAULT_BUDGET);
        locals.into_iter().map(|(local, name)| (name, local)).collect()
    }

    /// Imports the document of `config` (file or URL) under the namespace `name` (or
    /// `config.namespace`).
    ///
    /// External `$ref`s are followed: from a file, to files in its folder or in a folder
    /// of `refDirs`; from a URL, to URLs of its origin.
    pub async fn openapi(name: &str, config: &OpenApiConfig) -> Result<RestProvider, RestError> {
        let relative = |path: &std::path::Path| relative_to_base(config, path);
        let (text, source_name, source_url, origin) = match (&config.spec, &config.url) {
            (Some(path), _) => {
                let path = relative(path);
                let text = tokio_read(&path).await?;
                let roots = ref_dirs(config);
                let shown = path.display().to_string();
                (text, shown, None, Some(openapi::Origin::File { path, roots }))
            }
            (None, Some(url)) => {
                let text = fetch_document(url, config).await?;
                let origin =
                    reqwest::Url::parse(url).ok().map(|url| openapi::Origin::Url { url, config });
                // Messages name the document without the credentials its URL may hold.
                (text, request::url_for_messages(url), Some(url.clone()), origin)
            }
            (None, None) => {
                return Err(RestError::Config {
                    name: name.to_owned(),
                    message: "set `spec` (a file) or `url`".into(),
                });
            }
        };
        let mut document = Document::parse(&text, &source_name, source_url.as_deref())?;
        if let Some(origin) = origin {
            openapi::bundle(&mut document, origin).await;
        }
        RestProvider::from_document(name, document, config)
    }

    /// Imports a document given as text (JSON or YAML); `source_name` names it in errors.
    ///
    /// Text has no folder of its own: external `$ref`s name files in the folders of
    /// `config.ref_dirs` (relative ones resolved against `config.base_dir`), tried in
    /// order, and are read now. Without `refDirs` none is followed, and the operations
    /// reaching one are left out with a warning saying how to give the files.
    pub fn openapi_from_text(
        name: &str,
        text: &str,
        source_name: &str,
        config: &OpenApiConfig,
    ) -> Result<RestProvider, RestError> {
        let mut document = Document::parse(text, source_name, config.url.as_deref())?;
        openapi::bundle_text(&mut document, ref_dirs(config));
        RestProvider::from_document(name, document, config)
    }

    /// Imports an already parsed document; external `$ref`s as for
    /// [`RestProvider::openapi_from_text`].
    pub fn openapi_from_value(
        name: &str,
        document: Value,
        source_name: &str,
        config: &OpenApiConfig,
    ) -> Result<RestProvider, RestError> {
        let mut document = Document::from_value(document, source_name, config.url.as_deref())?;
        openapi::bundle_text(&mut document, ref_dirs(config));
        RestProvider::from_document(name, document, config)
    }

    fn from_document(
        name: &str,
        document: Document,
        config: &OpenApiConfig,
    ) -> Result<RestProvider, RestError> {
        let namespace = config.namespace.as_deref().unwrap_or(name);
        check_namespace(namespace)?;
        let imported = openapi::import(&document, namespace, config)?;
        let mut warnings = imported.warnings;
        let auth = imported.auth;
        // A configured value no header can carry (a token from a variable that ends in a
        // newline) is the configuration's fault: refused now, naming the setting, rather
        // than with every call as if the model's arguments were wrong.
        let unsendable = config
            .headers
            .iter()
            .find_map(|(header, value)| {
                http::unsendable_header(&format!("headers.{header}"), header, value)
            })
            .or_else(|| auth.unsendable());
        if let Some(message) = unsendable {
            return Err(RestError::Config { name: name.to_owned(), message });
        }
        for unknown in auth.unknown_schemes() {
            warnings.push(format!(
                "{}: `auth.{unknown}` names no security scheme of the document",
                document.source_name
            ));
        }
        // A document read from a file whose `servers` are relative (`/api/v3`) gives no
        // URL to call: say so now, not at each call.
        let unplaced: Vec<&str> = imported
            .operations
            .iter()
            .filter(|op| !op.server.as_deref().is_some_and(|s| s.contains("://")))
            .map(|op| op.name.as_str())
            .collect();
        if !unplaced.is_empty() {
            let shown: Vec<String> = unplaced.iter().take(3).map(|o| format!("`{o}`")).collect();
            let more = match unplaced.len() {
                n if n > 3 => format!(" and {} more", n - 3),
                _ => String::new(),
            };
            warnings.push(format!(
                "{}: {} operation{} ({}{more}) {} no absolute server URL (the document's \
                 `servers` are missing or relative, and it was not read from a URL): set \
                 `baseUrl` in the import, or calls fail",
                document.source_name,
                unplaced.len(),
                if unplaced.len() == 1 { "" } else { "s" },
                shown.join(", "),
                if unplaced.len() == 1 { "has" } else { "have" },
            ));
        }
        // An `Authorization` header parameter is no argument (OpenAPI has clients ignore
        // it, and a model would be asked for a credential): an operation declaring one
        // with no security requirement gets the header only from the configuration, so
        // say where, now, not with each call's 401.
        let configured = config.headers.keys().any(|h| h.eq_ignore_ascii_case("authorization"));
        let bare: Vec<&str> = imported
            .operations
            .iter()
            .filter(|op| {
                op.declares_authorization && !configured && op.security.iter().all(Vec::is_empty)
            })
            .map(|op| op.name.as_str())
            .collect();
        if !bare.is_empty() {
            let shown: Vec<String> = bare.iter().take(3).map(|o| format!("`{o}`")).collect();
            let more = if bare.len() > 3 {
                format!(" and {} more", bare.len() - 3)
            } else {
                String::new()
            };
            warnings.push(format!(
                "{}: {} operation{} ({}{more}) declare{} an `Authorization` header parameter and \
                 no security scheme; it is no argument (OpenAPI has clients ignore it, and the \
                 model would be asked for a credential): set `headers: {{Authorization: …}}` in \
                 the import, or calls go without it",
                document.source_name,
                bare.len(),
                if bare.len() == 1 { "" } else { "s" },
                shown.join(", "),
                if bare.len() == 1 { "s" } else { "" },
            ));
        }
        // Operations that need credentials the configuration does not give are sent
        // without them: say so now, not with each call's 401.
        let mut unauthenticated: BTreeMap<Vec<&str>, Vec<&str>> = BTreeMap::new();
        for op in &imported.operations {
            let missing = auth.missing(&op.security);
            if !missing.is_empty() {
                unauthenticated.entry(missing).or_default().push(&op.name);
            }
        }
        for (schemes, ops) in unauthenticated {
            let shown: Vec<String> = ops.iter().take(3).map(|o| format!("`{o}`")).collect();
            let more =
                if ops.len() > 3 { format!(" and {} more", ops.len() - 3) } else { String::new() };
            warnings.push(format!(
                "{}: {} operation{} ({}{more}) need{} security scheme {}, and `auth` gives no \
                 credentials for {}: they are sent without; set `auth: {{{}: {{...}}}}` in \
                 the import (values from the environment as `${{VAR}}`)",
                document.source_name,
                ops.len(),
                if ops.len() == 1 { "" } else { "s" },
                shown.join(", "),
                if ops.len() == 1 { "s" } else { "" },
                schemes.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(" or "),
                if schemes.len() == 1 { "it" } else { "any" },
                schemes[0],
            ));
        }
        let client = http::client(config.max_redirects.unwrap_or(DEFAULT_MAX_REDIRECTS))?;
        let settings = HttpSettings {
            timeout: Duration::from_millis(config.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)),
            max_response_bytes: config.max_response_bytes.unwrap_or(DEFAULT_MAX_RESPONSE_BYTES),
            stream: false,
        };
        let headers: Vec<(String, String)> =
            config.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let passthrough = passthrough_names(namespace, &config.passthrough_headers)?;
        let mut secrets = Secrets::default();
        if let Some(base) = &config.base_url {
            secrets.url(base);
        }
        // The operations' servers, with the configured server variables filled in.
        let servers: BTreeSet<&str> =
            imported.operations.iter().filter_map(|op| op.server.as_deref()).collect();
        for server in servers {
            secrets.url(server);
        }
        for value in config.headers.values() {
            secrets.template(&Template::parse(value));
        }
        let secrets: Arc<[String]> = secrets.into_forms().into();
        let tools = imported
            .operations
            .into_iter()
            .map(|op| {
                let output_schema = op.output.as_ref().map(|o| Arc::new(o.schema.clone()));
                let output =
                    op.output.as_ref().zip(output_schema.as_ref()).map(|(o, schema)| {
                        Box::new(OutputCheck::new(Arc::clone(schema), o.wrapped))
                    });
                // Built from `new`, so that members the shared type gains start empty.
                let mut spec =
                    ToolSpec::new(op.name.clone(), op.description.clone(), op.input_schema.clone())
                        .with_annotations(op.annotations.clone());
                spec.title = op.title.clone();
                spec.output_schema = output_schema;
                let base_url = op.server.clone();
                RestTool {
                    spec,
                    plan: Plan::OpenApi {
                        op: Box::new(op),
                        base_url,
                        headers: headers.clone(),
                        output,
                    },
                    settings,
                    client: client.clone(),
                    passthrough: passthrough.clone(),
                    secrets: Arc::clone(&secrets),
                }
            })
            .collect();
        for warning in &warnings {
            tracing::warn!(namespace, "{warning}");
        }
        Ok(RestProvider::assemble(namespace, tools, warnings, Some(Arc::new(auth))))
    }

    fn assemble(
        namespace: &str,
        tools: Vec<RestTool>,
        warnings: Vec<String>,
        auth: Option<Arc<Auth>>,
    ) -> RestProvider {
        let tools: Vec<Arc<RestTool>> = tools.into_iter().map(Arc::new).collect();
        let by_name = tools.iter().enumerate().map(|(i, t)| (t.spec.name.clone(), i)).collect();
        RestProvider {
            namespace: namespace.to_owned(),
            tools,
            by_name,
            warnings,
            auth,
            known_secrets: Arc::from([]),
            shut_down: AtomicBool::new(false),
        }
    }

    /// The values the loader took from the environment when it expanded `${VAR}` in the
    /// configuration (toolmux's loader keeps them as its secrets). They are kept out of
    /// everything the provider shows, wherever they stand: a URL's path
    /// (`https://api.example/bot${TOKEN}/sendMessage`), its query, a redirect's target, an
    /// error response's excerpt. The requests still carry them. Values shorter than four
    /// characters are ignored, as the orchestrator's redactor ignores them.
    ///
    /// Without them the provider redacts what it can tell on its own (see the crate's
    /// docs): configured query, user info, fragment and header values, and the pieces of a
    /// configured path that look like credentials.
    pub fn with_secrets<I, S>(mut self, values: I) -> RestProvider
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut known = self.known_secrets.to_vec();
        known.extend(crate::secrets::forms_of(values));
        known.sort();
        known.dedup();
        // An inline tool's description may show its URL's path (the default one does),
        // which may hold a value from the environment (`/bot${TOKEN}/sendMessage`).
        for tool in &mut self.tools {
            if let (Some(tool), false) = (Arc::get_mut(tool), known.is_empty())
                && matches!(tool.plan, Plan::Inline(_))
            {
                tool.spec.description = crate::secrets::scrub(&tool.spec.description, &known);
            }
        }
        self.known_secrets = known.into();
        self
    }

    /// Every value `tool`'s results and errors must not show: its configured ones and the
    /// loader's.
    fn secrets_of(&self, tool: &RestTool) -> Vec<String> {
        tool.secrets.iter().chain(self.known_secrets.iter()).cloned().collect()
    }

    /// Warnings of the import (too many tools, unusable security schemes); partial success
    /// is not an error.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The name a model and a user see of the tool named `local` here (`rest__get`).
    fn full_name(&self, local: &str) -> String {
        format!("{}{}{local}", self.namespace, naming::SEPARATOR)
    }

    /// The specs of every tool, without awaiting.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|t| t.spec.clone()).collect()
    }

    /// [`RestProvider::attempt`], with the secrets of the tool kept out of its error, and
    /// out of its result when that is an error result (an API's error page may echo the
    /// request's URL).
    async fn run(
        &self,
        tool: &RestTool,
        args: Map<String, Value>,
        ctx: &CallContext,
    ) -> Result<ToolOutput, RestError> {
        let attempt = self.attempt(tool, args, ctx).await;
        // OAuth2 tokens fetched for this call (or before) are known only here: the
        // orchestrator's redactor is built from the configuration's secrets and cannot
        // be told of new ones, so they leave nothing this provider returns, an API's echo
        // of the `Authorization` header in a successful answer included.
        let fetched = self.auth.as_ref().map(|auth| auth.fetched_secrets()).unwrap_or_default();
        let mut secrets = self.secrets_of(tool);
        secrets.extend(fetched.iter().cloned());
        let mut output = attempt.map_err(|e| e.redacted(&secrets))?;
        if output.is_error {
            // Every part: a success whose body does not match the output schema is an
            // error result that carries the body as a JSON part.
            crate::secrets::scrub_output(&mut output, &secrets);
        }
        if !fetched.is_empty() {
            crate::secrets::scrub_output(&mut output, &fetched);
        }
        Ok(output)
    }

    async fn attempt(
        &self,
        tool: &RestTool,
        args: Map<String, Value>,
        ctx: &CallContext,
    ) -> Result<ToolOutput, RestError> {
        // Errors name the tool as the model and the user see it (`rest__get`).
        let name = &self.full_name(&tool.spec.name);
        // `5.0` goes as `5` where the input schema says integer (see `integers`); an inline
        // tool without a declared schema has no integer in its generated one.
        let mut args = args;
        crate::integers::integers_in_arguments(&tool.spec.input_schema, &mut args);
        let mut retried = false;
        loop {
            let (mut request, schemes) = match &tool.plan {
                Plan::Inline(plan) => (inline_request(plan, &args, name)?, Vec::new()),
                Plan::OpenApi { op, base_url, headers, .. } => {
                    let base =
                        base_url.as_deref().filter(|b| b.contains("://")).ok_or_else(|| {
                            RestError::Config {
                                name: self.namespace.clone(),
                                message: "the document names no absolute server URL: set `baseUrl`"
                                    .into(),
                            }
                        })?;
                    let mut request = request::build(op, base, &args)
                        .map_err(|message| RestError::Request { tool: name.to_owned(), message })?;
                    // The import's `headers` replace what the operation would send under
                    // the same name (its body's `Content-Type`, a header parameter): sent
                    // beside it, a server sees two values and may take either. A form's
                    // or a multipart body's own type stays, since it names the encoding
                    // (and the parts' boundary) the body is written in.
                    let encoded_body = matches!(request.body, Body::Form(_) | Body::Multipart(_));
                    for (header, value) in headers {
                        if encoded_body && header.eq_ignore_ascii_case("content-type") {
                            continue;
                        }
                        // Cookies go in the request's one `Cookie` header, each replacing
                        // an operation's cookie parameter of its name.
                        if header.eq_ignore_ascii_case("cookie") {
                            request.set_cookies(value);
                            continue;
                        }
                        request.set_header(header, value.clone());
                    }
                    // Ask for the JSON the output schema describes, unless the import's
                    // `headers` say what to accept.
                    if let Some(output) = &op.output
                        && !request.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("accept"))
                    {
                        request.headers.push(("Accept".into(), output.accept.clone()));
                    }
                    let schemes = self
                        .auth
                        .as_ref()
                        .and_then(|auth| auth.choose(&op.security))
                        .map(<[String]>::to_vec)
                        .unwrap_or_default();
                    (request, schemes)
                }
            };
            if let Some(auth) = &self.auth {
                let scopes = match &tool.plan {
                    Plan::OpenApi { op, .. } => &op.scopes,
                    Plan::Inline(_) => &BTreeMap::new(),
                };
                auth.apply(&schemes, scopes, &mut request, &tool.client, name).await?;
            }
            // The caller's headers this tool passes on, unless the request sets them.
            for header in tool.passthrough.iter() {
                let set = request.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(header));
                if !set && let Some(value) = ctx.caller_header(header) {
                    request.headers.push((header.clone(), value.to_owned()));
                }
            }
            // Whatever this response puts into an excerpt or a progress message is
            // redacted before it is cut.
            let mut secrets = self.secrets_of(tool);
            if let Some(auth) = &self.auth {
                secrets.extend(auth.secrets(&schemes));
                secrets.extend(auth.fetched_secrets());
            }
            let mut response =
                http::send(&tool.client, &request, tool.settings, name, &secrets, ctx).await?;
            if let Some(unfollowed) = response.unfollowed.as_mut() {
                unfollowed.redact(&response.secrets);
            }
            if response.status == 401
                && !retried
                && let Some(auth) = self.auth.as_ref().filter(|a| a.uses_tokens(&schemes))
            {
                // The token may have been revoked early: fetch a new one once.
                auth.invalidate(&schemes);
                retried = true;
                continue;
            }
            // The API's own rate limit: an error that says when to call again (the
            // orchestrator's retries and the model can wait), not a plain failed result.
            if response.status == 429 || (response.status == 503 && response.retry_after.is_some())
            {
                let body = response
                    .text()
                    .unwrap_or_else(|| String::from_utf8_lossy(&response.body).into_owned());
                let said = match body.trim() {
                    "" => String::new(),
                    text => format!(": {}", http::redacted_excerpt(text, 300, &response.secrets)),
                };
                return Err(RestError::RateLimited {
                    tool: name.to_owned(),
                    answer: format!(
                        "the API answered HTTP {} {}{said}",
                        response.status, response.reason
                    ),
                    retry_after: response.retry_after.unwrap_or(DEFAULT_RETRY_AFTER),
                });
            }
            return Ok(match &tool.plan {
                Plan::OpenApi { output: Some(check), .. } => check.apply(response),
                Plan::Inline(InlinePlan { select: Some(select), .. }) => {
                    response.into_output_selecting(select)
                }
                _ => response.into_output(),
            });
        }
    }
}

/// When to call again after an HTTP 429 that gives no `Retry-After`.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(5);

/// `path` resolved against the configuration file's folder, when relative.
fn relative_to_base(config: &OpenApiConfig, path: &std::path::Path) -> std::path::PathBuf {
    match (&config.base_dir, path.is_relative()) {
        (Some(dir), true) => dir.join(path.strip_prefix("./").unwrap_or(path)),
        _ => path.to_owned(),
    }
}

/// The import's `refDirs`, resolved against the configuration file's folder.
fn ref_dirs(config: &OpenApiConfig) -> Vec<std::path::PathBuf> {
    config.ref_dirs.iter().map(|dir| relative_to_base(config, dir)).collect()
}

pub(crate) fn check_namespace(namespace: &str) -> Result<(), RestError> {
    naming::validate_namespace(namespace)
        .map_err(|e| RestError::Config { name: namespace.to_owned(), message: e.to_string() })
}

async fn tokio_read(path: &std::path::Path) -> Result<String, RestError> {
    let path_buf = path.to_owned();
    let read =
        tokio::task::spawn_blocking(move || read_document_file(&path_buf, MAX_DOCUMENT_BYTES))
            .await;
    match read {
        Ok(Ok(text)) => Ok(text),
        Ok(Err(message)) => Err(RestError::ReadSpec { path: path.to_owned(), message }),
        Err(join) => Err(RestError::ReadSpec { path: path.to_owned(), message: join.to_string() }),
    }
}

/// The text of the document file at `path`, refused when it is no regular file (a FIFO
/// would block the import until something writes to it, a device such as `/dev/zero`
/// never ends) or larger than `max` bytes. The error says why, the OS's reason included.
pub(crate) fn read_document_file(path: &std::path::Path, max: usize) -> Result<String, String> {
    use std::io::Read;
    let not_regular = |kind: std::fs::FileType| {
        format!(
            "it is {}, not a regular file: give the document as a file or a URL",
            file_kind(kind)
        )
    };
    let too_large = || {
        format!(
            "it is larger than {} MiB, the most a document may be: split it into files its \
             `$ref`s name",
            max >> 20
        )
    };
    // Checked before opening, since opening a FIFO blocks until a writer comes.
    let metadata = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !metadata.is_file() {
        return Err(not_regular(metadata.file_type()));
    }
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    // And again on the file opened, which may not be the one checked.
    let metadata = file.metadata().map_err(|e| e.to_string())?;
    if !metadata.is_file() {
        return Err(not_regular(metadata.file_type()));
    }
    if metadata.len() > max as u64 {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    // One byte more than allowed tells a file that grew while it was read.
    file.take(max as u64 + 1).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    if bytes.len() > max {
        return Err(too_large());
    }
    String::from_utf8(bytes)
        .map_err(|_| "it is not UTF-8 text, as JSON and YAML documents are".to_owned())
}

/// What a file that is not a regular file is, for messages.
fn file_kind(kind: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if kind.is_char_device() {
            return "a character device";
        }
        if kind.is_block_device() {
            return "a block device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    if kind.is_dir() { "a directory" } else { "something else" }
}

/// Largest OpenAPI document fetched, in bytes.
const MAX_DOCUMENT_BYTES: usize = 64 * 1024 * 1024;

pub(crate) async fn fetch_document(url: &str, config: &OpenApiConfig) -> Result<String, RestError> {
    let client = http::client(config.max_redirects.unwrap_or(DEFAULT_MAX_REDIRECTS))?;
    let mut request = PreparedRequest {
        method: "GET".into(),
        url: url.to_owned(),
        headers: config.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        cookies: Vec::new(),
        body: Body::None,
    };
    request
        .headers
        .push(("Accept".into(), "application/json, application/yaml;q=0.9, */*;q=0.5".into()));
    let settings = HttpSettings {
        timeout: Duration::from_millis(config.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)),
        max_response_bytes: MAX_DOCUMENT_BYTES,
        stream: false,
    };
    // The document's URL may carry a token in its path (`/specs/${TOKEN}/openapi.json`).
    let mut secrets = Secrets::default();
    secrets.url(url);
    let secrets = secrets.into_forms();
    let fetch_error = |message: String| {
        RestError::FetchSpec { url: request::url_for_messages(url), message, source: None }
            .redacted(&secrets)
    };
    let response = http::send(&client, &request, settings, "openapi", &[], &CallContext::new())
        .await
        .map_err(|e| match e {
            // No setting raises this limit; a file has none.
            RestError::ResponseTooLarge { limit, .. } => fetch_error(format!(
                "the document is larger than {} MiB, the most read from a URL: download it and \
                 give it as a file with `spec`",
                limit / (1024 * 1024)
            )),
            other => fetch_error(other.to_string()),
        })?;
    if !(200..300).contains(&response.status) {
        let mut message = format!("HTTP {} {}", response.status, response.reason);
        if let Some(unfollowed) = &response.unfollowed {
            message.push_str(": ");
            message.push_str(&unfollowed.note());
        }
        return Err(fetch_error(message));
    }
    String::from_utf8(response.body).map_err(|_| fetch_error("the document is not UTF-8".into()))
}

/// The parameters of body strings that hold more than one placeholder or more than it
/// (`"Hello ${parameters.name}!"`): put in as text.
fn body_text_parameters(template: &Value, out: &mut BTreeSet<String>) {
    match template {
        Value::String(text) => {
            let parsed = Template::parse(text);
            if parsed.sole_parameter().is_none() {
                out.extend(parsed.parameters().map(str::to_owned));
            }
        }
        Value::Array(items) => items.iter().for_each(|v| body_text_parameters(v, out)),
        Value::Object(map) => map.values().for_each(|v| body_text_parameters(v, out)),
        _ => {}
    }
}

/// The values a parameter's schema lists (`enum`, or `const`) as URL text, when every one
/// is a string, number or boolean; a dotted name reaches into `properties` of objects.
fn listed_values(schema: &Value, parameter: &str) -> Option<Vec<String>> {
    let mut current = schema;
    for part in parameter.split('.') {
        current = current.get("properties")?.get(part)?;
    }
    let values: Vec<&Value> = match (current.get("enum"), current.get("const")) {
        (Some(Value::Array(values)), _) => values.iter().collect(),
        (None, Some(value)) => vec![value],
        _ => return None,
    };
    let scalar = |v: &&Value| matches!(v, Value::String(_) | Value::Number(_) | Value::Bool(_));
    if values.is_empty() || !values.iter().all(scalar) {
        return None;
    }
    Some(values.into_iter().map(crate::template::value_text).collect())
}

fn inline_tool(
    name: &str,
    local: String,
    config: &RestToolConfig,
    client: reqwest::Client,
) -> Result<RestTool, RestError> {
    let config_error = |message: String| RestError::Config { name: name.to_owned(), message };
    let method = config.method.to_ascii_uppercase();
    if reqwest::Method::from_bytes(method.as_bytes()).is_err() {
        return Err(config_error(format!("invalid method `{}`", config.method)));
    }
    if !(config.url.starts_with("http://") || config.url.starts_with("https://")) {
        // Without its query and user info, which may hold a key from the environment.
        return Err(config_error(format!(
            "`url` must start with http:// or https://: `{}`",
            request::url_text_for_messages(&config.url)
        )));
    }
    if let Some(select) = &config.select {
        select.check().map_err(config_error)?;
    }
    // Placeholders are valid in a header; a line break from a variable is not.
    if let Some(message) = config.headers.iter().find_map(|(header, value)| {
        http::unsendable_header(&format!("headers.{header}"), header, value)
    }) {
        return Err(config_error(message));
    }
    let mut url = UrlTemplate::parse(&config.url);
    // An argument in the host (or port or user info) chooses where the request goes: the
    // model could send it to loopback or a cloud metadata address. It takes only the values
    // the tool's `parametersSchema` lists for it.
    for parameter in url.authority_parameters().into_iter().map(str::to_owned).collect::<Vec<_>>() {
        let values = config
            .parameters_schema
            .as_ref()
            .and_then(|schema| listed_values(schema, &parameter))
            .ok_or_else(|| {
                config_error(format!(
                    "`url` puts parameter `{parameter}` in the host, so the model could send \
                     the request to any host (loopback and cloud metadata addresses included); \
                     write the host in the URL, or list the values `{parameter}` may take as \
                     an `enum` in the tool's parameter schema (`parametersSchema`; an external \
                     tool's `inputSchema`): `\"properties\": {{\"{parameter}\": {{\"enum\": \
                     [\"eu\", \"us\"]}}}}`"
                ))
            })?;
        url.allow_authority_values(&parameter, values);
    }
    let headers: Vec<(String, Template)> =
        config.headers.iter().map(|(k, v)| (k.clone(), Template::parse(v))).collect();
    // A header of the message itself filled from an argument would let the model cut the
    // body short (`Content-Length`) or send the request elsewhere (`Host`).
    if let Some((header, _)) = headers.iter().find(|(header, template)| {
        request::is_message_header(header) && template.parameters().next().is_some()
    }) {
        return Err(config_error(format!(
            "header `{header}` is filled from parameters, but it belongs to the HTTP message \
             and the client sets it: remove it from `headers` (or give it a fixed value)"
        )));
    }
    let query: Vec<(String, Template)> =
        config.query.iter().map(|(k, v)| (k.clone(), Template::parse(v))).collect();
    let mut secrets = Secrets::default();
    secrets.url(&config.url);
    for (_, template) in headers.iter().chain(&query) {
        secrets.template(template);
    }
    let mut used = BTreeSet::new();
    let required: BTreeSet<String> = url.path_parameters().map(top_level).collect();
    used.extend(required.iter().cloned());
    used.extend(url.query_parameters().map(top_level));
    for (_, t) in headers.iter().chain(&query) {
        used.extend(t.parameters().map(top_level));
    }
    // Parameters only ever put in text (a URL, a header, a string of the body) are scalars;
    // one that stands alone as a body value takes any JSON (a number, an object).
    let mut in_text: BTreeSet<String> = used.clone();
    let mut whole = BTreeSet::new();
    if let Some(body) = &config.body {
        let mut in_body = BTreeSet::new();
        body_parameters(body, &mut in_body);
        let mut sole = BTreeSet::new();
        crate::template::sole_body_parameters(body, &mut sole);
        // A parameter used inside a longer string of the body is text there.
        let mut in_strings = BTreeSet::new();
        body_text_parameters(body, &mut in_strings);
        in_text.extend(in_strings.iter().map(|p| top_level(p)));
        whole.extend(sole.iter().map(|p| top_level(p)));
        used.extend(in_body.iter().map(|p| top_level(p)));
    }
    let input_schema = match &config.parameters_schema {
        Some(schema) if schema.get("type").and_then(Value::as_str) == Some("object") => {
            schema.clone()
        }
        Some(_) => {
            return Err(config_error(
                "`parametersSchema` must be an object schema (`\"type\": \"object\"`)".into(),
            ));
        }
        None => {
            let properties: Map<String, Value> = used
                .iter()
                .map(|p| {
                    let schema = if whole.contains(p) && !in_text.contains(p) {
                        json!({"description": "any JSON value, put in the body as it is"})
                    } else {
                        json!({"type": ["string", "number", "boolean"]})
                    };
                    (p.clone(), schema)
                })
                .collect();
            json!({"type": "object", "properties": properties, "required": required})
        }
    };
    let read_only = matches!(method.as_str(), "GET" | "HEAD" | "OPTIONS");
    let annotations = ToolAnnotations {
        read_only,
        idempotent: read_only || matches!(method.as_str(), "PUT" | "DELETE"),
        destructive: method == "DELETE",
        permission: Some(PermissionClass::Network),
        ..ToolAnnotations::default()
    };
    let secrets = secrets.into_forms();
    let description = match &config.description {
        Some(description) => description.clone(),
        // Only the URL's path goes in, placeholders shown as `{id}`: the query and user info
        // may hold a key from the environment, and so may a path segment.
        None => {
            let shown = Template::parse(&request::url_text_for_messages(&config.url)).shown();
            format!("{method} {}", crate::secrets::scrub(&shown, &secrets))
        }
    };
    let spec = ToolSpec::new(local, description, input_schema).with_annotations(annotations);
    Ok(RestTool {
        spec,
        plan: Plan::Inline(InlinePlan {
            method,
            url,
            headers,
            query,
            body: config.body.clone(),
            used,
            select: config.select.clone(),
        }),
        settings: HttpSettings {
            timeout: Duration::from_millis(config.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)),
            max_response_bytes: config.max_response_bytes.unwrap_or(DEFAULT_MAX_RESPONSE_BYTES),
            stream: config.stream,
        },
        client,
        passthrough: passthrough_names(name, &config.passthrough_headers)?,
        secrets: secrets.into(),
    })
}

/// `passthroughHeaders`, checked: never a header of the connection itself.
fn passthrough_names(owner: &str, names: &[String]) -> Result<Arc<[String]>, RestError> {
    if let Some(never) = names.iter().find(|n| !toolmux_core::passable_header(n)) {
        return Err(RestError::Config {
            name: owner.to_owned(),
            message: format!(
                "`passthroughHeaders` names `{never}`, which belongs to the request itself and \
                 is never passed on"
            ),
        });
    }
    Ok(names.iter().cloned().collect())
}

fn top_level(name: &str) -> String {
    name.split('.').next().unwrap_or(name).to_owned()
}

fn inline_request(
    plan: &InlinePlan,
    args: &Map<String, Value>,
    tool: &str,
) -> Result<PreparedRequest, RestError> {
    let missing = |what: &str, name: String| RestError::Request {
        tool: tool.to_owned(),
        message: format!("missing argument `{name}` for the {what}"),
    };
    let mut url = plan
        .url
        .render(args)
        .map_err(|e| RestError::Request { tool: tool.to_owned(), message: e.message() })?;
    let mut headers = Vec::new();
    for (name, template) in &plan.headers {
        if template.sole_parameter().is_some_and(|p| lookup(args, p).is_none()) {
            continue;
        }
        headers.push((
            name.clone(),
            template.render(args, Escape::Verbatim).map_err(|n| missing("headers", n))?,
        ));
    }
    let mut query = Vec::new();
    for (name, template) in &plan.query {
        if template.sole_parameter().is_some_and(|p| lookup(args, p).is_none()) {
            continue;
        }
        query.push((
            name.clone(),
            template.render(args, Escape::Verbatim).map_err(|n| missing("query", n))?,
        ));
    }
    let unused: Map<String, Value> = args
        .iter()
        .filter(|(k, v)| !plan.used.contains(*k) && !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let sends_body = matches!(plan.method.as_str(), "POST" | "PUT" | "PATCH");
    let body = match &plan.body {
        Some(template) => {
            // With a body template nothing carries the arguments no template names: a
            // misspelled one would vanish from the request without a word.
            if let Some(name) = unused.keys().next() {
                return Err(RestError::Request {
                    tool: tool.to_owned(),
                    message: unknown_argument(name, plan.used.iter().map(String::as_str)),
                });
            }
            Body::Json(render_body(template, args).map_err(|n| missing("body", n))?)
        }
        None if sends_body => Body::Json(Value::Object(unused)),
        None => {
            for (k, v) in &unused {
                match v {
                    Value::Array(items) => query
                        .extend(items.iter().map(|i| (k.clone(), crate::template::value_text(i)))),
                    other => query.push((k.clone(), crate::template::value_text(other))),
                }
            }
            Body::None
        }
    };
    let mut request = PreparedRequest {
        method: plan.method.clone(),
        url: String::new(),
        headers,
        cookies: Vec::new(),
        body,
    };
    request.url = std::mem::take(&mut url);
    for (k, v) in &query {
        request.add_query(k, v);
    }
    Ok(request)
}

#[async_trait]
impl ToolProvider for RestProvider {
    fn kind(&self) -> ToolKind {
        ToolKind::Rest
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(self.specs())
    }

    async fn has_tool(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// A tool that passes some of the caller's headers on may answer each caller apart.
    fn cache_partition(&self, tool: &str, ctx: &CallContext) -> Option<String> {
        let names = &self.tools[*self.by_name.get(tool)?].passthrough;
        (!names.is_empty()).then(|| ctx.caller_header_values(names.iter().map(String::as_str)))
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        if self.shut_down.load(Ordering::Acquire) {
            return Err(ToolError::Unavailable {
                provider: self.namespace.clone(),
                message: "shut down".into(),
            });
        }
        let Some(tool) = self.by_name.get(name).map(|&i| Arc::clone(&self.tools[i])) else {
            let suggestions = close_names(name, self.by_name.keys());
            return Err(ToolError::UnknownTool { name: name.to_owned(), suggestions });
        };
        let name = &self.full_name(name);
        let args = match arguments {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => {
                return Err(ToolError::InvalidArguments {
                    tool: name.to_owned(),
                    violations: vec![toolmux_core::Violation {
                        pointer: String::new(),
                        message: format!("arguments must be an object, not {other}"),
                    }],
                });
            }
        };
        let mut limit = tool.settings.timeout;
        if let Some(deadline) = ctx.deadline() {
            limit = limit.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        }
        let work = self.run(&tool, args, ctx);
        tokio::select! {
            () = ctx.cancel_token().cancelled() => Err(ToolError::Cancelled { tool: name.to_owned() }),
            outcome = tokio::time::timeout(limit, work) => match outcome {
                Err(_) => Err(ToolError::Timeout { tool: name.to_owned(), after: limit, idle: None }),
                Ok(result) => result.map_err(|e| e.into_tool_error(&self.namespace)),
            },
        }
    }

    async fn shutdown(&self) -> Result<(), ToolError> {
        self.shut_down.store(true, Ordering::Release);
        Ok(())
    }
}

/// Up to three known names sharing the longest prefix with `name`.
fn close_names<'a>(name: &str, known: impl Iterator<Item = &'a String>) -> Vec<String> {
    let mut scored: Vec<(usize, &String)> = known
        .map(|k| (k.chars().zip(name.chars()).take_while(|(a, b)| a == b).count(), k))
        .filter(|(score, _)| *score >= 3)
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    scored.into_iter().take(3).map(|(_, k)| k.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    fn tools(value: Value) -> BTreeMap<String, RestToolConfig> {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn inline_names_are_sanitized_and_distinct() {
        let provider = RestProvider::inline(&tools(json!({
            "a.b": {"description": "x", "url": "http://127.0.0.1:1/a"},
            "a_b": {"description": "y", "url": "http://127.0.0.1:1/b"},
            "weather": {"description": "z", "url": "http://127.0.0.1:1/${parameters.city}?u=${parameters.unit}"}
        })))
        .unwrap();
        let specs = provider.specs();
        let names: Vec<&str> = specs.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names.len(), 3);
        assert_ne!(names[0], names[1]);
        assert!(names[0].starts_with("a_b_") && names[1].starts_with("a_b_"), "{names:?}");
        expect![[r#"{"properties":{"city":{"type":["string","number","boolean"]},"unit":{"type":["string","number","boolean"]}},"required":["city"],"type":"object"}"#]]
            .assert_eq(&specs[2].input_schema.to_string());
    }

    #[test]
    fn inline_configuration_errors() {
        let err = |v: Value| RestProvider::inline(&tools(v)).unwrap_err().to_string();
        expect!["invalid configuration of `t`: invalid method `GE T`"].assert_eq(&err(
            json!({"t": {"description": "x", "method": "GE T", "url": "http://h"}}),
        ));
        expect![
            "invalid configuration of `t`: `url` must start with http:// or https://: `ftp://h`"
        ]
        .assert_eq(&err(json!({"t": {"description": "x", "url": "ftp://h"}})));
        expect![[r#"invalid configuration of `t`: `parametersSchema` must be an object schema (`"type": "object"`)"#]]
            .assert_eq(&err(json!({"t": {"description": "x", "url": "http://h", "parametersSchema": {"type": "string"}}})));
        expect!["invalid configuration of `Bad_NS`: invalid namespace `Bad_NS`: use a lowercase letter followed by lowercase letters, digits or `-`"]
            .assert_eq(&RestProvider::inline_in("Bad_NS", &BTreeMap::new()).unwrap_err().to_string());
    }
}
