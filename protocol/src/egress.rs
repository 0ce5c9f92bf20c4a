//! Where a crew step may connect through its host's proxy: a rule is written `host`,
//! `host:port`, `*.domain` or `*.domain:port` (a crew node's `network.allow`, the host's
//! `--egress-allow`). A rule without a port lets through 443 and 80; `*.domain` is every name
//! under the domain, not the domain itself (as GitHub's and Anthropic's allowlists read it).

use std::fmt;

/// One allowed destination pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    host: Host,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    /// This name or address, lowercase, without brackets.
    Exact(String),
    /// Any name ending in `.` and this.
    Under(String),
}

/// The longest name a rule takes (DNS's limit).
const NAME_MAX: usize = 253;

impl Rule {
    /// Reads a rule; the error says what a rule looks like.
    pub fn parse(text: &str) -> Result<Rule, String> {
        let bad = |why: &str| format!("`{text}` is not a destination: {why} (write `host`, `host:port` or `*.domain`)");
        let t = text.trim();
        let (host, port) = split_host_port(t).ok_or_else(|| bad("its port is not a number from 1 to 65535"))?;
        let host = host.to_ascii_lowercase();
        let host = host.strip_suffix('.').unwrap_or(&host).to_owned();
        if host.is_empty() || host.len() > NAME_MAX {
            return Err(bad("name a host"));
        }
        if host.parse::<std::net::IpAddr>().is_ok() {
            return Ok(Rule { host: Host::Exact(host), port });
        }
        let (wild, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest.to_owned()),
            None => (false, host),
        };
        let label_ok =
            |l: &str| !l.is_empty() && l.len() <= 63 && !l.starts_with('-') && !l.ends_with('-') && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if !name.split('.').all(label_ok) {
            return Err(bad("a host is letters, digits, `-` and dots, with `*.` only in front"));
        }
        if wild && !name.contains('.') {
            return Err(bad("`*.` takes a domain with a dot (`*.example.com`), not a whole top-level domain"));
        }
        Ok(Rule { host: if wild { Host::Under(name) } else { Host::Exact(name) }, port })
    }

    /// Whether a connection to `host` (a name or an address, as the client wrote it) at `port`
    /// is let through.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => port == 443 || port == 80,
        };
        let host = normalize(host);
        port_ok
            && match &self.host {
                Host::Exact(h) => *h == host,
                Host::Under(d) => host.len() > d.len() + 1 && host.ends_with(d.as_str()) && host.as_bytes()[host.len() - d.len() - 1] == b'.',
            }
    }

    /// The exact host and port of a rule that names both (a loopback address a room forwards).
    pub fn exact(&self) -> Option<(&str, u16)> {
        match (&self.host, self.port) {
            (Host::Exact(h), Some(p)) => Some((h, p)),
            _ => None,
        }
    }

    /// The rule for a URL's host and port (its scheme's when it names none).
    pub fn for_url(url: &str) -> Option<Rule> {
        let url = url::Url::parse(url.trim()).ok()?;
        // An IPv6 host comes back in brackets, as a rule writes it.
        Rule::parse(&format!("{}:{}", url.host_str()?, url.port_or_known_default()?)).ok()
    }
}

/// A host name as compared: lowercase, no trailing dot, no brackets.
pub fn normalize(host: &str) -> String {
    let h = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    h.strip_suffix('.').map(str::to_owned).unwrap_or(h)
}

/// An IPv6 address in brackets, anything else as it is.
fn bracket(host: &str) -> String {
    if host.contains(':') { format!("[{host}]") } else { host.to_owned() }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`; `None` for a port that is not 1 to 65535.
pub fn split_host_port(t: &str) -> Option<(String, Option<u16>)> {
    let port = |p: &str| p.parse::<u16>().ok().filter(|p| *p > 0);
    if let Some(rest) = t.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after.strip_prefix(':') {
            Some(p) => Some((host.to_owned(), Some(port(p)?))),
            None if after.is_empty() => Some((host.to_owned(), None)),
            None => None,
        };
    }
    match t.rsplit_once(':') {
        // More than one colon and no brackets: an IPv6 address without a port.
        Some((h, _)) if h.contains(':') => Some((t.to_owned(), None)),
        Some((h, p)) => Some((h.to_owned(), Some(port(p)?))),
        None => Some((t.to_owned(), None)),
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Exact(h) => write!(f, "{}", bracket(h))?,
            Host::Under(d) => write!(f, "*.{d}")?,
        }
        match self.port {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_read_and_match_as_written() {
        let r = Rule::parse("*.Example.com").unwrap();
        assert!(r.allows("api.example.com", 443) && r.allows("a.b.example.com.", 80));
        assert!(!r.allows("example.com", 443) && !r.allows("badexample.com", 443) && !r.allows("api.example.com", 22));
        let r = Rule::parse("registry.npmjs.org:8443").unwrap();
        assert!(r.allows("REGISTRY.npmjs.org", 8443) && !r.allows("registry.npmjs.org", 443));
        assert_eq!(r.to_string(), "registry.npmjs.org:8443");
        let r = Rule::parse("[::1]:5000").unwrap();
        assert!(r.allows("[::1]", 5000) && r.allows("::1", 5000));
        assert_eq!(r.exact(), Some(("::1", 5000)));
        assert!(Rule::parse("127.0.0.1:80").unwrap().allows("127.0.0.1", 80));
        for bad in ["", "*", "*.com", "a b", "host:0", "host:99999", "x.*.com", "-a.com", "host:port"] {
            assert!(Rule::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_url_gives_its_host_and_port() {
        assert_eq!(Rule::for_url("https://api.anthropic.com").unwrap().to_string(), "api.anthropic.com:443");
        assert_eq!(Rule::for_url("http://127.0.0.1:4000/v1?x=1").unwrap().to_string(), "127.0.0.1:4000");
        assert_eq!(Rule::for_url("http://user:pw@[::1]:9/").unwrap().to_string(), "[::1]:9");
        assert!(Rule::for_url("not a url").is_none());
    }
}
