//! Where Kortex may send requests on a resource's behalf: plugin tools (`KortexTool`) and
//! model providers (`LLMProvider`) alike.
//!
//! Refused unless the resource sets `allowPrivateTargets: true`: link-local and
//! cloud-metadata addresses, the Kubernetes API server (its Service and its endpoints),
//! and in cluster mode loopback addresses. Refused whatever the resource says: **Kortex
//! itself** — its pod addresses, the Services in front of it, and its own port on loopback.
//! Literal addresses in URLs are checked before a request is made, host names after DNS
//! resolution (a resolver that drops refused addresses, so a name cannot be pointed at the
//! metadata service), and redirects are never followed.
//!
//! Every request also carries [`VIA_HEADER`] with this installation's marker, and Kortex's
//! HTTP server refuses requests that carry it: whatever route (an Ingress, another
//! Service, a proxy) leads back to Kortex, a resource cannot make Kortex call itself.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, OnceLock, RwLock};

/// The header every outbound request of a tool or provider carries.
pub const VIA_HEADER: &str = "kortex-via";

/// Host names that always mean a cloud metadata service.
const METADATA_NAMES: &[&str] = &[
    "metadata",
    "metadata.google.internal",
    "metadata.azure.internal",
    "instance-data",
    "instance-data.ec2.internal",
];

/// Host names that always mean the API server (and `kubernetes.default.svc.<domain>`).
const API_SERVER_NAMES: &[&str] = &["kubernetes", "kubernetes.default", "kubernetes.default.svc"];

/// What tools and providers may not reach.
#[derive(Debug, Default)]
pub struct Egress {
    /// API server endpoints (from `KUBERNETES_SERVICE_HOST`/`_PORT`, the kubeconfig, and
    /// the `kubernetes` Service's endpoints).
    api_servers: RwLock<Vec<(ApiHost, u16)>>,
    /// Kortex itself (refreshed from the cluster).
    own: RwLock<Own>,
    /// The ports Kortex listens on (refused on loopback and unspecified addresses).
    own_ports: RwLock<Vec<u16>>,
    /// Cluster mode: loopback is Kortex's own pod.
    cluster: bool,
    /// This installation's marker (the value of [`VIA_HEADER`]).
    marker: String,
}

/// Kortex's own addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Own {
    /// Its pod addresses and the cluster IPs of the Services in front of it (any port).
    pub ips: Vec<IpAddr>,
    /// The names of those Services (`svc`, `svc.ns`, `svc.ns.svc`, `svc.ns.svc.<domain>`).
    pub names: Vec<String>,
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

static INSTALLED: OnceLock<Arc<Egress>> = OnceLock::new();

/// The rules of this process ([`install`]ed at start; standalone rules otherwise).
pub fn current() -> Arc<Egress> {
    INSTALLED
        .get_or_init(|| Arc::new(Egress::standalone(Own::default())))
        .clone()
}

/// Makes `egress` the rules of this process (the first call wins).
pub fn install(egress: Arc<Egress>) -> Arc<Egress> {
    INSTALLED.get_or_init(|| egress).clone()
}

/// Which rule refused a target: `Private` ones a resource may lift, `Kortex` never.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    Private(&'static str),
    Kortex,
}

impl Egress {
    /// The rules of `kortex serve`: loopback (a local model server) is allowed, Kortex's
    /// own ports on it ([`Egress::add_own_port`]) are not.
    pub fn standalone(own: Own) -> Self {
        Self {
            own: RwLock::new(own),
            marker: uuid::Uuid::now_v7().simple().to_string(),
            ..Self::default()
        }
    }

    /// The rules of `kortex run`: the in-cluster API server from the environment, loopback
    /// refused, and `marker` naming this installation (the same on every replica).
    pub fn cluster(own: Own, marker: &str) -> Self {
        let egress = Self {
            own: RwLock::new(own),
            cluster: true,
            marker: marker.to_owned(),
            ..Self::default()
        };
        if let Ok(host) = std::env::var("KUBERNETES_SERVICE_HOST") {
            let port = std::env::var("KUBERNETES_SERVICE_PORT")
                .ok()
                .and_then(|p| p.parse().ok())
                .unwrap_or(443);
            egress.add_api_server(&host, port);
        }
        egress
    }

