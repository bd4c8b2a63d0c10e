//! External `$ref`s of OpenAPI documents: files beside a document read from a file, URLs
//! of the same origin for one read from a URL, and what they may never reach (files
//! outside the document's folder unless `refDirs` names them, local files from a URL,
//! another origin, a URL from a file), and what a document file may be (a regular file of
//! 64 MiB at most).
#![allow(clippy::unwrap_used)]

use crate::common::{Reply, keeping_server, serve};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::{Arc, Mutex};
use toolmux_core::{CallContext, ToolProvider};
use toolmux_rest::{OpenApiConfig, RestProvider};

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A document in `api/` whose operations reach files beside it, in folders below it,
/// back into itself, in a cycle of two files, outside its folder and on the web.
fn files(base: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let api = dir.path().join("api");
    write(
        &api,
        "openapi.yaml",
        &format!(
            r##"openapi: 3.0.3
info: {{title: pets, version: "1"}}
servers: [{{url: "{base}"}}]
paths:
  /pets:
    post:
      operationId: addPet
      requestBody:
        content:
          application/json:
            schema: {{$ref: "./schemas/pet.yaml#/Pet"}}
  /owners:
    $ref: "paths/owners.yaml"
  /outside:
    post:
      operationId: outside
      requestBody:
        content:
          application/json:
            schema: {{$ref: "../shared/thing.yaml#/Thing"}}
  /web:
    post:
      operationId: web
      requestBody:
        content:
          application/json:
            schema: {{$ref: "{base}/thing.yaml#/Thing"}}
components:
  schemas:
    Name: {{type: string, minLength: 1}}
"##
        ),
    );
    write(
        &api,
        "schemas/pet.yaml",
        r##"Pet:
  type: object
  required: [name]
  properties:
    name: {$ref: "../openapi.yaml#/components/schemas/Name"}
    owner: {$ref: "owner.yaml#/Owner"}
    tag: {$ref: "./tag.json"}
"##,
    );
    write(
        &api,
        "schemas/owner.yaml",
        r##"Owner:
  type: object
  properties:
    id: {type: integer}
    pets: {type: array, items: {$ref: "pet.yaml#/Pet"}}
"##,
    );
    write(&api, "schemas/tag.json", r#"{"type": "string", "maxLength": 8}"#);
    write(
        &api,
        "paths/owners.yaml",
        "get:\n  operationId: listOwners\n  parameters: [{$ref: \"../params.yaml#/limit\"}]\n",
    );
    write(&api, "params.yaml", "limit: {name: limit, in: query, schema: {type: integer}}\n");
    write(
        dir.path(),
        "shared/thing.yaml",
        "Thing: {type: object, properties: {x: {type: string}}}\n",
    );
    dir
}

fn schema_of(provider: &RestProvider, tool: &str) -> Value {
    let spec = provider.specs().into_iter().find(|t| t.name == tool).unwrap();
    (*spec.input_schema).clone()
}

/// Relative file references are followed from a document read from a file: beside it,
/// below it, back into it and around a cycle of two files; what is outside its folder
/// (and a URL) is left out with a warning saying why and how to allow it.
#[tokio::test]
async fn relative_file_references_are_followed_within_the_documents_folder() {
    let (base, seen) = keeping_server().await;
    let dir = files(&base);
    let config = OpenApiConfig::from_file("api/openapi.yaml").with_base_dir(dir.path());
    let provider = RestProvider::openapi("pets", &config).await.unwrap();
    let mut names: Vec<String> = provider.specs().into_iter().map(|t| t.name).collect();
    names.sort();
    assert_eq!(names, ["add_pet", "list_owners"]);
    let add = schema_of(&provider, "add_pet");
    assert_eq!(add["properties"]["name"], json!({"$ref": "#/$defs/Name"}));
    assert_eq!(add["properties"]["tag"], json!({"$ref": "#/$defs/tag"}));
    assert_eq!(add["properties"]["owner"], json!({"$ref": "#/$defs/Owner"}));
    let defs: Vec<&String> = add["$defs"].as_object().unwrap().keys().collect();
    assert_eq!(defs, ["Name", "Owner", "Pet", "tag"]);
    assert_eq!(
        add["$defs"]["Owner"]["properties"]["pets"]["items"],
        json!({"$ref": "#/$defs/Pet"})
    );
    assert_eq!(add["$defs"]["tag"], json!({"type": "string", "maxLength": 8}));
    assert_eq!(
        schema_of(&provider, "list_owners")["properties"]["limit"],
        json!({"type": "integer"})
    );
    let warnings = provider.warnings().join("\n");
    let outside = dir.path().join("shared/thing.yaml");
    assert!(
        warnings.contains(&format!(
            "external reference `{}#/Thing` is not followed: the file is outside the document's \
             folder; name its folder in the import's `refDirs` to read it",
            outside.display()
        )),
        "{warnings}"
    );
    assert!(
        warnings.contains(&format!(
            "external reference `{base}/thing.yaml#/Thing` is not followed: a document read \
             from a file follows references to files only"
        )),
        "{warnings}"
    );
    let out = provider
        .call(
            "add_pet",
            json!({"name": "Rex", "tag": "dog", "owner": {"id": 1}}),
            &CallContext::new(),
        )
        .await
        .unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let body: Value = serde_json::from_slice(&seen.lock().unwrap()[0].body).unwrap();
    assert_eq!(body, json!({"name": "Rex", "tag": "dog", "owner": {"id": 1}}));
}

/// A folder named in `refDirs` (relative to the configuration's folder) may be read.
#[tokio::test]
async fn ref_dirs_allow_files_outside_the_documents_folder() {
    let (base, _) = keeping_server().await;
    let dir = files(&base);
    let mut config = OpenApiConfig::from_file("api/openapi.yaml").with_base_dir(dir.path());
    config.ref_dirs = vec!["shared".into()];
    let provider = RestProvider::openapi("pets", &config).await.unwrap();
    let mut names: Vec<String> = provider.specs().into_iter().map(|t| t.name).collect();
    names.sort();
    assert_eq!(names, ["add_pet", "list_owners", "outside"]);
    assert_eq!(schema_of(&provider, "outside")["properties"]["x"], json!({"type": "string"}));
}

/// A document read from a URL follows relative references on its own origin, and never
/// reads a local file or another origin for them.
#[tokio::test]
async fn url_documents_follow_references_on_their_own_origin_only() {
    let fetched: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = fetched.clone();
    let base = serve(move |request| {
        let line = request.request_line().to_owned();
        log.lock().unwrap().push(line.clone());
        let path = line.split(' ').nth(1).unwrap_or_default().to_owned();
        match path.as_str() {
            "/specs/v1/openapi.json" => Reply::json(
                200,
                json!({"openapi": "3.1.0", "info": {"title": "w", "version": "1"},
                    "servers": [{"url": "https://api.example"}],
                    "paths": {
                        "/pets": {"post": {"operationId": "addPet", "requestBody": {"content": {
                            "application/json": {"schema": {"$ref": "pet.json#/Pet"}}}}}},
                        "/local": {"post": {"operationId": "local", "requestBody": {"content": {
                            "application/json": {"schema": {"$ref": "file:///etc/hostname"}}}}}},
                        "/away": {"post": {"operationId": "away", "requestBody": {"content": {
                            "application/json": {"schema": {"$ref": "http://127.0.0.2:1/x.json"}}}}}}}}),
            ),
            "/specs/v1/pet.json" => Reply::json(
                200,
                json!({"Pet": {"type": "object", "properties": {"kind": {"$ref": "../common/kind.json"}}}}),
            ),
            "/specs/common/kind.json" => Reply::json(200, json!({"enum": ["cat", "dog"]})),
            _ => Reply::json(404, json!({})),
        }
    })
    .await;
    let config = OpenApiConfig::from_url(format!("{base}/specs/v1/openapi.json"));
    let provider = RestProvider::openapi("web", &config).await.unwrap();
    let mut names: Vec<String> = provider.specs().into_iter().map(|t| t.name).collect();
    names.sort();
    assert_eq!(names, ["add_pet"]);
    assert_eq!(
        schema_of(&provider, "add_pet")["properties"]["kind"],
        json!({"$ref": "#/$defs/kind"})
    );
    let warnings = provider.warnings().join("\n");
    assert!(
        warnings.contains(
            "external reference `file:///etc/hostname` is not followed: a document read from a \
             URL follows references on its own origin only"
        ),
        "{warnings}"
    );
    assert!(warnings.contains("`http://127.0.0.2:1/x.json` is not followed"), "{warnings}");
    let lines = fetched.lock().unwrap().clone();
    assert_eq!(lines.len(), 3, "{lines:?}");
}

/// Errors inside an external file name that file and the place in it.
#[tokio::test]
async fn errors_in_external_files_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "openapi.yaml",
        "openapi: 3.0.3\ninfo: {title: t, version: '1'}\nservers: [{url: 'http://127.0.0.1:1'}]\n\
         paths:\n  /a:\n    post:\n      operationId: a\n      requestBody:\n        content:\n          \
         application/json:\n            schema: {$ref: 'pet.yaml#/Pet'}\n  /b:\n    get:\n      \
         operationId: b\n      parameters: [{$ref: 'missing.yaml#/p'}]\n  /c:\n    get: {operationId: c}\n",
    );
    write(dir.path(), "pet.yaml", "Pet: {properties: {x: {$ref: '#/Nope'}}}\n");
    let config = OpenApiConfig::from_file(dir.path().join("openapi.yaml"));
    let provider = RestProvider::openapi("t", &config).await.unwrap();
    let warnings = provider.warnings().join("\n");
    assert!(
        warnings
            .contains("pet.yaml: at /Pet/properties/x/$ref: dangling reference `pet.yaml#/Nope`"),
        "{warnings}"
    );
    assert!(
        warnings.contains("external reference `missing.yaml#/p` is not followed: cannot read it:"),
        "{warnings}"
    );
}

