//! The OpenAPI 3.1 document: its header, the bearer scheme, and the problem responses that
//! every operation shares. The paths come from the router itself (`api_router`), so a route
//! cannot exist undocumented; `openapi/openapi.json` is this document, checked by a test.

use utoipa::OpenApi;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, ContentBuilder, Ref, RefOr, ResponseBuilder};

use super::error::Problem;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "shopfloor",
        description = "The REST API of shopfloor: orgs, members, tokens, projects, workflows, runs, approvals, run events and the audit log. Errors are RFC 9457 `application/problem+json`; lists take `limit` (at most 200) and an opaque `cursor`; create-POSTs accept an `Idempotency-Key`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    servers((url = "/", description = "This server")),
    security(("bearer" = [])),
    components(schemas(Problem)),
    tags(
        (name = "health", description = "Liveness, readiness and this document"),
        (name = "members", description = "People of an org and their roles"),
        (name = "tokens", description = "API tokens: created, listed, revoked"),
        (name = "projects", description = "Projects of an org"),
        (name = "workflows", description = "Versioned workflow definitions"),
        (name = "runs", description = "Runs: submit, list, inspect, cancel, retry, rerun"),
        (name = "approvals", description = "Answers to approval steps"),
        (name = "events", description = "Run events: per run, and the project stream (SSE)"),
        (name = "hosts", description = "Hosts of a project: list, registration tokens, deregistration"),
        (name = "host-protocol", description = "What `shopfloor host` calls with its host credential: register, claim, start, heartbeat, session, complete"),
        (name = "audit", description = "Who did what, when"),
    ),
)]
pub struct ApiDoc;

/// The problem responses, by status, that operations refer to.
const PROBLEMS: [(&str, &str, &str); 11] = [
    ("400", "BadRequest", "Malformed request: body, path or query parameter"),
    ("401", "Unauthorized", "Missing, invalid, expired or revoked bearer token"),
    ("403", "Forbidden", "The token's role does not allow this"),
    ("404", "NotFound", "No such org, project or object (also for another org's ids)"),
    ("409", "Conflict", "The object's state does not allow this now"),
    ("413", "PayloadTooLarge", "Request body larger than 1 MiB"),
    ("415", "UnsupportedMediaType", "Request body of the wrong content type"),
    ("422", "Unprocessable", "Well-formed request that cannot be carried out"),
    ("429", "TooManyRequests", "Over a rate limit of this token or address (`rate-limited`: wait `Retry-After` seconds), or a line that is full"),
    ("500", "Internal", "Internal error (its cause is logged, never shown)"),
    (
        "503",
        "Unavailable",
        "The database is unreachable for now, nothing was changed (`unavailable`); the change collided with another and was rolled back (`busy`); or the request took longer than the server's timeout (`timeout`). Send it again after `Retry-After` seconds",
    ),
];

/// Completes the document once every route is in it: the bearer scheme, the shared problem
/// responses, and on each operation the problems it can answer.
pub fn finish(doc: &mut utoipa::openapi::OpenApi) {
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "bearer",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .bearer_format("JWT")
                .description(Some("An API token (`shopfloor admin create-org` prints the first one)"))
                .build(),
        ),
    );
    for (_, name, description) in PROBLEMS {
        let response = ResponseBuilder::new().description(description).content(PROBLEM_TYPE, problem_content()).build();
        components.responses.insert(name.to_owned(), RefOr::T(response));
    }
    for item in doc.paths.paths.values_mut() {
        for op in [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch] {
            add_problems(op.as_mut());
        }
    }
}

/// What every text of a request may not hold: NUL, which PostgreSQL cannot store (the
/// extractors refuse it with a 400).
const NO_NUL: &str = "^[^\\x00]*$";

/// States on each text schema with no pattern, format or list of values of its own that it
/// holds no NUL: a bound the server enforces on every path, query and body. A free-form
/// object (a run's input, an approval's fields) holds `JsonValue`s, which say the same of
/// every text inside them.
pub fn no_nul_in_text(doc: &mut serde_json::Value) {
    walk(doc);
    let json_value = serde_json::json!({
        "description": "Any JSON value whose texts, keys included, hold no NUL",
        "anyOf": [
            { "type": "string", "pattern": NO_NUL },
            { "type": ["number", "boolean", "null"] },
            { "type": "array", "items": { "$ref": JSON_VALUE } },
            { "type": "object", "propertyNames": { "pattern": NO_NUL }, "additionalProperties": { "$ref": JSON_VALUE } },
        ],
    });
    if let Some(schemas) = doc.pointer_mut("/components/schemas").and_then(serde_json::Value::as_object_mut) {
        schemas.insert("JsonValue".into(), json_value);
    }
}

const JSON_VALUE: &str = "#/components/schemas/JsonValue";

fn walk(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(fields) => {
            let free_object = match fields.get("type") {
                Some(serde_json::Value::String(t)) => t == "object",
                Some(serde_json::Value::Array(ts)) => ts.iter().any(|t| t == "object"),
                _ => false,
            };
            if free_object && !["properties", "additionalProperties", "$ref", "propertyNames"].iter().any(|k| fields.contains_key(*k)) {
                fields.insert("propertyNames".into(), serde_json::json!({ "pattern": NO_NUL }));
                fields.insert("additionalProperties".into(), serde_json::json!({ "$ref": JSON_VALUE }));
            }
            let text = match fields.get("type") {
                Some(serde_json::Value::String(t)) => t == "string",
                Some(serde_json::Value::Array(ts)) => ts.iter().any(|t| t == "string"),
                _ => false,
            };
            if text && !["pattern", "format", "enum", "const"].iter().any(|k| fields.contains_key(*k)) {
                fields.insert("pattern".into(), NO_NUL.into());
            }
            fields.values_mut().for_each(walk);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
        _ => {}
    }
}

/// The content type of every error's body.
const PROBLEM_TYPE: &str = "application/problem+json";

/// An error's body: a `Problem`.
fn problem_content() -> Content {
    ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build()
}

/// Every operation can answer 429 (a rate limit), 500 and 503 (the database away, a timeout,
/// or for a write a collision to retry); an authenticated one also 400, 401, 403 and 404; one with a body also
/// 413, 415 and 422. An error an operation describes itself (`(status = 409, description =
/// "…")`) answers a `Problem` too, so its attribute need not say so.
fn add_problems(op: Option<&mut Operation>) {
    let Some(op) = op else { return };
    for (status, response) in &mut op.responses.responses {
        let RefOr::T(response) = response else { continue };
        if status.starts_with(['4', '5']) && response.content.is_empty() {
            response.content.insert(PROBLEM_TYPE.to_owned(), problem_content());
        }
    }
    let public = op.security.as_ref().is_some_and(|s| s.iter().all(|r| r == &Default::default()));
    let mut statuses: Vec<&str> = vec!["429", "500", "503"];
    if !public {
        statuses.extend(["400", "401", "403", "404"]);
    }
    if op.request_body.is_some() {
        statuses.extend(["413", "415", "422"]);
    }
    for status in statuses {
        if op.responses.responses.contains_key(status) {
            continue;
        }
        if let Some((_, name, _)) = PROBLEMS.iter().find(|(s, _, _)| *s == status) {
            op.responses.responses.insert(status.to_owned(), RefOr::Ref(Ref::new(format!("#/components/responses/{name}"))));
        }
    }
}
