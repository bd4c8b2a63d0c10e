//! Output schemas derived from documented success responses, and the structured content
//! of calls: real OpenAPI documents (`@readme/oas-examples`' petstore in Swagger 2.0,
//! OpenAPI 3.0 and 3.1) called against a loopback server, and small documents for the
//! rules.
#![allow(clippy::unwrap_used)]

use crate::common::{Reply, SeenRequest, check_tools, npm_file, serve};
use expect_test::{Expect, expect};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use toolmux_core::{CallContext, ToolOutput, ToolProvider, ToolSpec};
use toolmux_rest::{OpenApiConfig, RestProvider};

/// A pet as the petstore documents it.
fn rex() -> Value {
    json!({"id": 1, "category": {"id": 2, "name": "dogs"}, "name": "Rex",
           "photoUrls": ["https://example.com/rex.png"], "tags": [{"id": 3, "name": "good"}],
           "status": "available"})
}

/// A petstore server: `/pet/1` is Rex, `/pet/404` a JSON 404, `/pet/2` a pet without its
/// required `photoUrls`, `/pet/3` an HTML page, `/pet/findByStatus` a list, and
/// `/user/login` a JSON string. Records every request.
async fn petstore_server() -> (String, Arc<Mutex<Vec<SeenRequest>>>) {
    let seen: Arc<Mutex<Vec<SeenRequest>>> = Arc::default();
    let record = seen.clone();
    let base = serve(move |request| {
        record.lock().unwrap().push(request.clone());
        let line = request.request_line().to_owned();
        let path = line.split(' ').nth(1).unwrap_or_default();
        match path.split('?').next().unwrap_or_default() {
            "/v2/pet/1" => Reply::json(200, rex()),
            "/v2/pet/2" => Reply::json(200, json!({"id": 2, "name": "Bob"})),
            "/v2/pet/3" => Reply {
                status: 200,
                headers: vec![("Content-Type".into(), "text/html".into())],
                chunks: vec![(0, b"<html>maintenance</html>".to_vec())],
            },
            "/v2/pet/findByStatus" => Reply::json(200, json!([rex()])),
            "/v2/user/login" => Reply::json(200, json!("session-token")),
            _ => Reply::json(404, json!({"code": 404, "message": "Pet not found"})),
        }
    })
    .await;
    (format!("{base}/v2"), seen)
}

fn petstore(version: &str, base: &str, config: OpenApiConfig) -> RestProvider {
    let path = npm_file("@readme/oas-examples", &format!("{version}/json/petstore.json"));
    let text = std::fs::read_to_string(path).unwrap();
    let config = config.with_base_url(base);
    RestProvider::openapi_from_text("petstore", &text, "petstore.json", &config).unwrap()
}

fn tool<'a>(tools: &'a [ToolSpec], name: &str) -> &'a ToolSpec {
    tools.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no tool {name}"))
}

/// What kind of output schema a tool got: `none`, `object` (with the top `$ref`, if any)
/// or `wrapped` (with the `result` property's type or `$ref`).
fn kind(spec: &ToolSpec) -> String {
    let Some(schema) = &spec.output_schema else { return "none".into() };
    let describe = |s: &Value| {
        let of = |k: &str| s.get(k).map(|v| v.to_string().replace('"', ""));
        of("$ref").or_else(|| of("type")).or_else(|| of("anyOf").map(|_| "anyOf".into()))
    };
    if schema.get("x-toolmux-wrap-result") == Some(&Value::Bool(true)) {
        let result = &schema["properties"]["result"];
        let items = result.get("items").and_then(describe).map(|i| format!(" of {i}"));
        format!("wrapped {}{}", describe(result).unwrap_or_default(), items.unwrap_or_default())
    } else {
        let reference = schema.get("$ref").and_then(Value::as_str);
        reference.map_or_else(|| "object".into(), |r| format!("object {r}"))
    }
}

fn kinds(tools: &[ToolSpec]) -> String {
    let mut lines: Vec<String> = tools.iter().map(|t| format!("{}: {}", t.name, kind(t))).collect();
    lines.sort();
    lines.join("\n")
}

