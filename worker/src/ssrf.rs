//! Which addresses a tool's HTTP request may reach: the worker's defence
//! against server-side request forgery (SSRF).
//!
//! A tool's endpoint and arguments come from definitions and from the model;
//! neither may point the worker at its own machine, its private network or
//! the cloud metadata service (`169.254.169.254`). Every address a tool
//! request would connect to is classified ([`classify`]) against the
//! special-purpose ranges of RFC 6890 and the IANA registries that followed
//! it; an address in one of them is refused unless the worker's
//! [`NetworkPolicy`] allowlists it (`--allow-private-network CIDR`, or
//! `BELAY_ALLOW_PRIVATE_NETWORKS` with commas).
//!
//! The check runs on the addresses the worker actually connects to:
//! [`CheckedResolver`] resolves a host name and hands the HTTP client only
//! checked addresses (so a DNS answer cannot change between check and
//! connect), and an IP-literal URL, which no resolver sees, is checked by
//! [`NetworkPolicy::check_url`] before anything is sent.
//!
//! The policy covers tool requests (`type: http`, `type: async_webhook`,
//! reconcile probes) and the URLs an MCP server names for OAuth discovery
//! (its metadata, its authorization server's, the token endpoint found
//! there: [`crate::oauth_discovery`]). Model provider URLs, MCP server URLs
//! and a configured `token_url` come from the operator's configuration, not
//! from definitions, the model or a server, and are not checked.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

pub use ipnet::IpNet;
use ipnet::{Ipv4Net, Ipv6Net};
use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// The worker flag that allowlists a range (repeatable).
pub const ALLOW_FLAG: &str = "--allow-private-network";
/// The environment variable of [`ALLOW_FLAG`]: CIDR blocks separated by commas.
pub const ALLOW_ENV: &str = "BELAY_ALLOW_PRIVATE_NETWORKS";

/// What a non-public range is for: the word an error message uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RangeKind {
    /// "This network" `0.0.0.0/8` (RFC 791, RFC 6890) and `::/128`
    /// (RFC 4291). Linux connects `0.0.0.0` to the local machine.
    Unspecified,
    /// `127.0.0.0/8` (RFC 1122) and `::1/128` (RFC 4291).
    Loopback,
    /// RFC 1918 (`10/8`, `172.16/12`, `192.168/16`), unique local
    /// `fc00::/7` (RFC 4193), deprecated site-local `fec0::/10` (RFC 3879)
    /// and local-use translation `64:ff9b:1::/48` (RFC 8215).
    Private,
    /// Shared address space of carrier-grade NAT, `100.64.0.0/10` (RFC 6598).
    SharedAddressSpace,
    /// `169.254.0.0/16` (RFC 3927; the cloud metadata service lives at
    /// `169.254.169.254`) and `fe80::/10` (RFC 4291).
    LinkLocal,
    /// `224.0.0.0/4` (RFC 5771) and `ff00::/8` (RFC 4291).
    Multicast,
    /// The limited broadcast address `255.255.255.255` (RFC 919).
    Broadcast,
    /// `240.0.0.0/4` (RFC 1112) and the discard-only `100::/64` (RFC 6666).
    Reserved,
    /// IETF protocol assignments: `192.0.0.0/24` (RFC 6890) and
    /// `2001::/23` (RFC 2928; Teredo and the IPv6 benchmarking range are in
    /// it). Its few global anycast addresses are refused too: no tool lives
    /// there.
    ProtocolAssignment,
    /// `198.18.0.0/15` (RFC 2544).
    Benchmarking,
    /// `192.0.2.0/24`, `198.51.100.0/24`, `203.0.113.0/24` (RFC 5737),
    /// `2001:db8::/32` (RFC 3849) and `3fff::/20` (RFC 9637).
    Documentation,
}

impl RangeKind {
    /// The kind as a message says it: `loopback`, `private`, …
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Loopback => "loopback",
            Self::Private => "private",
            Self::SharedAddressSpace => "shared (carrier-grade NAT)",
            Self::LinkLocal => "link-local",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
            Self::Reserved => "reserved",
            Self::ProtocolAssignment => "IETF protocol assignment",
            Self::Benchmarking => "benchmarking",
            Self::Documentation => "documentation",
        }
    }
}

