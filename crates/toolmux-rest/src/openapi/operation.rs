//! From the operations of a document to tools: selection, names, flat input schemas,
//! parameter maps, servers and security.

use super::document::{Document, Version, escape_token};
use super::schema::{Direction, SchemaConverter, ref_name};
use super::select::{OperationFacts, matches};
use super::{
    BodyEncoding, BodySpec, Field, Imported, Location, METHODS, Operation, OutputSchema,
    SecurityScheme, Style,
};
use crate::config::DEFAULT_MAX_TOOLS;
use crate::{OpenApiConfig, RestError, names};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use toolmux_core::{PermissionClass, ToolAnnotations, naming};

/// Longest description kept, in bytes.
const MAX_DESCRIPTION: usize = 2000;
/// Longest argument name (what model APIs accept for property names).
const MAX_ARGUMENT_NAME: usize = 64;

/// Imports every selected operation of `doc` as a tool of `namespace`.
pub(crate) fn import(
    doc: &Document,
    namespace: &str,
    config: &OpenApiConfig,
) -> Result<Imported, RestError> {
    let mut converter = SchemaConverter::new(doc, Direction::Request);
    let mut responses = (config.output_schemas != Some(false))
        .then(|| SchemaConverter::new(doc, Direction::Response));
    let mut warnings = Vec::new();
    let mut operations = Vec::new();
    let mut keys = Vec::new();
    // Beside each of `keys`: the operation's `operationId` and the name `rename` gives it.
    let mut origins: Vec<(Option<String>, Option<String>)> = Vec::new();
    // Operations left out because their part of the document is broken, with the first
    // reason: the import fails only when nothing else was usable.
    let mut left_out: Vec<RestError> = Vec::new();
    let auth =
        crate::auth::Auth::new(security_schemes(doc, config, &mut warnings), config.auth.clone());
    let empty = Map::new();
    let paths = doc.root.get("paths").and_then(Value::as_object).unwrap_or(&empty);
    for (path, item) in paths {
        let item_at = format!("/paths/{}", escape_token(path));
        let (item, item_at) = match doc.follow(item, &item_at) {
            Ok(found) => found,
            Err(e) => {
                warnings.push(format!("{e}; the operations of path `{path}` are left out"));
                left_out.push(e);
                continue;
            }
        };
        let Some(item_map) = item.as_object() else { continue };
        for (method, op, op_at) in item_operations(item_map, &item_at, &mut warnings, doc) {
            let method = method.as_str();
            let route = format!("{} {path}", method.to_ascii_uppercase());
            let built = if op.is_object() {
                if !selected(doc, item, op, method, path, config) {
                    continue;
                }
                build_operation(
                    doc,
                    &mut converter,
                    config,
                    &auth,
                    &mut warnings,
                    OperationSite { item, item_at: &item_at, op, method, path, at: &op_at },
                )
            } else {
                Err(doc.error(&op_at, "operation is not an object"))
            };
            match built {
                Ok(mut built) => {
                    if let Some(responses) = responses.as_mut() {
                        match output_schema(doc, responses, op, &op_at) {
                            Ok(output) => built.output = output,
                            Err(e) => warnings
                                .push(format!("{e}; operation `{route}` gets no output schema")),
                        }
                    }
                    let id = op.get("operationId").and_then(Value::as_str);
                    let renamed = id
                        .and_then(|id| config.rename.get(id))
                        .or_else(|| config.rename.get(&route))
                        .cloned();
                    origins.push((id.map(str::to_owned), renamed));
                    keys.push((built.name.clone(), route));
                    operations.push(built);
                }
                Err(e) => {
                    let id = op.get("operationId").and_then(Value::as_str);
                    let which = id.map_or_else(String::new, |id| format!(" (`{id}`)"));
                    warnings.push(format!("{e}; operation `{route}`{which} is left out"));
                    left_out.push(e);
                }
            }
        }
    }
    // Cycles cut in either direction, each said once.
    let cut = converter.take_warnings().into_iter();
    for warning in cut.chain(responses.iter_mut().flat_map(SchemaConverter::take_warnings)) {
        if !warnings.contains(&warning) {
            warnings.push(warning);
        }
    }
    if operations.is_empty()
        && let Some(first) = left_out.into_iter().next()
    {
        // Nothing usable: the first broken place is the error.
        return Err(first);
    }
    for (name, _) in &mut keys {
        *name = names::fit(namespace, name, naming::DEFAULT_BUDGET);
    }
    names::dedupe(namespace, &mut keys, naming::DEFAULT_BUDGET);
    name_warnings(doc, &keys, &origins, &mut warnings);
    for (op, (name, _)) in operations.iter_mut().zip(keys) {
        op.name = name;
    }
    let max_tools = config.max_tools.unwrap_or(DEFAULT_MAX_TOOLS);
    if operations.len() > max_tools {
        warnings.push(format!(
            "{}: {} operations imported as tools, more than the {max_tools} set by `maxTools`; \
             models choose worse among many tools: narrow the import with `include`/`exclude`, \
             or defer its tools to be found by searching (`toolSearch: {{defer: ['{namespace}__*']}}`)",
            doc.source_name,
            operations.len()
        ));
    }
    Ok(Imported { operations, auth, warnings })
}

/// Warnings about the tools' final names (`keys`, with their routes, beside `origins`):
/// an `operationId` several operations share, which OpenAPI says is unique (their tools
/// get a hash of their route each, so the names stay distinct and do not depend on the
/// document's order), and a `rename` that did not give the name it asked for, its
/// characters sanitized or its length cut, as `x-mcp-name` and inline tools' names are.
fn name_warnings(
    doc: &Document,
    keys: &[(String, String)],
    origins: &[(Option<String>, Option<String>)],
    warnings: &mut Vec<String>,
) {
    let mut by_id: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, (id, _)) in origins.iter().enumerate() {
        if let Some(id) = id {
            by_id.entry(id).or_default().push(i);
        }
    }
    for (id, holders) in by_id.into_iter().filter(|(_, holders)| holders.len() > 1) {
        let list = |f: &dyn Fn(&(String, String)) -> &str| {
            holders.iter().map(|&i| format!("`{}`", f(&keys[i]))).collect::<Vec<_>>().join(", ")
        };
        warnings.push(format!(
            "{}: operationId `{id}` is used by {}, where OpenAPI requires each to be unique; \
             their tools are {} (a hash of each route added), and a `rename` of `{id}` names \
             all of them: rename them by `METHOD /path` instead",
            doc.source_name,
            list(&|(_, route)| route),
            list(&|(name, _)| name),
        ));
    }
    for ((name, route), (_, renamed)) in keys.iter().zip(origins) {
        if let Some(asked) = renamed
            && asked != name
        {
            warnings.push(format!(
                "{}: `rename` names `{route}` `{asked}`, which became `{name}`: a tool name \
                 is ASCII letters, digits, `_` and `-`, fits the name budget after the \
                 namespace and is distinct from the others",
                doc.source_name,
            ));
        }
    }
}

