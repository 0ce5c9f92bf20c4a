//! Which network targets an outgoing webhook may reach. A tenant's admin chooses the URL and
//! our servers send to it, so without a wall a URL could reach what only the server can:
//! loopback services, the private network, a cloud's metadata endpoint (SSRF).
//!
//! URLs are parsed by the `url` crate (WHATWG), the parser reqwest sends with, so the host we
//! judge is the host reqwest connects to: `2130706433`, `0x7f000001`, `0177.0.0.1` and `127.1`
//! all become `127.0.0.1` before anything here looks at them. IPv6 addresses that carry an
//! IPv4 address (mapped, compatible, translated, NAT64, 6to4, Teredo) are judged by the
//! address they carry, since that is where the packets end up.
//!
//! A URL is checked when a subscription is made and again at each send; a name is judged
//! again after resolution by [`VettedResolver`], the resolver of the delivery client, so the
//! addresses judged are the addresses connected to (no window for DNS rebinding between a
//! check and the connect).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::{Host, Url};

/// Which targets outgoing webhooks may reach. The default refuses every internal one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// `SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE`: loopback, private (RFC 1918, RFC 4193) and
    /// carrier-grade NAT targets and local names are allowed, for on-premises installs and
    /// tests. Link-local, metadata, unspecified, multicast and reserved targets stay refused:
    /// no receiver lives there, and link-local is where clouds keep their metadata.
    pub allow_private: bool,
}

/// What kind of internal target an address or name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inside {
    Loopback,
    /// RFC 1918, RFC 4193 (`fc00::/7`), deprecated site-local, and local-only names.
    Private,
    /// `100.64.0.0/10`, carrier-grade NAT (RFC 6598).
    SharedAddressSpace,
    LinkLocal,
    /// A cloud's instance metadata service.
    Metadata,
    Unspecified,
    Multicast,
    Broadcast,
    Documentation,
    /// Special-purpose and unallocated space that no public receiver uses.
    Reserved,
}

impl Inside {
    /// The kind in words, to follow "is": `127.0.0.1 is a loopback address`.
    pub fn words(self) -> &'static str {
        match self {
            Inside::Loopback => "a loopback address",
            Inside::Private => "a private address",
            Inside::SharedAddressSpace => "a carrier-grade NAT address",
            Inside::LinkLocal => "a link-local address",
            Inside::Metadata => "a cloud metadata address",
            Inside::Unspecified => "the unspecified address",
            Inside::Multicast => "a multicast address",
            Inside::Broadcast => "the broadcast address",
            Inside::Documentation => "a documentation address",
            Inside::Reserved => "a reserved address",
        }
    }

    /// Whether `Policy::allow_private` lets a target of this kind through.
    fn private_network(self) -> bool {
        matches!(self, Inside::Loopback | Inside::Private | Inside::SharedAddressSpace)
    }
}

/// Why a URL may not be a webhook's target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("url must be an http:// or https:// URL")]
    NotHttp,
    #[error("url must not carry a user name or password")]
    Userinfo,
    /// The URL's host, as parsed (numeric spellings already normalized), is internal.
    #[error("{host} is {}", kind.words())]
    Host { host: String, kind: Inside },
    /// At send time: a name resolved to an internal address. Which address is not said: the
    /// server's resolver would otherwise tell a tenant about the internal network's names.
    #[error("{name} resolves to an internal address")]
    Resolved { name: String },
}

impl Policy {
    /// Whether an address may be connected to.
    pub fn permits(self, ip: IpAddr) -> bool {
        self.permits_kind(classify(ip))
    }

    fn permits_kind(self, kind: Option<Inside>) -> bool {
        match kind {
            None => true,
            Some(kind) => self.allow_private && kind.private_network(),
        }
    }

    /// Parses a webhook's target URL and checks its scheme, userinfo and host.
    pub fn target(self, url: &str) -> Result<Url, Refused> {
        let url = Url::parse(url).map_err(|_| Refused::NotHttp)?;
        self.check(&url)?;
        Ok(url)
    }

