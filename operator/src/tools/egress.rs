//! Where plugin tools may send requests. Link-local and cloud-metadata addresses and the
//! Kubernetes API server are refused unless a `KortexTool` sets `allowPrivateTargets`:
//! literal addresses in URLs are checked before a request is made, host names after DNS
//! resolution (a resolver that drops refused addresses, so a name cannot be pointed at the
//! metadata service), and redirects are never followed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// Host names that always mean a metadata service or the API server.
const REFUSED_NAMES: &[&str] = &[
    "metadata",
    "metadata.google.internal",
    "metadata.azure.internal",
    "instance-data",
    "instance-data.ec2.internal",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
];

/// What plugin tools may not reach.
#[derive(Clone, Debug, Default)]
pub struct Egress {
    /// API server endpoints (from `KUBERNETES_SERVICE_HOST`/`_PORT` or the kubeconfig).
    api_servers: Vec<(ApiHost, u16)>,
}

/// The host part of an API server endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ApiHost {
    Ip(IpAddr),
    Name(String),
}

/// The IPv4 address an IPv6 address carries, if it carries one: IPv4-mapped
/// (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`, deprecated but still routed by some
/// stacks) and NAT64 (`64:ff9b::a.b.c.d`, RFC 6052), so none of them is a way around the
/// IPv4 rules.
fn unmapped(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else {
        return ip;
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let s = v6.segments();
    let embedded = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s[..6] {
        [0x64, 0xff9b, 0, 0, 0, 0] => IpAddr::V4(embedded),
        // `::` and `::1` stay IPv6.
        [0, 0, 0, 0, 0, 0] if s[6] != 0 => IpAddr::V4(embedded),
        _ => ip,
    }
}

impl Egress {
    /// The rules for this process: the in-cluster API server from the environment.
    pub fn from_env() -> Self {
        let mut egress = Self::default();
        if let Ok(host) = std::env::var("KUBERNETES_SERVICE_HOST") {
            let port = std::env::var("KUBERNETES_SERVICE_PORT")
                .ok()
                .and_then(|p| p.parse().ok())
                .unwrap_or(443);
            egress.add_api_server(&host, port);
        }
        egress
    }

    /// Also refuses the API server at `host` (an address or a name) and `port`, e.g. the
    /// server of a kubeconfig.
    pub fn add_api_server(&mut self, host: &str, port: u16) {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let host = match host.parse::<IpAddr>() {
            Ok(ip) => ApiHost::Ip(unmapped(ip)),
            Err(_) => ApiHost::Name(host.trim_end_matches('.').to_ascii_lowercase()),
        };
        self.api_servers.push((host, port));
    }

    /// Why connecting to `ip` is refused, whatever the port: metadata services, link-local
    /// and unroutable addresses, and API server addresses that are not loopback (a Service
    /// IP or a node address serves nothing else a tool should reach).
    pub fn refuse_ip(&self, ip: IpAddr) -> Option<&'static str> {
        let ip = unmapped(ip);
        if !ip.is_loopback() && self.api_servers.iter().any(|(h, _)| *h == ApiHost::Ip(ip)) {
            return Some("the Kubernetes API server");
        }
        match ip {
            IpAddr::V4(v4) => refuse_v4(v4),
            IpAddr::V6(v6) => refuse_v6(v6),
        }
    }

    /// Why the host name `name` is refused, if it is (before resolution).
    pub fn refuse_name(&self, name: &str) -> Option<&'static str> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if name.starts_with("kubernetes.default.svc.")
            || REFUSED_NAMES[5..].contains(&name.as_str())
        {
            return Some("the Kubernetes API server");
        }
        if REFUSED_NAMES[..5].contains(&name.as_str()) {
            return Some("a cloud metadata service");
        }
        None
    }

    /// Whether `host:port` is a configured API server endpoint (`localhost` counting as
    /// the loopback addresses, for development clusters on this machine).
    fn is_api_server(&self, host: &url::Host<&str>, port: u16) -> bool {
        let hosts: Vec<ApiHost> = match host {
            url::Host::Ipv4(v4) => vec![ApiHost::Ip(IpAddr::V4(*v4))],
            url::Host::Ipv6(v6) => vec![ApiHost::Ip(unmapped(IpAddr::V6(*v6)))],
            url::Host::Domain(name) => {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                if name == "localhost" || name.ends_with(".localhost") {
                    vec![
                        ApiHost::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST)),
                        ApiHost::Ip(IpAddr::V6(Ipv6Addr::LOCALHOST)),
                        ApiHost::Name(name),
                    ]
                } else {
                    vec![ApiHost::Name(name)]
                }
            }
        };
        self.api_servers
            .iter()
            .any(|(h, p)| *p == port && hosts.contains(h))
    }

    /// Checks the host and port of `url` (a literal address or a name) before a request.
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), String> {
        let Some(host) = url.host() else {
            return Err(format!("{url} has no host"));
        };
        let port = url.port_or_known_default().unwrap_or(0);
        let reason = match &host {
            url::Host::Ipv4(v4) => self.refuse_ip(IpAddr::V4(*v4)),
            url::Host::Ipv6(v6) => self.refuse_ip(IpAddr::V6(*v6)),
            url::Host::Domain(name) => self.refuse_name(name),
        }
        .or_else(|| {
            self.is_api_server(&host, port)
                .then_some("the Kubernetes API server")
        });
        match reason {
            Some(what) => Err(refusal(url.host_str().unwrap_or_default(), what)),
            None => Ok(()),
        }
    }

    /// An HTTP client for plugin tools: refused addresses dropped from every resolution
    /// and no proxy (unless `open`), no redirects.
    pub fn client(self: &Arc<Self>, open: bool) -> Result<reqwest::Client, String> {
        let builder = reqwest::Client::builder()
            .user_agent(concat!("kortex/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(std::time::Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none());
        // A proxy would resolve names itself, out of the guard's sight: guarded clients
        // connect directly.
        let builder = if open {
            builder
        } else {
            builder
                .no_proxy()
                .dns_resolver(GuardedResolver(self.clone()))
        };
        builder
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))
    }
}

