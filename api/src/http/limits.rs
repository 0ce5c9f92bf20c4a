//! Abuse limits of the HTTP surface: request rates per token and per address, the cap on open
//! event streams per token, the request timeout, and bodies refused by their `Content-Length`
//! before they are read.
//!
//! **Rates** are GCRA token buckets (governor's keyed limiters), each a sustained rate and a
//! burst. What a request is charged to:
//! - A request carrying `Authorization` is charged to its token: the key is a hash of the
//!   header's value, taken *before* verification, so a token over its rate costs no database
//!   read. The text of a valid token never changes, so the hash is its identity; another text
//!   is another token, which fails verification. The host protocol (`/api/v1/host/…`) has its
//!   own, larger buckets: a host sends a session report per running step each second and a
//!   claim per freed slot, and steps that end at once (the bench's) multiply that.
//! - A request without one, and a credential that was refused (a 401), are charged to the
//!   client's address: so a spray of made-up tokens, each of them new to the token buckets, is
//!   caught here. While an address's bucket is empty, everything from it is refused, whatever
//!   it carries, but a webhook delivery whose signature holds (governor cannot look at a
//!   bucket without taking from it, so the time it is empty until is kept beside it, `dry`).
//! - The console's sign-in (`/signin/token`, `/auth/github`, `/auth/github/callback`) has a
//!   bucket per address of its own, per minute: each attempt may verify a token or call GitHub.
//! - GitHub's webhook deliveries whose signature holds are charged to nothing and refused by
//!   nothing, whatever their address's state: GitHub sends from a few addresses, in bursts as
//!   large as the events behind them, and does not send a refused delivery again, so a limit
//!   there would lose events. A delivery whose signature fails is a refused credential, charged
//!   to its address like a 401 of the API (`webhooks`).
//!
//! The address is the peer's (`ConnectInfo`), or with `SHOPFLOOR_TRUST_FORWARDED_FOR` the last
//! address of `X-Forwarded-For` (the one the proxy in front of us appended). IPv6 addresses
//! count by their /64, the smallest block one client is usually given. Without a known peer
//! (a router served without connect info, as some tests do) nothing is charged to addresses.
//!
//! Memory stays bounded: every `SWEEP_EVERY` checks a bucket set forgets the keys whose bucket
//! is full again (`retain_recent`), so it holds about the keys seen in the last burst's worth
//! of time.
//!
//! **Event streams** are counted per token (its `jti`, after verification: the stream handler
//! has the caller); a `StreamSlot` is held by the stream's body and gives its place back when
//! the body is dropped, however the stream ends.
//!
//! **The timeout** bounds how long a handler takes to answer (a slow upload included), not a
//! streamed body: an event stream answers at once and then lives as long as its client. The
//! host `claim` long poll gets its own bound, its 30 s wait and a margin.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use sha2::{Digest, Sha256};

use super::error::ApiError;
pub use super::error::retry_after_secs;

/// The host protocol's routes, which have their own token buckets.
const HOST_PREFIX: &str = "/api/v1/host/";
/// The long poll, which may legitimately wait `MAX_WAIT_SECS`.
const CLAIM_PATH: &str = "/api/v1/host/claim";
/// The longest a host's claim waits (`host_protocol::claim`): here, since its request's time
/// bound is this and `CLAIM_MARGIN`.
pub const MAX_WAIT_SECS: u32 = 30;
/// What the claim's bound adds to its longest wait: its last look and its answer.
const CLAIM_MARGIN: Duration = Duration::from_secs(15);
/// Checks between two sweeps of a bucket set.
const SWEEP_EVERY: u64 = 4096;
/// More emptied addresses than this and the expired ones are forgotten at once.
const DRY_SWEEP_AT: usize = 10_000;