    /// Checks a parsed URL: `http` or `https`, no userinfo, and a host that is not internal
    /// (an IP address by its range, a name by the names that are local everywhere; what a
    /// name resolves to is checked by [`VettedResolver`] when it is connected to).
    pub fn check(self, url: &Url) -> Result<(), Refused> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Refused::NotHttp);
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(Refused::Userinfo);
        }
        let kind = match url.host() {
            None => return Err(Refused::NotHttp),
            Some(Host::Ipv4(ip)) => classify_v4(ip),
            Some(Host::Ipv6(ip)) => classify_v6(ip),
            Some(Host::Domain(name)) => classify_name(name),
        };
        match kind {
            Some(kind) if !self.permits_kind(Some(kind)) => Err(Refused::Host { host: url.host_str().unwrap_or_default().to_owned(), kind }),
            _ => Ok(()),
        }
    }
}

/// The kind of internal address `ip` is; `None` for a public one.
pub fn classify(ip: IpAddr) -> Option<Inside> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// Whether `ip` lies in `net/len`.
fn in_v4(ip: Ipv4Addr, net: [u8; 4], len: u32) -> bool {
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn in_v6(ip: Ipv6Addr, net: Ipv6Addr, len: u32) -> bool {
    let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
    u128::from(ip) & mask == u128::from(net) & mask
}

/// Metadata services: AWS, GCP, Azure, Oracle and others at 169.254.169.254; AWS's ECS and
/// EKS credential endpoints; Alibaba's; Azure's WireServer (a public-looking address every
/// Azure VM reaches).
const METADATA_V4: [Ipv4Addr; 5] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(169, 254, 170, 2),
    Ipv4Addr::new(169, 254, 170, 23),
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(168, 63, 129, 16),
];

/// AWS's IPv6 metadata and EKS credential endpoints (inside `fc00::/7`, named for the reason).
const METADATA_V6: [Ipv6Addr; 2] = [Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x254), Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x23)];

fn classify_v4(ip: Ipv4Addr) -> Option<Inside> {
    // Most specific first: metadata addresses sit inside link-local and CGNAT space.
    let table: [([u8; 4], u32, Inside); 17] = [
        ([0, 0, 0, 0], 32, Inside::Unspecified),
        ([255, 255, 255, 255], 32, Inside::Broadcast),
        ([0, 0, 0, 0], 8, Inside::Reserved),
        ([10, 0, 0, 0], 8, Inside::Private),
        ([100, 64, 0, 0], 10, Inside::SharedAddressSpace),
        ([127, 0, 0, 0], 8, Inside::Loopback),
        ([169, 254, 0, 0], 16, Inside::LinkLocal),
        ([172, 16, 0, 0], 12, Inside::Private),
        ([192, 0, 0, 0], 24, Inside::Reserved),
        ([192, 0, 2, 0], 24, Inside::Documentation),
        ([192, 88, 99, 0], 24, Inside::Reserved),
        ([192, 168, 0, 0], 16, Inside::Private),
        ([198, 18, 0, 0], 15, Inside::Reserved),
        ([198, 51, 100, 0], 24, Inside::Documentation),
        ([203, 0, 113, 0], 24, Inside::Documentation),
        ([224, 0, 0, 0], 4, Inside::Multicast),
        ([240, 0, 0, 0], 4, Inside::Reserved),
    ];
    if METADATA_V4.contains(&ip) {
        return Some(Inside::Metadata);
    }
    table.iter().find(|(net, len, _)| in_v4(ip, *net, *len)).map(|(_, _, kind)| *kind)
}