/// A chain of files naming files ends after 16 of them: the reference beyond is not
/// followed, saying so, and only the operation reaching it is left out.
#[tokio::test]
async fn chains_of_files_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "openapi.yaml",
        "openapi: 3.0.3\ninfo: {title: t, version: '1'}\nservers: [{url: 'http://127.0.0.1:1'}]\n\
         paths:\n  /a:\n    post:\n      operationId: a\n      requestBody:\n        content:\n          \
         application/json:\n            schema: {$ref: 'f1.yaml'}\n  /b:\n    get: {operationId: b}\n",
    );
    for n in 1..=17 {
        write(
            dir.path(),
            &format!("f{n}.yaml"),
            &format!("properties:\n  x: {{$ref: 'f{}.yaml'}}\n", n + 1),
        );
    }
    write(dir.path(), "f18.yaml", "type: string\n");
    let config = OpenApiConfig::from_file(dir.path().join("openapi.yaml"));
    let provider = RestProvider::openapi("t", &config).await.unwrap();
    let names: Vec<String> = provider.specs().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["b"]);
    let warnings = provider.warnings().join("\n");
    assert!(
        warnings.contains(
            "f16.yaml: at /properties/x/$ref: external reference `f17.yaml` is not followed: \
             references nest more than 16 files deep"
        ),
        "{warnings}"
    );
}