/// The abuse limits: `SHOPFLOOR_RATE_PER_TOKEN` (50 requests per second, burst
/// `SHOPFLOOR_RATE_PER_TOKEN_BURST` 500), `SHOPFLOOR_RATE_PER_HOST` (500, burst
/// `SHOPFLOOR_RATE_PER_HOST_BURST` 5,000: host credentials on the host protocol),
/// `SHOPFLOOR_RATE_PER_ADDRESS` (20, burst `SHOPFLOOR_RATE_PER_ADDRESS_BURST` 200: requests
/// without a credential and refused credentials), `SHOPFLOOR_SIGNIN_PER_MINUTE` (30, burst
/// `SHOPFLOOR_SIGNIN_BURST` 30: console sign-in attempts per address),
/// `SHOPFLOOR_TRUST_FORWARDED_FOR` (off), `SHOPFLOOR_REQUEST_TIMEOUT_SECS` (30),
/// `SHOPFLOOR_STREAMS_PER_TOKEN` (8). A rate of 0 turns that limit off, and so does a timeout
/// of 0.
#[derive(Debug, Clone, clap::Args)]
pub struct LimitArgs {
    /// Requests per second one token may send to the REST API, sustained.
    #[arg(long = "rate-per-token", env = "SHOPFLOOR_RATE_PER_TOKEN", default_value_t = 50)]
    pub per_token: u32,
    /// Requests one token may send at once beyond its sustained rate.
    #[arg(long = "rate-per-token-burst", env = "SHOPFLOOR_RATE_PER_TOKEN_BURST", default_value_t = 500)]
    pub per_token_burst: u32,
    /// Requests per second one host credential may send to the host protocol, sustained.
    #[arg(long = "rate-per-host", env = "SHOPFLOOR_RATE_PER_HOST", default_value_t = 500)]
    pub per_host: u32,
    /// Requests one host credential may send at once beyond its sustained rate.
    #[arg(long = "rate-per-host-burst", env = "SHOPFLOOR_RATE_PER_HOST_BURST", default_value_t = 5_000)]
    pub per_host_burst: u32,
    /// Requests per second from one address without a credential, or with one that was
    /// refused, sustained. While an address is over it, everything from it is refused.
    #[arg(long = "rate-per-address", env = "SHOPFLOOR_RATE_PER_ADDRESS", default_value_t = 20)]
    pub per_address: u32,
    /// Such requests one address may send at once beyond its sustained rate.
    #[arg(long = "rate-per-address-burst", env = "SHOPFLOOR_RATE_PER_ADDRESS_BURST", default_value_t = 200)]
    pub per_address_burst: u32,
    /// Console sign-in attempts (token, GitHub, GitHub's callback) per minute from one address.
    #[arg(long = "signin-per-minute", env = "SHOPFLOOR_SIGNIN_PER_MINUTE", default_value_t = 30)]
    pub signin_per_minute: u32,
    /// Sign-in attempts one address may make at once.
    #[arg(long = "signin-burst", env = "SHOPFLOOR_SIGNIN_BURST", default_value_t = 30)]
    pub signin_burst: u32,
    /// Take the client's address from the last `X-Forwarded-For` entry. Only behind a proxy
    /// that sets it, and only when clients cannot reach this server past that proxy: anyone
    /// else could name any address.
    #[arg(long = "trust-forwarded-for", env = "SHOPFLOOR_TRUST_FORWARDED_FOR", default_value_t = false)]
    pub trust_forwarded_for: bool,
    /// Seconds a request may take before it is answered 503 (event streams and the host claim
    /// excepted: a stream answers at once, a claim gets its 30 s wait and a margin).
    #[arg(long = "request-timeout-secs", env = "SHOPFLOOR_REQUEST_TIMEOUT_SECS", default_value_t = 30)]
    pub request_timeout_secs: u64,
    /// Streams one token may hold open at once (event streams and the console's live
    /// transcripts); the next is refused with 429.
    #[arg(long = "streams-per-token", env = "SHOPFLOOR_STREAMS_PER_TOKEN", default_value_t = 8)]
    pub streams_per_token: usize,
}

impl Default for LimitArgs {
    fn default() -> Self {
        LimitArgs {
            per_token: 50,
            per_token_burst: 500,
            per_host: 500,
            per_host_burst: 5_000,
            per_address: 20,
            per_address_burst: 200,
            signin_per_minute: 30,
            signin_burst: 30,
            trust_forwarded_for: false,
            request_timeout_secs: 30,
            streams_per_token: 8,
        }
    }
}

/// One bucket per key, or none when the limit is off.
struct Buckets<K: Hash + Eq + Clone> {
    limiter: Option<DefaultKeyedRateLimiter<K>>,
    checks: AtomicU64,
}

impl<K: Hash + Eq + Clone> Buckets<K> {
    fn new(quota: impl FnOnce(NonZeroU32) -> Quota, rate: u32, burst: u32) -> Self {
        let limiter = NonZeroU32::new(rate).map(|r| {
            let burst = NonZeroU32::new(burst).unwrap_or(r);
            RateLimiter::dashmap(quota(r).allow_burst(burst))
        });
        Buckets { limiter, checks: AtomicU64::new(0) }
    }

    /// Takes a request from `key`'s bucket, or says how long until it holds one.
    fn take(&self, key: &K) -> Result<(), Duration> {
        let Some(limiter) = &self.limiter else { return Ok(()) };
        if self.checks.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
        limiter.check_key(key).map_err(|not_until| not_until.wait_time_from(limiter.clock().now()))
    }
}