fn classify_v6(ip: Ipv6Addr) -> Option<Inside> {
    if ip.is_unspecified() {
        return Some(Inside::Unspecified);
    }
    if ip.is_loopback() {
        return Some(Inside::Loopback);
    }
    if METADATA_V6.contains(&ip) {
        return Some(Inside::Metadata);
    }
    if let Some(v4) = embedded_v4(ip) {
        return match classify_v4(v4) {
            // IPv4-compatible addresses (`::a.b.c.d`) are deprecated: nothing public uses them.
            None if in_v6(ip, Ipv6Addr::UNSPECIFIED, 96) => Some(Inside::Reserved),
            kind => kind,
        };
    }
    let v6 = |s: &str| s.parse::<Ipv6Addr>().expect("a literal address");
    let table: [(&str, u32, Inside); 9] = [
        ("64:ff9b:1::", 48, Inside::Private),
        ("100::", 64, Inside::Reserved),
        ("2001:2::", 48, Inside::Reserved),
        ("2001:10::", 28, Inside::Reserved),
        ("2001:20::", 28, Inside::Reserved),
        ("2001:db8::", 32, Inside::Documentation),
        ("3fff::", 20, Inside::Documentation),
        ("fc00::", 7, Inside::Private),
        ("fec0::", 10, Inside::Private),
    ];
    if let Some((_, _, kind)) = table.iter().find(|(net, len, _)| in_v6(ip, v6(net), *len)) {
        return Some(*kind);
    }
    if in_v6(ip, v6("fe80::"), 10) {
        return Some(Inside::LinkLocal);
    }
    if ip.is_multicast() {
        return Some(Inside::Multicast);
    }
    // Only 2000::/3 is allocated as global unicast; everything else is not a public receiver.
    if !in_v6(ip, v6("2000::"), 3) {
        return Some(Inside::Reserved);
    }
    None
}

/// The IPv4 address an IPv6 address carries, where packets to it end up: IPv4-mapped
/// `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d`, IPv4-translated `::ffff:0:a.b.c.d`, NAT64
/// `64:ff9b::a.b.c.d`, 6to4 `2002:AABB:CCDD::/48`, and a Teredo client (`2001:0::/32`, its
/// address inverted in the last 32 bits).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(ip);
    let low = Ipv4Addr::from(bits as u32);
    let v6 = |s: &str| s.parse::<Ipv6Addr>().expect("a literal address");
    if in_v6(ip, v6("::ffff:0:0"), 96) || in_v6(ip, Ipv6Addr::UNSPECIFIED, 96) || in_v6(ip, v6("::ffff:0:0:0"), 96) || in_v6(ip, v6("64:ff9b::"), 96) {
        return Some(low);
    }
    if in_v6(ip, v6("2002::"), 16) {
        return Some(Ipv4Addr::from((bits >> 80) as u32));
    }
    if in_v6(ip, v6("2001::"), 32) {
        return Some(Ipv4Addr::from(!(bits as u32)));
    }
    None
}

/// Names that are internal wherever they are resolved: `localhost` and `*.localhost`
/// (RFC 6761), the metadata services' names, and names of private-use domains (`.internal`,
/// `.local`, `.home.arpa`) or of no domain at all (a single label, completed by the server's
/// search domains). Any other name is judged by what it resolves to, when it is sent to.
fn classify_name(name: &str) -> Option<Inside> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    const METADATA: [&str; 5] = ["metadata.google.internal", "metadata.goog", "metadata", "instance-data", "instance-data.ec2.internal"];
    if METADATA.contains(&name.as_str()) {
        return Some(Inside::Metadata);
    }
    if name == "localhost" || name.ends_with(".localhost") {
        return Some(Inside::Loopback);
    }
    let local_domain = [".internal", ".local", ".home.arpa", ".localdomain"].iter().any(|d| name.ends_with(d));
    if local_domain || !name.contains('.') {
        return Some(Inside::Private);
    }
    None
}

/// The delivery client's resolver: it resolves through `inner` and refuses a name when any of
/// its addresses is one the policy refuses (an attacker's name may answer a public address
/// and an internal one, hoping the connector tries both). The connector connects only to the
/// addresses this answers, so what was checked is what is reached. IP-literal hosts never
/// reach a resolver; [`Policy::check`] judges them before the send.
pub struct VettedResolver {
    inner: Arc<dyn Resolve>,
    policy: Policy,
}

impl VettedResolver {
    pub fn new(inner: Arc<dyn Resolve>, policy: Policy) -> VettedResolver {
        VettedResolver { inner, policy }
    }
}

