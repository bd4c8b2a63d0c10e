//! Request bodies of a FastAPI application's document (OpenAPI 3.1, written as FastAPI
//! emits it) and of OpenAPI 3.0's nullable objects, as a loopback server receives them.
#![allow(clippy::unwrap_used)]

use crate::common::{SeenRequest, keeping_server};
use serde_json::{Value, json};
use std::sync::Mutex;
use toolmux_core::{CallContext, ToolProvider};
use toolmux_rest::{OpenApiConfig, RestProvider};

/// What FastAPI (0.115, Pydantic 2) emits for
///
/// ```python
/// class Item(BaseModel):
///     name: str
///     price: float
///     quantity: int = 1
///     description: str | None = None
///     sizes: list[int] = []
///     stock: dict[str, int] = {}
///     shelf: int | None = None
///     dimensions: Dims | None = None
///
/// class Dims(BaseModel):
///     width: int
///     depth: float
///
/// @app.post("/items/")
/// def create_item(item: Item): ...
///
/// @app.put("/items/{item_id}")
/// def update_item(item_id: int, item: Optional[Item] = Body(None)): ...
///
/// @app.post("/items/bulk")
/// def create_items(items: list[Item]): ...
/// ```
fn fastapi_document(base: &str) -> Value {
    let validation_error = json!({"422": {"description": "Validation Error", "content":
        {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}}}});
    let ok = json!({"description": "Successful Response",
        "content": {"application/json": {"schema": {}}}});
    json!({
        "openapi": "3.1.0",
        "info": {"title": "FastAPI", "version": "0.1.0"},
        "servers": [{"url": base}],
        "paths": {
            "/items/": {"post": {
                "summary": "Create Item",
                "operationId": "create_item_items__post",
                "requestBody": {"content": {"application/json": {"schema":
                    {"$ref": "#/components/schemas/Item"}}}, "required": true},
                "responses": {"200": ok, "422": validation_error["422"]}
            }},
            "/items/bulk": {"post": {
                "summary": "Create Items",
                "operationId": "create_items_items_bulk_post",
                "requestBody": {"content": {"application/json": {"schema": {"type": "array",
                    "items": {"$ref": "#/components/schemas/Item"}, "title": "Items"}}},
                    "required": true},
                "responses": {"200": ok, "422": validation_error["422"]}
            }},
            "/items/{item_id}": {"put": {
                "summary": "Update Item",
                "operationId": "update_item_items__item_id__put",
                "parameters": [{"name": "item_id", "in": "path", "required": true,
                    "schema": {"type": "integer", "title": "Item Id"}}],
                "requestBody": {"content": {"application/json": {"schema": {
                    "anyOf": [{"$ref": "#/components/schemas/Item"}, {"type": "null"}],
                    "title": "Item"}}}},
                "responses": {"200": ok, "422": validation_error["422"]}
            }}
        },
        "components": {"schemas": {
            "HTTPValidationError": {"properties": {"detail": {"items":
                {"$ref": "#/components/schemas/ValidationError"}, "type": "array",
                "title": "Detail"}}, "type": "object", "title": "HTTPValidationError"},
            "Item": {"properties": {
                "name": {"type": "string", "title": "Name"},
                "price": {"type": "number", "title": "Price"},
                "quantity": {"type": "integer", "title": "Quantity", "default": 1},
                "description": {"anyOf": [{"type": "string"}, {"type": "null"}],
                    "title": "Description"},
                "sizes": {"items": {"type": "integer"}, "type": "array", "title": "Sizes",
                    "default": []},
                "stock": {"additionalProperties": {"type": "integer"}, "type": "object",
                    "title": "Stock", "default": {}},
                "shelf": {"anyOf": [{"type": "integer"}, {"type": "null"}], "title": "Shelf"},
                "dimensions": {"anyOf": [{"$ref": "#/components/schemas/Dims"},
                    {"type": "null"}]}
            }, "type": "object", "required": ["name", "price"], "title": "Item"},
            "Dims": {"properties": {
                "width": {"type": "integer", "title": "Width"},
                "depth": {"type": "number", "title": "Depth"}
            }, "type": "object", "required": ["width", "depth"], "title": "Dims"},
            "ValidationError": {"properties": {
                "loc": {"items": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                    "type": "array", "title": "Location"},
                "msg": {"type": "string", "title": "Message"},
                "type": {"type": "string", "title": "Error Type"}
            }, "type": "object", "required": ["loc", "msg", "type"], "title": "ValidationError"}
        }}
    })
}

fn fastapi(base: &str) -> RestProvider {
    RestProvider::openapi_from_value(
        "shop",
        fastapi_document(base),
        "shop.json",
        &OpenApiConfig::default(),
    )
    .unwrap()
}

/// The request tool `tool` sends with `args`.
async fn sent(
    provider: &RestProvider,
    seen: &Mutex<Vec<SeenRequest>>,
    tool: &str,
    args: Value,
) -> SeenRequest {
    let out = provider.call(tool, args, &CallContext::new()).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    seen.lock().unwrap().last().cloned().unwrap()
}