impl fmt::Display for RangeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an IPv6 address carries an IPv4 address that decides where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Embedding {
    /// `::ffff:0:0/96` (RFC 4291): a dual-stack socket connects to the IPv4
    /// address itself.
    Mapped,
    /// `::/96`, deprecated (RFC 4291 §2.5.5.1).
    Compatible,
    /// `::ffff:0:0:0/96` (RFC 2765).
    Translated,
    /// The well-known NAT64 prefix `64:ff9b::/96` (RFC 6052).
    Nat64,
    /// 6to4, `2002::/16` (RFC 3056): the IPv4 address is bits 16 to 47.
    SixToFour,
}

impl Embedding {
    fn as_str(self) -> &'static str {
        match self {
            Self::Mapped => "IPv4-mapped",
            Self::Compatible => "IPv4-compatible",
            Self::Translated => "IPv4-translated",
            Self::Nat64 => "NAT64",
            Self::SixToFour => "6to4",
        }
    }
}

/// A non-public range an address is in: what [`classify`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpecialRange {
    /// The kind of range.
    pub kind: RangeKind,
    /// The range itself, e.g. `127.0.0.0/8`.
    pub net: IpNet,
    /// The RFC that reserves it, e.g. `RFC 1122`.
    pub rfc: &'static str,
    /// For an IPv6 address that carries an IPv4 address: how, and which
    /// address (the one `net` contains).
    pub embedded: Option<(Embedding, Ipv4Addr)>,
}

/// One row of the tables below.
struct Range(IpNet, RangeKind, &'static str);

const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8, kind: RangeKind, rfc: &'static str) -> Range {
    Range(
        IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), prefix)),
        kind,
        rfc,
    )
}

const fn v6(segments: [u16; 8], prefix: u8, kind: RangeKind, rfc: &'static str) -> Range {
    let [a, b, c, d, e, f, g, h] = segments;
    Range(
        IpNet::V6(Ipv6Net::new_assert(
            Ipv6Addr::new(a, b, c, d, e, f, g, h),
            prefix,
        )),
        kind,
        rfc,
    )
}

/// The ranges refused by default; the first that holds an address names it.
/// Broadcast comes before the reserved `240/4` that holds it, so it is named
/// as broadcast. The IPv6 forms that carry an IPv4 address are judged by
/// that address (see [`embedded_v4`]).
#[rustfmt::skip]
const RANGES: &[Range] = {
    use RangeKind::*;
    &[
        v4(0, 0, 0, 0, 8, Unspecified, "RFC 6890"),
        v4(10, 0, 0, 0, 8, Private, "RFC 1918"),
        v4(100, 64, 0, 0, 10, SharedAddressSpace, "RFC 6598"),
        v4(127, 0, 0, 0, 8, Loopback, "RFC 1122"),
        v4(169, 254, 0, 0, 16, LinkLocal, "RFC 3927"),
        v4(172, 16, 0, 0, 12, Private, "RFC 1918"),
        v4(192, 0, 0, 0, 24, ProtocolAssignment, "RFC 6890"),
        v4(192, 0, 2, 0, 24, Documentation, "RFC 5737"),
        v4(192, 168, 0, 0, 16, Private, "RFC 1918"),
        v4(198, 18, 0, 0, 15, Benchmarking, "RFC 2544"),
        v4(198, 51, 100, 0, 24, Documentation, "RFC 5737"),
        v4(203, 0, 113, 0, 24, Documentation, "RFC 5737"),
        v4(224, 0, 0, 0, 4, Multicast, "RFC 5771"),
        v4(255, 255, 255, 255, 32, Broadcast, "RFC 919"),
        v4(240, 0, 0, 0, 4, Reserved, "RFC 1112"),
        v6([0; 8], 128, Unspecified, "RFC 4291"),
        v6([0, 0, 0, 0, 0, 0, 0, 1], 128, Loopback, "RFC 4291"),
        v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, Private, "RFC 8215"),
        v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64, Reserved, "RFC 6666"),
        v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, Documentation, "RFC 3849"),
        v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, ProtocolAssignment, "RFC 2928"),
        v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, Documentation, "RFC 9637"),
        v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, Private, "RFC 4193"),
        v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, LinkLocal, "RFC 4291"),
        v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, Private, "RFC 3879"),
        v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, Multicast, "RFC 4291"),
    ]
};