/// The operations of a path item: `(lower-case method, operation, its pointer)`, the fixed
/// methods first, then (OpenAPI 3.2) those under `additionalOperations`, whose keys are
/// HTTP methods as sent (`LINK`, `PURGE`). One that repeats a fixed method, or is not an
/// HTTP method, is left out with a warning.
fn item_operations<'a>(
    item: &'a Map<String, Value>,
    item_at: &str,
    warnings: &mut Vec<String>,
    doc: &Document,
) -> Vec<(String, &'a Value, String)> {
    let mut operations: Vec<(String, &Value, String)> = METHODS
        .iter()
        .filter_map(|&m| item.get(m).map(|op| (m.to_owned(), op, format!("{item_at}/{m}"))))
        .collect();
    let Some(additional) = item.get("additionalOperations").and_then(Value::as_object) else {
        return operations;
    };
    for (method, op) in additional {
        let at = format!("{item_at}/additionalOperations/{}", escape_token(method));
        let lower = method.to_ascii_lowercase();
        let is_token = !method.is_empty()
            && method.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if METHODS.contains(&lower.as_str()) {
            warnings.push(format!(
                "{}: at {at}: `{method}` is a fixed field of the path item, not an additional \
                 operation; left out",
                doc.source_name
            ));
        } else if !is_token {
            warnings.push(format!(
                "{}: at {at}: `{method}` is not an HTTP method; left out",
                doc.source_name
            ));
        } else {
            operations.push((lower, op, at));
        }
    }
    operations
}

/// Whether an operation is selected by its extensions and the configuration. `x-mcp`
/// (a boolean) on the operation wins over the path item's, which wins over the document's.
fn selected(
    doc: &Document,
    item: &Value,
    op: &Value,
    method: &str,
    path: &str,
    config: &OpenApiConfig,
) -> bool {
    let x_mcp = [op, item, &doc.root].iter().find_map(|v| v.get("x-mcp").and_then(Value::as_bool));
    if x_mcp == Some(false) || op.pointer("/x-speakeasy-mcp/disabled") == Some(&Value::Bool(true)) {
        return false;
    }
    if !config.include_deprecated && op.get("deprecated") == Some(&Value::Bool(true)) {
        return false;
    }
    let facts = OperationFacts {
        method,
        path,
        operation_id: op.get("operationId").and_then(Value::as_str),
        tags: op
            .get("tags")
            .and_then(Value::as_array)
            .map(|tags| tags.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default(),
    };
    config.include.as_ref().is_none_or(|s| matches(s, &facts))
        && !config.exclude.as_ref().is_some_and(|s| matches(s, &facts))
}

/// Where an operation sits in the document.
struct OperationSite<'a> {
    item: &'a Value,
    item_at: &'a str,
    op: &'a Value,
    method: &'a str,
    path: &'a str,
    at: &'a str,
}

/// One flat argument before clashes are resolved.
struct Candidate {
    field: Field,
    schema: Value,
    required: bool,
}

fn build_operation(
    doc: &Document,
    converter: &mut SchemaConverter<'_>,
    config: &OpenApiConfig,
    auth: &crate::auth::Auth,
    warnings: &mut Vec<String>,
    site: OperationSite<'_>,
) -> Result<Operation, RestError> {
    let OperationSite { item, item_at, op, method, path, at } = site;
    let security = security_requirements(doc, op);
    // A parameter the configured credentials supply (an API key the document also lists
    // among the operation's parameters) is no argument: the model would be asked for
    // the key, and its value sent beside the real one.
    let supplied = auth.supplied_parameters(&security);
    let mut candidates = Vec::new();
    let mut swagger_body = None;
    let mut form_params = Vec::new();
    let mut declares_authorization = false;
    for (param, param_at) in merged_parameters(doc, item, item_at, op, at)? {
        let name = param.get("name").and_then(Value::as_str).unwrap_or_default();
        let location = match param.get("in").and_then(Value::as_str) {
            Some("path") => Location::Path,
            Some("query") => Location::Query,
            // OpenAPI 3.2: the whole query string, serialized as its `content` says
            // ([`Style::QueryString`]).
            Some("querystring") => Location::Query,
            Some("header") => Location::Header,
            Some("cookie") => Location::Cookie,
            Some("body") => {
                swagger_body = Some((param, param_at));
                continue;
            }
            Some("formData") => {
                form_params.push((param, param_at));
                continue;
            }
            other => {
                return Err(doc.error(
                    &format!("{param_at}/in"),
                    format!("unknown parameter location `{}`", other.unwrap_or("(missing)")),
                ));
            }
        };
        if name.is_empty() {
            return Err(doc.error(&format!("{param_at}/name"), "parameter without a name"));
        }
        // A path parameter the path template has no `{placeholder}` for has nowhere to go:
        // as a required argument the model would be asked for a value that is then
        // dropped without a word, so it is no argument and the document's slip is said.
        if location == Location::Path && !path_placeholders(path).contains(&name) {
            let id = op.get("operationId").and_then(Value::as_str);
            let which = id.map_or_else(String::new, |id| format!(" (`{id}`)"));
            warnings.push(format!(
                "{}: operation `{} {path}`{which}: path parameter `{name}` is left out, as the \
                 path has no `{{{name}}}` to put it in; fix the path or the parameter's `in`",
                doc.source_name,
                method.to_ascii_uppercase(),
            ));
            continue;
        }
        // OpenAPI: these header parameters are ignored; the client sets them.
        if location == Location::Header
            && ["accept", "content-type", "authorization"]
                .contains(&name.to_ascii_lowercase().as_str())
        {
            declares_authorization |= name.eq_ignore_ascii_case("authorization");
            continue;
        }
        // Headers of the message itself: an argument's `Content-Length` cuts the body short
        // or holds the request until its timeout, a `Host` sends it (credentials and all)
        // to another virtual host. The HTTP client sets them; no argument may.
        if location == Location::Header && crate::request::is_message_header(name) {
            let id = op.get("operationId").and_then(Value::as_str);
            let which = id.map_or_else(String::new, |id| format!(" (`{id}`)"));
            warnings.push(format!(
                "{}: operation `{} {path}`{which}: header parameter `{name}` is left out, as \
                 the HTTP client sets it and an argument could cut or redirect the request",
                doc.source_name,
                method.to_ascii_uppercase(),
            ));
            continue;
        }
        let key = match location {
            Location::Header => name.to_ascii_lowercase(),
            _ => name.to_owned(),
        };
        if supplied.iter().any(|(l, n)| *l == location && *n == key) {
            continue;
        }
        // A header the import's `headers` set goes with the configured value: asking the
        // model for it would let a model override what the user configured (a key, an
        // API version), so it is no argument.
        if location == Location::Header
            && config.headers.keys().any(|h| h.eq_ignore_ascii_case(name))
        {
            continue;
        }
        // So is a cookie a configured `Cookie` header sets: all go in one header.
        if location == Location::Cookie
            && config.headers.iter().any(|(h, v)| {
                h.eq_ignore_ascii_case("cookie")
                    && v.split(';').any(|pair| pair.split('=').next().map(str::trim) == Some(name))
            })
        {
            continue;
        }
        let schema = parameter_schema(doc, converter, param, &param_at)?;
        let (style, explode) = if param.get("in").and_then(Value::as_str) == Some("querystring") {
            (Style::QueryString { json: json_content(param) }, false)
        } else {
            parameter_style(doc, param, location)
        };
        candidates.push(Candidate {
            field: Field {
                flat: String::new(),
                location,
                name: name.to_owned(),
                style,
                explode,
                // OpenAPI: it applies to query parameters only.
                allow_reserved: location == Location::Query
                    && param.get("allowReserved") == Some(&Value::Bool(true)),
                binary: false,
                base64: false,
                content_type: None,
            },
            schema,
            required: location == Location::Path
                || param.get("required") == Some(&Value::Bool(true)),
        });
    }
    // A `{placeholder}` of the path that no parameter declares (documents forget them):
    // an argument all the same, a required string, or the URL would carry `%7Bid%7D`.
    for name in path_placeholders(path) {
        let declared =
            candidates.iter().any(|c| c.field.location == Location::Path && c.field.name == name);
        if !declared {
            candidates.push(Candidate {
                field: Field {
                    flat: String::new(),
                    location: Location::Path,
                    name: name.to_owned(),
                    style: Style::Simple,
                    explode: false,
                    allow_reserved: false,
                    binary: false,
                    base64: false,
                    content_type: None,
                },
                schema: json!({"type": "string",
                    "description": format!("`{{{name}}}` in the path (the document declares no parameter for it)")}),
                required: true,
            });
        }
    }
    let body = if doc.version == Version::Swagger2 {
        swagger_request_body(doc, converter, op, swagger_body, &form_params, &mut candidates)?
    } else {
        request_body(doc, converter, op, at, &mut candidates)?
    };
    let (fields, properties, required) = flatten(candidates);
    let body = body.map(|mut body| {
        // An empty name marks the whole-body argument, which a clash may have renamed.
        body.whole = fields
            .iter()
            .find(|f| f.location == Location::Body && f.name.is_empty())
            .map(|f| f.flat.clone());
        body
    });
    let mut input_schema = json!({"type": "object", "properties": properties});
    if !body.as_ref().is_some_and(|b| b.open) {
        // Arguments nothing takes are refused (see `request::build`): say so up front.
        input_schema["additionalProperties"] = Value::Bool(false);
    }
    if !required.is_empty() {
        input_schema["required"] = Value::Array(required.into_iter().map(Value::String).collect());
    }
    converter.attach_defs(&mut input_schema)?;
    let operation_id = op.get("operationId").and_then(Value::as_str);
    Ok(Operation {
        name: tool_name(op, method, path, operation_id, config),
        title: op
            .get("summary")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
        description: description(op, method, path),
        method: method.to_ascii_uppercase(),
        path: path.to_owned(),
        server: server_url(doc, [(op, at), (item, item_at), (&doc.root, "")], config)?,
        input_schema,
        fields,
        body,
        scopes: requirement_scopes(doc, op),
        security,
        annotations: annotations(method),
        output: None,
        declares_authorization,
    })
}

