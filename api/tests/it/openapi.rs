//! The OpenAPI document: `openapi/openapi.json` is what the code generates (a drift test that
//! rewrites the file and fails, so the difference is committed), and it is a valid OpenAPI 3.1
//! document whose references all resolve and whose path templates match their parameters.

use std::collections::BTreeSet;
use std::path::PathBuf;

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../openapi/openapi.json")
}

fn generated() -> String {
    let mut text = serde_json::to_string_pretty(&api::http::openapi()).expect("the document serializes");
    text.push('\n');
    text
}

#[test]
fn the_committed_document_is_the_generated_one() {
    let fresh = generated();
    let path = committed_path();
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed == fresh {
        return;
    }
    std::fs::write(&path, &fresh).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    // `make openapi` sets this: regenerating is then the point, not a failure.
    if std::env::var_os("SHOPFLOOR_OPENAPI_WRITE").is_some() {
        return;
    }
    panic!("openapi/openapi.json differed from the code and has been rewritten: review it and commit it (`make openapi` does the same)");
}

#[test]
fn the_document_is_valid_openapi_3_1() {
    let text = generated();
    let spec = oas3::from_json(&text).unwrap_or_else(|e| panic!("not an OpenAPI 3.1 document: {e}"));
    let version = spec.validate_version().expect("a supported openapi version");
    assert_eq!((version.major, version.minor), (3, 1), "openapi: {}", spec.openapi);

    let mut ids = BTreeSet::new();
    for (path, method, op) in spec.operations() {
        let what = format!("{method} {path}");
        let id = op.operation_id.clone().unwrap_or_else(|| panic!("{what} has no operationId"));
        assert!(ids.insert(id.clone()), "operationId {id} is used twice");
        assert!(op.summary.is_some() || op.description.is_some(), "{what} is not described");
        // Every $ref resolves: parameters, body, responses and their schemas.
        let params = op.parameters(&spec).unwrap_or_else(|e| panic!("{what}: a parameter does not resolve: {e}"));
        if let Some(body) = op.request_body(&spec).unwrap_or_else(|e| panic!("{what}: the body does not resolve: {e}")) {
            for (ct, media) in &body.content {
                media.schema(&spec).unwrap_or_else(|e| panic!("{what} {ct}: the body schema does not resolve: {e}"));
            }
        }
        let responses = op.responses(&spec);
        assert_eq!(responses.len(), op.responses.as_ref().map_or(0, |r| r.len()), "{what}: a response does not resolve");
        assert!(responses.keys().any(|s| s.starts_with('2')), "{what} documents no success");
        for (status, response) in &responses {
            for (ct, media) in &response.content {
                media.schema(&spec).unwrap_or_else(|e| panic!("{what} {status} {ct}: the schema does not resolve: {e}"));
            }
        }
        // Path templates and path parameters name the same things.
        let templated: BTreeSet<String> = path.split('/').filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}'))).map(str::to_owned).collect();
        let declared: BTreeSet<String> = params.iter().filter(|p| p.location == oas3::spec::ParameterIn::Path).map(|p| p.name.clone()).collect();
        assert_eq!(templated, declared, "{what}: path parameters");
        // Authenticated operations document the problems every request can meet.
        if !path.ends_with("healthz") && !path.ends_with("readyz") && !path.ends_with("openapi.json") {
            for status in ["400", "401", "403", "404", "500"] {
                assert!(responses.contains_key(status), "{what} does not document {status}");
            }
        }
    }
    assert!(ids.len() >= 30, "only {} operations documented", ids.len());
}

/// Every bound a handler enforces on a list is in the document: each `limit` parameter says
/// 1 to the largest page, which is what the handlers accept (a value outside is refused, see
/// `paging`); every text a request carries says it holds no NUL, which the extractors refuse;
/// a free-form object says the same of the texts inside it.
#[test]
fn the_document_states_the_bounds_the_handlers_enforce() {
    let doc: serde_json::Value = serde_json::from_str(&generated()).unwrap();
    let mut limits = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for p in op["parameters"].as_array().map(Vec::as_slice).unwrap_or_default() {
                let s = &p["schema"];
                if p["name"] == "limit" && p["in"] == "query" {
                    limits += 1;
                    assert_eq!((s["minimum"].as_u64(), s["maximum"].as_u64()), (Some(1), Some(u64::from(api::http::page::MAX_LIMIT))), "{method} {path}: {s}");
                }
                if s["type"] == "string" {
                    assert!(s.get("pattern").or(s.get("format")).or(s.get("enum")).is_some(), "{method} {path}: {} says nothing of NUL: {s}", p["name"]);
                }
            }
        }
    }
    assert!(limits >= 10, "only {limits} lists");
    let schemas = &doc["components"]["schemas"];
    assert_eq!(schemas["SubmitRun"]["properties"]["input"]["additionalProperties"]["$ref"], "#/components/schemas/JsonValue");
    assert_eq!(schemas["SetBoardLimit"]["properties"]["column"]["minLength"], 1);
    let spend = &doc["paths"]["/api/v1/orgs/{org}/spend"]["get"];
    let from = spend["parameters"].as_array().unwrap().iter().find(|p| p["name"] == "from").unwrap();
    assert_eq!(from["schema"]["format"], "date", "{from}");
}