/// The name of the tool whose name starts with `prefix` (FastAPI's operation ids are
/// shortened into tool names).
fn tool(provider: &RestProvider, prefix: &str) -> String {
    provider.specs().into_iter().map(|s| s.name).find(|n| n.starts_with(prefix)).unwrap()
}

/// The input schema of tool `name`.
fn input_schema(provider: &RestProvider, name: &str) -> Value {
    provider.specs().into_iter().find(|s| s.name == name).unwrap().input_schema.as_ref().clone()
}

/// `Optional[Item] = Body(None)` imports as a required `Item` does: the item's properties
/// are the arguments (none required, since the body may be left out), and the server gets
/// the JSON object made of those given, or no body at all when none is.
#[tokio::test]
async fn an_optional_fastapi_body_is_flattened_and_left_out_when_empty() {
    let (base, seen) = keeping_server().await;
    let provider = fastapi(&base);
    let update = &tool(&provider, "update_item");
    let schema = input_schema(&provider, update);
    let mut names: Vec<&String> = schema["properties"].as_object().unwrap().keys().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "description",
            "dimensions",
            "item_id",
            "name",
            "price",
            "quantity",
            "shelf",
            "sizes",
            "stock"
        ],
        "{schema}"
    );
    assert_eq!(schema["required"], json!(["item_id"]), "{schema}");

    let request =
        sent(&provider, &seen, update, json!({"item_id": 7, "name": "lamp", "price": 12.5})).await;
    assert_eq!(request.request_line(), "PUT /items/7 HTTP/1.1");
    assert_eq!(request.header("content-type").as_deref(), Some("application/json"));
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(body, json!({"name": "lamp", "price": 12.5}));

    let request = sent(&provider, &seen, update, json!({"item_id": 7})).await;
    assert_eq!(request.request_line(), "PUT /items/7 HTTP/1.1");
    assert!(request.body.is_empty(), "{:?}", String::from_utf8_lossy(&request.body));
    assert_eq!(request.header("content-type"), None, "{}", request.head);
}

/// A required `Item` is flattened as before, its required properties required.
#[tokio::test]
async fn a_required_fastapi_body_is_flattened() {
    let (base, seen) = keeping_server().await;
    let provider = fastapi(&base);
    let create = &tool(&provider, "create_item");
    let schema = input_schema(&provider, create);
    assert_eq!(schema["required"], json!(["name", "price"]), "{schema}");
    let request = sent(
        &provider,
        &seen,
        create,
        json!({"name": "lamp", "price": 12.5, "description": null, "sizes": [1, 2]}),
    )
    .await;
    assert_eq!(request.request_line(), "POST /items/ HTTP/1.1");
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(body, json!({"name": "lamp", "price": 12.5, "description": null, "sizes": [1, 2]}));
}

/// One `PUT /things/{id}` operation of an OpenAPI 3.0 document whose body is `schema`,
/// with a schema `Thing` to refer to.
fn nullable_30(base: &str, schema: Value, required: bool) -> RestProvider {
    let doc = json!({"openapi": "3.0.3", "info": {"title": "t", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/things/{id}": {"put": {"operationId": "put_thing",
            "parameters": [{"name": "id", "in": "path", "required": true,
                "schema": {"type": "string"}}],
            "requestBody": {"required": required,
                "content": {"application/json": {"schema": schema}}},
            "responses": {"204": {"description": "done"}}}}},
        "components": {"schemas": {
            "Thing": {"type": "object", "required": ["id"], "properties": {
                "id": {"type": "string"}, "colour": {"type": "string"}}},
            "Other": {"type": "object", "properties": {"size": {"type": "integer"}}}}}});
    RestProvider::openapi_from_value("t", doc, "t.json", &OpenApiConfig::default()).unwrap()
}

/// OpenAPI 3.0's nullable object bodies (`nullable: true` on the object, or on an `allOf`
/// of one reference) are flattened too, with the same clash rule as a plain object: the
/// path's `id` becomes `id__path` beside the body's `id`.
#[tokio::test]
async fn nullable_object_bodies_of_openapi_30_are_flattened() {
    let inline = json!({"type": "object", "nullable": true, "required": ["id"], "properties": {
        "id": {"type": "string"}, "colour": {"type": "string"}}});
    let referenced = json!({"allOf": [{"$ref": "#/components/schemas/Thing"}], "nullable": true});
    for schema in [inline, referenced] {
        let (base, seen) = keeping_server().await;
        let provider = nullable_30(&base, schema.clone(), true);
        let input = input_schema(&provider, "put_thing");
        let mut names: Vec<&String> = input["properties"].as_object().unwrap().keys().collect();
        names.sort();
        assert_eq!(names, ["colour", "id", "id__path"], "{schema}: {input}");
        assert_eq!(input["required"], json!(["id__path", "id"]), "{schema}: {input}");
        let request = sent(
            &provider,
            &seen,
            "put_thing",
            json!({"id__path": "a", "id": "b", "colour": "red"}),
        )
        .await;
        assert_eq!(request.request_line(), "PUT /things/a HTTP/1.1");
        let body: Value = serde_json::from_slice(&request.body).unwrap();
        assert_eq!(body, json!({"id": "b", "colour": "red"}), "{schema}");
    }
}