/// The IPv4 address an IPv6 address carries, and how, for the forms whose
/// destination is that IPv4 address (checked after `::` and `::1`, which
/// `::/96` also holds).
fn embedded_v4(ip: Ipv6Addr) -> Option<(Embedding, Ipv4Addr)> {
    let bits = ip.to_bits();
    let low = Ipv4Addr::from_bits(bits as u32);
    let s = ip.segments();
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some((Embedding::Mapped, low)),
        [0, 0, 0, 0, 0, 0, _, _] => Some((Embedding::Compatible, low)),
        [0, 0, 0, 0, 0xffff, 0, _, _] => Some((Embedding::Translated, low)),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some((Embedding::Nat64, low)),
        [0x2002, hi, lo, ..] => Some((
            Embedding::SixToFour,
            Ipv4Addr::from_bits((u32::from(hi) << 16) | u32::from(lo)),
        )),
        _ => None,
    }
}

/// The first range of [`RANGES`] that holds `ip`.
fn lookup(ip: IpAddr) -> Option<SpecialRange> {
    RANGES
        .iter()
        .find(|Range(net, ..)| net.contains(&ip))
        .map(|Range(net, kind, rfc)| SpecialRange {
            kind: *kind,
            net: *net,
            rfc,
            embedded: None,
        })
}

/// The non-public range `ip` is in, or `None` for a public address. An IPv6
/// address that carries an IPv4 address (`::ffff:127.0.0.1`, NAT64, 6to4)
/// is judged by the IPv4 address.
pub fn classify(ip: IpAddr) -> Option<SpecialRange> {
    lookup(ip).or_else(|| {
        let IpAddr::V6(v6) = ip else { return None };
        let (how, v4) = embedded_v4(v6)?;
        lookup(IpAddr::V4(v4)).map(|range| SpecialRange {
            embedded: Some((how, v4)),
            ..range
        })
    })
}

/// A value of [`ALLOW_FLAG`] that is not a CIDR block; the message names
/// the flag and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{ALLOW_FLAG} ({ALLOW_ENV}): {value:?} is not a CIDR block \
     (like 10.0.0.0/8, fd00::/8 or 127.0.0.1): {reason}",
    ALLOW_FLAG = ALLOW_FLAG,
    ALLOW_ENV = ALLOW_ENV
)]
pub struct CidrError {
    /// The text as given, without surrounding blanks.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Parses one allowlist entry: a CIDR block (`10.0.0.0/8`, `fd00::/8`) or a
/// single address (`127.0.0.1`, `::1`). Blanks around it are ignored; a
/// block with host bits set (`10.0.0.1/8`) is refused, since it is most
/// likely a typo for either the block or the address.
pub fn parse_cidr(text: &str) -> Result<IpNet, CidrError> {
    let value = text.trim();
    let error = |reason: String| CidrError {
        value: value.to_owned(),
        reason,
    };
    if value.is_empty() {
        return Err(error("it is empty".to_owned()));
    }
    if !value.contains('/') {
        return value
            .parse::<IpAddr>()
            .map(IpNet::from)
            .map_err(|e| error(e.to_string()));
    }
    let net: IpNet = value.parse().map_err(|e: ipnet::AddrParseError| {
        error(format!("{e} (an address, `/`, then a prefix length)"))
    })?;
    if net.trunc() != net {
        return Err(error(format!(
            "it has host bits set: the block is {}, the single address {}",
            net.trunc(),
            net.addr()
        )));
    }
    Ok(net)
}

/// The [`ALLOW_FLAG`] flag, shared by `belay-worker` and `belay dev`
/// (`#[command(flatten)]`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AllowPrivateNetworkArgs {
    /// A non-public block HTTP tools may reach (CIDR, e.g. 10.0.0.0/8, or one
    /// address; tool servers on this machine need 127.0.0.0/8); repeatable,
    /// commas in the variable. Without it, loopback, private, link-local and
    /// other non-public addresses are refused.
    #[arg(long = "allow-private-network", env = ALLOW_ENV, value_name = "CIDR",
          value_delimiter = ',')]
    pub allow_private_networks: Vec<String>,
}

