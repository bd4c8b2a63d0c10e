//! toolmux-rest turns HTTP APIs into tools: inline tools described in configuration
//! (`restTools`) and every operation of an OpenAPI document (`openapi`), Swagger 2.0,
//! OpenAPI 3.0, 3.1 or 3.2, read from a file or a URL.
//!
//! It is for programs that give models access to REST APIs through toolmux: the facade
//! builds one [`RestProvider`] for the inline tools (namespace `rest`) and one per imported
//! document (namespace = the import's name), and hands them to the orchestrator.
//!
//! Imported operations get one flat input schema each (path, query, header and cookie
//! parameters and the body's properties side by side; clashes renamed `{name}__{location}`),
//! JSON Schema 2020-12 with `$defs` pruned to what the operation reaches, and names that fit
//! the 64-character budget after the namespace. An operation whose success responses all
//! document JSON gets an output schema from them (an object schema, other bodies wrapped as
//! `{"result": …}`), and its successful calls return the body as structured content,
//! checked against it ([`OpenApiConfig::output_schemas`]).
//!
//! # Configuration
//!
//! [`RestToolConfig`] and [`OpenApiConfig`] are the values of `restTools.<name>` and
//! `openapi.<name>` in toolmux's configuration file. Whoever loads that file expands
//! `${VAR}` and `${VAR:-default}` from the environment first and must leave every
//! `${parameters.…}` placeholder alone: those are filled per call, from the arguments,
//! URL-encoded for their position (a path segment or a query component), verbatim in
//! headers, and as JSON values in a body template. Credentials (`auth`) arrive expanded and
//! are never logged or put into error messages. The loader hands the values it took from the
//! environment to [`RestProvider::with_secrets`] (and [`OpenApiImport::with_secrets`]):
//! they are kept out of everything a provider shows (errors, error results, a redirect's
//! target, `Debug`) wherever they stand, a URL's path included. With or without them it
//! redacts the configured query, user info, fragment and header values, and the pieces of a
//! configured path that look like credentials (16 characters or more, letters and digits:
//! the bot token of `https://api.example/bot${TOKEN}/sendMessage`). The OAuth2 tokens it
//! fetches are secrets no configuration names, so it redacts them itself from everything
//! it returns, successful answers included. Relative `spec` paths
//! are resolved against [`OpenApiConfig::base_dir`], which the loader sets to the
//! configuration file's folder.
//!
//! # What a call cannot do
//!
//! A path argument never leaves its segment (`/`, `?`, `#` are encoded) and one that would
//! make a `.` or `..` segment is refused. Redirects are followed only within the request's
//! origin (scheme, host and port): the 3xx of a redirect to another origin is the result,
//! so credentials in headers never reach another host. An imported operation refuses
//! arguments that no parameter or body property takes, naming the closest valid one.
//!
//! # Example
//!
//! ```
//! use toolmux_core::ToolProvider;
//! use toolmux_rest::{OpenApiConfig, RestProvider};
//!
//! let document = r#"
//! openapi: 3.0.3
//! info: {title: Pets, version: "1"}
//! servers: [{url: "https://pets.example/v1"}]
//! paths:
//!   /pets/{petId}:
//!     get:
//!       operationId: showPetById
//!       summary: Info for a specific pet
//!       parameters:
//!         - {name: petId, in: path, required: true, schema: {type: string}}
//!         - {name: petId, in: query, schema: {type: integer, nullable: true}}
//!       responses: {"200": {description: A pet}}
//! "#;
//! let pets = RestProvider::openapi_from_text("pets", document, "pets.yaml", &OpenApiConfig::default())
//!     .unwrap();
//! assert_eq!(pets.namespace(), "pets");
//! let tools = pets.specs();
//! assert_eq!(tools[0].name, "show_pet_by_id");
//! let properties = &tools[0].input_schema["properties"];
//! assert_eq!(properties["petId__path"]["type"], "string");
//! assert_eq!(properties["petId__query"]["type"], serde_json::json!(["integer", "null"]));
//! ```
#![deny(missing_docs)]

mod auth;
mod config;
mod error;
mod http;
mod integers;
mod later;
mod names;
mod openapi;
mod output;
mod provider;
mod request;
mod secrets;
mod template;
mod web;

pub use config::{
    Credentials, DEFAULT_MAX_REDIRECTS, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_MAX_TOOLS,
    DEFAULT_TIMEOUT_MS, OpenApiConfig, RestToolConfig, Selector, TokenAuthMethod,
};
pub use error::RestError;
pub use later::OpenApiImport;
pub use provider::{INLINE_NAMESPACE, RestProvider};
pub use web::{FetchConfig, SearchConfig, SearchProvider, WEB_NAMESPACE, WebConfig, WebProvider};