    /// This installation's marker: the value of [`VIA_HEADER`] on its requests.
    pub fn marker(&self) -> &str {
        &self.marker
    }

    /// Also refuses the API server at `host` (an address or a name) and `port`, e.g. the
    /// server of a kubeconfig or an endpoint of the `kubernetes` Service.
    pub fn add_api_server(&self, host: &str, port: u16) {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let host = match host.parse::<IpAddr>() {
            Ok(ip) => ApiHost::Ip(unmapped(ip)),
            Err(_) => ApiHost::Name(host.trim_end_matches('.').to_ascii_lowercase()),
        };
        let mut servers = self.api_servers.write().unwrap_or_else(|e| e.into_inner());
        if !servers.contains(&(host.clone(), port)) {
            servers.push((host, port));
        }
    }

    /// Replaces what is known of Kortex itself (refreshed from the cluster).
    pub fn set_own(&self, own: Own) {
        let mut current = self.own.write().unwrap_or_else(|e| e.into_inner());
        *current = own;
    }

    /// Also refuses `port` on loopback: Kortex listens on it.
    pub fn add_own_port(&self, port: u16) {
        let mut ports = self.own_ports.write().unwrap_or_else(|e| e.into_inner());
        if !ports.contains(&port) {
            ports.push(port);
        }
    }

    /// What is known of Kortex itself.
    pub fn own(&self) -> Own {
        self.own.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn refusal_for_ip(&self, ip: IpAddr) -> Option<Refusal> {
        let ip = unmapped(ip);
        if self
            .own
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .ips
            .iter()
            .any(|own| unmapped(*own) == ip)
        {
            return Some(Refusal::Kortex);
        }
        if !ip.is_loopback()
            && self
                .api_servers
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|(h, _)| *h == ApiHost::Ip(ip))
        {
            return Some(Refusal::Private("the Kubernetes API server"));
        }
        if self.cluster && ip.is_loopback() {
            return Some(Refusal::Private("a loopback address (Kortex's own pod)"));
        }
        match ip {
            IpAddr::V4(v4) => refuse_v4(v4),
            IpAddr::V6(v6) => refuse_v6(v6),
        }
        .map(Refusal::Private)
    }

