//! The network wall: a walled step has no route out of its room (a network namespace of its
//! own, with only its loopback). What it may reach, it reaches through a proxy in the host
//! (`proxy`), over a unix socket bound into the room, which lets through only the step's
//! allowed destinations ([`Allowed`]) and reports each refusal as a `step.egress_refused` run
//! event. In the room, `bridge` listens on loopback for the harness: the proxy's port (in
//! `HTTP_PROXY` and `HTTPS_PROXY`), and each allowed loopback destination at its own address,
//! so that a client which goes straight to a loopback base URL (as clients do, `NO_PROXY`) still
//! arrives.
//!
//! What a step may reach, by whose word:
//! - **the host's operator:** `--egress-allow`, and the model API's base URL the host's
//!   environment or the harness's own settings name (`ANTHROPIC_BASE_URL`, Codex's
//!   `model_providers.*.base_url`);
//! - **the harness's maker:** its model API's documented endpoint (`api.anthropic.com`;
//!   `api.openai.com` and `chatgpt.com` for Codex);
//! - **the workflow:** its crew node's `network.allow` and its MCP servers' URLs. A workflow is
//!   written by people the host's operator may not know: its word never reaches an address of
//!   the host's own (loopback, link-local, the cloud's metadata service), whatever a name
//!   resolves to.

use std::net::IpAddr;

use protocol::egress::Rule;

pub mod bridge;
pub mod proxy;

/// Whose word lets a destination through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Operator,
    Harness,
    Workflow,
}

/// The destinations one step may reach.
#[derive(Debug, Clone, Default)]
pub struct Allowed {
    rules: Vec<(Rule, Source)>,
}

impl Allowed {
    pub fn new(rules: impl IntoIterator<Item = (Rule, Source)>) -> Allowed {
        Allowed { rules: rules.into_iter().collect() }
    }

    /// Whose word lets `host:port` through, the operator's first; `None`: refused.
    pub fn source(&self, host: &str, port: u16) -> Option<Source> {
        self.rules.iter().filter(|(r, _)| r.allows(host, port)).map(|(_, s)| *s).min_by_key(|s| *s as u8)
    }

    /// The loopback destinations the room listens for at their own address: those named
    /// exactly (host and port) by the operator or a base URL.
    pub fn forwards(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .rules
            .iter()
            .filter(|(_, s)| *s != Source::Workflow)
            .filter_map(|(r, _)| r.exact())
            .filter(|(h, _)| *h == "localhost" || h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()))
            .map(|(h, p)| if h.contains(':') { format!("[{h}]:{p}") } else { format!("{h}:{p}") })
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// An address of the host's own, which only the operator's word reaches: loopback,
/// unspecified, link-local (the cloud's metadata service at 169.254.169.254), and IPv4 mapped
/// into IPv6.
pub fn is_hosts_own(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_unspecified() || v4.is_link_local(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_hosts_own(IpAddr::V4(v4)),
            None => v6.is_loopback() || v6.is_unspecified() || (v6.segments()[0] & 0xffc0) == 0xfe80,
        },
    }
}

/// Reads the operator's `--egress-allow` list; the error names the first bad rule.
pub fn operator_rules(list: &[String]) -> Result<Vec<Rule>, String> {
    list.iter().map(|r| r.trim()).filter(|r| !r.is_empty()).map(|r| Rule::parse(r).map_err(|why| format!("--egress-allow: {why}"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> Rule {
        Rule::parse(s).unwrap()
    }

    #[test]
    fn the_operators_word_comes_first_and_loopback_is_forwarded_only_on_it() {
        let a = Allowed::new([
            (rule("127.0.0.1:5000"), Source::Workflow),
            (rule("127.0.0.1:5000"), Source::Operator),
            (rule("127.0.0.1:6000"), Source::Workflow),
            (rule("[::1]:7000"), Source::Harness),
            (rule("*.npmjs.org"), Source::Workflow),
        ]);
        assert_eq!(a.source("127.0.0.1", 5000), Some(Source::Operator));
        assert_eq!(a.source("registry.npmjs.org", 443), Some(Source::Workflow));
        assert_eq!(a.source("example.com", 443), None);
        assert_eq!(a.forwards(), ["127.0.0.1:5000", "[::1]:7000"]);
    }

    #[test]
    fn the_hosts_own_addresses() {
        for own in ["127.0.0.1", "127.9.9.9", "0.0.0.0", "169.254.169.254", "::1", "::", "fe80::1", "::ffff:127.0.0.1"] {
            assert!(is_hosts_own(own.parse().unwrap()), "{own}");
        }
        for other in ["10.0.0.5", "93.184.216.34", "2606:4700::1111", "::ffff:1.1.1.1"] {
            assert!(!is_hosts_own(other.parse().unwrap()), "{other}");
        }
    }
}