/// The replica's limiters and open-stream counts (in `AppState`, built once at start).
pub struct Limits {
    tokens: Buckets<[u8; 16]>,
    hosts: Buckets<[u8; 16]>,
    addresses: Buckets<IpAddr>,
    signins: Buckets<IpAddr>,
    /// Addresses whose bucket ran dry, and until when it stays empty.
    dry: Mutex<HashMap<IpAddr, Instant>>,
    /// Open event streams by token `jti`; a token with none has no entry.
    streams: Mutex<HashMap<uuid::Uuid, usize>>,
    trust_forwarded_for: bool,
    timeout: Option<Duration>,
    max_streams: usize,
}

impl Limits {
    pub fn new(args: &LimitArgs) -> Limits {
        Limits {
            tokens: Buckets::new(Quota::per_second, args.per_token, args.per_token_burst),
            hosts: Buckets::new(Quota::per_second, args.per_host, args.per_host_burst),
            addresses: Buckets::new(Quota::per_second, args.per_address, args.per_address_burst),
            signins: Buckets::new(Quota::per_minute, args.signin_per_minute, args.signin_burst),
            dry: Mutex::default(),
            streams: Mutex::default(),
            trust_forwarded_for: args.trust_forwarded_for,
            timeout: (args.request_timeout_secs > 0).then(|| Duration::from_secs(args.request_timeout_secs)),
            max_streams: args.streams_per_token,
        }
    }

    /// The client's address, as the limits count it (see the module's header).
    pub fn address(&self, request: &Request) -> Option<IpAddr> {
        let forwarded = self.trust_forwarded_for.then(|| last_forwarded(request.headers())).flatten();
        let peer = || request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
        forwarded.or_else(peer).map(block)
    }

    /// How long `address` stays refused, if its bucket ran dry.
    pub fn refused(&self, address: IpAddr) -> Option<Duration> {
        let dry = self.dry.lock().unwrap_or_else(PoisonError::into_inner);
        let until = *dry.get(&address)?;
        until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())
    }

    /// Charges one request to `address` (one without a credential, or a refused one).
    pub fn charge_address(&self, address: IpAddr) -> Result<(), Duration> {
        self.addresses.take(&address).inspect_err(|wait| {
            let mut dry = self.dry.lock().unwrap_or_else(PoisonError::into_inner);
            if dry.len() >= DRY_SWEEP_AT {
                let now = Instant::now();
                dry.retain(|_, until| *until > now);
            }
            dry.insert(address, Instant::now() + *wait);
        })
    }

    /// Charges one sign-in attempt to `address`.
    pub fn charge_signin(&self, address: IpAddr) -> Result<(), Duration> {
        self.signins.take(&address)
    }

    /// How long the request at `path` may take, if it is bounded.
    pub fn timeout_for(&self, path: &str) -> Option<Duration> {
        let timeout = self.timeout?;
        if path == CLAIM_PATH {
            return Some(timeout.max(Duration::from_secs(u64::from(MAX_WAIT_SECS)) + CLAIM_MARGIN));
        }
        Some(timeout)
    }

    /// A place for one more event stream of the token `jti`, held until the slot is dropped.
    pub fn open_stream(self: &Arc<Self>, jti: uuid::Uuid) -> Result<StreamSlot, ApiError> {
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        let open = streams.entry(jti).or_default();
        if *open >= self.max_streams {
            let max = self.max_streams;
            if *open == 0 {
                streams.remove(&jti);
            }
            return Err(ApiError::TooManyRequests(format!("this token already has {max} event streams open; close one first")));
        }
        *open += 1;
        Ok(StreamSlot { limits: self.clone(), jti })
    }
}

/// One open event stream's place; given back when dropped.
pub struct StreamSlot {
    limits: Arc<Limits>,
    jti: uuid::Uuid,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut streams = self.limits.streams.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(open) = streams.get_mut(&self.jti) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                streams.remove(&self.jti);
            }
        }
    }
}

/// The last address of the last `X-Forwarded-For` header: the one our proxy appended.
fn last_forwarded(headers: &HeaderMap) -> Option<IpAddr> {
    let value = headers.get_all("x-forwarded-for").iter().next_back()?.to_str().ok()?;
    let last = value.rsplit(',').next()?.trim();
    last.parse::<IpAddr>().ok().or_else(|| last.parse::<SocketAddr>().ok().map(|s| s.ip()))
}

/// The key an address counts under: IPv4 as it is (also when mapped into IPv6), IPv6 by /64.
fn block(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(v6.to_bits() & !u128::from(u64::MAX))),
        },
    }
}