    /// Why connecting to `ip` is refused (whatever the port), if it is: Kortex itself,
    /// metadata services, link-local and unroutable addresses, API server addresses that
    /// are not loopback (a Service IP or a node address serves nothing else a tool should
    /// reach), and loopback in cluster mode.
    pub fn refuse_ip(&self, ip: IpAddr) -> Option<&'static str> {
        self.refusal_for_ip(ip).map(Refusal::what)
    }

    fn refusal_for_name(&self, name: &str) -> Option<Refusal> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let own = self.own.read().unwrap_or_else(|e| e.into_inner());
        if own.names.contains(&name) {
            return Some(Refusal::Kortex);
        }
        drop(own);
        if name.starts_with("kubernetes.default.svc.") || API_SERVER_NAMES.contains(&name.as_str())
        {
            return Some(Refusal::Private("the Kubernetes API server"));
        }
        if METADATA_NAMES.contains(&name.as_str()) {
            return Some(Refusal::Private("a cloud metadata service"));
        }
        if self.cluster && (name == "localhost" || name.ends_with(".localhost")) {
            return Some(Refusal::Private("a loopback address (Kortex's own pod)"));
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
                if is_localhost(&name) {
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
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|(h, p)| *p == port && hosts.contains(h))
    }

    /// Whether `host:port` is Kortex's own listener on this machine.
    fn is_own_port(&self, host: &url::Host<&str>, port: u16) -> bool {
        let local = match host {
            url::Host::Ipv4(v4) => v4.is_loopback() || v4.is_unspecified(),
            url::Host::Ipv6(v6) => {
                let ip = unmapped(IpAddr::V6(*v6));
                ip.is_loopback() || ip.is_unspecified()
            }
            url::Host::Domain(name) => {
                is_localhost(&name.trim_end_matches('.').to_ascii_lowercase())
            }
        };
        local
            && self
                .own_ports
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&port)
    }

    /// Checks the host and port of `url` (a literal address or a name) before a request;
    /// `open` (`allowPrivateTargets`) lifts every rule but the one about Kortex itself.
    pub fn check_url(&self, url: &reqwest::Url, open: bool) -> Result<(), String> {
        let Some(host) = url.host() else {
            return Err(format!("{url} has no host"));
        };
        let port = url.port_or_known_default().unwrap_or(0);
        let refusal = if self.is_own_port(&host, port) {
            Some(Refusal::Kortex)
        } else {
            match &host {
                url::Host::Ipv4(v4) => self.refusal_for_ip(IpAddr::V4(*v4)),
                url::Host::Ipv6(v6) => self.refusal_for_ip(IpAddr::V6(*v6)),
                url::Host::Domain(name) => self.refusal_for_name(name),
            }
            .or_else(|| {
                self.is_api_server(&host, port)
                    .then_some(Refusal::Private("the Kubernetes API server"))
            })
        };
        match refusal {
            Some(Refusal::Private(_)) if open => Ok(()),
            Some(r) => Err(r.message(url.host_str().unwrap_or_default())),
            None => Ok(()),
        }
    }

    /// An HTTP client for tools and providers: refused addresses dropped from every
    /// resolution (unless `open`, Kortex's own always), no redirects, and the
    /// installation's marker on every request. `env_proxies`: honour `HTTPS_PROXY` and the
    /// like (a proxy resolves names itself, out of the resolver's sight; URLs are still
    /// checked before each request, and the marker still travels).
    pub fn client(
        self: &Arc<Self>,
        open: bool,
        builder: reqwest::ClientBuilder,
        env_proxies: bool,
    ) -> Result<reqwest::Client, String> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Ok(value) = reqwest::header::HeaderValue::from_str(&self.marker) {
            headers.insert(VIA_HEADER, value);
        }
        let builder = builder
            .redirect(reqwest::redirect::Policy::none())
            .default_headers(headers)
            .dns_resolver(GuardedResolver {
                egress: self.clone(),
                open,
            });
        let builder = if env_proxies {
            builder
        } else {
            builder.no_proxy()
        };
        builder
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))
    }

    /// A plugin tool's client (`open`: `allowPrivateTargets`).
    pub fn plugin_client(self: &Arc<Self>, open: bool) -> Result<reqwest::Client, String> {
        let builder = reqwest::Client::builder()
            .user_agent(concat!("kortex/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(std::time::Duration::from_secs(10));
        self.client(open, builder, open)
    }
}

/// Reads at most `limit` bytes of a response body; whether there was more (the rest is not
/// read). One reader for every answer Kortex takes from outside (providers, tools).
pub async fn read_capped(
    response: reqwest::Response,
    limit: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    use futures_util::StreamExt;
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        let room = limit.saturating_sub(body.len());
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

/// An error with its sources, each once: what a transport failure says to a person.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn is_localhost(name: &str) -> bool {
    name == "localhost" || name.ends_with(".localhost")
}

impl Refusal {
    fn what(self) -> &'static str {
        match self {
            Self::Private(what) => what,
            Self::Kortex => "Kortex itself",
        }
    }

    fn message(self, host: &str) -> String {
        match self {
            Self::Private(what) => refusal(host, what),
            Self::Kortex => format!(
                "refused: {host} is Kortex itself; no tool or provider may send requests to Kortex, whatever allowPrivateTargets says"
            ),
        }
    }
}

