//! The mapping rules of the OpenAPI import, one small document each.
#![allow(clippy::unwrap_used)]

use crate::common;
use expect_test::{Expect, expect};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use toolmux_core::{CallContext, ToolProvider};
use toolmux_rest::{OpenApiConfig, RestProvider};

fn import(doc: Value, config: &OpenApiConfig) -> RestProvider {
    RestProvider::openapi_from_value("api", doc, "api.json", config).unwrap()
}

/// Renders every tool as `name: schema`.
fn check(doc: Value, config: &OpenApiConfig, expected: Expect) {
    let provider = import(doc, config);
    let text: Vec<String> = provider
        .specs()
        .iter()
        .map(|t| format!("{}: {}", t.name, serde_json::to_string(&t.input_schema).unwrap()))
        .collect();
    expected.assert_eq(&text.join("\n"));
}

fn check_error(doc: Value, expected: Expect) {
    let err = RestProvider::openapi_from_value("api", doc, "api.json", &OpenApiConfig::default())
        .unwrap_err();
    expected.assert_eq(&err.to_string());
}

fn v3(paths: Value) -> Value {
    json!({"openapi": "3.0.3", "info": {"title": "t", "version": "1"}, "paths": paths,
           "components": {"schemas": {
               "Pet": {"type": "object", "required": ["name"], "properties": {
                   "name": {"type": "string"}, "id": {"type": "integer"},
                   "parent": {"$ref": "#/components/schemas/Pet"}}}}}})
}