/// The output schema of an operation, from its success responses, converted like input
/// schemas (`$ref`s to `$defs`, recursion kept as references) but for a response
/// (`writeOnly` properties left out, `readOnly` ones kept).
///
/// The success responses are the `2xx` codes and the `2XX` range (`default` may be an
/// error). Every one of them must hold JSON (OpenAPI 3: an `application/json` or `+json`
/// media type with a `schema`; Swagger 2: a `schema`, with JSON among `produces` when it
/// is given) whose schema constrains something: a success that could be empty (`204`),
/// something else, or any JSON at all gives no output schema, since MCP asks every result
/// of a tool with one for structured content conforming to it. Several different schemas
/// are alternatives (`anyOf`). A schema that is an object (`type: object`, directly,
/// through a `$ref` or in an `allOf`) is the output schema as it is; any other (an array,
/// a scalar, a nullable object) is wrapped as the property `result` of an object, as
/// FastMCP does (`x-toolmux-wrap-result` marks it).
fn output_schema(
    doc: &Document,
    converter: &mut SchemaConverter<'_>,
    op: &Value,
    at: &str,
) -> Result<Option<OutputSchema>, RestError> {
    let Some(responses) = op.get("responses").and_then(Value::as_object) else {
        return Ok(None);
    };
    // Explicit codes in order, the `2XX` range after them (digits sort before `X`).
    let mut success: Vec<(&String, &Value)> =
        responses.iter().filter(|(code, _)| is_success(code)).collect();
    success.sort_by_key(|(code, _)| code.to_ascii_uppercase());
    if success.is_empty() {
        return Ok(None);
    }
    let mut schemas: Vec<Value> = Vec::new();
    let mut media_types: Vec<String> = Vec::new();
    for (code, response) in success {
        let (response, response_at) =
            doc.follow(response, &format!("{at}/responses/{}", escape_token(code)))?;
        let found = if doc.version == Version::Swagger2 {
            swagger_response_schema(doc, op, response, &response_at)
        } else {
            response
                .get("content")
                .and_then(Value::as_object)
                .and_then(|content| content.iter().find(|(m, _)| is_json_media(m)))
                .and_then(|(media, content)| {
                    let schema_at = format!("{response_at}/content/{}/schema", escape_token(media));
                    Some((content.get("schema")?, schema_at, media.clone()))
                })
        };
        let Some((schema, schema_at, media)) = found else { return Ok(None) };
        let converted = converter.convert(schema, &schema_at)?;
        if !constrains(&converted) {
            return Ok(None);
        }
        if !schemas.contains(&converted) {
            schemas.push(converted);
        }
        if !media_types.contains(&media) {
            media_types.push(media);
        }
    }
    let body = if schemas.len() == 1 { schemas.remove(0) } else { json!({"anyOf": schemas}) };
    let wrapped = !is_object(converter, &body, 0)?;
    let mut schema = if wrapped {
        json!({
            "type": "object",
            "properties": {"result": body},
            "required": ["result"],
            "x-toolmux-wrap-result": true,
        })
    } else {
        let mut body = body;
        if let Value::Object(map) = &mut body {
            // Said outright, as MCP requires; it holds already.
            map.entry("type").or_insert_with(|| json!("object"));
        }
        body
    };
    converter.attach_defs(&mut schema)?;
    // A listing carries every output schema to the client; a huge one (a whole API's
    // object graph) is left out, and the tool answers in text alone.
    if serde_json::to_vec(&schema).map_or(true, |bytes| bytes.len() > OUTPUT_SCHEMA_MAX_BYTES) {
        return Ok(None);
    }
    Ok(Some(OutputSchema { schema, wrapped, accept: media_types.join(", ") }))
}

/// The largest output schema an imported tool gets, in bytes of compact JSON.
pub(crate) const OUTPUT_SCHEMA_MAX_BYTES: usize = 32 * 1024;