impl AllowPrivateNetworkArgs {
    /// The policy these values make ([`NetworkPolicy::from_cidrs`]).
    pub fn policy(&self) -> Result<NetworkPolicy, CidrError> {
        NetworkPolicy::from_cidrs(&self.allow_private_networks)
    }
}

/// Which non-public addresses tool requests may reach: none by default,
/// plus those in the allowlisted CIDR blocks. Public addresses are always
/// reachable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkPolicy {
    allowed: Vec<IpNet>,
}

impl NetworkPolicy {
    /// A policy that allows the non-public addresses in `allowed`.
    pub fn new(allowed: Vec<IpNet>) -> Self {
        Self { allowed }
    }

    /// A policy from the values of [`ALLOW_FLAG`] (each parsed with
    /// [`parse_cidr`]); blank values are skipped, so an empty
    /// [`ALLOW_ENV`] or a trailing comma allows nothing more.
    pub fn from_cidrs<I, S>(values: I) -> Result<Self, CidrError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let allowed = values
            .into_iter()
            .filter(|v| !v.as_ref().trim().is_empty())
            .map(|v| parse_cidr(v.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(Self::new(allowed))
    }

    /// A policy that allows loopback (`127.0.0.0/8` and `::1/128`): for tests
    /// and examples whose tool servers run on this machine.
    pub fn allowing_loopback() -> Self {
        Self::new(vec![
            IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::LOCALHOST, 8)),
            IpNet::V6(Ipv6Net::new_assert(Ipv6Addr::LOCALHOST, 128)),
        ])
    }

    /// The allowlisted blocks.
    pub fn allowed(&self) -> &[IpNet] {
        &self.allowed
    }

    /// `Ok` when a tool request may connect to `ip`: it is public, or an
    /// allowlisted block holds it (or, for an IPv6 form that carries an IPv4
    /// address, that address). Otherwise the range it is in.
    pub fn check(&self, ip: IpAddr) -> Result<(), SpecialRange> {
        let Some(range) = classify(ip) else {
            return Ok(());
        };
        let embedded = range.embedded.map(|(_, v4)| IpAddr::V4(v4));
        let allowed = self
            .allowed
            .iter()
            .any(|net| net.contains(&ip) || embedded.is_some_and(|v4| net.contains(&v4)));
        if allowed { Ok(()) } else { Err(range) }
    }

    /// Checks the host of `url` when it is an IP literal, which no resolver
    /// sees. A host name is checked when it is resolved, by
    /// [`CheckedResolver`].
    pub fn check_url(&self, url: &Url) -> Result<(), AddressRefused> {
        let Some(host) = url.host_str() else {
            return Ok(());
        };
        // The URL parser writes an IPv4 host in dotted form whatever form it
        // was given in (`2130706433`, `0x7f.1`), an IPv6 host in brackets,
        // and refuses a domain that would read as a number, so a host that
        // does not parse here is a name.
        let literal = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let Ok(ip) = literal.parse::<IpAddr>() else {
            return Ok(());
        };
        self.check(ip).map_err(|range| AddressRefused {
            host: host.to_owned(),
            address: ip,
            range,
            resolved: false,
        })
    }
}

/// A tool request refused because its host is, or resolves to, a
/// non-public address the worker does not allow. Nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressRefused {
    /// The URL's host, as written (`localhost`, `127.0.0.1`, `[::1]`).
    pub host: String,
    /// The refused address.
    pub address: IpAddr,
    /// The range it is in.
    pub range: SpecialRange,
    /// Whether `address` came from resolving `host` (else `host` is it).
    pub resolved: bool,
}

impl fmt::Display for AddressRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            host,
            address,
            range,
            resolved,
        } = self;
        write!(f, "tool request to {host} refused: ")?;
        if *resolved {
            write!(f, "it resolves to ")?;
        } else {
            write!(f, "it is ")?;
        }
        write!(f, "{} {address}", range.kind)?;
        if let Some((how, v4)) = range.embedded {
            write!(f, " ({} {v4})", how.as_str())?;
        }
        let single = IpNet::from(*address);
        write!(
            f,
            " (in {}, {}), which tool requests may not reach unless the worker allows it \
             with {ALLOW_FLAG} {single} or a block that holds it ({ALLOW_ENV})",
            range.net, range.rfc
        )
    }
}