/// The token bucket key of a credential: the first half of the SHA-256 of the header's value.
fn credential_key(headers: &HeaderMap) -> Option<[u8; 16]> {
    let value = headers.get(header::AUTHORIZATION)?;
    let digest = Sha256::digest(value.as_bytes());
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest[..16]);
    Some(key)
}

/// The declared length of a request's body, when it says one.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

/// The REST API's rates (see the module's header); layered around every REST route.
pub async fn rates(State(limits): State<Arc<Limits>>, request: Request, next: Next) -> Response {
    let address = limits.address(&request);
    if let Some(wait) = address.and_then(|a| limits.refused(a)) {
        return ApiError::RateLimited(wait).into_response();
    }
    let credential = credential_key(request.headers());
    match (credential, address) {
        (Some(key), _) => {
            let buckets = if request.uri().path().starts_with(HOST_PREFIX) { &limits.hosts } else { &limits.tokens };
            if let Err(wait) = buckets.take(&key) {
                return ApiError::RateLimited(wait).into_response();
            }
        }
        (None, Some(address)) => {
            if let Err(wait) = limits.charge_address(address) {
                return ApiError::RateLimited(wait).into_response();
            }
        }
        (None, None) => {}
    }
    let response = next.run(request).await;
    if let (Some(_), Some(address)) = (credential, address) {
        if response.status() == StatusCode::UNAUTHORIZED {
            // The answer stands; what follows from this address may be refused.
            let _ = limits.charge_address(address);
        }
    }
    response
}

/// Answers 503 when a request takes longer than its bound (`Limits::timeout_for`).
pub async fn timeout(State(limits): State<Arc<Limits>>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let Some(bound) = limits.timeout_for(&path) else { return next.run(request).await };
    match tokio::time::timeout(bound, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(http.method = %method, http.path = %path, timeout_secs = bound.as_secs(), "a request took too long and was stopped");
            ApiError::TimedOut(bound).into_response()
        }
    }
}

/// Refuses a body whose `Content-Length` is over the REST API's limit before reading it (a
/// chunked body is still cut at the limit while it is read).
pub async fn declared_body_limit(request: Request, next: Next) -> Response {
    if declared_length(request.headers()).is_some_and(|n| n > super::error::BODY_LIMIT as u64) {
        return ApiError::PayloadTooLarge.into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_count_by_ipv4_or_ipv6_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(block(a), block(b));
        assert_ne!(block(a), block(c));
        assert_eq!(block("::ffff:192.0.2.7".parse().unwrap()), "192.0.2.7".parse::<IpAddr>().unwrap());
        assert_eq!(block("192.0.2.7".parse().unwrap()), "192.0.2.7".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn the_last_forwarded_address_is_the_proxys_word() {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", "203.0.113.9, 198.51.100.1".parse().unwrap());
        h.append("x-forwarded-for", "192.0.2.5".parse().unwrap());
        assert_eq!(last_forwarded(&h), Some("192.0.2.5".parse().unwrap()));
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", "203.0.113.9, not an address".parse().unwrap());
        assert_eq!(last_forwarded(&h), None);
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(10)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2_001)), 3);
    }

    #[test]
    fn an_emptied_address_stays_refused_until_its_bucket_refills() {
        let limits = Limits::new(&LimitArgs { per_address: 1, per_address_burst: 2, ..LimitArgs::default() });
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        assert!(limits.charge_address(ip).is_ok() && limits.charge_address(ip).is_ok());
        assert_eq!(limits.refused(ip), None);
        let wait = limits.charge_address(ip).unwrap_err();
        // One address a second: the next cell comes within the second, so the answer says 1.
        assert!(wait > Duration::ZERO, "{wait:?}");
        assert_eq!(retry_after_secs(wait), 1, "{wait:?}");
        assert!(limits.refused(ip).is_some());
        assert_eq!(limits.refused("192.0.2.2".parse().unwrap()), None);
    }

    #[test]
    fn stream_slots_come_back_when_dropped() {
        let limits = Arc::new(Limits::new(&LimitArgs { streams_per_token: 2, ..LimitArgs::default() }));
        let jti = uuid::Uuid::new_v4();
        let a = limits.open_stream(jti).unwrap();
        let _b = limits.open_stream(jti).unwrap();
        assert!(limits.open_stream(jti).is_err());
        assert!(limits.open_stream(uuid::Uuid::new_v4()).is_ok(), "another token has its own places");
        drop(a);
        let _c = limits.open_stream(jti).unwrap();
        drop((_b, _c));
        assert!(limits.streams.lock().unwrap().is_empty(), "a token with no stream has no entry");
    }
}
