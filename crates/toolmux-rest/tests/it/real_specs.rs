//! Imports real OpenAPI documents from npm test peers: GitHub's REST API description and
//! the examples of `@readme/oas-examples` in Swagger 2.0, OpenAPI 3.0 and 3.1.
#![allow(clippy::unwrap_used)]

use crate::common::{check_tools, count_operations, npm_file};
use serde_json::Value;
use toolmux_rest::{OpenApiConfig, RestProvider, Selector};

fn load(path: &std::path::Path) -> (String, Value) {
    let text = std::fs::read_to_string(path).unwrap();
    let value = serde_json::from_str(&text).unwrap();
    (text, value)
}

#[test]
fn github_imports_every_operation_with_valid_schemas() {
    let path = npm_file("@octokit/openapi", "generated/api.github.com.json");
    let (text, doc) = load(&path);
    for include_deprecated in [false, true] {
        let config =
            OpenApiConfig { include_deprecated, max_tools: Some(5000), ..OpenApiConfig::default() };
        let github =
            RestProvider::openapi_from_text("github", &text, "api.github.com.json", &config)
                .unwrap();
        let tools = github.specs();
        assert_eq!(tools.len(), count_operations(&doc, include_deprecated));
        if include_deprecated {
            assert!(tools.len() >= 1223, "{}", tools.len());
            continue;
        }
        let failures = check_tools("github", &tools);
        assert!(
            failures.is_empty(),
            "{} failures:\n{}",
            failures.len(),
            failures[..failures.len().min(30)].join("\n")
        );
        assert!(github.warnings().is_empty(), "{:?}", github.warnings());
        // Output schemas for most operations, none of them huge (a listing carries them).
        let typed: Vec<usize> = tools
            .iter()
            .filter_map(|t| t.output_schema.as_ref().map(|s| s.to_string().len()))
            .collect();
        assert!(typed.len() > 600, "{} tools with an output schema", typed.len());
        assert!(typed.iter().all(|&bytes| bytes <= 32 * 1024), "{:?}", typed.iter().max());
        let get_content = tools.iter().find(|t| t.name == "repos_get_content").unwrap();
        let props = &get_content.input_schema["properties"];
        for arg in ["owner", "repo", "path", "ref"] {
            assert!(props.get(arg).is_some(), "{arg} missing in {props}");
        }
    }
}

#[test]
fn github_selection_by_tag_path_and_method() {
    let path = npm_file("@octokit/openapi", "generated/api.github.com.json");
    let (text, doc) = load(&path);
    let config = OpenApiConfig {
        include: Some(Selector {
            tags: vec!["issues".into()],
            methods: vec!["GET".into()],
            ..Selector::default()
        }),
        exclude: Some(Selector {
            paths: vec!["/repos/*/*/issues/comments/**".into()],
            ..Selector::default()
        }),
        ..OpenApiConfig::default()
    };
    let issues = RestProvider::openapi_from_text("issues", &text, "gh", &config).unwrap();
    let mut expected = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let Some(op) = item.get("get") else { continue };
        let tagged = op["tags"].as_array().is_some_and(|t| t.iter().any(|t| t == "issues"));
        let deprecated = op.get("deprecated") == Some(&Value::Bool(true));
        if tagged && !deprecated && !path.starts_with("/repos/{owner}/{repo}/issues/comments") {
            expected += 1;
        }
    }
    assert!(expected > 5);
    assert_eq!(issues.specs().len(), expected);
    assert!(issues.specs().iter().all(|t| t.annotations.read_only));
}

#[test]
fn github_has_more_tools_than_the_default_threshold_and_warns() {
    let path = npm_file("@octokit/openapi", "generated/api.github.com.json");
    let (text, _) = load(&path);
    let github = RestProvider::openapi_from_text(
        "github",
        &text,
        "api.github.com.json",
        &OpenApiConfig::default(),
    )
    .unwrap();
    assert_eq!(github.warnings().len(), 1);
    assert!(
        github.warnings()[0].contains("more than the 128 set by `maxTools`"),
        "{}",
        github.warnings()[0]
    );
}

/// Every example document of `@readme/oas-examples` in JSON and YAML.
fn readme_examples() -> Vec<std::path::PathBuf> {
    let root = npm_file("@readme/oas-examples", "3.0/json/petstore.json");
    let root = root.parent().unwrap().parent().unwrap().parent().unwrap().to_owned();
    let mut files = Vec::new();
    for version in ["2.0", "3.0", "3.1"] {
        for format in ["json", "yaml"] {
            let dir = root.join(version).join(format);
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_file() {
                    files.push(path);
                }
            }
        }
    }
    files.sort();
    files
}

#[test]
fn readme_examples_import_with_valid_schemas() {
    let files = readme_examples();
    assert!(files.len() > 60, "{}", files.len());
    let mut failures = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let doc: Value = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).unwrap()
        } else {
            serde_yaml_ng::from_str(&text).unwrap()
        };
        let name = path
            .strip_prefix(path.parent().unwrap().parent().unwrap().parent().unwrap())
            .unwrap()
            .display()
            .to_string();
        let config = OpenApiConfig { include_deprecated: true, ..OpenApiConfig::default() };
        match RestProvider::openapi_from_text("ex", &text, &name, &config) {
            Ok(provider) => {
                let tools = provider.specs();
                let expected = count_operations(&doc, true);
                if tools.len() != expected {
                    failures
                        .push(format!("{name}: {} tools for {expected} operations", tools.len()));
                }
                failures
                    .extend(check_tools("ex", &tools).into_iter().map(|f| format!("{name}: {f}")));
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn documents_load_from_files_relative_to_the_base_dir() {
    let petstore = npm_file("@readme/oas-examples", "3.1/yaml/petstore.yaml");
    let dir = petstore.parent().unwrap().parent().unwrap();
    let config = OpenApiConfig::from_file("yaml/petstore.yaml").with_base_dir(dir);
    let provider = RestProvider::openapi("petstore", &config).await.unwrap();
    let names: Vec<String> = provider.specs().into_iter().map(|t| t.name).collect();
    assert!(names.contains(&"find_pets_by_status".to_owned()), "{names:?}");

    let missing = OpenApiConfig::from_file("yaml/nope.yaml").with_base_dir(dir);
    let err = RestProvider::openapi("petstore", &missing).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "cannot read OpenAPI document `{}`: No such file or directory (os error 2)",
            dir.join("yaml/nope.yaml").display()
        )
    );
    let neither = RestProvider::openapi("petstore", &OpenApiConfig::default()).await.unwrap_err();
    assert_eq!(
        neither.to_string(),
        "invalid configuration of `petstore`: set `spec` (a file) or `url`"
    );
}