/// Whether a response code is a success: `200`…`299` or the range `2XX`.
fn is_success(code: &str) -> bool {
    code.eq_ignore_ascii_case("2XX")
        || (code.len() == 3 && code.starts_with('2') && code.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether a media type is JSON: `application/json` or a `+json` type, parameters aside
/// (`application/x-ndjson` and `application/json-seq` are streams, not one value).
fn is_json_media(media: &str) -> bool {
    let essence = media.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

/// The schema of a Swagger 2 response, when the operation produces JSON (`produces` of the
/// operation, else of the document; JSON when neither says).
fn swagger_response_schema<'a>(
    doc: &Document,
    op: &Value,
    response: &'a Value,
    response_at: &str,
) -> Option<(&'a Value, String, String)> {
    let schema = response.get("schema")?;
    let produces = op
        .get("produces")
        .or_else(|| doc.root.get("produces"))
        .and_then(Value::as_array)
        .filter(|list| !list.is_empty());
    let media = match produces {
        None => "application/json".to_owned(),
        Some(list) => list.iter().filter_map(Value::as_str).find(|m| is_json_media(m))?.to_owned(),
    };
    Some((schema, format!("{response_at}/schema"), media))
}

/// Whether a converted schema rules anything out: `{}`, `true` and schemas of annotations
/// only accept any JSON, which says nothing a client could use.
fn constrains(schema: &Value) -> bool {
    const ANNOTATIONS: &[&str] = &[
        "title",
        "description",
        "examples",
        "default",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$comment",
        "format",
    ];
    match schema {
        Value::Object(map) => map.keys().any(|k| !ANNOTATIONS.contains(&k.as_str())),
        Value::Bool(accepts) => !accepts,
        _ => false,
    }
}

/// Whether every value a converted schema accepts is an object: `type: object`, directly or
/// through a `$ref`; an `allOf` with such a member; an `anyOf`/`oneOf` of such members.
/// Recursion is cut after 16 steps, as for request bodies (then it is not known to be one).
fn is_object(
    converter: &mut SchemaConverter<'_>,
    schema: &Value,
    depth: usize,
) -> Result<bool, RestError> {
    if depth > 16 {
        return Ok(false);
    }
    let Some(map) = schema.as_object() else { return Ok(false) };
    if map.get("type").and_then(Value::as_str) == Some("object") {
        return Ok(true);
    }
    if let Some(name) = ref_name(schema) {
        let target = converter.definition(name)?.cloned();
        if let Some(target) = target
            && is_object(converter, &target, depth + 1)?
        {
            return Ok(true);
        }
    }
    if let Some(Value::Array(members)) = map.get("allOf") {
        for member in members {
            if is_object(converter, member, depth + 1)? {
                return Ok(true);
            }
        }
    }
    for keyword in ["anyOf", "oneOf"] {
        if let Some(Value::Array(members)) = map.get(keyword)
            && !members.is_empty()
        {
            let mut all = true;
            for member in members {
                all &= is_object(converter, member, depth + 1)?;
            }
            if all {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Path-level and operation-level parameters, the operation's winning on `(name, in)`;
/// header names compare without case, as HTTP compares them (a path item's
/// `X-Api-Version` and its operation's `x-api-version` are one header).
fn merged_parameters<'a>(
    doc: &'a Document,
    item: &'a Value,
    item_at: &str,
    op: &'a Value,
    op_at: &str,
) -> Result<Vec<(&'a Value, String)>, RestError> {
    let mut merged: Vec<(&Value, String)> = Vec::new();
    let mut index: HashMap<(String, String), usize> = HashMap::new();
    for (list, at) in [(item.get("parameters"), item_at), (op.get("parameters"), op_at)] {
        let Some(list) = list.and_then(Value::as_array) else { continue };
        for (i, param) in list.iter().enumerate() {
            let (param, param_at) = doc.follow(param, &format!("{at}/parameters/{i}"))?;
            let name = param.get("name").and_then(Value::as_str).unwrap_or_default();
            let location = param.get("in").and_then(Value::as_str).unwrap_or_default();
            let name =
                if location == "header" { name.to_ascii_lowercase() } else { name.to_owned() };
            let key = (name, location.to_owned());
            match index.get(&key) {
                Some(&slot) => merged[slot] = (param, param_at),
                None => {
                    index.insert(key, merged.len());
                    merged.push((param, param_at));
                }
            }
        }
    }
    Ok(merged)
}

/// The JSON Schema of one parameter, with its description.
fn parameter_schema(
    doc: &Document,
    converter: &mut SchemaConverter<'_>,
    param: &Value,
    at: &str,
) -> Result<Value, RestError> {
    let mut schema = if let Some(schema) = param.get("schema") {
        converter.convert(schema, &format!("{at}/schema"))?
    } else if let Some((media, content)) =
        param.get("content").and_then(Value::as_object).and_then(|c| c.iter().next())
    {
        match content.get("schema") {
            Some(schema) => converter
                .convert(schema, &format!("{at}/content/{}/schema", escape_token(media)))?,
            None => json!({}),
        }
    } else if doc.version == Version::Swagger2 {
        // Swagger 2 puts the schema keywords on the parameter itself.
        let keys = [
            "type",
            "format",
            "items",
            "enum",
            "default",
            "maximum",
            "exclusiveMaximum",
            "minimum",
            "exclusiveMinimum",
            "maxLength",
            "minLength",
            "pattern",
            "maxItems",
            "minItems",
            "uniqueItems",
            "multipleOf",
            // Read by the converter as `nullable`.
            "x-nullable",
        ];
        let inline: Map<String, Value> = keys
            .iter()
            .filter_map(|k| param.get(*k).map(|v| ((*k).to_owned(), v.clone())))
            .collect();
        converter.convert(&Value::Object(inline), at)?
    } else {
        json!({})
    };
    let description = param.get("description").and_then(Value::as_str);
    with_description(&mut schema, description);
    Ok(schema)
}

fn with_description(schema: &mut Value, description: Option<&str>) {
    if let Value::Bool(true) = schema {
        *schema = json!({});
    }
    if let (Some(text), Value::Object(map)) = (description, schema)
        && !text.is_empty()
        && !map.contains_key("description")
    {
        map.insert("description".into(), Value::String(text.to_owned()));
    }
}

/// Whether parameter `param` is described by `content` of a JSON media type.
fn json_content(param: &Value) -> bool {
    param
        .get("content")
        .and_then(Value::as_object)
        .and_then(|content| content.keys().next())
        .is_some_and(|media| is_json_media(media))
}

fn parameter_style(doc: &Document, param: &Value, location: Location) -> (Style, bool) {
    if json_content(param) {
        return (Style::Json, false);
    }
    if doc.version == Version::Swagger2 {
        return match param.get("collectionFormat").and_then(Value::as_str) {
            Some("multi") => (Style::Form, true),
            Some("ssv") => (Style::SpaceDelimited, false),
            Some("tsv") => (Style::TabDelimited, false),
            Some("pipes") => (Style::PipeDelimited, false),
            _ if location == Location::Query => (Style::Form, false),
            _ => (Style::Simple, false),
        };
    }
    let style = match param.get("style").and_then(Value::as_str) {
        Some("form") => Style::Form,
        Some("simple") => Style::Simple,
        Some("spaceDelimited") => Style::SpaceDelimited,
        Some("pipeDelimited") => Style::PipeDelimited,
        Some("deepObject") => Style::DeepObject,
        Some("label") => Style::Label,
        Some("matrix") => Style::Matrix,
        _ => match location {
            Location::Query | Location::Cookie => Style::Form,
            _ => Style::Simple,
        },
    };
    let explode = param.get("explode").and_then(Value::as_bool).unwrap_or(style == Style::Form);
    (style, explode)
}

/// The media type chosen for a body: JSON first, then forms, then whatever is first.
fn choose_media(content: &Map<String, Value>) -> Option<(&String, &Value)> {
    content
        .iter()
        .find(|(m, _)| m.contains("json"))
        .or_else(|| {
            content.iter().find(|(m, _)| m.starts_with("application/x-www-form-urlencoded"))
        })
        .or_else(|| content.iter().find(|(m, _)| m.starts_with("multipart/form-data")))
        .or_else(|| content.iter().next())
}

fn encoding_of(media: &str) -> BodyEncoding {
    if media.contains("json") || media == "*/*" {
        BodyEncoding::Json
    } else if media.starts_with("application/x-www-form-urlencoded") {
        BodyEncoding::Form
    } else if media.starts_with("multipart/") {
        BodyEncoding::Multipart
    } else {
        BodyEncoding::Raw
    }
}

/// OpenAPI 3 `requestBody`: flattened into candidates when it is a plain object.
fn request_body(
    doc: &Document,
    converter: &mut SchemaConverter<'_>,
    op: &Value,
    op_at: &str,
    candidates: &mut Vec<Candidate>,
) -> Result<Option<BodySpec>, RestError> {
    let Some(body) = op.get("requestBody") else { return Ok(None) };
    let (body, body_at) = doc.follow(body, &format!("{op_at}/requestBody"))?;
    let Some((media, content)) =
        body.get("content").and_then(Value::as_object).and_then(choose_media)
    else {
        return Ok(None);
    };
    let required = body.get("required") == Some(&Value::Bool(true));
    let encoding = encoding_of(media);
    let content_type = if media == "*/*" { "application/json".to_owned() } else { media.clone() };
    let description = body.get("description").and_then(Value::as_str);
    let schema = match content.get("schema") {
        Some(schema) => converter
            .convert(schema, &format!("{body_at}/content/{}/schema", escape_token(media)))?,
        None if encoding == BodyEncoding::Raw => json!({"type": "string"}),
        None => json!({}),
    };
    let body = BodyShape { required, description, encoding };
    let fields = content.get("encoding").and_then(Value::as_object);
    let open = body_candidates(converter, schema, &body, fields, candidates)?;
    Ok(Some(BodySpec { content_type, encoding, whole: None, required, open }))
}

/// Swagger 2 `in: body` and `in: formData` parameters.
fn swagger_request_body(
    doc: &Document,
    converter: &mut SchemaConverter<'_>,
    op: &Value,
    body: Option<(&Value, String)>,
    form_params: &[(&Value, String)],
    candidates: &mut Vec<Candidate>,
) -> Result<Option<BodySpec>, RestError> {
    let consumes = |root: &Value| -> Vec<String> {
        root.get("consumes")
            .and_then(Value::as_array)
            .map(|c| c.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let mut media = consumes(op);
    if media.is_empty() {
        media = consumes(&doc.root);
    }
    if let Some((param, at)) = body {
        let schema = match param.get("schema") {
            Some(schema) => converter.convert(schema, &format!("{at}/schema"))?,
            None => json!({}),
        };
        let required = param.get("required") == Some(&Value::Bool(true));
        let description = param.get("description").and_then(Value::as_str);
        // JSON when the operation takes it (or says nothing), else what it does take
        // (`application/xml`, `text/plain`): a body sent as JSON to an API that reads XML
        // is refused.
        let content_type = media
            .iter()
            .find(|m| m.contains("json"))
            .or_else(|| media.first())
            .cloned()
            .unwrap_or_else(|| "application/json".into());
        let encoding = encoding_of(&content_type);
        let body = BodyShape { required, description, encoding };
        let open = body_candidates(converter, schema, &body, None, candidates)?;
        return Ok(Some(BodySpec { content_type, encoding, whole: None, required, open }));
    }
    if form_params.is_empty() {
        return Ok(None);
    }
    let any_file =
        form_params.iter().any(|(p, _)| p.get("type").and_then(Value::as_str) == Some("file"));
    let multipart = any_file || media.iter().any(|m| m.starts_with("multipart/form-data"));
    let (content_type, encoding) = if multipart {
        ("multipart/form-data".to_owned(), BodyEncoding::Multipart)
    } else {
        ("application/x-www-form-urlencoded".to_owned(), BodyEncoding::Form)
    };
    for (param, at) in form_params {
        let name = param.get("name").and_then(Value::as_str).unwrap_or_default();
        let schema = parameter_schema(doc, converter, param, at)?;
        let base64 = multipart && param.get("format").and_then(Value::as_str) == Some("byte");
        let binary = base64 || param.get("type").and_then(Value::as_str) == Some("file");
        let (style, explode) = parameter_style(doc, param, Location::Query);
        candidates.push(Candidate {
            field: Field {
                flat: String::new(),
                location: Location::Body,
                name: name.to_owned(),
                style,
                explode,
                allow_reserved: false,
                binary,
                base64,
                content_type: None,
            },
            schema,
            required: param.get("required") == Some(&Value::Bool(true)),
        });
    }
    Ok(Some(BodySpec { content_type, encoding, whole: None, required: false, open: false }))
}

/// What a request body is, besides its schema.
struct BodyShape<'a> {
    required: bool,
    description: Option<&'a str>,
    encoding: BodyEncoding,
}

/// Adds the body's properties as candidates, or one `body` candidate when the body is not
/// a plain object (an array, a scalar, a composition). Returns whether the flattened body
/// takes properties it does not name. `fields` is the media type's `encoding`: how each
/// property of a form goes (`style`, `explode`) and the media type of each multipart part
/// (`contentType`).
fn body_candidates(
    converter: &mut SchemaConverter<'_>,
    schema: Value,
    body: &BodyShape<'_>,
    fields: Option<&Map<String, Value>>,
    candidates: &mut Vec<Candidate>,
) -> Result<bool, RestError> {
    let BodyShape { required, description, encoding } = *body;
    let shape = if encoding == BodyEncoding::Raw {
        None
    } else {
        // A body that is an object or `null` (FastAPI's `Optional[Item] = Body(None)`:
        // `anyOf: [Item, {type: null}]`; OpenAPI 3.0's `nullable: true`) is flattened as
        // the object: leaving every property out sends no body (see `request::build`).
        let object = without_null(&schema);
        object_shape(converter, object.as_ref().unwrap_or(&schema), 0)?
    };
    if let Some(ObjectShape { properties: props, required: required_props, open }) = shape {
        for (name, prop) in props {
            let file = match encoding {
                BodyEncoding::Multipart => file_content(converter, &prop, 0)?,
                _ => FileContent::default(),
            };
            let is_required = required && required_props.contains(&name);
            let declared = fields.and_then(|f| f.get(&name)).and_then(Value::as_object);
            let (style, explode, content_type) =
                field_encoding(converter, &prop, declared, encoding)?;
            // The `encoding`'s media type, else the one the schema says the file holds.
            let content_type = content_type.or(file.media);
            let (binary, base64) = (file.binary, file.base64);
            candidates.push(Candidate {
                field: Field {
                    flat: String::new(),
                    location: Location::Body,
                    name,
                    style,
                    explode,
                    allow_reserved: false,
                    binary,
                    base64,
                    content_type,
                },
                schema: prop,
                required: is_required,
            });
        }
        return Ok(open);
    }
    let mut schema = schema;
    with_description(&mut schema, description.or(Some("The request body.")));
    candidates.push(Candidate {
        field: Field {
            flat: String::new(),
            location: Location::Body,
            // An empty name marks the whole body.
            name: String::new(),
            style: Style::Form,
            explode: true,
            allow_reserved: false,
            binary: false,
            base64: false,
            content_type: None,
        },
        schema,
        required,
    });
    Ok(false)
}

/// What a multipart property says of the file it may be.
#[derive(Debug, Default)]
struct FileContent {
    /// It is a file, sent as a file part.
    binary: bool,
    /// The argument is base64 of the file's bytes, not its content as text.
    base64: bool,
    /// The media type the schema gives its content (`contentMediaType`), for the part.
    media: Option<String>,
}

/// Whether a multipart property is a file, and whether it is given as base64: `format:
/// binary` is a file whose argument is its content as text; `format: byte` (or
/// `base64`, as OpenAPI 3.0's examples write it) and `contentEncoding: base64` (3.1) are
/// files whose argument is base64 of their bytes. A string with a `contentMediaType`
/// (3.1: `image/png`, `application/octet-stream`) is a file of that type, its argument
/// its content as text unless `contentEncoding` says base64, as for `format: binary`. A
/// list of files (`type: array` of such items) is one file part each, as it was one part
/// each of anything else.
fn file_content(
    converter: &mut SchemaConverter<'_>,
    schema: &Value,
    depth: usize,
) -> Result<FileContent, RestError> {
    let resolved;
    let schema = match ref_name(schema) {
        Some(name) => {
            resolved = converter.definition(name)?.cloned().unwrap_or_default();
            &resolved
        }
        None => schema,
    };
    let format = schema.get("format").and_then(Value::as_str);
    let encoded = schema
        .get("contentEncoding")
        .and_then(Value::as_str)
        .is_some_and(|e| e.eq_ignore_ascii_case("base64") || e.eq_ignore_ascii_case("base64url"));
    let base64 = encoded || matches!(format, Some("byte" | "base64"));
    // `contentMediaType` describes strings; an object or an array with one is not a file.
    let string = match schema.get("type") {
        Some(Value::String(kind)) => kind == "string",
        Some(Value::Array(kinds)) => kinds.iter().any(|k| k == "string"),
        _ => true,
    };
    let media = schema
        .get("contentMediaType")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|media| string && !media.is_empty());
    if base64 || format == Some("binary") || media.is_some() {
        // A wildcard (`image/*`) says what is accepted, not what a part is.
        let media = media.filter(|media| !media.contains('*')).map(str::to_owned);
        return Ok(FileContent { binary: true, base64, media });
    }
    match schema.get("items") {
        Some(items) if depth == 0 && items.is_object() => file_content(converter, items, 1),
        _ => Ok(FileContent::default()),
    }
}

/// How one property of a form or multipart body goes, from its `encoding` entry: its
/// style and explode (forms; `form` and exploded by default, as for query parameters) and
/// its part's media type (multipart; the first of a list, none for a wildcard). Without a
/// style, a property that is an object goes as JSON text, the default media type OpenAPI
/// gives an object.
fn field_encoding(
    converter: &mut SchemaConverter<'_>,
    schema: &Value,
    declared: Option<&Map<String, Value>>,
    encoding: BodyEncoding,
) -> Result<(Style, bool, Option<String>), RestError> {
    let said = |key: &str| declared.and_then(|d| d.get(key));
    let content_type = said("contentType")
        .and_then(Value::as_str)
        .and_then(|list| list.split(',').next())
        .map(str::trim)
        .filter(|media| !media.is_empty() && !media.contains('*'))
        .map(str::to_owned);
    let style = said("style").and_then(Value::as_str).map(|style| match style {
        "spaceDelimited" => Style::SpaceDelimited,
        "pipeDelimited" => Style::PipeDelimited,
        "deepObject" => Style::DeepObject,
        _ => Style::Form,
    });
    let explicit_explode = said("explode").and_then(Value::as_bool);
    if encoding == BodyEncoding::Form && (style.is_some() || explicit_explode.is_some()) {
        let style = style.unwrap_or(Style::Form);
        return Ok((style, explicit_explode.unwrap_or(style == Style::Form), content_type));
    }
    let json = match &content_type {
        Some(media) => is_json_media(media),
        None => encoding == BodyEncoding::Form && may_be_object(converter, schema)?,
    };
    let style = if json { Style::Json } else { Style::Form };
    Ok((style, style == Style::Form, content_type))
}

/// Whether a converted schema describes objects, possibly beside `null` (a nullable
/// object of OpenAPI 3.0 is `type: [object, null]` once converted).
fn may_be_object(converter: &mut SchemaConverter<'_>, schema: &Value) -> Result<bool, RestError> {
    if let Some(Value::Array(types)) = schema.get("type") {
        return Ok(types.iter().any(|t| t == "object"));
    }
    if let Some(Value::Array(members)) = schema.get("anyOf") {
        for member in members {
            if is_object(converter, member, 0)? {
                return Ok(true);
            }
        }
    }
    is_object(converter, schema, 0)
}

/// The part of a converted schema that is not `null`, when the schema is a nullable one:
/// `type: [object, null]` (how `nullable: true` converts) becomes `type: object`, and an
/// `anyOf`/`oneOf` of exactly two members, one of them `{type: null}`, with nothing but
/// annotations beside it, becomes the other member. Several non-null members (a truly
/// polymorphic body) are `None`, as is a schema that does not allow `null`.
fn without_null(schema: &Value) -> Option<Value> {
    const ANNOTATIONS: &[&str] = &["title", "description", "default", "examples", "$comment"];
    let map = schema.as_object()?;
    if let Some(Value::Array(types)) = map.get("type") {
        let object_or_null = types.len() == 2
            && types.iter().any(|t| t == "object")
            && types.iter().any(|t| t == "null");
        if !object_or_null {
            return None;
        }
        let mut object = map.clone();
        object.insert("type".into(), json!("object"));
        return Some(Value::Object(object));
    }
    let is_null = |member: &Value| {
        member.as_object().is_some_and(|m| {
            m.get("type").is_some_and(|t| t == "null")
                && m.keys().all(|k| k == "type" || ANNOTATIONS.contains(&k.as_str()))
        })
    };
    let keyword = ["anyOf", "oneOf"].into_iter().find(|k| map.contains_key(*k))?;
    if map.keys().any(|k| k != keyword && !ANNOTATIONS.contains(&k.as_str())) {
        return None;
    }
    match map.get(keyword)?.as_array()?.as_slice() {
        [a, b] if is_null(b) && !is_null(a) => Some(a.clone()),
        [a, b] if is_null(a) && !is_null(b) => Some(b.clone()),
        _ => None,
    }
}

/// What a flattenable body names.
struct ObjectShape {
    properties: Map<String, Value>,
    required: Vec<String>,
    /// It allows properties it does not name, explicitly (JSON Schema allows them when
    /// `additionalProperties` is absent, but OpenAPI documents rarely mean that, and a
    /// misspelled argument is far more likely than an unnamed property).
    open: bool,
}

/// The properties and required names of a plain object schema: `properties` with no
/// `oneOf`/`anyOf`/`not`/`if`, following references, and merging the members of an `allOf`
/// that are themselves plain objects. `None` when the body cannot be flattened.
fn object_shape(
    converter: &mut SchemaConverter<'_>,
    schema: &Value,
    depth: usize,
) -> Result<Option<ObjectShape>, RestError> {
    if depth > 16 {
        return Ok(None);
    }
    if let Some(name) = ref_name(schema) {
        if schema.as_object().is_some_and(|m| m.keys().any(|k| k != "$ref" && k != "description")) {
            return Ok(None);
        }
        let Some(target) = converter.definition(name)?.cloned() else { return Ok(None) };
        return object_shape(converter, &target, depth + 1);
    }
    let Some(map) = schema.as_object() else { return Ok(None) };
    let open = ["oneOf", "anyOf", "not", "if", "$ref"].iter().any(|k| map.contains_key(*k));
    let typed_otherwise = map.get("type").is_some_and(|t| t != "object");
    if open || typed_otherwise {
        return Ok(None);
    }
    let mut props = Map::new();
    let mut required = Vec::new();
    let mut open = map.contains_key("patternProperties")
        || map.get("additionalProperties").is_some_and(|a| a != &Value::Bool(false));
    if let Some(members) = map.get("allOf") {
        let Some(members) = members.as_array() else { return Ok(None) };
        for member in members {
            // A member that allows anything adds nothing (a cut cycle leaves one).
            if member == &Value::Bool(true) || member.as_object().is_some_and(Map::is_empty) {
                continue;
            }
            let Some(shape) = object_shape(converter, member, depth + 1)? else { return Ok(None) };
            props.extend(shape.properties);
            required.extend(shape.required);
            open |= shape.open;
        }
    } else if !map.get("properties").is_some_and(Value::is_object) {
        return Ok(None);
    }
    if let Some(Value::Object(own)) = map.get("properties") {
        props.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    if let Some(Value::Array(names)) = map.get("required") {
        required.extend(names.iter().filter_map(Value::as_str).map(str::to_owned));
    }
    Ok(Some(ObjectShape { properties: props, required, open }))
}

/// An argument name models accept: `[A-Za-z0-9_.-]`, at most 64 characters.
fn argument_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') { c } else { '_' })
        .collect();
    out.truncate(MAX_ARGUMENT_NAME);
    if out.is_empty() { "_".into() } else { out }
}

/// Gives every candidate its flat name: parameters clashing with another candidate get
/// `__{location}`; body fields keep their names.
fn flatten(mut candidates: Vec<Candidate>) -> (Vec<Field>, Map<String, Value>, Vec<String>) {
    let base: Vec<String> =
        candidates
            .iter()
            .map(|c| {
                if c.field.name.is_empty() {
                    "body".to_owned()
                } else {
                    argument_name(&c.field.name)
                }
            })
            .collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for name in &base {
        *counts.entry(name.as_str()).or_default() += 1;
    }
    // The name each wants: its own, or, when two share it, its own with its location
    // (`id__query`) unless it is the body's.
    let wanted: Vec<(String, bool)> = candidates
        .iter()
        .zip(&base)
        .map(|(candidate, name)| {
            let clashes = counts.get(name.as_str()).copied().unwrap_or(0) > 1;
            if clashes && candidate.field.location != Location::Body {
                let suffix = format!("__{}", candidate.field.location.as_str());
                let kept = &name[..name.len().min(MAX_ARGUMENT_NAME - suffix.len())];
                (format!("{kept}{suffix}"), true)
            } else {
                (name.clone(), false)
            }
        })
        .collect();
    // Own names are given first, so that a parameter really named `id__query` keeps its
    // name and the query's `id` is numbered, not the other way round; a name taken
    // already (two that differ only in characters models cannot use) gets `_2`, `_3`…
    let mut taken: HashSet<String> = HashSet::new();
    let mut flats = vec![String::new(); wanted.len()];
    for renamed_pass in [false, true] {
        for (i, (name, renamed)) in wanted.iter().enumerate() {
            if *renamed != renamed_pass {
                continue;
            }
            let mut flat = name.clone();
            let mut n = 1;
            while !taken.insert(flat.clone()) {
                n += 1;
                let suffix = format!("_{n}");
                flat = name.clone();
                flat.truncate(MAX_ARGUMENT_NAME - suffix.len());
                flat.push_str(&suffix);
            }
            flats[i] = flat;
        }
    }
    let mut properties = Map::new();
    let mut required = Vec::new();
    let mut fields = Vec::with_capacity(candidates.len());
    for (candidate, flat) in candidates.iter_mut().zip(flats) {
        candidate.field.flat = flat.clone();
        if candidate.required {
            required.push(flat.clone());
        }
        properties.insert(flat, std::mem::take(&mut candidate.schema));
        fields.push(candidate.field.clone());
    }
    (fields, properties, required)
}

fn tool_name(
    op: &Value,
    method: &str,
    path: &str,
    operation_id: Option<&str>,
    config: &OpenApiConfig,
) -> String {
    let route = format!("{} {path}", method.to_ascii_uppercase());
    let configured =
        operation_id.and_then(|id| config.rename.get(id)).or_else(|| config.rename.get(&route));
    if let Some(name) = configured {
        return names::sanitize(name);
    }
    let extension = op
        .get("x-mcp-name")
        .and_then(Value::as_str)
        .or_else(|| op.pointer("/x-speakeasy-mcp/name").and_then(Value::as_str));
    if let Some(name) = extension.filter(|n| !n.is_empty()) {
        return names::sanitize(name);
    }
    operation_id
        .map(names::snake_case)
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| names::from_method_and_path(method, path))
}

fn description(op: &Value, method: &str, path: &str) -> String {
    let summary = op.get("summary").and_then(Value::as_str).map(str::trim).unwrap_or_default();
    let details = op.get("description").and_then(Value::as_str).map(str::trim).unwrap_or_default();
    let mut text = match (summary.is_empty(), details.is_empty()) {
        (false, false) if details.starts_with(summary) => details.to_owned(),
        (false, false) => format!("{summary}\n\n{details}"),
        (false, true) => summary.to_owned(),
        (true, false) => details.to_owned(),
        (true, true) => format!("{} {path}", method.to_ascii_uppercase()),
    };
    if text.len() > MAX_DESCRIPTION {
        let mut cut = MAX_DESCRIPTION;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

fn annotations(method: &str) -> ToolAnnotations {
    let read_only = matches!(method, "get" | "head" | "options" | "trace" | "query");
    ToolAnnotations {
        read_only,
        destructive: method == "delete",
        idempotent: read_only || matches!(method, "put" | "delete"),
        open_world: true,
        permission: Some(PermissionClass::Network),
        ..ToolAnnotations::default()
    }
}

/// The base URL of an operation, from the configuration, its servers or the document's:
/// `places` are the operation, its path item and the document root with their pointers.
fn server_url(
    doc: &Document,
    places: [(&Value, &str); 3],
    config: &OpenApiConfig,
) -> Result<Option<String>, RestError> {
    if let Some(base) = &config.base_url {
        return Ok(Some(base.trim_end_matches('/').to_owned()));
    }
    let url = if doc.version == Version::Swagger2 {
        let host = doc.root.get("host").and_then(Value::as_str);
        let base_path = doc.root.get("basePath").and_then(Value::as_str).unwrap_or("");
        // Swagger 2.0: without `schemes`, the scheme the document was read with (a
        // document read over `http` describes an API served over `http`); `https` for a
        // document from a file or given as text.
        let document_scheme = doc
            .source_url
            .as_deref()
            .and_then(|url| reqwest::Url::parse(url).ok())
            .map(|url| url.scheme().to_owned())
            .filter(|scheme| scheme == "http" || scheme == "https");
        let scheme = doc
            .root
            .get("schemes")
            .and_then(Value::as_array)
            .and_then(|s| {
                s.iter()
                    .filter_map(Value::as_str)
                    .find(|s| *s == "https")
                    .or_else(|| s.first()?.as_str())
            })
            .or(document_scheme.as_deref())
            .unwrap_or("https");
        match host {
            Some(host) => format!("{scheme}://{host}{base_path}"),
            None => base_path.to_owned(),
        }
    } else {
        // Without `servers`, OpenAPI's default server is `/`.
        let first = places.iter().find_map(|(v, at)| {
            let server = v.get("servers").and_then(Value::as_array)?.first()?;
            Some((server, format!("{at}/servers/0")))
        });
        match first {
            Some((server, at)) => expand_server(doc, server, &at, &config.server_variables)?,
            None => String::new(),
        }
    };
    Ok(Some(absolute(doc, url.trim_end_matches('/'))))
}

/// A server URL with its variables filled from `overrides` (`serverVariables`) or their
/// defaults; a value outside the variable's `enum`, or a variable with neither, is an error.
fn expand_server(
    doc: &Document,
    server: &Value,
    at: &str,
    overrides: &BTreeMap<String, String>,
) -> Result<String, RestError> {
    let mut url = server.get("url").and_then(Value::as_str).unwrap_or_default().to_owned();
    let empty = Map::new();
    let variables = server.get("variables").and_then(Value::as_object).unwrap_or(&empty);
    // A `{placeholder}` the document declares no variable for takes its value from
    // `serverVariables`; without one it would be sent as `%7Bname%7D`.
    let placeholders: Vec<String> =
        path_placeholders(&url).into_iter().map(str::to_owned).collect();
    for name in &placeholders {
        if variables.contains_key(name) {
            continue;
        }
        let Some(value) = overrides.get(name) else {
            return Err(doc.error(
                &format!("{at}/url"),
                format!(
                    "server URL `{url}` has `{{{name}}}`, which its `variables` do not declare: \
                     set `serverVariables.{name}` (or `baseUrl`) in the import's configuration"
                ),
            ));
        };
        url = url.replace(&format!("{{{name}}}"), value);
    }
    for (name, variable) in variables {
        let var_at = format!("{at}/variables/{}", escape_token(name));
        let overridden = overrides.get(name).map(String::as_str);
        let Some(value) = overridden.or_else(|| variable.get("default").and_then(Value::as_str))
        else {
            return Err(doc.error(
                &var_at,
                format!(
                    "server variable `{name}` has no `default`: set `serverVariables.{name}` in \
                     the import's configuration"
                ),
            ));
        };
        let allowed: Vec<&str> = variable
            .get("enum")
            .and_then(Value::as_array)
            .map(|values| values.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if !allowed.is_empty() && !allowed.contains(&value) {
            let list: Vec<String> = allowed.iter().map(|v| format!("`{v}`")).collect();
            let (source, fix) = match overridden {
                Some(_) => (format!("`serverVariables.{name}`"), "set it".to_owned()),
                None => ("its `default`".to_owned(), format!("set `serverVariables.{name}`")),
            };
            return Err(doc.error(
                &format!("{var_at}/enum"),
                format!(
                    "server variable `{name}` cannot be `{value}` (from {source}): its `enum` \
                     allows {}; {fix} to one of them",
                    list.join(", ")
                ),
            ));
        }
        url = url.replace(&format!("{{{name}}}"), value);
    }
    Ok(url)
}

/// Resolves a relative server URL against the URL the document came from (OpenAPI's rule
/// for the Server Object's own URL).
fn absolute(doc: &Document, url: &str) -> String {
    if url.contains("://") {
        return url.to_owned();
    }
    let Some(source) = doc.source_url.as_deref().and_then(|s| reqwest::Url::parse(s).ok()) else {
        return url.to_owned();
    };
    let joined = if url.is_empty() { source.join("/") } else { source.join(url) };
    joined.map_or_else(|_| url.to_owned(), |u| u.as_str().trim_end_matches('/').to_owned())
}

fn security_requirements(doc: &Document, op: &Value) -> Vec<Vec<String>> {
    let list = op.get("security").or_else(|| doc.root.get("security"));
    list.and_then(Value::as_array)
        .map(|alternatives| {
            alternatives
                .iter()
                .filter_map(Value::as_object)
                .map(|req| req.keys().cloned().collect())
                .collect()
        })
        .unwrap_or_default()
}

/// The names of the `{placeholders}` of `path`, in order.
fn path_placeholders(path: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else { break };
        let name = &after[..close];
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
        rest = &after[close + 1..];
    }
    names
}

/// The scopes each scheme's requirements name (an OAuth2 scheme's), over every
/// alternative, in order and without repeats.
fn requirement_scopes(doc: &Document, op: &Value) -> BTreeMap<String, Vec<String>> {
    let list = op.get("security").or_else(|| doc.root.get("security"));
    let mut scopes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for requirement in list.and_then(Value::as_array).into_iter().flatten() {
        for (scheme, named) in requirement.as_object().into_iter().flatten() {
            for scope in named.as_array().into_iter().flatten().filter_map(Value::as_str) {
                let of_scheme = scopes.entry(scheme.clone()).or_default();
                if !of_scheme.iter().any(|s| s == scope) {
                    of_scheme.push(scope.to_owned());
                }
            }
        }
    }
    scopes
}

/// `url` (a security scheme's `tokenUrl`) made absolute: OpenAPI resolves a relative URL
/// in a security scheme against the API's server (the configured `baseUrl`, else the
/// document's first server), never against where the document was read from, which may be
/// a documentation host that must not see the client's secret. The server is taken as a
/// folder (`token` beside `https://h/v1` is `https://h/v1/token`). Without an absolute
/// server the URL stays relative, and a token request says how to give one.
fn token_url(url: &str, server: Option<&str>) -> String {
    if url.contains("://") {
        return url.to_owned();
    }
    let Some(server) = server.and_then(|s| reqwest::Url::parse(&format!("{s}/")).ok()) else {
        return url.to_owned();
    };
    server.join(url).map_or_else(|_| url.to_owned(), |u| u.as_str().to_owned())
}

fn security_schemes(
    doc: &Document,
    config: &OpenApiConfig,
    warnings: &mut Vec<String>,
) -> BTreeMap<String, SecurityScheme> {
    // The server relative token URLs resolve against: the document's own (a broken one is
    // reported by the operations using it), with the configured `baseUrl` first.
    let root = [(&doc.root, ""), (&doc.root, ""), (&doc.root, "")];
    let server = server_url(doc, root, config).ok().flatten().filter(|s| s.contains("://"));
    let schemes = if doc.version == Version::Swagger2 {
        doc.root.get("securityDefinitions")
    } else {
        doc.root.pointer("/components/securitySchemes")
    };
    let mut out = BTreeMap::new();
    let Some(schemes) = schemes.and_then(Value::as_object) else { return out };
    for (name, scheme) in schemes {
        let Ok((scheme, _)) = doc.follow(scheme, "") else { continue };
        let kind = scheme.get("type").and_then(Value::as_str).unwrap_or_default();
        let mapped = match kind {
            "apiKey" => {
                let location = match scheme.get("in").and_then(Value::as_str) {
                    Some("query") => Location::Query,
                    Some("cookie") => Location::Cookie,
                    _ => Location::Header,
                };
                let key = scheme.get("name").and_then(Value::as_str).unwrap_or_default();
                SecurityScheme::ApiKey { name: key.to_owned(), location }
            }
            "basic" => SecurityScheme::Basic,
            "http" => match scheme
                .get("scheme")
                .and_then(Value::as_str)
                .map(str::to_ascii_lowercase)
                .as_deref()
            {
                Some("bearer") => SecurityScheme::Bearer,
                Some("basic") => SecurityScheme::Basic,
                other => {
                    SecurityScheme::Unsupported { kind: format!("http {}", other.unwrap_or("?")) }
                }
            },
            "oauth2" => {
                let flow = scheme.pointer("/flows/clientCredentials").or_else(|| {
                    (scheme.get("flow").and_then(Value::as_str) == Some("application"))
                        .then_some(scheme)
                });
                match flow {
                    Some(flow) => SecurityScheme::ClientCredentials {
                        token_url: flow
                            .get("tokenUrl")
                            .and_then(Value::as_str)
                            .map(|u| token_url(u, server.as_deref())),
                        scopes: Vec::new(),
                    },
                    None => SecurityScheme::Unsupported {
                        kind: "oauth2 without client credentials".into(),
                    },
                }
            }
            other => SecurityScheme::Unsupported { kind: other.to_owned() },
        };
        if let SecurityScheme::Unsupported { kind } = &mapped {
            warnings.push(format!(
                "{}: security scheme `{name}` ({kind}) cannot be applied by toolmux; \
                 operations needing it are sent without it unless another scheme fits",
                doc.source_name
            ));
        }
        out.insert(name.clone(), mapped);
    }
    out
}