/// A document given as text has no folder of its own: its relative references name files
/// in the folders of `refDirs` (relative to the configuration's folder), looked up in
/// order, and the files they reach follow theirs from their own folders; a file outside
/// every folder of `refDirs` is not read. Called, the operation sends what the file says.
#[tokio::test]
async fn a_text_document_follows_references_into_its_ref_dirs() {
    let (base, seen) = keeping_server().await;
    let dir = files(&base);
    write(dir.path(), "empty/.keep", "");
    write(dir.path(), "secret.yaml", "Secret: {type: string}\n");
    let text = format!(
        r##"openapi: 3.1.0
info: {{title: pets, version: "1"}}
servers: [{{url: "{base}"}}]
paths:
  /pets:
    post:
      operationId: addPet
      requestBody:
        content:
          application/json:
            schema: {{$ref: "schemas/pet.yaml#/Pet"}}
  /escape:
    post:
      operationId: escape
      requestBody:
        content:
          application/json:
            schema: {{$ref: "../secret.yaml#/Secret"}}
components:
  schemas:
    Name: {{type: string}}
"##
    );
    let mut config = OpenApiConfig::default().with_base_dir(dir.path());
    config.ref_dirs = vec!["empty".into(), "api".into()];
    let provider = RestProvider::openapi_from_text("pets", &text, "inline", &config).unwrap();
    let names: Vec<String> = provider.specs().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["add_pet"], "{:?}", provider.warnings());
    let add = schema_of(&provider, "add_pet");
    let defs: Vec<&String> = add["$defs"].as_object().unwrap().keys().collect();
    assert_eq!(defs, ["Name", "Owner", "Pet", "tag"]);
    let warnings = provider.warnings().join("\n");
    assert!(
        warnings.contains(
            "is not followed: the file is outside every folder of `refDirs`; name its folder \
             in the import's `refDirs` to read it"
        ),
        "{warnings}"
    );
    let args = json!({"name": "Rex", "tag": "dog", "owner": {"id": 1}});
    let out = provider.call("add_pet", args.clone(), &CallContext::new()).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let body: Value = serde_json::from_slice(&seen.lock().unwrap()[0].body).unwrap();
    assert_eq!(body, args);
}