impl std::error::Error for AddressRefused {}

/// A DNS resolver for tool requests: resolves with the system resolver, then
/// refuses the host if any of its addresses is refused by the policy (a name
/// that points partly inside counts as pointing inside, whichever address
/// the client would try first). The client connects only to the addresses
/// returned here, so the checked addresses are the ones used.
#[derive(Debug, Clone)]
pub struct CheckedResolver {
    policy: Arc<NetworkPolicy>,
}

impl CheckedResolver {
    /// A resolver that applies `policy`.
    pub fn new(policy: Arc<NetworkPolicy>) -> Self {
        Self { policy }
    }
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = Arc::clone(&self.policy);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            // Port 0: the client sets the URL's port on every address.
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            for addr in &addrs {
                policy.check(addr.ip()).map_err(|range| AddressRefused {
                    host: host.clone(),
                    address: addr.ip(),
                    range,
                    resolved: true,
                })?;
            }
            let addrs: Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// The policy's refusal, when that is why `err` happened: the resolver's
/// error comes back wrapped in the connector's and the client's.
pub fn address_refused(err: &reqwest::Error) -> Option<&AddressRefused> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(inner) = source {
        if let Some(refused) = inner.downcast_ref::<AddressRefused>() {
            return Some(refused);
        }
        source = inner.source();
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::RangeKind::*;
    use super::*;

    fn kind(ip: &str) -> Option<RangeKind> {
        classify(ip.parse().unwrap()).map(|r| r.kind)
    }

    #[test]
    fn non_public_ranges_are_classified() {
        let cases = [
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", Unspecified),
            ("::", Unspecified),
            ("127.0.0.1", Loopback),
            ("127.255.255.254", Loopback),
            ("::1", Loopback),
            ("10.1.2.3", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.168.1.1", Private),
            ("fd12:3456::1", Private),
            ("fc00::1", Private),
            ("fec0::1", Private),
            ("64:ff9b:1::a00:1", Private),
            ("100.64.0.1", SharedAddressSpace),
            ("100.127.255.255", SharedAddressSpace),
            ("169.254.169.254", LinkLocal),
            ("fe80::1", LinkLocal),
            ("224.0.0.1", Multicast),
            ("239.255.255.250", Multicast),
            ("ff02::1", Multicast),
            ("255.255.255.255", Broadcast),
            ("240.0.0.1", Reserved),
            ("100::1", Reserved),
            ("192.0.0.8", ProtocolAssignment),
            ("2001::1", ProtocolAssignment),
            ("198.18.0.1", Benchmarking),
            ("192.0.2.1", Documentation),
            ("198.51.100.7", Documentation),
            ("203.0.113.9", Documentation),
            ("2001:db8::1", Documentation),
            ("3fff::1", Documentation),
        ];
        for (ip, expected) in cases {
            assert_eq!(kind(ip), Some(expected), "{ip}");
        }
    }

    #[test]
    fn public_addresses_are_not_classified() {
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.215.14",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "169.253.255.255",
            "192.0.3.1",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2a00:1450:4001::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert_eq!(kind(ip), None, "{ip}");
        }
    }

    #[test]
    fn ipv6_forms_of_ipv4_addresses_are_judged_by_the_ipv4_address() {
        let cases = [
            ("::ffff:127.0.0.1", Embedding::Mapped, Loopback, "127.0.0.1"),
            (
                "::ffff:169.254.169.254",
                Embedding::Mapped,
                LinkLocal,
                "169.254.169.254",
            ),
            ("::10.0.0.1", Embedding::Compatible, Private, "10.0.0.1"),
            (
                "::ffff:0:7f00:1",
                Embedding::Translated,
                Loopback,
                "127.0.0.1",
            ),
            ("64:ff9b::7f00:1", Embedding::Nat64, Loopback, "127.0.0.1"),
            (
                "2002:c0a8:101::1",
                Embedding::SixToFour,
                Private,
                "192.168.1.1",
            ),
        ];
        for (ip, how, expected, v4) in cases {
            let range = classify(ip.parse().unwrap()).unwrap();
            assert_eq!(range.kind, expected, "{ip}");
            assert_eq!(range.embedded, Some((how, v4.parse().unwrap())), "{ip}");
        }
    }

    #[test]
    fn the_allowlist_lets_its_blocks_through_and_nothing_else() {
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let strict = NetworkPolicy::default();
        assert!(strict.check(ip("127.0.0.1")).is_err());
        assert!(strict.check(ip("8.8.8.8")).is_ok());

        let loopback = NetworkPolicy::allowing_loopback();
        assert!(loopback.check(ip("127.0.0.1")).is_ok());
        assert!(loopback.check(ip("127.9.9.9")).is_ok());
        assert!(loopback.check(ip("::1")).is_ok());
        // The mapped form reaches the same host as the IPv4 address.
        assert!(loopback.check(ip("::ffff:127.0.0.1")).is_ok());
        assert!(loopback.check(ip("10.0.0.1")).is_err());
        assert!(loopback.check(ip("169.254.169.254")).is_err());

        let private = NetworkPolicy::new(vec![parse_cidr("10.0.0.0/8").unwrap()]);
        assert!(private.check(ip("10.200.0.1")).is_ok());
        assert!(private.check(ip("11.0.0.1")).is_ok(), "public");
        assert!(private.check(ip("192.168.0.1")).is_err());
        assert!(private.check(ip("127.0.0.1")).is_err());
    }

    #[test]
    fn cidr_parsing_accepts_blocks_and_single_addresses() {
        assert_eq!(parse_cidr("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(parse_cidr(" fd00::/8 ").unwrap().to_string(), "fd00::/8");
        assert_eq!(parse_cidr("127.0.0.1").unwrap().to_string(), "127.0.0.1/32");
        assert_eq!(parse_cidr("::1").unwrap().to_string(), "::1/128");
    }

    #[test]
    fn a_policy_from_flag_values_skips_blanks_and_stops_at_a_bad_one() {
        let policy = NetworkPolicy::from_cidrs(["10.0.0.0/8", "", " ", "::1"]).unwrap();
        let allowed: Vec<String> = policy.allowed().iter().map(ToString::to_string).collect();
        assert_eq!(allowed, ["10.0.0.0/8", "::1/128"]);
        assert!(
            NetworkPolicy::from_cidrs([""])
                .unwrap()
                .allowed()
                .is_empty()
        );
        let err = NetworkPolicy::from_cidrs(["10.0.0.0/8", "10.0.0.0/40"]).unwrap_err();
        assert_eq!(err.value, "10.0.0.0/40");
    }

    #[test]
    fn cidr_parsing_errors_name_the_value_and_the_problem() {
        let cases = [
            ("10.0.0.0/33", "invalid IP address syntax"),
            ("10.0.0.1/8", "host bits set: the block is 10.0.0.0/8"),
            ("", "empty"),
            ("localhost", "invalid IP address syntax"),
            ("10.0.0.0/", "invalid IP address syntax"),
            ("fd00::/129", "invalid IP address syntax"),
        ];
        for (text, reason) in cases {
            let err = parse_cidr(text).unwrap_err();
            let message = err.to_string();
            assert!(message.contains(&format!("{text:?}")), "{message}");
            assert!(message.contains(reason), "{message}");
        }
    }

    #[test]
    fn a_refusal_names_host_address_kind_and_flag() {
        let policy = NetworkPolicy::default();
        let url = Url::parse("http://[::ffff:127.0.0.1]:8080/x").unwrap();
        let err = policy.check_url(&url).unwrap_err();
        let message = err.to_string();
        for part in [
            "tool request to [::ffff:7f00:1] refused",
            "loopback ::ffff:127.0.0.1 (IPv4-mapped 127.0.0.1)",
            "127.0.0.0/8, RFC 1122",
            "--allow-private-network ::ffff:127.0.0.1/128",
            "BELAY_ALLOW_PRIVATE_NETWORKS",
        ] {
            assert!(message.contains(part), "{part:?} not in {message}");
        }
        let url = Url::parse("http://169.254.169.254/latest/meta-data/").unwrap();
        let message = policy.check_url(&url).unwrap_err().to_string();
        assert!(
            message.contains("it is link-local 169.254.169.254 (in 169.254.0.0/16, RFC 3927)"),
            "{message}"
        );
        let url = Url::parse("http://tools.example/x").unwrap();
        assert!(
            policy.check_url(&url).is_ok(),
            "names are left to the resolver"
        );
    }
}
