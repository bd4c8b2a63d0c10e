//! Integration tests of the REST, OpenAPI and web tools, one module per subject, in one
//! test binary (each binary links the HTTP client and TLS stack, so one links faster than
//! many).

// Helpers outside `#[test]` functions panic on purpose too: a panic is the failure report.
#![allow(clippy::unwrap_used)]

mod auth_and_streams;
mod common;
mod external_refs;
mod fastapi_bodies;
mod httpbinx;
mod import_rules;
mod openapi_32;
mod output_schemas;
mod real_specs;
mod request_bodies;
mod request_safety;
mod response_charsets;
mod web;
