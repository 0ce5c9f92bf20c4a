//! The headers every response carries, whatever answered it (a handler, an extractor's
//! rejection, an error page, a fallback): no MIME sniffing, no referrer sent off the site, no
//! framing, a Content-Security-Policy (the console's for HTML, none allowed for the rest), no
//! caching unless the answer says otherwise (static files do), and HSTS when the server's public
//! URL is `https://`. A header the answer set itself is left as it is.

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;

/// The console's pages: their own scripts and styles only, forms posted to this site or to an
/// `https:` one (GitHub's sign-in), never framed.
const HTML_POLICY: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self' https:";
/// Everything else (JSON, problem documents, event streams): nothing to load, never framed.
const DATA_POLICY: &str = "default-src 'none'; frame-ancestors 'none'";
/// Two years, the preload list's minimum.
const HSTS: &str = "max-age=63072000; includeSubDomains";

/// Whether responses say HSTS: the server is reached over `https://`.
#[derive(Debug, Clone, Copy)]
pub struct Tls(pub bool);

/// Adds the headers a response lacks.
pub async fn harden(State(Tls(tls)): State<Tls>, request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let html = response.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|t| t.starts_with("text/html"));
    let headers = response.headers_mut();
    let mut default = |name: HeaderName, value: &'static str| {
        headers.entry(name).or_insert(HeaderValue::from_static(value));
    };
    default(header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    default(header::REFERRER_POLICY, "same-origin");
    default(header::X_FRAME_OPTIONS, "DENY");
    default(header::CONTENT_SECURITY_POLICY, if html { HTML_POLICY } else { DATA_POLICY });
    default(header::CACHE_CONTROL, "no-store");
    if tls {
        default(header::STRICT_TRANSPORT_SECURITY, HSTS);
    }
    response
}