/// Without `refDirs`, a document given as text follows no external reference: the
/// operations reaching one are left out, the warning naming the reference, saying the
/// document was given as text and how to give its files; the others are imported.
#[tokio::test]
async fn a_text_document_without_ref_dirs_says_how_to_give_its_files() {
    let (base, seen) = keeping_server().await;
    let doc = json!({"openapi": "3.1.0", "info": {"title": "t", "version": "1"},
        "servers": [{"url": base}],
        "paths": {
            "/pets": {"post": {"operationId": "addPet", "requestBody": {"content": {
                "application/json": {"schema": {"$ref": "./pet.yaml#/Pet"}}}}}},
            "/ping": {"get": {"operationId": "ping"}}}});
    let provider =
        RestProvider::openapi_from_value("t", doc, "inline", &OpenApiConfig::default()).unwrap();
    let names: Vec<String> = provider.specs().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["ping"]);
    assert_eq!(
        provider.warnings(),
        ["inline: at /paths/~1pets/post/requestBody/content/application~1json/schema/$ref: \
          external reference `./pet.yaml#/Pet` is not followed: the document was given as \
          text, so it has no folder to look the file up in; give the document as a file \
          (`spec`) instead, or name the folders of its files in the import's `refDirs`; \
          operation `POST /pets` (`addPet`) is left out"]
    );
    let out = provider.call("ping", json!({}), &CallContext::new()).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    assert_eq!(seen.lock().unwrap().len(), 1);
}

/// Makes a FIFO at `path` with the system's `mkfifo`.
fn fifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .current_dir(path.parent().unwrap())
        .status()
        .unwrap();
    assert!(status.success());
}

async fn spec_error(config: &OpenApiConfig) -> String {
    let import = RestProvider::openapi("s", config);
    let result = tokio::time::timeout(std::time::Duration::from_secs(20), import)
        .await
        .expect("the import ended within 20 s");
    result.unwrap_err().to_string()
}

/// A `spec` file is read as a regular file of 64 MiB at most, as a URL's document is:
/// `/dev/zero` was read until memory ran out and a FIFO held the import until something
/// wrote to it. A missing file's error says why, as the OS does.
#[tokio::test]
async fn a_spec_file_is_a_regular_file_of_64_mib_at_most() {
    let dir = tempfile::tempdir().unwrap();
    let config = |path: &str| OpenApiConfig::from_file(path).with_base_dir(dir.path());
    let err = spec_error(&config("/dev/zero")).await;
    assert_eq!(
        err,
        "cannot read OpenAPI document `/dev/zero`: it is a character device, not a regular \
         file: give the document as a file or a URL"
    );
    fifo(&dir.path().join("pipe.yaml"));
    let err = spec_error(&config("pipe.yaml")).await;
    assert!(err.ends_with("pipe.yaml`: it is a FIFO (named pipe), not a regular file: give the document as a file or a URL"), "{err}");
    let large = std::fs::File::create(dir.path().join("large.yaml")).unwrap();
    large.set_len((64 << 20) + 1).unwrap();
    let err = spec_error(&config("large.yaml")).await;
    assert!(err.ends_with("large.yaml`: it is larger than 64 MiB, the most a document may be: split it into files its `$ref`s name"), "{err}");
    let err = spec_error(&config("missing.yaml")).await;
    assert!(err.ends_with("missing.yaml`: No such file or directory (os error 2)"), "{err}");
}

/// An external file that is a FIFO leaves its operation out, where reading it held the
/// import until something wrote to it.
#[tokio::test]
async fn an_external_fifo_leaves_its_operation_out() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "openapi.yaml",
        r##"openapi: 3.0.3
info: {title: t, version: "1"}
servers: [{url: "http://127.0.0.1:9"}]
paths:
  /piped:
    post:
      operationId: piped
      requestBody:
        content:
          application/json:
            schema: {$ref: "./pipe.yaml#/Thing"}
  /plain:
    get: {operationId: plain}
"##,
    );
    fifo(&dir.path().join("pipe.yaml"));
    let config = OpenApiConfig::from_file("openapi.yaml").with_base_dir(dir.path());
    let import = RestProvider::openapi("t", &config);
    let provider = tokio::time::timeout(std::time::Duration::from_secs(20), import)
        .await
        .expect("the import ended within 20 s")
        .unwrap();
    let names: Vec<String> = provider.specs().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["plain"]);
    let warnings = provider.warnings().join("\n");
    assert!(warnings.contains("it is a FIFO (named pipe), not a regular file"), "{warnings}");
}
