//! OpenAPI import: a document (Swagger 2.0, OpenAPI 3.0, 3.1 or 3.2) becomes one tool per
//! selected operation, each with one flat input schema and a map telling where every
//! argument goes.

mod document;
mod external;
mod operation;
mod schema;
mod select;

pub(crate) use document::Document;
pub(crate) use external::{Origin, bundle, bundle_text};
pub(crate) use operation::import;

use serde_json::Value;
use toolmux_core::ToolAnnotations;

/// The HTTP methods an OpenAPI path item may hold as fields, in the order tools are listed
/// (`query` since 3.2; other methods are under the item's `additionalOperations`).
pub(crate) const METHODS: &[&str] =
    &["get", "put", "post", "delete", "options", "head", "patch", "trace", "query"];

/// Where one argument goes in the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Location {
    Path,
    Query,
    Header,
    Cookie,
    /// A property of the request body (JSON object, form or multipart field).
    Body,
}

impl Location {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Location::Path => "path",
            Location::Query => "query",
            Location::Header => "header",
            Location::Cookie => "cookie",
            Location::Body => "body",
        }
    }
}

/// How a parameter's array or object value is written (OpenAPI `style`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    Form,
    Simple,
    SpaceDelimited,
    PipeDelimited,
    TabDelimited,
    DeepObject,
    Label,
    Matrix,
    /// A parameter described by `content` with a JSON media type: its value sent as JSON
    /// text (`filter={"a":1}`, escaped where it goes), not spread into pairs.
    Json,
    /// An OpenAPI 3.2 `querystring` parameter: its value is the whole query string, its
    /// name never sent. An object is written as `application/x-www-form-urlencoded`
    /// pairs (`color=red&size=2`); with a JSON media type (`json`) the value is its JSON
    /// text, escaped; any other value (a `text/plain` string) is its text, escaped.
    QueryString {
        json: bool,
    },
}

/// One flat argument and where it goes.
#[derive(Debug, Clone)]
pub(crate) struct Field {
    /// The argument's name in the tool's input schema.
    pub(crate) flat: String,
    pub(crate) location: Location,
    /// The name in the request (parameter or body property).
    pub(crate) name: String,
    pub(crate) style: Style,
    pub(crate) explode: bool,
    /// A query parameter's `allowReserved`: its values keep RFC 3986's reserved
    /// characters (`/`, `:`, `?`…) unencoded where they cannot change the query's shape.
    pub(crate) allow_reserved: bool,
    /// A multipart field sent as a file (one part each, for a list of files).
    pub(crate) binary: bool,
    /// A multipart file given as base64 (`format: byte`, `contentEncoding: base64`),
    /// decoded into the part's bytes; `binary` too.
    pub(crate) base64: bool,
    /// The media type of a multipart body's part for this field, from the body's
    /// `encoding` (`image/png`), else from the schema's `contentMediaType`; without one, an
    /// object goes as `application/json`, a file as `application/octet-stream` and
    /// anything else as plain text.
    pub(crate) content_type: Option<String>,
}

/// How the request body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyEncoding {
    Json,
    Form,
    Multipart,
    /// Sent as it is (text, octet stream).
    Raw,
}

/// The request body of an operation.
#[derive(Debug, Clone)]
pub(crate) struct BodySpec {
    pub(crate) content_type: String,
    pub(crate) encoding: BodyEncoding,
    /// The argument holding the whole body, when the body is not flattened.
    pub(crate) whole: Option<String>,
    /// The document requires a body (`requestBody.required`, Swagger 2's `in: body`
    /// parameter's `required`): a flattened JSON body goes as `{}` when no property is
    /// given, where an optional one is left out.
    pub(crate) required: bool,
    /// The flattened body's schema allows properties it does not name (`additionalProperties`
    /// set to `true` or a schema, or `patternProperties`): arguments no parameter or
    /// property takes go into the body instead of being refused.
    pub(crate) open: bool,
}

/// The output schema of an operation, derived from its success responses (see
/// `operation::output_schema` for the rule).
#[derive(Debug, Clone)]
pub(crate) struct OutputSchema {
    /// An object schema (`type: object` at the top, as MCP requires), with its `$defs`.
    pub(crate) schema: Value,
    /// The response body is the `result` property of `schema`, not the whole of it: the
    /// documented body is not always an object (an array, a scalar, a nullable object).
    pub(crate) wrapped: bool,
    /// The `Accept` header asking for the media types the schema describes.
    pub(crate) accept: String,
}

/// One imported operation, ready to be listed and called.
#[derive(Debug, Clone)]
pub(crate) struct Operation {
    pub(crate) name: String,
    /// The operation's `summary`, when it has one.
    pub(crate) title: Option<String>,
    pub(crate) description: String,
    /// Upper-case HTTP method.
    pub(crate) method: String,
    /// The path template (`/pets/{petId}`).
    pub(crate) path: String,
    /// The base URL of this operation's server, when the document names one.
    pub(crate) server: Option<String>,
    pub(crate) input_schema: Value,
    pub(crate) fields: Vec<Field>,
    pub(crate) body: Option<BodySpec>,
    /// Alternative sets of security schemes; the first whose credentials are all
    /// configured is used. Empty: no security.
    pub(crate) security: Vec<Vec<String>>,
    /// The scopes the operation's requirements ask of each OAuth2 scheme (all of its
    /// alternatives' together), requested with its token unless `auth` sets `scopes`.
    pub(crate) scopes: std::collections::BTreeMap<String, Vec<String>>,
    pub(crate) annotations: ToolAnnotations,
    /// The output schema; `None` when the success responses do not say what JSON they
    /// hold, or the import's `outputSchemas` is `false`.
    pub(crate) output: Option<OutputSchema>,
    /// It declares an `Authorization` header parameter, which OpenAPI has clients ignore
    /// (no argument: the credentials are the configuration's).
    pub(crate) declares_authorization: bool,
}

/// A security scheme of the document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SecurityScheme {
    ApiKey {
        name: String,
        location: Location,
    },
    Bearer,
    Basic,
    ClientCredentials {
        token_url: Option<String>,
        scopes: Vec<String>,
    },
    /// A scheme toolmux cannot apply (OpenID Connect, OAuth2 flows needing a person).
    Unsupported {
        kind: String,
    },
}

/// The result of an import: operations, the document's security schemes with the
/// configured credentials, and warnings.
#[derive(Debug)]
pub(crate) struct Imported {
    pub(crate) operations: Vec<Operation>,
    pub(crate) auth: crate::auth::Auth,
    pub(crate) warnings: Vec<String>,
}