/// A required flattened body whose arguments are all left out goes as `{}`, where an
/// optional one is left out: a server answers a missing required body 422.
#[tokio::test]
async fn a_required_body_without_arguments_is_an_empty_object() {
    let schema = json!({"$ref": "#/components/schemas/Other"});
    for (required, expected) in [(true, &b"{}"[..]), (false, &b""[..])] {
        let (base, seen) = keeping_server().await;
        let provider = nullable_30(&base, schema.clone(), required);
        let request = sent(&provider, &seen, "put_thing", json!({"id": "a"})).await;
        assert_eq!(request.body, expected, "required: {required}");
    }
}

/// A body that may be one of several objects (with or without `null`) stays one `body`
/// argument sent as given: its properties could not be told apart.
#[tokio::test]
async fn a_polymorphic_body_stays_one_argument() {
    let thing = json!({"$ref": "#/components/schemas/Thing"});
    let other = json!({"$ref": "#/components/schemas/Other"});
    let nothing = json!({"type": "null"});
    for schema in [
        json!({"anyOf": [thing, other]}),
        json!({"oneOf": [thing, other, nothing]}),
        json!({"anyOf": [thing, nothing], "properties": {"extra": {"type": "string"}}}),
    ] {
        let (base, seen) = keeping_server().await;
        let provider = nullable_30(&base, schema.clone(), true);
        let input = input_schema(&provider, "put_thing");
        let mut names: Vec<&String> = input["properties"].as_object().unwrap().keys().collect();
        names.sort();
        assert_eq!(names, ["body", "id"], "{schema}: {input}");
        let request =
            sent(&provider, &seen, "put_thing", json!({"id": "a", "body": {"size": 3}})).await;
        let body: Value = serde_json::from_slice(&request.body).unwrap();
        assert_eq!(body, json!({"size": 3}), "{schema}");
    }
}

/// Whole numbers written with a fraction (`5.0`, as Python writes a float) go into a JSON
/// body as `5` where the schema says integer: a property, a nullable one (`anyOf` with
/// `null`), an array's items, a map's values, a referenced object's properties, the items
/// of an array body of references; `number` places keep what was written.
#[tokio::test]
async fn whole_numbers_go_into_json_bodies_as_integers_where_the_schema_says_integer() {
    let (base, seen) = keeping_server().await;
    let provider = fastapi(&base);
    let item = json!({"name": "lamp", "price": 12.0, "quantity": 2.0, "sizes": [1.0, 2.0],
        "stock": {"north": 3.0}, "shelf": 4.0, "dimensions": {"width": 30.0, "depth": 8.0}});
    let request = sent(&provider, &seen, &tool(&provider, "create_item_"), item.clone()).await;
    assert_eq!(
        std::str::from_utf8(&request.body).unwrap(),
        r#"{"dimensions":{"depth":8.0,"width":30},"name":"lamp","price":12.0,"quantity":2,"shelf":4,"sizes":[1,2],"stock":{"north":3}}"#
    );

    let request =
        sent(&provider, &seen, &tool(&provider, "create_items"), json!({"body": [item]})).await;
    assert_eq!(
        std::str::from_utf8(&request.body).unwrap(),
        r#"[{"dimensions":{"depth":8.0,"width":30},"name":"lamp","price":12.0,"quantity":2,"shelf":4,"sizes":[1,2],"stock":{"north":3}}]"#
    );
}

/// An inline tool with a declared `parametersSchema` sends `5.0` as `5` where the schema
/// says integer, in its body template and in a body made of its arguments alike.
#[tokio::test]
async fn inline_tools_send_whole_numbers_as_integers_where_their_schema_says_integer() {
    let (base, seen) = keeping_server().await;
    let schema = json!({"type": "object", "properties": {
        "n": {"type": "integer"}, "ratio": {"type": "number"},
        "ids": {"type": "array", "items": {"$ref": "#/definitions/Id"}}},
        "definitions": {"Id": {"type": "integer"}}});
    let tools: std::collections::BTreeMap<String, toolmux_rest::RestToolConfig> =
        serde_json::from_value(json!({
            "templated": {"description": "t", "method": "POST", "url": format!("{base}/t"),
                "body": {"count": "${parameters.n}", "ratio": "${parameters.ratio}",
                    "ids": "${parameters.ids}"},
                "parametersSchema": schema},
            "plain": {"description": "p", "method": "PUT", "url": format!("{base}/p"),
                "parametersSchema": schema}
        }))
        .unwrap();
    let provider = RestProvider::inline(&tools).unwrap();
    let args = json!({"n": 5.0, "ratio": 2.0, "ids": [7.0, 8.5]});
    let request = sent(&provider, &seen, "templated", args.clone()).await;
    assert_eq!(
        std::str::from_utf8(&request.body).unwrap(),
        r#"{"count":5,"ids":[7,8.5],"ratio":2.0}"#
    );
    let request = sent(&provider, &seen, "plain", args).await;
    assert_eq!(std::str::from_utf8(&request.body).unwrap(), r#"{"ids":[7,8.5],"n":5,"ratio":2.0}"#);
}