#[tokio::test]
async fn petstore_output_schemas_come_from_success_responses() {
    let (base, _) = petstore_server().await;
    let expected = expect![[r#"
        add_pet: none
        create_user: none
        create_users_with_array_input: none
        create_users_with_list_input: none
        delete_order: none
        delete_pet: none
        delete_user: none
        find_pets_by_status: wrapped array of #/$defs/Pet
        get_inventory: object
        get_order_by_id: object #/$defs/Order
        get_pet_by_id: object #/$defs/Pet
        get_user_by_name: object #/$defs/User
        login_user: wrapped string
        logout_user: none
        place_order: object #/$defs/Order
        update_pet: none
        update_pet_with_form: none
        update_user: none
        upload_file: object #/$defs/ApiResponse"#]];
    for version in ["2.0", "3.0", "3.1"] {
        let tools = petstore(version, &base, OpenApiConfig::default()).specs();
        expected.assert_eq(&kinds(&tools));
        // Every output schema is an object schema that is valid JSON Schema 2020-12.
        assert!(
            check_tools("petstore", &tools).is_empty(),
            "{:?}",
            check_tools("petstore", &tools)
        );
        // Responses keep what the server sets (`readOnly`) and the definitions reached.
        let pet = tool(&tools, "get_pet_by_id").output_schema.clone().unwrap();
        assert_eq!(pet["type"], "object");
        let defs: Vec<&String> = pet["$defs"].as_object().unwrap().keys().collect();
        assert_eq!(defs, ["Category", "Pet", "Tag"], "{version}");
        let id = &pet["$defs"]["Pet"]["properties"]["id"];
        assert_eq!(id["type"], "integer", "{version}");
        if version != "2.0" {
            assert_eq!(id["readOnly"], true, "{version}");
        }
        // Documented bodies validate against the schema as a client would check them.
        let validator = jsonschema::draft202012::options().build(&pet).unwrap();
        assert!(validator.is_valid(&rex()));
        assert!(!validator.is_valid(&json!({"id": 2, "name": "Bob"})));
    }
    let off = petstore(
        "3.0",
        &base,
        OpenApiConfig { output_schemas: Some(false), ..OpenApiConfig::default() },
    );
    assert!(off.specs().iter().all(|t| t.output_schema.is_none()));
}

async fn call(provider: &RestProvider, tool: &str, args: Value) -> ToolOutput {
    provider.call(tool, args, &CallContext::new()).await.unwrap()
}

fn body(out: &ToolOutput) -> Value {
    let text: String = out
        .content
        .iter()
        .filter_map(|p| match p {
            toolmux_core::ContentPart::Json { value } => Some(value.to_string()),
            toolmux_core::ContentPart::Text { text } => Some(text.clone()),
            _ => None,
        })
        .collect();
    serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"))
}

#[tokio::test]
async fn a_success_carries_its_body_as_structured_content_and_a_failure_none() {
    let (base, seen) = petstore_server().await;
    for version in ["2.0", "3.0", "3.1"] {
        let provider = petstore(version, &base, OpenApiConfig::default());
        let out = call(&provider, "get_pet_by_id", json!({"petId": 1})).await;
        assert!(!out.is_error, "{}", out.to_text());
        assert_eq!(out.structured, Some(rex()));
        assert_eq!(body(&out), rex());
        // The request asked for the JSON the schema describes, not the document's XML.
        let request = seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!(request.request_line(), "GET /v2/pet/1 HTTP/1.1");
        assert_eq!(request.header("accept").as_deref(), Some("application/json"));

        let out = call(&provider, "get_pet_by_id", json!({"petId": 404})).await;
        assert!(out.is_error);
        assert_eq!(out.structured, None);
        assert_eq!(out.extras["status"], 404);
        assert_eq!(out.to_text(), r#"HTTP 404 Not Found: {"code":404,"message":"Pet not found"}"#);

        // A list and a string are wrapped, as the schemas say.
        let out = call(&provider, "find_pets_by_status", json!({"status": ["available"]})).await;
        assert_eq!(out.structured, Some(json!({"result": [rex()]})));
        assert_eq!(body(&out), json!([rex()]));
        let out = call(&provider, "login_user", json!({"username": "u", "password": "p"})).await;
        assert_eq!(out.structured, Some(json!({"result": "session-token"})));
    }
    // Without output schemas, responses come as they are (and reqwest accepts anything).
    let provider =
        petstore("3.0", &base, OpenApiConfig { output_schemas: Some(false), ..Default::default() });
    let out = call(&provider, "get_pet_by_id", json!({"petId": 1})).await;
    assert_eq!((out.structured, out.is_error), (None, false));
    let request = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(request.header("accept").as_deref(), Some("*/*"));
}

#[tokio::test]
async fn a_success_the_schema_does_not_describe_is_an_error_saying_so() {
    let (base, _) = petstore_server().await;
    let provider = petstore("3.0", &base, OpenApiConfig::default());
    let out = call(&provider, "get_pet_by_id", json!({"petId": 2})).await;
    assert!(out.is_error);
    assert_eq!(out.structured, None);
    assert_eq!(out.extras["status"], 200);
    let text = out.to_text();
    expect![[r#"HTTP 200 OK, but its body does not match the documented schema: at its top, "photoUrls" is a required property; the tool's output schema (from the operation's documented responses) promises structured content that conforms, so this result is reported as an error. The request itself succeeded: do not repeat it for this reason. Setting `outputSchemas: false` on this OpenAPI import takes responses as they come"#]]
        .assert_eq(text.lines().next().unwrap());
    // The body follows the note, for the model to read.
    assert!(text.ends_with(r#"{"id":2,"name":"Bob"}"#), "{text}");

    let out = call(&provider, "get_pet_by_id", json!({"petId": 3})).await;
    assert!(out.is_error);
    let text = out.to_text();
    assert!(text.starts_with("HTTP 200 OK, but its body is not JSON (text/html);"), "{text}");
    assert!(text.ends_with("<html>maintenance</html>"), "{text}");
}

fn v3(paths: Value, schemas: Value) -> Value {
    json!({"openapi": "3.0.3", "info": {"title": "t", "version": "1"},
           "servers": [{"url": "https://api.example"}], "paths": paths,
           "components": {"schemas": schemas}})
}

/// The output schema of the only operation of `responses`.
fn check(responses: Value, schemas: Value, expected: Expect) {
    let doc = v3(json!({"/x": {"get": {"operationId": "op", "responses": responses}}}), schemas);
    let provider =
        RestProvider::openapi_from_value("t", doc, "t.json", &OpenApiConfig::default()).unwrap();
    let tools = provider.specs();
    assert!(check_tools("t", &tools).is_empty(), "{:?}", check_tools("t", &tools));
    let schema = tools[0].output_schema.as_deref().map_or("none".into(), Value::to_string);
    expected.assert_eq(&schema);
}

fn json_response(schema: Value) -> Value {
    json!({"description": "ok", "content": {"application/json": {"schema": schema}}})
}

#[test]
fn arrays_behind_references_are_wrapped_and_objects_are_not() {
    check(
        json!({"200": json_response(json!({"$ref": "#/components/schemas/Pets"}))}),
        json!({"Pets": {"type": "array", "items": {"$ref": "#/components/schemas/Pet"}},
               "Pet": {"type": "object", "properties": {"name": {"type": "string"}}}}),
        expect![[
            r##"{"$defs":{"Pet":{"properties":{"name":{"type":"string"}},"type":"object"},"Pets":{"items":{"$ref":"#/$defs/Pet"},"type":"array"}},"properties":{"result":{"$ref":"#/$defs/Pets"}},"required":["result"],"type":"object","x-toolmux-wrap-result":true}"##
        ]],
    );
    // An `allOf` with an object member is an object; a nullable object is not.
    check(
        json!({"200": json_response(json!({"allOf": [{"$ref": "#/components/schemas/Pet"}],
                                           "description": "a pet"}))}),
        json!({"Pet": {"type": "object", "properties": {"name": {"type": "string"}}}}),
        expect![[
            r##"{"$defs":{"Pet":{"properties":{"name":{"type":"string"}},"type":"object"}},"allOf":[{"$ref":"#/$defs/Pet"}],"description":"a pet","type":"object"}"##
        ]],
    );
    check(
        json!({"200": json_response(json!({"type": "object", "nullable": true}))}),
        json!({}),
        expect![[
            r#"{"properties":{"result":{"type":["object","null"]}},"required":["result"],"type":"object","x-toolmux-wrap-result":true}"#
        ]],
    );
}

#[test]
fn recursive_response_schemas_stay_references() {
    check(
        json!({"200": json_response(json!({"$ref": "#/components/schemas/Node"}))}),
        json!({"Node": {"type": "object", "properties": {
            "children": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}}}}}),
        expect![[
            r##"{"$defs":{"Node":{"properties":{"children":{"items":{"$ref":"#/$defs/Node"},"type":"array"}},"type":"object"}},"$ref":"#/$defs/Node","type":"object"}"##
        ]],
    );
}

#[test]
fn several_success_schemas_are_alternatives() {
    check(
        json!({"200": json_response(json!({"type": "object", "properties": {"a": {"type": "string"}}})),
               "201": {"description": "created", "content": {"application/problem+json": {
                   "schema": {"type": "object", "properties": {"b": {"type": "integer"}}}}}},
               "404": json_response(json!({"type": "string"}))}),
        json!({}),
        expect![[
            r#"{"anyOf":[{"properties":{"a":{"type":"string"}},"type":"object"},{"properties":{"b":{"type":"integer"}},"type":"object"}],"type":"object"}"#
        ]],
    );
}

#[test]
fn no_output_schema_without_json_that_says_something() {
    let none = || expect!["none"];
    // No content at all, as a 204 has.
    check(
        json!({"200": json_response(json!({"type": "object"})), "204": {"description": "gone"}}),
        json!({}),
        none(),
    );
    // Only XML, or only a stream of JSON values.
    check(
        json!({"200": {"description": "ok", "content": {"application/xml": {"schema": {"type": "object"}}}}}),
        json!({}),
        none(),
    );
    check(
        json!({"200": {"description": "ok", "content": {"application/x-ndjson": {"schema": {"type": "object"}}}}}),
        json!({}),
        none(),
    );
    // Any JSON at all (FastAPI's `schema: {}`), or JSON without a schema.
    check(json!({"200": json_response(json!({"description": "anything"}))}), json!({}), none());
    check(
        json!({"200": {"description": "ok", "content": {"application/json": {}}}}),
        json!({}),
        none(),
    );
    // Only `default`, which may be an error.
    check(json!({"default": json_response(json!({"type": "object"}))}), json!({}), none());
}

#[test]
fn a_broken_response_schema_costs_the_output_schema_not_the_tool() {
    let doc = v3(
        json!({"/x": {"get": {"operationId": "op", "responses": {
            "200": json_response(json!({"$ref": "#/components/schemas/Missing"}))}}}}),
        json!({}),
    );
    let provider =
        RestProvider::openapi_from_value("t", doc, "t.json", &OpenApiConfig::default()).unwrap();
    assert_eq!(provider.specs().len(), 1);
    assert!(provider.specs()[0].output_schema.is_none());
    expect![[r#"["t.json: at /paths/~1x/get/responses/200/content/application~1json/schema/$ref: dangling reference `#/components/schemas/Missing`; operation `GET /x` gets no output schema"]"#]]
        .assert_eq(&format!("{:?}", provider.warnings()));
}

/// Text in the charset its `Content-Type` names (`iso-8859-1`, `Shift_JIS`) is read as
/// that text, in successes and in failures' messages alike; it was called binary, or its
/// letters replaced.
#[tokio::test]
async fn text_in_a_declared_charset_is_decoded() {
    let base = serve(|seen| {
        let (status, kind, bytes): (u16, &str, Vec<u8>) = match seen.request_line() {
            line if line.starts_with("GET /latin") => {
                (200, "text/plain; charset=ISO-8859-1", b"caf\xe9".to_vec())
            }
            line if line.starts_with("GET /sjis") => {
                (200, "text/plain; charset=\"Shift_JIS\"", b"\x93\xfa\x96\x7b".to_vec())
            }
            _ => (400, "text/plain; charset=windows-1252", b"d\xe9j\xe0 vu".to_vec()),
        };
        Reply {
            status,
            headers: vec![("Content-Type".into(), kind.into())],
            chunks: vec![(0, bytes)],
        }
    })
    .await;
    let get = |id: &str| json!({"get": {"operationId": id, "responses": {"200": {"description": "text"}}}});
    let doc = json!({"openapi": "3.0.3", "info": {"title": "t", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/latin": get("latin"), "/sjis": get("sjis"), "/fails": get("fails")}});
    let provider =
        RestProvider::openapi_from_value("t", doc, "t.json", &OpenApiConfig::default()).unwrap();
    assert_eq!(call(&provider, "latin", json!({})).await.to_text(), "café");
    assert_eq!(call(&provider, "sjis", json!({})).await.to_text(), "日本");
    let failed = call(&provider, "fails", json!({})).await;
    assert!(failed.is_error);
    assert_eq!(failed.to_text(), "HTTP 400 Bad Request: déjà vu");
}

/// `patternProperties` keys are regexes as `pattern` values are, cleaned up the same way:
/// ECMA's literal braces (`^{[a-z]+}$`) are escaped, and a key no validator compiles
/// (ECMA's `[^]`) is dropped with the `additionalProperties: false` that would then refuse
/// its properties. The output schema compiles, and a body it describes is a success.
#[tokio::test]
async fn pattern_property_keys_are_cleaned_up_as_patterns_are() {
    let base = serve(|_| Reply::json(200, json!({"{abc}": "v", "n1": 5}))).await;
    let schema = json!({"type": "object", "additionalProperties": false, "patternProperties": {
        "^{[a-z]+}$": {"type": "string"}, "^n[^]*$": {"type": "integer"}}});
    let mut doc = v3(
        json!({"/x": {"get": {"operationId": "op", "responses": {"200": json_response(schema)}}}}),
        json!({}),
    );
    doc["servers"] = json!([{"url": base}]);
    let provider =
        RestProvider::openapi_from_value("t", doc, "t.json", &OpenApiConfig::default()).unwrap();
    let tools = provider.specs();
    assert!(check_tools("t", &tools).is_empty(), "{:?}", check_tools("t", &tools));
    let out = call(&provider, "op", json!({})).await;
    assert!(!out.is_error, "{}", out.to_text());
    assert_eq!(out.structured, Some(json!({"{abc}": "v", "n1": 5})));
}

/// A success that does not match the output schema is an error result carrying the body;
/// a configured secret the API echoes in it (a credential, a configured header's value)
/// is redacted there too, in its JSON part as in its text.
#[tokio::test]
async fn a_mismatching_success_echoing_a_secret_has_it_redacted() {
    let secret = "k-9fQ2xK7mWp";
    let base = serve(|seen| {
        Reply::json(200, json!({"echo": seen.header("x-api-key"), "other": seen.header("x-other")}))
    })
    .await;
    let schema = json!({"type": "object", "required": ["id"],
        "properties": {"id": {"type": "integer"}}});
    let mut doc = v3(
        json!({"/x": {"get": {"operationId": "op", "security": [{"key": []}],
            "responses": {"200": json_response(schema)}}}}),
        json!({}),
    );
    doc["servers"] = json!([{"url": base}]);
    doc["components"]["securitySchemes"] =
        json!({"key": {"type": "apiKey", "in": "header", "name": "X-Api-Key"}});
    let mut config = OpenApiConfig::default();
    let key = toolmux_rest::Credentials {
        api_key: Some(secret.into()),
        ..toolmux_rest::Credentials::default()
    };
    config.auth.insert("key".into(), key);
    config.headers.insert("X-Other".into(), "h-7Rt4vQ1zLs".into());
    let provider = RestProvider::openapi_from_value("t", doc, "t.json", &config).unwrap();
    let out = call(&provider, "op", json!({})).await;
    assert!(out.is_error, "{}", out.to_text());
    let shown = serde_json::to_string(&out).unwrap();
    assert!(!shown.contains(secret) && !shown.contains("7Rt4vQ1zLs"), "{shown}");
    assert!(shown.contains("REDACTED"), "{shown}");
}