#[test]
fn clashes_between_locations_get_suffixes() {
    check(
        v3(json!({"/pets/{id}": {"put": {
            "operationId": "updatePet",
            "parameters": [
                {"name": "id", "in": "path", "required": true, "schema": {"type": "integer"}},
                {"name": "id", "in": "query", "schema": {"type": "string"}},
                {"name": "name", "in": "header", "schema": {"type": "string"}},
                {"name": "page[size]", "in": "query", "schema": {"type": "integer"}}],
            "requestBody": {"required": true, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Pet"}}}}}}})),
        &OpenApiConfig::default(),
        expect![[
            r##"update_pet: {"$defs":{"Pet":{"properties":{"id":{"type":"integer"},"name":{"type":"string"},"parent":{"$ref":"#/$defs/Pet"}},"required":["name"],"type":"object"}},"additionalProperties":false,"properties":{"id":{"type":"integer"},"id__path":{"type":"integer"},"id__query":{"type":"string"},"name":{"type":"string"},"name__header":{"type":"string"},"page_size_":{"type":"integer"},"parent":{"$ref":"#/$defs/Pet"}},"required":["id__path","name"],"type":"object"}"##
        ]],
    );
}

#[test]
fn non_object_bodies_become_one_body_argument() {
    check(
        v3(json!({"/pets": {"post": {
            "requestBody": {"content": {"application/json": {
                "schema": {"type": "array", "items": {"$ref": "#/components/schemas/Pet"}}}}}},
            "put": {"requestBody": {"required": true, "content": {"text/plain": {}}}}}})),
        &OpenApiConfig::default(),
        expect![[r##"
            put_pets: {"additionalProperties":false,"properties":{"body":{"description":"The request body.","type":"string"}},"required":["body"],"type":"object"}
            post_pets: {"$defs":{"Pet":{"properties":{"id":{"type":"integer"},"name":{"type":"string"},"parent":{"$ref":"#/$defs/Pet"}},"required":["name"],"type":"object"}},"additionalProperties":false,"properties":{"body":{"description":"The request body.","items":{"$ref":"#/$defs/Pet"},"type":"array"}},"type":"object"}"##]],
    );
}

#[test]
fn read_only_body_properties_are_not_arguments() {
    let mut doc = v3(json!({
        "/users": {"post": {"operationId": "createUser", "requestBody": {"required": true,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/User"}}}}}},
        "/users/{uid}": {"put": {"operationId": "replaceUser",
            "parameters": [{"name": "uid", "in": "path", "required": true, "schema": {"type": "string"}}],
            "requestBody": {"required": true, "content": {"application/json": {"schema": {
                "type": "object", "required": ["id", "email"], "properties": {
                    "id": {"$ref": "#/components/schemas/Id"},
                    "email": {"type": "string"},
                    "owner": {"$ref": "#/components/schemas/User"}}}}}}}}}));
    doc["components"]["schemas"]["Id"] = json!({"type": "string", "readOnly": true});
    doc["components"]["schemas"]["User"] = json!({"type": "object",
        "required": ["id", "name", "password"], "properties": {
            "id": {"type": "integer", "readOnly": true},
            "name": {"type": "string"},
            "password": {"type": "string", "writeOnly": true},
            "createdAt": {"type": "string", "format": "date-time", "readOnly": true}}});
    check(
        doc,
        &OpenApiConfig::default(),
        expect![[r##"
            create_user: {"additionalProperties":false,"properties":{"name":{"type":"string"},"password":{"type":"string","writeOnly":true}},"required":["name","password"],"type":"object"}
            replace_user: {"$defs":{"User":{"properties":{"name":{"type":"string"},"password":{"type":"string","writeOnly":true}},"required":["name","password"],"type":"object"}},"additionalProperties":false,"properties":{"email":{"type":"string"},"owner":{"$ref":"#/$defs/User"},"uid":{"type":"string"}},"required":["uid","email"],"type":"object"}"##]],
    );
}

#[test]
fn names_rename_and_extensions() {
    let doc = v3(json!({
        "/a": {"get": {"operationId": "listThings", "x-mcp-name": "things"},
               "post": {"operationId": "makeThing"}},
        "/b/{id}": {"get": {"parameters": [{"name": "id", "in": "path", "required": true}]},
                    "delete": {"operationId": "zapB", "x-mcp": false}},
        "/c": {"get": {"operationId": "x".repeat(80)}, "post": {"operationId": "oldThing", "deprecated": true}}}));
    let config = OpenApiConfig {
        rename: BTreeMap::from([("makeThing".to_owned(), "create".to_owned())]),
        ..OpenApiConfig::default()
    };
    let provider = import(doc, &config);
    let names: Vec<String> = provider.specs().into_iter().map(|t| t.name).collect();
    expect![[r#"["things", "create", "get_b_by_id", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx_93a87c2f"]"#]]
        .assert_eq(&format!("{names:?}"));
}

#[test]
fn swagger_two_form_data_and_body() {
    check(
        json!({"swagger": "2.0", "host": "h.example", "basePath": "/v2", "paths": {
            "/pet/{petId}/upload": {"post": {"operationId": "uploadFile",
                "consumes": ["multipart/form-data"],
                "parameters": [
                    {"name": "petId", "in": "path", "required": true, "type": "integer", "format": "int64"},
                    {"name": "file", "in": "formData", "type": "file"},
                    {"name": "tags", "in": "query", "type": "array", "items": {"type": "string"}, "collectionFormat": "multi"}]}},
            "/pet": {"post": {"operationId": "addPet", "parameters": [
                {"in": "body", "name": "body", "required": true, "schema": {"$ref": "#/definitions/Pet"}}]}}},
            "definitions": {"Pet": {"type": "object", "properties": {
                "name": {"type": "string", "x-nullable": true, "example": "Rex"},
                "age": {"type": "integer", "minimum": 0, "exclusiveMinimum": true}}}}}),
        &OpenApiConfig::default(),
        expect![[r#"
            add_pet: {"additionalProperties":false,"properties":{"age":{"exclusiveMinimum":0,"type":"integer"},"name":{"examples":["Rex"],"type":["string","null"]}},"type":"object"}
            upload_file: {"additionalProperties":false,"properties":{"file":{"format":"binary","type":"string"},"petId":{"format":"int64","type":"integer"},"tags":{"items":{"type":"string"},"type":"array"}},"required":["petId"],"type":"object"}"#]],
    );
}

#[test]
fn broken_operations_are_left_out_with_warnings_naming_the_place() {
    let mut doc = v3(json!({
        "/a": {"get": {"parameters": [{"$ref": "#/components/parameters/nope"}]}},
        "/b": {"post": {"operationId": "postB", "requestBody": {"content": {"application/json": {
            "schema": {"properties": {"x": {"$ref": "#/components/schemas/Gone"}}}}}}}},
        "/c": {"get": {"parameters": [{"$ref": "other.yaml#/components/parameters/q"}]}},
        "/d": {"$ref": "#/paths/~1missing"},
        "/e": {"get": "not an operation"},
        "/f": {"put": {"operationId": "putF", "requestBody": {"content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/Broken"}}}}}},
        "/pets": {"post": {"operationId": "addPet", "requestBody": {"content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/Pet"}}}}}}}));
    doc["components"]["schemas"]["Broken"] =
        json!({"type": "object", "properties": {"y": {"$ref": "#/components/schemas/Nope"}}});
    let provider = import(doc, &OpenApiConfig::default());
    let names: Vec<String> = provider.specs().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["add_pet"]);
    expect![[r#"
        api.json: at /paths/~1a/get/parameters/0/$ref: dangling reference `#/components/parameters/nope`; operation `GET /a` is left out
        api.json: at /paths/~1b/post/requestBody/content/application~1json/schema/properties/x/$ref: dangling reference `#/components/schemas/Gone`; operation `POST /b` (`postB`) is left out
        api.json: at /paths/~1c/get/parameters/0/$ref: external reference `other.yaml#/components/parameters/q` is not followed: the document was given as text, so it has no folder to look the file up in; give the document as a file (`spec`) instead, or name the folders of its files in the import's `refDirs`; operation `GET /c` is left out
        api.json: at /paths/~1d/$ref: dangling reference `#/paths/~1missing`; the operations of path `/d` are left out
        api.json: at /paths/~1e/get: operation is not an object; operation `GET /e` is left out
        api.json: at /components/schemas/Broken/properties/y/$ref: dangling reference `#/components/schemas/Nope`; operation `PUT /f` (`putF`) is left out
        api.json: 1 operation (`add_pet`) has no absolute server URL (the document's `servers` are missing or relative, and it was not read from a URL): set `baseUrl` in the import, or calls fail"#]]
    .assert_eq(&provider.warnings().join("\n"));
}

#[test]
fn bad_documents_name_the_place() {
    // Only a document with no usable operation is an error: the first broken place.
    check_error(
        v3(json!({"/a": {"get": {"parameters": [{"$ref": "#/components/parameters/nope"}]}}})),
        expect![
            "api.json: at /paths/~1a/get/parameters/0/$ref: dangling reference `#/components/parameters/nope`"
        ],
    );
    check_error(
        v3(
            json!({"/a": {"get": {"responses": {}, "requestBody": {"content": {"application/json": {
            "schema": {"properties": {"x": {"$ref": "#/components/schemas/Gone"}}}}}}}}}),
        ),
        expect![
            "api.json: at /paths/~1a/get/requestBody/content/application~1json/schema/properties/x/$ref: dangling reference `#/components/schemas/Gone`"
        ],
    );
    check_error(
        json!({"openapi": "4.0.0", "paths": {}}),
        expect![
            "api.json: at /openapi: unsupported OpenAPI version `4.0.0` (supported: 2.0, 3.0.x, 3.1.x, 3.2.x)"
        ],
    );
    check_error(
        v3(json!({"/a": {"get": {"parameters": [{"name": "q", "in": "body2"}]}}})),
        expect![[
            r#"api.json: at /paths/~1a/get/parameters/0/in: unknown parameter location `body2`"#
        ]],
    );
}

#[test]
fn invalid_yaml_names_line_and_column() {
    let err = RestProvider::openapi_from_text(
        "api",
        "openapi: 3.0.0\npaths:\n  /a:\n    get: [unclosed\n",
        "api.yaml",
        &OpenApiConfig::default(),
    )
    .unwrap_err();
    expect![
        "api.yaml: not valid JSON or YAML at line 5 column 1: did not find expected ',' or ']'"
    ]
    .assert_eq(&err.to_string());
}

#[test]
fn server_variables_and_relative_servers() {
    let doc = json!({"openapi": "3.1.0", "info": {"title": "t", "version": "1"},
        "servers": [{"url": "https://{region}.api.example/{version}", "variables": {
            "region": {"default": "eu"}, "version": {"default": "v1"}}}],
        "paths": {"/a": {"get": {}}}});
    let config = OpenApiConfig {
        server_variables: BTreeMap::from([("region".to_owned(), "us".to_owned())]),
        ..OpenApiConfig::default()
    };
    // The base URL is not public; the request error shows it.
    let provider = import(doc, &config);
    assert_eq!(provider.specs().len(), 1);
}

#[test]
fn server_variables_outside_their_enum_or_without_a_value_are_errors() {
    let doc = |variables: Value| {
        json!({"openapi": "3.1.0", "info": {"title": "t", "version": "1"},
            "servers": [{"url": "https://{region}.api.example/v1", "variables": variables}],
            "paths": {"/a": {"get": {}}}})
    };
    let error = |doc: Value, region: Option<&str>| {
        let config = OpenApiConfig {
            server_variables: region
                .map(|r| BTreeMap::from([("region".to_owned(), r.to_owned())]))
                .unwrap_or_default(),
            ..OpenApiConfig::default()
        };
        RestProvider::openapi_from_value("api", doc, "api.json", &config).unwrap_err().to_string()
    };
    let listed = json!({"region": {"default": "eu", "enum": ["eu", "us"]}});
    expect![[r#"api.json: at /servers/0/variables/region/enum: server variable `region` cannot be `mars` (from `serverVariables.region`): its `enum` allows `eu`, `us`; set it to one of them"#]]
        .assert_eq(&error(doc(listed.clone()), Some("mars")));
    expect![[r#"api.json: at /servers/0/variables/region/enum: server variable `region` cannot be `ap` (from its `default`): its `enum` allows `eu`, `us`; set `serverVariables.region` to one of them"#]]
        .assert_eq(&error(doc(json!({"region": {"default": "ap", "enum": ["eu", "us"]}})), None));
    expect![[r#"api.json: at /servers/0/variables/region: server variable `region` has no `default`: set `serverVariables.region` in the import's configuration"#]]
        .assert_eq(&error(doc(json!({"region": {"enum": ["eu", "us"]}})), None));
    // A value in the enum, or a `baseUrl`, imports.
    let config = |region: &str| OpenApiConfig {
        server_variables: BTreeMap::from([("region".to_owned(), region.to_owned())]),
        ..OpenApiConfig::default()
    };
    assert_eq!(import(doc(listed.clone()), &config("us")).specs().len(), 1);
    let no_default = doc(json!({"region": {"enum": ["eu"]}}));
    let with_base = OpenApiConfig::default().with_base_url("http://127.0.0.1:1");
    assert_eq!(import(no_default, &with_base).specs().len(), 1);
    // An operation's own server that is broken leaves that operation out.
    let mut mixed = doc(listed);
    mixed["paths"]["/b"] = json!({"get": {"servers": [{"url": "https://{zone}.example",
        "variables": {"zone": {"enum": ["z1"]}}}]}});
    let provider = import(mixed, &OpenApiConfig::default());
    assert_eq!(provider.specs().len(), 1);
    expect![[r#"["api.json: at /paths/~1b/get/servers/0/variables/zone: server variable `zone` has no `default`: set `serverVariables.zone` in the import's configuration; operation `GET /b` is left out"]"#]]
        .assert_eq(&format!("{:?}", provider.warnings()));
}

#[tokio::test]
async fn server_variables_reach_the_request() {
    let lines: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let seen = lines.clone();
    let base = common::serve(move |request| {
        seen.lock().unwrap().push(request.request_line().to_owned());
        common::Reply::json(200, json!({}))
    })
    .await;
    let doc = json!({"openapi": "3.1.0", "info": {"title": "t", "version": "1"},
        "servers": [{"url": format!("{base}/{{version}}/{{tier}}"), "variables": {
            "version": {"default": "v1", "enum": ["v1", "v2"]}, "tier": {"default": "free"}}}],
        "paths": {"/a": {"get": {"operationId": "getA"}}}});
    let config = OpenApiConfig {
        server_variables: BTreeMap::from([("version".to_owned(), "v2".to_owned())]),
        ..OpenApiConfig::default()
    };
    let provider = import(doc, &config);
    let out = provider.call("get_a", json!({}), &CallContext::new()).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    assert_eq!(*lines.lock().unwrap(), ["GET /v2/free/a HTTP/1.1"]);
}

#[test]
fn all_of_bodies_are_merged_and_flattened() {
    let mut doc = v3(json!({"/dogs": {"post": {"operationId": "addDog", "requestBody": {
        "required": true, "content": {"application/json": {"schema": {"allOf": [
            {"$ref": "#/components/schemas/Pet"},
            {"type": "object", "required": ["bark"], "properties": {"bark": {"type": "boolean"}}}]}}}}}},
        "/cats": {"post": {"operationId": "addCat", "requestBody": {"content": {"application/json": {
            "schema": {"oneOf": [{"$ref": "#/components/schemas/Pet"}, {"type": "string"}]}}}}}}}));
    doc["paths"]["/dogs"]["post"]["summary"] = json!("Add a dog");
    let provider = import(doc, &OpenApiConfig::default());
    let specs = provider.specs();
    assert_eq!(specs[1].title.as_deref(), Some("Add a dog"));
    let text: Vec<String> = specs
        .iter()
        .map(|t| format!("{}: {}", t.name, serde_json::to_string(&t.input_schema).unwrap()))
        .collect();
    expect![[r##"
        add_cat: {"$defs":{"Pet":{"properties":{"id":{"type":"integer"},"name":{"type":"string"},"parent":{"$ref":"#/$defs/Pet"}},"required":["name"],"type":"object"}},"additionalProperties":false,"properties":{"body":{"description":"The request body.","oneOf":[{"$ref":"#/$defs/Pet"},{"type":"string"}]}},"type":"object"}
        add_dog: {"$defs":{"Pet":{"properties":{"id":{"type":"integer"},"name":{"type":"string"},"parent":{"$ref":"#/$defs/Pet"}},"required":["name"],"type":"object"}},"additionalProperties":false,"properties":{"bark":{"type":"boolean"},"id":{"type":"integer"},"name":{"type":"string"},"parent":{"$ref":"#/$defs/Pet"}},"required":["bark","name"],"type":"object"}"##]].assert_eq(&text.join("\n"));
}

#[test]
fn x_mcp_flags_nest_operation_over_path_over_document() {
    let mut doc = v3(json!({
        "/hidden": {"x-mcp": false, "get": {"operationId": "hiddenGet"},
                    "post": {"operationId": "shownPost", "x-mcp": true}},
        "/plain": {"get": {"operationId": "plainGet"}}}));
    let names = |doc: Value| -> Vec<String> {
        import(doc, &OpenApiConfig::default()).specs().into_iter().map(|t| t.name).collect()
    };
    assert_eq!(names(doc.clone()), ["shown_post", "plain_get"]);
    doc["x-mcp"] = json!(false);
    assert_eq!(names(doc), ["shown_post"]);
}

/// Swagger 2.0 without `schemes` is called with the scheme its document was read with
/// (the specification's default), and without `host` at the host that served it: a
/// document read over `http` was called over `https` (a TLS handshake with a plain HTTP
/// server, which timed out).
#[tokio::test]
async fn swagger_without_schemes_or_host_takes_them_from_its_url() {
    let lines: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let host: std::sync::Arc<std::sync::Mutex<String>> = Default::default();
    let (seen, served_host) = (lines.clone(), host.clone());
    let base = common::serve(move |request| {
        let line = request.request_line().to_owned();
        seen.lock().unwrap().push(line.clone());
        let mut doc = json!({"swagger": "2.0", "info": {"title": "t", "version": "1"},
            "basePath": "/v2", "paths": {"/pets": {"get": {"operationId": "listPets"}}}});
        if line.starts_with("GET /with-host.json ") {
            doc["host"] = json!(*served_host.lock().unwrap());
        }
        common::Reply::json(200, doc)
    })
    .await;
    *host.lock().unwrap() = base.trim_start_matches("http://").to_owned();
    for document in ["with-host.json", "without-host.json"] {
        let config = OpenApiConfig {
            url: Some(format!("{base}/{document}")),
            timeout_ms: Some(5000),
            ..OpenApiConfig::default()
        };
        let provider = RestProvider::openapi("api", &config).await.unwrap();
        let out = provider.call("list_pets", json!({}), &CallContext::new()).await;
        let out = out.unwrap_or_else(|e| panic!("{document}: {e}"));
        assert!(!out.is_error, "{document}: {}", out.to_text());
        assert_eq!(lines.lock().unwrap().last().unwrap(), "GET /v2/pets HTTP/1.1", "{document}");
    }
}

/// A `$ref` cycle that never goes into a part of the value (`Alias` is `AliasB` is
/// `Alias`; `Node` is `allOf: [Node, …]`; `Expr` is `oneOf: [Expr, string]`) would check
/// the same value against the same schema forever, which JSON Schema leaves undefined
/// and which crashes FastMCP (`RecursionError`, #1016, #1206) and fastapi_mcp (#238): the
/// reference closing it adds nothing (gone alone or in an `allOf`, `false` in a `oneOf`),
/// with a warning naming the cycle. Recursion into a part of the value (`Tree`'s `kids`)
/// stays a reference, and the tools are called and their answers checked as usual.
#[tokio::test]
async fn ref_cycles_that_never_go_into_the_value_are_cut_with_a_warning() {
    let base = common::serve(|request| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or_default();
        common::Reply::json(200, body)
    })
    .await;
    let reply = |schema: &str| {
        json!({"200": {"description": "ok", "content": {"application/json": {
            "schema": {"$ref": format!("#/components/schemas/{schema}")}}}}})
    };
    let body = |schema: Value| json!({"required": true, "content": {"application/json": {"schema": schema}}});
    let doc = json!({"openapi": "3.0.3", "info": {"title": "c", "version": "1"},
        "servers": [{"url": base}],
        "paths": {
            "/nodes": {"post": {"operationId": "addNode", "responses": reply("Node"),
                "requestBody": body(json!({"$ref": "#/components/schemas/Node"}))}},
            "/things": {"post": {"operationId": "addThing", "requestBody": body(json!({
                "type": "object", "properties": {
                    "a": {"$ref": "#/components/schemas/Alias"},
                    "e": {"$ref": "#/components/schemas/Expr"},
                    "t": {"$ref": "#/components/schemas/Tree"}}}))}}},
        "components": {"schemas": {
            "Alias": {"$ref": "#/components/schemas/AliasB"},
            "AliasB": {"$ref": "#/components/schemas/Alias"},
            "Node": {"allOf": [{"$ref": "#/components/schemas/Node"}, {"type": "object",
                "required": ["name"], "properties": {"name": {"type": "string"},
                    "kids": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}}}}]},
            "Expr": {"oneOf": [{"$ref": "#/components/schemas/Expr"}, {"type": "string"}]},
            "Tree": {"type": "object", "properties": {
                "kids": {"type": "array", "items": {"$ref": "#/components/schemas/Tree"}}}}}}});
    let provider = import(doc, &OpenApiConfig::default());
    let text: Vec<String> = provider
        .specs()
        .iter()
        .map(|t| format!("{}: {}", t.name, serde_json::to_string(&t.input_schema).unwrap()))
        .collect();
    expect![[r##"
        add_node: {"$defs":{"Node":{"allOf":[{},{"properties":{"kids":{"items":{"$ref":"#/$defs/Node"},"type":"array"},"name":{"type":"string"}},"required":["name"],"type":"object"}]}},"additionalProperties":false,"properties":{"kids":{"items":{"$ref":"#/$defs/Node"},"type":"array"},"name":{"type":"string"}},"required":["name"],"type":"object"}
        add_thing: {"$defs":{"Alias":{"$ref":"#/$defs/AliasB"},"AliasB":{},"Expr":{"oneOf":[false,{"type":"string"}]},"Tree":{"properties":{"kids":{"items":{"$ref":"#/$defs/Tree"},"type":"array"}},"type":"object"}},"additionalProperties":false,"properties":{"a":{"$ref":"#/$defs/Alias"},"e":{"$ref":"#/$defs/Expr"},"t":{"$ref":"#/$defs/Tree"}},"type":"object"}"##]].assert_eq(&text.join("\n"));
    expect![[r#"
        api.json: at /components/schemas/Node: the schema refers back to itself without going into a part of the value (`#/components/schemas/Node` → `#/components/schemas/Node`), which JSON Schema leaves undefined: the reference to `#/components/schemas/Node` is read as adding nothing; break the cycle in the document
        api.json: at /components/schemas/AliasB: the schema refers back to itself without going into a part of the value (`#/components/schemas/Alias` → `#/components/schemas/AliasB` → `#/components/schemas/Alias`), which JSON Schema leaves undefined: the reference to `#/components/schemas/Alias` is read as adding nothing; break the cycle in the document
        api.json: at /components/schemas/Expr: the schema refers back to itself without going into a part of the value (`#/components/schemas/Expr` → `#/components/schemas/Expr`), which JSON Schema leaves undefined: the reference to `#/components/schemas/Expr` is read as adding nothing; break the cycle in the document"#]].assert_eq(&provider.warnings().join("\n"));
    let ctx = CallContext::new();
    let node = json!({"name": "root", "kids": [{"name": "leaf", "kids": []}]});
    let out = provider.call("add_node", node.clone(), &ctx).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    assert_eq!(out.structured, Some(node));
    let thing = json!({"a": {"anything": [1]}, "e": "x + 1", "t": {"kids": [{"kids": []}]}});
    let out = provider.call("add_thing", thing, &ctx).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
}

/// Names are fitted after the namespace and de-duplicated within the same budget: long
/// `operationId`s that are equal, or equal in the head a shortened name keeps, under a long
/// namespace all end distinct and within 64 characters as clients see them
/// (`{namespace}__{name}`). FastMCP truncated before its mount added a prefix (#2596), and
/// a de-duplicating suffix added after truncation overshot the limit (mcp-use #1885).
#[test]
fn long_and_duplicate_names_stay_distinct_within_the_budget_after_the_namespace() {
    let long = "getTheVeryLongListOfEverythingThatBelongsToTheCurrentOrganisationAndItsTeams";
    let doc = v3(json!({
        "/a": {"get": {"operationId": long}},
        "/b": {"get": {"operationId": long}},
        "/c": {"get": {"operationId": format!("{long}Archived")}},
        "/d": {"get": {"operationId": "short"}, "post": {"operationId": "short"}}}));
    let namespace = "an-enterprise-namespace";
    let provider =
        RestProvider::openapi_from_value(namespace, doc, "api.json", &OpenApiConfig::default())
            .unwrap();
    let names: Vec<String> =
        provider.specs().into_iter().map(|t| format!("{namespace}__{}", t.name)).collect();
    for name in &names {
        assert!(name.len() <= 64, "{name} is {} characters", name.len());
    }
    let distinct: std::collections::BTreeSet<&String> = names.iter().collect();
    assert_eq!(distinct.len(), names.len(), "{names:?}");
    expect![[r#"
        an-enterprise-namespace__get_the_very_long_list_of_ever_ebcf12f4
        an-enterprise-namespace__get_the_very_long_list_of_ever_fc7f20e7
        an-enterprise-namespace__get_the_very_long_list_of_ever_9adbf6a7
        an-enterprise-namespace__short_6b6a8aaf
        an-enterprise-namespace__short_e32c49cd"#]]
    .assert_eq(&names.join("\n"));
}

/// YAML merge keys (`<<: *anchor`) are applied, as the configuration loader applies them:
/// an operation gets the parameters merged into it and a schema the properties, where
/// a `<<` property appeared and the parameters were lost.
#[tokio::test]
async fn yaml_merge_keys_are_applied() {
    let (base, seen) = common::keeping_server().await;
    let document = format!(
        r#"
openapi: 3.0.3
info: {{title: pets, version: "1"}}
servers: [{{url: "{base}"}}]
x-paged: &paged
  parameters:
    - {{name: limit, in: query, schema: {{type: integer, maximum: 100}}}}
x-named: &named
  name: {{type: string}}
paths:
  /pets:
    post:
      <<: *paged
      operationId: addPet
      requestBody:
        content:
          application/json:
            schema:
              type: object
              properties:
                <<: *named
                age: {{type: integer}}
"#
    );
    let provider =
        RestProvider::openapi_from_text("pets", &document, "pets.yaml", &OpenApiConfig::default())
            .unwrap();
    let spec = &provider.specs()[0];
    let mut arguments: Vec<&String> =
        spec.input_schema["properties"].as_object().unwrap().keys().collect();
    arguments.sort();
    assert_eq!(arguments, ["age", "limit", "name"]);
    let out = provider
        .call("add_pet", json!({"limit": 5, "name": "Rex"}), &CallContext::new())
        .await
        .unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].request_line(), "POST /pets?limit=5 HTTP/1.1");
    assert_eq!(seen[0].body, br#"{"name":"Rex"}"#);
}

/// An integer wider than 64 bits is read as the float JSON reads it as, where the whole
/// YAML document failed to load ("number out of range") and the same one as JSON loaded.
#[test]
fn yaml_integers_wider_than_64_bits_are_read_as_json_reads_them() {
    let yaml = r#"
openapi: 3.0.3
info: {title: big, version: "1"}
paths:
  /n:
    get:
      operationId: getN
      parameters:
        - name: n
          in: query
          schema: {type: integer, maximum: 99999999999999999999999, minimum: -99999999999999999999999}
"#;
    let json_text = r#"{"openapi": "3.0.3", "info": {"title": "big", "version": "1"},
        "paths": {"/n": {"get": {"operationId": "getN", "parameters": [{"name": "n",
        "in": "query", "schema": {"type": "integer", "maximum": 99999999999999999999999,
        "minimum": -99999999999999999999999}}]}}}}"#;
    let config = OpenApiConfig::default();
    let from_yaml = RestProvider::openapi_from_text("big", yaml, "big.yaml", &config).unwrap();
    let from_json = RestProvider::openapi_from_text("big", json_text, "big.json", &config).unwrap();
    let schema = &from_yaml.specs()[0].input_schema;
    assert_eq!(schema, &from_json.specs()[0].input_schema);
    assert_eq!(schema["properties"]["n"]["maximum"], json!(1e23));
    assert_eq!(schema["properties"]["n"]["minimum"], json!(-1e23));
}

/// A 3.1 document whose `Tree` schema recurses through `$ref: '#'` (under its `$id`) and
/// whose `Node` does through `$dynamicRef: '#node'`, with an operation taking each, and one
/// whose `$ref: '#'` stands in no schema with an `$id`.
fn recursive_document() -> Value {
    json!({"openapi": "3.1.0", "info": {"title": "t", "version": "1"},
        "paths": {
            "/trees": {"post": {"operationId": "addTree", "requestBody": {"content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Tree"}}}}}},
            "/nodes": {"post": {"operationId": "addNode", "requestBody": {"content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Node"}}}}}},
            "/roots": {"post": {"operationId": "addRoot", "requestBody": {"content": {
                "application/json": {"schema": {"type": "object", "properties": {
                    "root": {"$ref": "#"}}}}}}}}},
        "components": {"schemas": {
            "Tree": {"$id": "https://example.com/tree", "type": "object",
                "required": ["label"],
                "properties": {"label": {"type": "string"},
                    "children": {"type": "array", "items": {"$ref": "#"}}}},
            "Node": {"$id": "https://example.com/node", "$dynamicAnchor": "node",
                "type": "object", "required": ["value"],
                "properties": {"value": {"type": "integer"},
                    "next": {"$dynamicRef": "#node"}}}}}})
}

#[test]
fn a_reference_to_hash_is_its_schema_resource_and_dynamic_references_resolve() {
    let provider = import(recursive_document(), &OpenApiConfig::default());
    let tools = provider.specs();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["add_node", "add_tree"]);
    let warnings = provider.warnings().join("\n");
    assert!(
        warnings
            .contains("reference `#` is to the root of the OpenAPI document, which is no schema")
            && warnings.contains("operation `POST /roots` (`addRoot`) is left out"),
        "{warnings}"
    );
    assert!(
        common::check_tools("api", &tools).is_empty(),
        "{:?}",
        common::check_tools("api", &tools)
    );
    for tool in &tools {
        let text = tool.input_schema.to_string();
        assert!(!text.contains("paths") && !text.contains("$dynamicRef"), "{text}");
    }
    // The recursion checks the nested values as it does the top ones.
    let tree = jsonschema::draft202012::new(&tools[1].input_schema).unwrap();
    assert!(tree.is_valid(&json!({"label": "a", "children": [{"label": "b", "children": []}]})));
    assert!(!tree.is_valid(&json!({"label": "a", "children": [{"children": []}]})));
    let node = jsonschema::draft202012::new(&tools[0].input_schema).unwrap();
    assert!(node.is_valid(&json!({"value": 1, "next": {"value": 2}})));
    assert!(!node.is_valid(&json!({"value": 1, "next": {"value": "two"}})));
}

/// A path parameter the path template has no `{placeholder}` for is no argument (it was a
/// required one, whose value was dropped when the request was made), with a warning
/// naming the operation and the parameter; the request goes as the path says.
#[tokio::test]
async fn path_parameters_missing_from_the_template_are_left_out_with_a_warning() {
    let (base, seen) = common::keeping_server().await;
    let doc = json!({"openapi": "3.0.3", "info": {"title": "t", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/items": {"get": {"operationId": "listItems", "parameters": [
            {"name": "id", "in": "path", "required": true, "schema": {"type": "string"}},
            {"name": "q", "in": "query", "schema": {"type": "string"}}]}}}});
    let provider = import(doc, &OpenApiConfig::default());
    let warnings = provider.warnings().join("\n");
    assert_eq!(
        warnings,
        "api.json: operation `GET /items` (`listItems`): path parameter `id` is left out, as \
         the path has no `{id}` to put it in; fix the path or the parameter's `in`"
    );
    let schema = &provider.specs()[0].input_schema;
    assert_eq!(schema["properties"], json!({"q": {"type": "string"}}), "{schema}");
    assert!(schema.get("required").is_none(), "{schema}");
    let out = provider.call("list_items", json!({"q": "x"}), &CallContext::new()).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let request = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(request.request_line(), "GET /items?q=x HTTP/1.1");
}

/// Operations sharing an `operationId` get distinct names that depend on nothing but
/// their own route (a hash of it), with a warning naming every route and tool;
/// a `rename` to a name tools cannot have is sanitized with a warning saying what it
/// became, as `x-mcp-name` and inline tools' names are.
#[tokio::test]
async fn duplicate_operation_ids_and_sanitized_renames_are_said() {
    let (base, seen) = common::keeping_server().await;
    let paths = |first: &str, second: &str| {
        let mut paths = Map::new();
        for path in [first, second] {
            paths.insert(path.to_owned(), json!({"get": {"operationId": "getThing"}}));
        }
        paths.insert("/c".to_owned(), json!({"post": {"operationId": "makeThing"}}));
        json!({"openapi": "3.0.3", "info": {"title": "t", "version": "1"},
            "servers": [{"url": base}], "paths": paths})
    };
    let config = OpenApiConfig {
        rename: BTreeMap::from([("makeThing".to_owned(), "größe".to_owned())]),
        ..OpenApiConfig::default()
    };
    let provider = import(paths("/a", "/b"), &config);
    let names: Vec<String> = provider.specs().into_iter().map(|t| t.name).collect();
    expect![[r#"["get_thing_2e0399fe", "get_thing_37e5992c", "gr__e"]"#]]
        .assert_eq(&format!("{names:?}"));
    expect![[r#"
        api.json: operationId `getThing` is used by `GET /a`, `GET /b`, where OpenAPI requires each to be unique; their tools are `get_thing_2e0399fe`, `get_thing_37e5992c` (a hash of each route added), and a `rename` of `getThing` names all of them: rename them by `METHOD /path` instead
        api.json: `rename` names `POST /c` `größe`, which became `gr__e`: a tool name is ASCII letters, digits, `_` and `-`, fits the name budget after the namespace and is distinct from the others"#]].assert_eq(&provider.warnings().join("\n"));
    // Each name depends on its own route only: `/b`'s stays when `/a` is gone.
    let other = import(paths("/b", "/x"), &config);
    let again: Vec<String> = other.specs().into_iter().map(|t| t.name).collect();
    assert_eq!(again[0], names[1]);
    for (name, path) in [(&names[0], "/a"), (&names[1], "/b")] {
        let out = provider.call(name, json!({}), &CallContext::new()).await.unwrap();
        assert!(!out.is_error, "{}", out.to_text());
        let request = seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!(request.request_line(), format!("GET {path} HTTP/1.1"));
    }
}

/// A document whose `A1` refers to `A2`, and so on to `A{n}`, reached by one operation.
fn chain_document(n: usize) -> Value {
    let mut schemas = Map::new();
    for i in 1..=n {
        let mut schema = json!({"type": "object", "properties": {"v": {"type": "integer"}}});
        if i < n {
            schema["properties"]["next"] =
                json!({"$ref": format!("#/components/schemas/A{}", i + 1)});
        }
        schemas.insert(format!("A{i}"), schema);
    }
    json!({"openapi": "3.0.3", "info": {"title": "t", "version": "1"},
        "paths": {"/a": {"post": {"operationId": "postA", "requestBody": {"content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/A1"}}}}}}},
        "components": {"schemas": schemas}})
}

/// A chain of 20,000 references is read in time linear in its length: each definition is
/// converted once and looked for once (it took about 50 s, each round of conversions
/// looking through every definition registered so far). The bound is loose, for a debug
/// build on a busy machine; `schema.rs`'s unit test counts the work itself.
#[test]
fn a_long_chain_of_references_is_read_in_linear_time() {
    let doc = chain_document(20_000);
    let started = std::time::Instant::now();
    let provider = import(doc, &OpenApiConfig::default());
    let took = started.elapsed();
    let schema = &provider.specs()[0].input_schema;
    // `A1` is the body, flattened into the arguments; the rest are definitions.
    assert_eq!(schema["properties"]["next"]["$ref"], "#/$defs/A2");
    assert_eq!(schema["$defs"].as_object().unwrap().len(), 19_999);
    assert_eq!(schema["$defs"]["A19999"]["properties"]["next"]["$ref"], "#/$defs/A20000");
    assert!(took < std::time::Duration::from_secs(10), "took {took:?}");
}

/// A JSON-pointer `$ref` inside a schema with an `$id` (OpenAPI 3.1, JSON Schema 2020-12)
/// is within that schema resource: `#/$defs/Leaf` is the `Leaf` of the schema's own
/// `$defs`, where it was looked for in the document and the operation left out as a
/// dangling reference. A pointer the resource has no place for (`#/components/...`, as
/// most 3.1 documents write it) is still the document's.
#[tokio::test]
async fn pointers_inside_a_schema_with_an_id_resolve_in_that_resource() {
    let (base, seen) = common::keeping_server().await;
    let doc = json!({"openapi": "3.1.0", "info": {"title": "t", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/trees": {"post": {"operationId": "addTree", "requestBody": {"content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Tree"}}}}}}},
        "components": {"schemas": {
            "Tag": {"type": "object", "required": ["name"],
                "properties": {"name": {"type": "string"}}},
            "Tree": {"$id": "https://example.com/tree", "type": "object",
                "$defs": {"Leaf": {"type": "object", "required": ["inner"],
                    "properties": {"inner": {"type": "integer"}}}},
                "properties": {"leaf": {"$ref": "#/$defs/Leaf"},
                    "tag": {"$ref": "#/components/schemas/Tag"}}}}}});
    let provider = import(doc, &OpenApiConfig::default());
    assert!(provider.warnings().is_empty(), "{:?}", provider.warnings());
    let tools = provider.specs();
    let schema = &tools[0].input_schema;
    let validator = jsonschema::draft202012::new(schema).unwrap();
    assert!(validator.is_valid(&json!({"leaf": {"inner": 1}, "tag": {"name": "t"}})), "{schema}");
    assert!(!validator.is_valid(&json!({"leaf": {"inner": "x"}})), "{schema}");
    assert!(!validator.is_valid(&json!({"tag": {}})), "{schema}");
    let args = json!({"leaf": {"inner": 1}, "tag": {"name": "t"}});
    let out = provider.call("add_tree", args, &CallContext::new()).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let request = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(request.body, br#"{"leaf":{"inner":1},"tag":{"name":"t"}}"#);
}