impl Resolve for VettedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy;
        let host = name.as_str().to_owned();
        let lookup = self.inner.resolve(name);
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = lookup.await?.collect();
            if addrs.is_empty() || addrs.iter().any(|a| !policy.permits(a.ip())) {
                return Err(Box::new(Refused::Resolved { name: host }) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// The system's resolver (`getaddrinfo` on a blocking thread, as reqwest's own does).
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PUBLIC: Policy = Policy { allow_private: false };
    const ON_PREM: Policy = Policy { allow_private: true };

    fn kind_of(url: &str, policy: Policy) -> Option<Inside> {
        match policy.target(url) {
            Ok(_) => None,
            Err(Refused::Host { kind, .. }) => Some(kind),
            Err(e) => panic!("{url}: {e}"),
        }
    }

    #[test]
    fn every_spelling_of_an_internal_address_is_refused() {
        let cases = [
            // Loopback, in every numeric spelling the WHATWG parser accepts.
            ("http://127.0.0.1:8080/hook", Inside::Loopback),
            ("http://127.255.255.254/", Inside::Loopback),
            ("http://2130706433/", Inside::Loopback),
            ("http://0x7f000001/", Inside::Loopback),
            ("http://0x7f.0.0.1/", Inside::Loopback),
            ("http://0177.0.0.1/", Inside::Loopback),
            ("http://017700000001/", Inside::Loopback),
            ("http://127.1/", Inside::Loopback),
            ("http://127.0.1/", Inside::Loopback),
            ("http://127.0.0.1./", Inside::Loopback),
            ("http://%31%32%37.0.0.1/", Inside::Loopback),
            ("http://\u{ff11}\u{ff12}\u{ff17}.\u{ff10}.\u{ff10}.\u{ff11}/", Inside::Loopback),
            ("http://127\u{3002}0\u{3002}0\u{3002}1/", Inside::Loopback),
            ("http://[::1]/", Inside::Loopback),
            ("http://[0:0:0:0:0:0:0:1]/", Inside::Loopback),
            ("http://[::ffff:127.0.0.1]/", Inside::Loopback),
            ("http://[::ffff:7f00:1]/", Inside::Loopback),
            ("http://[::127.0.0.1]/", Inside::Loopback),
            ("http://[::ffff:0:127.0.0.1]/", Inside::Loopback),
            ("http://[64:ff9b::127.0.0.1]/", Inside::Loopback),
            ("http://[64:ff9b::7f00:1]/", Inside::Loopback),
            ("http://[2002:7f00:1::]/", Inside::Loopback),
            ("http://[2002:7f00:0001:ffff::1]/", Inside::Loopback),
            ("http://localhost/", Inside::Loopback),
            ("http://LOCALHOST./", Inside::Loopback),
            ("http://api.localhost:3000/", Inside::Loopback),
            // Unspecified (which Linux routes to loopback).
            ("http://0.0.0.0/", Inside::Unspecified),
            ("http://0/", Inside::Unspecified),
            ("http://[::]/", Inside::Unspecified),
            ("http://[::ffff:0.0.0.0]/", Inside::Unspecified),
            // Private.
            ("http://10.0.0.5/", Inside::Private),
            ("http://167772165/", Inside::Private),
            ("http://0xa000005/", Inside::Private),
            ("http://012.0.0.5/", Inside::Private),
            ("http://172.16.0.1/", Inside::Private),
            ("http://172.31.255.255/", Inside::Private),
            ("http://192.168.1.1/", Inside::Private),
            ("http://[::ffff:192.168.1.1]/", Inside::Private),
            ("http://[::ffff:c0a8:101]/", Inside::Private),
            ("http://[64:ff9b::10.1.2.3]/", Inside::Private),
            ("http://[2002:c0a8:101::1]/", Inside::Private),
            ("http://[fc00::1]/", Inside::Private),
            ("http://[fd12:3456::1]/", Inside::Private),
            ("http://[fec0::1]/", Inside::Private),
            ("http://[64:ff9b:1::a00:1]/", Inside::Private),
            ("http://db.internal/", Inside::Private),
            ("http://printer.local/", Inside::Private),
            ("http://nas.home.arpa/", Inside::Private),
            ("http://intranet/", Inside::Private),
            // Carrier-grade NAT.
            ("http://100.64.0.1/", Inside::SharedAddressSpace),
            ("http://100.127.255.255/", Inside::SharedAddressSpace),
            ("http://[::ffff:100.64.0.1]/", Inside::SharedAddressSpace),
            // Link-local.
            ("http://169.254.1.1/", Inside::LinkLocal),
            ("http://[fe80::1]/", Inside::LinkLocal),
            ("http://[febf::1]/", Inside::LinkLocal),
            // Metadata services, by address and name, in their other spellings too.
            ("http://169.254.169.254/latest/meta-data/", Inside::Metadata),
            ("http://2852039166/", Inside::Metadata),
            ("http://0xa9fea9fe/", Inside::Metadata),
            ("http://0251.0376.0251.0376/", Inside::Metadata),
            ("http://169.254.43518/", Inside::Metadata),
            ("http://[::ffff:169.254.169.254]/", Inside::Metadata),
            ("http://[::ffff:a9fe:a9fe]/", Inside::Metadata),
            ("http://[64:ff9b::a9fe:a9fe]/", Inside::Metadata),
            ("http://[2002:a9fe:a9fe::]/", Inside::Metadata),
            ("http://169.254.170.2/v2/credentials", Inside::Metadata),
            ("http://100.100.100.200/", Inside::Metadata),
            ("http://168.63.129.16/", Inside::Metadata),
            ("http://[fd00:ec2::254]/", Inside::Metadata),
            ("http://metadata.google.internal/computeMetadata/v1/", Inside::Metadata),
            ("http://metadata.google.internal./", Inside::Metadata),
            ("http://metadata/", Inside::Metadata),
            // Multicast and broadcast.
            ("http://224.0.0.1/", Inside::Multicast),
            ("http://239.255.255.250/", Inside::Multicast),
            ("http://[ff02::1]/", Inside::Multicast),
            ("http://[::ffff:224.0.0.1]/", Inside::Multicast),
            ("http://255.255.255.255/", Inside::Broadcast),
            ("http://4294967295/", Inside::Broadcast),
            // Reserved and special-purpose.
            ("http://0.1.2.3/", Inside::Reserved),
            ("http://192.0.0.8/", Inside::Reserved),
            ("http://198.18.0.1/", Inside::Reserved),
            ("http://198.19.255.255/", Inside::Reserved),
            ("http://240.0.0.1/", Inside::Reserved),
            ("http://192.88.99.1/", Inside::Reserved),
            ("http://[::8.8.8.8]/", Inside::Reserved),
            ("http://[100::1]/", Inside::Reserved),
            ("http://[2001:2::1]/", Inside::Reserved),
            ("http://[4000::1]/", Inside::Reserved),
            // Documentation.
            ("http://192.0.2.1/", Inside::Documentation),
            ("http://198.51.100.7/", Inside::Documentation),
            ("http://203.0.113.9/", Inside::Documentation),
            ("http://[2001:db8::1]/", Inside::Documentation),
        ];
        for (url, want) in cases {
            assert_eq!(kind_of(url, PUBLIC), Some(want), "{url}");
        }
    }

    #[test]
    fn teredo_is_judged_by_its_client() {
        // Client 127.0.0.1 is stored inverted: 0x80ff_fffe.
        assert_eq!(classify("2001:0:4136:e378:8000:63bf:80ff:fffe".parse().unwrap()), Some(Inside::Loopback));
        // Client 8.8.8.8 (inverted f7f7:f7f7) is public.
        assert_eq!(classify("2001:0:4136:e378:8000:63bf:f7f7:f7f7".parse().unwrap()), None);
    }

    #[test]
    fn public_targets_pass() {
        for url in [
            "https://hooks.example.com/shopfloor",
            "http://hooks.example.com:8080/x?y=1",
            "https://8.8.8.8/",
            "http://134744072/",
            "https://1.1.1.1:8443/",
            "https://[2606:4700:4700::1111]/",
            "https://[::ffff:8.8.8.8]/",
            "https://[64:ff9b::8.8.8.8]/",
            "https://[2002:808:808::1]/",
            "http://100.128.0.1/",
            "http://172.32.0.1/",
            "http://169.255.0.1/",
            "http://localhost.example.com/",
            "http://internal.example.com/",
        ] {
            assert_eq!(PUBLIC.target(url).map(|_| ()), Ok(()), "{url}");
        }
    }

    #[test]
    fn only_http_without_userinfo() {
        for url in ["ftp://example.com/", "file:///etc/passwd", "gopher://example.com/", "example.com/hook", "http://", "not a url"] {
            assert_eq!(PUBLIC.target(url).map(|_| ()), Err(Refused::NotHttp), "{url}");
        }
        for url in ["http://user@example.com/", "http://user:pass@example.com/", "https://:pass@example.com/", "http://example.com@127.0.0.1/"] {
            assert_eq!(PUBLIC.target(url).map(|_| ()), Err(Refused::Userinfo), "{url}");
        }
    }

    #[test]
    fn allowing_private_lets_in_the_private_network_and_nothing_else() {
        for url in [
            "http://127.0.0.1:9/",
            "http://2130706433/",
            "http://[::1]/",
            "http://[::ffff:7f00:1]/",
            "http://10.1.2.3/",
            "http://192.168.0.10/",
            "http://[fd12::1]/",
            "http://100.64.1.1/",
            "http://localhost:8080/",
            "http://receiver/",
            "http://db.internal/",
        ] {
            assert_eq!(ON_PREM.target(url).map(|_| ()), Ok(()), "{url}");
        }
        let still = [
            ("http://169.254.169.254/", Inside::Metadata),
            ("http://[fd00:ec2::254]/", Inside::Metadata),
            ("http://metadata.google.internal/", Inside::Metadata),
            ("http://169.254.1.1/", Inside::LinkLocal),
            ("http://0.0.0.0/", Inside::Unspecified),
            ("http://[::]/", Inside::Unspecified),
            ("http://224.0.0.1/", Inside::Multicast),
            ("http://255.255.255.255/", Inside::Broadcast),
            ("http://240.0.0.1/", Inside::Reserved),
        ];
        for (url, want) in still {
            assert_eq!(kind_of(url, ON_PREM), Some(want), "{url}");
        }
    }

    #[test]
    fn the_reason_names_the_normalized_host() {
        assert_eq!(PUBLIC.target("http://0x7f000001/").unwrap_err().to_string(), "127.0.0.1 is a loopback address");
        assert_eq!(PUBLIC.target("http://[::ffff:169.254.169.254]/").unwrap_err().to_string(), "[::ffff:a9fe:a9fe] is a cloud metadata address");
    }

    /// A resolver with fixed answers.
    struct Fixed(Vec<IpAddr>);

    impl Resolve for Fixed {
        fn resolve(&self, _: Name) -> Resolving {
            let addrs: Vec<SocketAddr> = self.0.iter().map(|ip| SocketAddr::new(*ip, 0)).collect();
            Box::pin(async move { Ok(Box::new(addrs.into_iter()) as Addrs) })
        }
    }

    async fn resolve(answers: &[&str], policy: Policy) -> Result<Vec<SocketAddr>, String> {
        let fixed = Fixed(answers.iter().map(|a| a.parse().unwrap()).collect());
        let vetted = VettedResolver::new(Arc::new(fixed), policy);
        let name: Name = "hooks.example.com".parse().unwrap();
        vetted.resolve(name).await.map(Iterator::collect).map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn a_name_is_refused_when_any_of_its_addresses_is_internal() {
        assert_eq!(resolve(&["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"], PUBLIC).await.map(|a| a.len()), Ok(2));
        let refused = Err("hooks.example.com resolves to an internal address".to_owned());
        assert_eq!(resolve(&["127.0.0.1"], PUBLIC).await, refused);
        assert_eq!(resolve(&["93.184.215.14", "10.0.0.1"], PUBLIC).await, refused);
        assert_eq!(resolve(&["::ffff:169.254.169.254"], PUBLIC).await, refused);
        assert_eq!(resolve(&[], PUBLIC).await, refused);
        assert_eq!(resolve(&["127.0.0.1"], ON_PREM).await.map(|a| a.len()), Ok(1));
        assert_eq!(resolve(&["169.254.169.254"], ON_PREM).await, refused);
    }
}