fn refusal(host: &str, what: &str) -> String {
    format!(
        "refused: {host} is {what}; tools and providers may not reach it unless their resource sets allowPrivateTargets: true"
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
struct GuardedResolver {
    egress: Arc<Egress>,
    /// `allowPrivateTargets`: only Kortex itself is dropped.
    open: bool,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let egress = self.egress.clone();
        let open = self.open;
        let host = name.as_str().to_owned();
        let refused = move |r: Refusal| !open || r == Refusal::Kortex;
        Box::pin(async move {
            if let Some(r) = egress.refusal_for_name(&host).filter(|r| refused(*r)) {
                return Err(r.message(&host).into());
            }
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut first_refusal = None;
            let allowed: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(
                    |a| match egress.refusal_for_ip(a.ip()).filter(|r| refused(*r)) {
                        Some(r) => {
                            first_refusal.get_or_insert(r);
                            false
                        }
                        None => true,
                    },
                )
                .collect();
            match (allowed.is_empty(), first_refusal) {
                (true, Some(r)) => Err(r.message(&host).into()),
                _ => Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(e: &Egress, url: &str) -> Result<(), String> {
        e.check_url(&reqwest::Url::parse(url).map_err(|e| e.to_string())?, false)
    }

    fn check_open(e: &Egress, url: &str) -> Result<(), String> {
        e.check_url(&reqwest::Url::parse(url).map_err(|e| e.to_string())?, true)
    }

    fn own() -> Own {
        Own {
            ips: vec![
                IpAddr::V4(Ipv4Addr::new(10, 244, 0, 7)),
                IpAddr::V4(Ipv4Addr::new(10, 96, 12, 34)),
            ],
            names: vec![
                "kortex.ops.svc".into(),
                "kortex.ops.svc.cluster.local".into(),
            ],
        }
    }

    /// Kortex listening on 8080.
    fn listening(e: Egress) -> Egress {
        e.add_own_port(8080);
        e
    }

    #[test]
    fn kortex_itself_is_never_a_target() {
        for e in [
            listening(Egress::standalone(own())),
            listening(Egress::cluster(own(), "m")),
        ] {
            for url in [
                "http://127.0.0.1:8080/chat/v1/sessions",
                "http://localhost:8080/api/v1/proposals",
                "http://[::1]:8080/",
                "http://0.0.0.0:8080/",
                "http://[::ffff:127.0.0.1]:8080/",
                "http://10.244.0.7:9000/",
                "http://10.96.12.34/chat/v1/sessions",
                "http://kortex.ops.svc:8080/",
                "http://KORTEX.ops.svc.cluster.local./",
            ] {
                for open in [false, true] {
                    let err = match e.check_url(
                        &reqwest::Url::parse(url).unwrap_or_else(|e| panic!("{e}")),
                        open,
                    ) {
                        Err(err) => err,
                        Ok(()) => panic!("{url} was allowed (open: {open})"),
                    };
                    assert!(err.contains("Kortex itself"), "{url}: {err}");
                }
            }
        }
    }

    #[test]
    fn loopback_is_kortex_own_pod_in_cluster_mode() {
        let standalone = Egress::standalone(own());
        let cluster = Egress::cluster(own(), "m");
        for url in [
            "http://127.0.0.1:11434/api/chat",
            "http://localhost:9000/mcp",
            "http://[::1]:8000/v1",
        ] {
            assert_eq!(check(&standalone, url), Ok(()), "{url}");
            let err = check(&cluster, url).err().unwrap_or_default();
            assert!(
                err.contains("loopback") && err.contains("allowPrivateTargets"),
                "{url}: {err}"
            );
            assert_eq!(check_open(&cluster, url), Ok(()), "{url}");
        }
        assert_eq!(
            cluster.refuse_ip(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            Some("a loopback address (Kortex's own pod)")
        );
        assert_eq!(
            cluster.refuse_ip(IpAddr::V4(Ipv4Addr::new(10, 244, 0, 7))),
            Some("Kortex itself")
        );
        assert_eq!(standalone.refuse_ip(IpAddr::V4(Ipv4Addr::LOCALHOST)), None);
    }

    #[test]
    fn metadata_link_local_and_api_server_are_refused() {
        let e = Egress::default();
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
            assert_eq!(check_open(&e, url), Ok(()), "{url}");
        }
        // An endpoint of the `kubernetes` Service, on any port.
        e.add_api_server("172.18.0.2", 6443);
        assert!(check(&e, "http://172.18.0.2:10250/pods").is_err());
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
