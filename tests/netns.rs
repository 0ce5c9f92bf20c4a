//! A network namespace joined to this one by veth links that can be made to drop every packet
//! without closing a socket: the silent network cut (an expired NAT mapping, a load balancer
//! that failed over) that a proxy in this process cannot show.
//!
//! Why not a userspace proxy that stops forwarding: on loopback, its kernel sockets stay open
//! and go on acknowledging whatever arrives, keepalive probes included, so the client's kernel
//! never learns that nothing is forwarded any more. A process started in the namespace
//! ([`Netns::command`]) reaches this one only over the links; [`Link::blackhole`] takes the
//! link's end in this namespace down, after which the frames the process's kernel sends on it are
//! dropped by the veth driver: nothing answers, nothing is refused, no reset comes back.
//!
//! Needs root and iproute2's `ip` (Linux). Without them a test that uses this fails saying so:
//! it is never skipped.

use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::process::Command;

/// A network namespace; deleted, with its links, when dropped.
pub struct Netns {
    name: String,
    /// This namespace's ends of the links, deleted with it.
    devices: Vec<String>,
    /// The second and third octets of this namespace's addresses: 10.A.B.0/24.
    net: (u8, u8),
}

/// A veth link between this namespace and a [`Netns`], a /30 of its own.
pub struct Link {
    /// The address of this namespace's end: a proxy listens here for the process inside.
    pub outside: Ipv4Addr,
    /// The address of the end inside the namespace.
    pub inside: Ipv4Addr,
    device: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `ip` ({e}): this test needs iproute2 and root (Linux network namespaces); install iproute2 and run it as root"));
    assert!(
        out.status.success(),
        "`ip {}` failed: {} (this test needs root for network namespaces)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

impl Netns {
    /// A new namespace named after `tag` and this process, so that concurrent test runs on
    /// one machine do not meet.
    pub fn create(tag: &str) -> Netns {
        let pid = std::process::id();
        let name = format!("sf-{tag}-{pid}");
        // Stale from a killed run of a process that had this pid: gone first.
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        Netns { name, devices: Vec::new(), net: (200 + (pid % 50) as u8, ((pid / 50) % 256) as u8) }
    }

    /// A new link into the namespace.
    pub fn link(&mut self) -> Link {
        let i = self.devices.len() as u8;
        assert!(i < 60, "at most 60 links");
        let (a, b) = self.net;
        let outside = Ipv4Addr::new(10, a, b, 4 * i + 1);
        let inside = Ipv4Addr::new(10, a, b, 4 * i + 2);
        // Device names have at most 15 characters.
        let id = std::process::id() % 10_000_000;
        let (out_dev, in_dev) = (format!("sf{id}o{i}"), format!("sf{id}i{i}"));
        let _ = Command::new("ip").args(["link", "del", &out_dev]).output();
        ip(&["link", "add", &out_dev, "type", "veth", "peer", "name", &in_dev]);
        self.devices.push(out_dev.clone());
        ip(&["link", "set", &in_dev, "netns", &self.name]);
        ip(&["addr", "add", &format!("{outside}/30"), "dev", &out_dev]);
        ip(&["link", "set", &out_dev, "up"]);
        ip(&["-n", &self.name, "addr", "add", &format!("{inside}/30"), "dev", &in_dev]);
        ip(&["-n", &self.name, "link", "set", &in_dev, "up"]);
        Link { outside, inside, device: out_dev }
    }

    /// `program` to be run inside the namespace (`ip netns exec` replaces itself with it, so
    /// the child's pid is the program's).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for dev in &self.devices {
            let _ = Command::new("ip").args(["link", "del", dev]).output();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

impl Link {
    /// From now on every packet either way is dropped; no socket is closed.
    pub fn blackhole(&self) {
        ip(&["link", "set", &self.device, "down"]);
    }

    /// Forwards again.
    pub fn restore(&self) {
        ip(&["link", "set", &self.device, "up"]);
    }
}