fn refusal(host: &str, what: &str) -> String {
    format!(
        "refused: {host} is {what}; plugin tools may not reach it unless the KortexTool sets allowPrivateTargets: true"
    )
}

fn refuse_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    // AWS/GCP/Azure/OpenStack IMDS, the ECS task endpoint, Alibaba Cloud, Azure's
    // WireServer and Oracle Cloud's legacy metadata address.
    if ip == Ipv4Addr::new(169, 254, 169, 254)
        || ip == Ipv4Addr::new(169, 254, 170, 2)
        || ip == Ipv4Addr::new(100, 100, 100, 200)
        || ip == Ipv4Addr::new(168, 63, 129, 16)
        || ip == Ipv4Addr::new(192, 0, 0, 192)
    {
        Some("a cloud metadata service")
    } else if ip.is_link_local() {
        Some("a link-local address")
    } else if ip.is_unspecified() || ip.is_broadcast() || o[0] == 0 {
        Some("not a routable address")
    } else {
        None
    }
}

fn refuse_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if s[0] == 0xfd00 && s[1] == 0x0ec2 && ip.segments()[7] == 0x0254 {
        Some("a cloud metadata service")
    } else if (s[0] & 0xffc0) == 0xfe80 {
        Some("a link-local address")
    } else if ip.is_unspecified() {
        Some("not a routable address")
    } else {
        None
    }
}

/// Resolves with the system resolver and drops refused addresses; a name that only
/// resolves to refused addresses fails with the reason.
struct GuardedResolver(Arc<Egress>);

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let egress = self.0.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            if let Some(what) = egress.refuse_name(&host) {
                return Err(refusal(&host, what).into());
            }
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut first_refusal = None;
            let allowed: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(|a| match egress.refuse_ip(a.ip()) {
                    Some(what) => {
                        first_refusal.get_or_insert(what);
                        false
                    }
                    None => true,
                })
                .collect();
            match (allowed.is_empty(), first_refusal) {
                (true, Some(what)) => Err(refusal(&host, what).into()),
                _ => Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(e: &Egress, url: &str) -> Result<(), String> {
        e.check_url(&reqwest::Url::parse(url).map_err(|e| e.to_string())?)
    }

    #[test]
    fn metadata_link_local_and_api_server_are_refused() {
        let mut e = Egress::default();
        e.add_api_server("10.96.0.1", 443);
        e.add_api_server("api.cluster.example", 6443);
        e.add_api_server("127.0.0.1", 6443);
        for url in [
            "http://169.254.169.254/latest/meta-data/",
            "http://169.254.10.1/",
            "http://[fe80::1]/",
            "http://[fd00:ec2::254]/",
            "http://[::ffff:169.254.169.254]/",
            "http://metadata.google.internal/computeMetadata/v1/",
            "http://kubernetes.default.svc/api",
            "https://kubernetes.default.svc.cluster.local:443/api",
            "https://10.96.0.1/api",
            "http://10.96.0.1:8080/",
            "https://API.cluster.example.:6443/api",
            "https://127.0.0.1:6443/api",
            "https://localhost:6443/api",
            "https://[::ffff:127.0.0.1]:6443/api",
            "http://100.100.100.200/",
            "http://168.63.129.16/machine?comp=goalstate",
            "http://192.0.0.192/",
            "http://[64:ff9b::a9fe:a9fe]/",
            "http://[::169.254.169.254]/",
            "http://[64:ff9b::10.96.0.1]/api",
            "http://0.0.0.0:8080/",
        ] {
            let err = match check(&e, url) {
                Err(err) => err,
                Ok(()) => panic!("{url} was allowed"),
            };
            assert!(err.contains("allowPrivateTargets"), "{url}: {err}");
        }
        for url in [
            "http://[::1]:8080/",
            "http://[2001:db8::1]/",
            "http://127.0.0.1:8080/",
            "http://localhost:9000/mcp",
            "https://api.cluster.example/",
            "http://10.0.0.7/",
            "http://jira-bridge.tools.svc:8080/search",
            "https://example.com/",
        ] {
            assert_eq!(check(&e, url), Ok(()), "{url}");
        }
    }
}
