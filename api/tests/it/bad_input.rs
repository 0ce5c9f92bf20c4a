//! Bad input never yields a 5xx: malformed JSON, wrong types, unknown fields, huge numbers,
//! invalid UTF-8, path traversal in ids, wrong content types, oversized bodies, unknown routes
//! and methods — each is answered with its exact 4xx and a problem+json body.

use reqwest::{Method, StatusCode};

use crate::support::{App, problem};

struct Bad {
    method: Method,
    path: String,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    want: u16,
    kind: &'static str,
}

fn bad(method: Method, path: &str, content_type: Option<&'static str>, body: &[u8], want: u16, kind: &'static str) -> Bad {
    Bad { method, path: path.to_owned(), content_type, body: body.to_vec(), want, kind }
}

#[tokio::test]
async fn bad_input_is_a_4xx_problem_never_a_5xx() {
    let app = App::with_engine().await;
    let org = app.org("acme").await;
    let p = "/api/v1/orgs/acme/projects/web";
    let run = app.created(&format!("{p}/runs"), &org.member, &serde_json::json!({ "workflow": "approve" })).await;
    let json = Some("application/json");
    let (post, get, patch, delete) = (Method::POST, Method::GET, Method::PATCH, Method::DELETE);
    let runs = format!("{p}/runs");
    let long_reason = format!("{{\"reason\": \"{}\"}}", "r".repeat(201));
    let deep = format!("{{\"workflow\":\"approve\",\"input\":{{\"x\":{}1{}}}}}", "[".repeat(5000), "]".repeat(5000));
    let mut cases = vec![
        // Malformed JSON, wrong types, unknown fields.
        bad(post.clone(), &runs, json, b"{\"workflow\": ", 400, "bad-request"),
        bad(post.clone(), &runs, json, b"", 400, "bad-request"),
        bad(post.clone(), &runs, json, b"{\"workflow\": 5}", 400, "bad-request"),
        bad(post.clone(), &runs, json, b"{\"workflow\": \"approve\", \"input\": [1]}", 400, "bad-request"),
        bad(post.clone(), &runs, json, b"{\"workflow\": \"approve\", \"extra\": 1}", 400, "bad-request"),
        bad(post.clone(), &runs, json, b"[\"approve\"]", 400, "bad-request"),
        bad(post.clone(), &runs, json, deep.as_bytes(), 400, "bad-request"),
        bad(post.clone(), "/api/v1/orgs/acme/members", json, b"{\"email\": \"a@b.c\", \"role\": \"superuser\"}", 400, "bad-request"),
        bad(patch.clone(), &format!("/api/v1/orgs/acme/members/{}", org.member_user), json, b"null", 400, "bad-request"),
        // Huge numbers.
        bad(post.clone(), &runs, json, b"{\"workflow\": \"approve\", \"version\": 1e400}", 400, "bad-request"),
        bad(post.clone(), &runs, json, b"{\"workflow\": \"approve\", \"version\": 99999999999999999999}", 400, "bad-request"),
        bad(post.clone(), &runs, json, b"{\"workflow\": \"approve\", \"version\": -2147483649}", 400, "bad-request"),
        bad(post.clone(), "/api/v1/orgs/acme/tokens", json, b"{\"name\": \"t\", \"expires_in_days\": 4294967296}", 400, "bad-request"),
        bad(post.clone(), "/api/v1/orgs/acme/tokens", json, b"{\"name\": \"t\", \"expires_in_days\": 100000}", 422, "unprocessable"),
        bad(post.clone(), &format!("{runs}/{run}/approvals/ask"), json, b"{\"ticket\": 1e999}", 400, "bad-request"),
        // Outside a documented bound: refused, never cut or lowered to fit.
        bad(post.clone(), &format!("{runs}/{run}/cancel"), json, long_reason.as_bytes(), 422, "unprocessable"),
        bad(post.clone(), &format!("{runs}/{run}/approvals/ask/reject"), json, long_reason.as_bytes(), 422, "unprocessable"),
        bad(post.clone(), "/api/v1/orgs/acme/tokens", json, format!("{{\"name\": \"{}\"}}", "n".repeat(101)).as_bytes(), 422, "unprocessable"),
        bad(post.clone(), &format!("{p}/host-registrations"), json, format!("{{\"name\": \"{}\"}}", "n".repeat(101)).as_bytes(), 422, "unprocessable"),
        bad(post.clone(), &format!("{p}/host-registrations"), json, b"{\"expires_in_hours\": 169}", 422, "unprocessable"),
        bad(Method::PUT, &format!("{p}/budgets/day"), json, b"{\"usd_limit\": 100000000}", 422, "unprocessable"),
        bad(Method::PUT, "/api/v1/orgs/acme/budgets/day", json, b"{\"usd_limit\": 99999999.999999}", 422, "unprocessable"),
        // Just past the largest: floats are read exactly, not to the nearest unit in the last place.
        bad(Method::PUT, "/api/v1/orgs/acme/budgets/day", json, b"{\"usd_limit\": 99999999.99000001}", 422, "unprocessable"),
        // NUL, which PostgreSQL cannot hold: in a JSON body and a workflow.
        bad(post.clone(), &runs, json, b"{\"workflow\": \"a\\u0000b\"}", 400, "bad-request"),
        bad(post.clone(), &runs, json, b"{\"workflow\": \"approve\", \"input\": {\"x\": \"\\u0000\"}}", 400, "bad-request"),
        bad(post.clone(), &format!("{p}/workflows"), Some("application/yaml"), b"name: a\x00b\nnodes: {}\n", 400, "bad-request"),
        bad(post.clone(), &format!("{p}/validate-workflow"), json, b"{\"source\": \"name: a\\u0000\"}", 400, "bad-request"),
        // A body that is not an object, though serde would read a struct from an array.
        bad(post.clone(), &format!("{p}/host-registrations"), json, b"[null, null]", 400, "bad-request"),
        bad(post.clone(), &format!("{runs}/{run}/cancel"), json, b"[\"why\"]", 400, "bad-request"),
        // A GitHub token that cannot be a header is refused before GitHub is asked.
        bad(post.clone(), "/api/v1/orgs/acme/github/installations", json, b"{\"installation_id\": 1, \"github_token\": \"gho_a\\nb\"}", 422, "unprocessable"),
        // Invalid UTF-8: in a JSON body and a YAML body.
        bad(post.clone(), &runs, json, b"\xff\xfe{", 400, "bad-request"),
        bad(post.clone(), &runs, json, b"{\"workflow\": \"\xff\"}", 400, "bad-request"),
        bad(post.clone(), &format!("{p}/workflows"), Some("application/yaml"), b"name: \xff\xfe\nnodes: {}\n", 400, "bad-request"),
        // Path traversal and ids that cannot be ids.
        bad(delete.clone(), "/api/v1/orgs/acme/tokens/..%2Fall", None, b"", 404, "not-found"),
        bad(patch.clone(), "/api/v1/orgs/acme/members/..%2F1", json, b"{\"role\": \"admin\"}", 404, "not-found"),
        bad(post.clone(), &format!("{runs}/run-..%2F1/cancel"), None, b"", 404, "not-found"),
        bad(Method::PUT, "/api/v1/orgs/acme/budgets/week", json, b"{\"usd_limit\": 5}", 404, "not-found"),
        bad(delete.clone(), &format!("{p}/budgets/fortnight"), None, b"", 404, "not-found"),
        bad(post.clone(), "/api/v1/orgs/acme/projects", json, b"{\"slug\": \"../etc\"}", 422, "unprocessable"),
        // Wrong content types.
        bad(post.clone(), &runs, Some("text/plain"), b"{\"workflow\": \"approve\"}", 415, "unsupported-media-type"),
        bad(post.clone(), &runs, None, b"{\"workflow\": \"approve\"}", 415, "unsupported-media-type"),
        bad(post.clone(), &format!("{p}/workflows"), Some("image/png"), b"name: x", 415, "unsupported-media-type"),
        // Domain refusals of well-formed input.
        bad(post.clone(), &runs, json, b"{\"workflow\": \"nope\"}", 404, "not-found"),
        bad(post.clone(), &runs, json, b"{\"workflow\": \"approve\", \"version\": 7}", 404, "not-found"),
        bad(post.clone(), &format!("{runs}/{run}/rerun?from=nowhere"), None, b"", 409, "conflict"),
        // Unknown routes and methods.
        bad(delete.clone(), "/api/v1/orgs/acme/projects", None, b"", 405, "method-not-allowed"),
    ];
    // GETs: each refused by its query or its path before anything is read.
    let bad_requests: [&str; 21] = [
        // Huge numbers.
        &format!("{runs}?limit=99999999999999999999"),
        &format!("{runs}?limit=-1"),
        // Outside a documented bound: refused, never cut or lowered to fit.
        &format!("{runs}?limit=2147483648"),
        &format!("{runs}?limit=201"),
        &format!("{runs}/{run}/events?limit=0"),
        "/api/v1/orgs/acme/audit?limit=500",
        // Positions past what a number holds.
        &format!("{runs}/{run}/events?after=1e999"),
        &format!("{p}/events?last_event_id=18446744073709551615.9223372036854775807"),
        &format!("{runs}/{run}/events?after=99999999999999999999"),
        // NUL, which PostgreSQL cannot hold: in a path and a query.
        &format!("{p}/workflows/a%00b"),
        &format!("{runs}?workflow=a%00b"),
        "/api/v1/orgs/acme/audit?actor=user:%00",
        // Dates PostgreSQL cannot hold.
        "/api/v1/orgs/acme/spend?to=-262143-01-01",
        "/api/v1/orgs/acme/spend?from=+262142-01-01",
        "/api/v1/orgs/acme/audit?since=-262143-01-01T00:00:00Z",
        &format!("{p}/audit?until=+262142-01-01T00:00:00Z"),
        // Invalid UTF-8 in a path.
        "/api/v1/orgs/%FF%FE/projects",
        &format!("{runs}/%FF%FE"),
        // Bad query parameters and cursors.
        &format!("{runs}?colour=blue"),
        &format!("{runs}?cursor=%00%01"),
        "/api/v1/orgs/acme/audit?since=yesterday",
    ];
    let not_found: [&str; 9] = [
        // A cursor whose key holds a NUL (base64 of `"\u0000"`): no page this server gave.
        "/api/v1/orgs/acme/projects?cursor=Ilx1MDAwMCI",
        "/api/v1/orgs/acme/members?cursor=Ilx1MDAwMCI",
        // A version past what a number holds.
        &format!("{p}/workflows/approve/versions/99999999999999999999"),
        // Path traversal and ids that cannot be ids.
        &format!("{runs}/..%2F..%2Fetc%2Fpasswd"),
        &format!("{runs}/run-..%2F..%2F"),
        &format!("{p}/workflows/..%2F..%2Fsecret"),
        "/api/v1/orgs/..%2Fother/projects",
        "/api/v1/orgs/acme/projects/..%2F..%2Fetc",
        // Unknown routes and methods.
        "/api/v1/nowhere",
    ];
    cases.extend(bad_requests.iter().map(|path| bad(get.clone(), path, None, b"", 400, "bad-request")));
    cases.extend(not_found.iter().map(|path| bad(get.clone(), path, None, b"", 404, "not-found")));
    for case in &cases {
        let mut req = app.http.request(case.method.clone(), app.url(&case.path)).bearer_auth(&org.owner).body(case.body.clone());
        if let Some(ct) = case.content_type {
            req = req.header("content-type", ct);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp.bytes().await.unwrap();
        let what = format!("{} {} {:?}", case.method, case.path, String::from_utf8_lossy(&case.body).chars().take(60).collect::<String>());
        assert_eq!(status.as_u16(), case.want, "{what}: {}", String::from_utf8_lossy(&body));
        let answer = problem(status, &headers, &body);
        assert_eq!(answer.kind, format!("https://shopfloor.dev/problems/{}", case.kind), "{what}");
    }

    // The largest documented budget is stored, not a 500 of the column's overflow.
    let most = serde_json::json!({ "usd_limit": 99_999_999.99 });
    let (status, _, body) = app.send(Method::PUT, &format!("{p}/budgets/day"), Some(&org.owner), Some(&most)).await;
    assert!(status.is_success(), "{status}: {}", String::from_utf8_lossy(&body));

    // A body over 1 MiB is refused with 413, whether its length is announced or streamed.
    let big = format!("{{\"workflow\": \"approve\", \"input\": {{\"x\": \"{}\"}}}}", "a".repeat(2 << 20));
    let resp = app.http.post(app.url(&runs)).bearer_auth(&org.member).header("content-type", "application/json").body(big.clone()).send().await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let too_large = problem(status, &headers, &resp.bytes().await.unwrap());
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(too_large.kind, "https://shopfloor.dev/problems/payload-too-large");
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big.into_bytes().chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    let streamed = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let resp = app
        .http
        .put(app.url(&format!("{p}/workflows/big")))
        .bearer_auth(&org.member)
        .header("content-type", "application/yaml")
        .body(streamed)
        .send()
        .await
        .unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    problem(status, &headers, &resp.bytes().await.unwrap());
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);

    // Bad credentials and stream positions.
    for auth in ["Bearer", "Bearer not.a.jwt", "Basic dXNlcjpwYXNz", &format!("Bearer {}", "x".repeat(10_000))] {
        let resp = app.http.get(app.url(&runs)).header("authorization", auth).send().await.unwrap();
        let (status, headers) = (resp.status(), resp.headers().clone());
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{auth:.30}");
        assert_eq!(headers.get("www-authenticate").unwrap(), "Bearer");
        problem(status, &headers, &resp.bytes().await.unwrap());
    }
    let resp = app.http.get(app.url(&format!("{p}/events"))).bearer_auth(&org.owner).header("last-event-id", "../../x").send().await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    assert_eq!(status, StatusCode::BAD_REQUEST);
    problem(status, &headers, &resp.bytes().await.unwrap());

    // Nothing above was carried out.
    let runs_made: i64 = sqlx::query_scalar("SELECT count(*) FROM runs").fetch_one(app.pool()).await.unwrap();
    assert_eq!(runs_made, 1);
    app.finish().await;
}
