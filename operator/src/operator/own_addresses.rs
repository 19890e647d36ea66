//! What the egress guard needs to know of the cluster in cluster mode: Kortex's own pod
//! addresses, the Services in front of it (so no tool or provider can make Kortex call
//! itself), and the endpoints of the `kubernetes` Service (the API server's real
//! addresses, not only its Service IP). Read at start and refreshed every minute.

use crate::egress::{Egress, Own};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often the Services and endpoints are read again.
const REFRESH: Duration = Duration::from_secs(60);
/// The label an EndpointSlice names its Service with.
const SERVICE_NAME: &str = "kubernetes.io/service-name";

/// This pod's addresses: `given` (`--pod-ips`, from the downward API's `status.podIPs`)
/// plus the source address this process uses towards `api_server` (its pod address, when
/// nothing is given).
pub fn pod_ips(given: &[IpAddr], api_server: Option<&str>) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = given.to_vec();
    let source = api_server
        .and_then(|host| host.trim_matches(['[', ']']).parse::<IpAddr>().ok())
        .and_then(|ip| {
            let bind: IpAddr = if ip.is_ipv4() {
                std::net::Ipv4Addr::UNSPECIFIED.into()
            } else {
                std::net::Ipv6Addr::UNSPECIFIED.into()
            };
            let socket = std::net::UdpSocket::bind((bind, 0)).ok()?;
            // A UDP connect sends nothing: it only picks the route and source address.
            socket.connect((ip, 443)).ok()?;
            socket.local_addr().ok().map(|a| a.ip())
        })
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified());
    ips.extend(source);
    ips.sort();
    ips.dedup();
    ips
}

/// The value every replica of one installation puts in `kortex-via`: the same for all of
/// them (a request from one replica to another is refused too), different per cluster and
/// namespace.
pub fn marker(cluster_url: &str, namespace: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{cluster_url}\n{namespace}").as_bytes());
    digest.iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// The names a Service answers to in-cluster.
pub fn service_names(name: &str, namespace: &str, cluster_domain: &str) -> Vec<String> {
    let domain = cluster_domain.trim_end_matches('.');
    vec![
        name.to_owned(),
        format!("{name}.{namespace}"),
        format!("{name}.{namespace}.svc"),
        format!("{name}.{namespace}.svc.{domain}"),
    ]
}

/// The names of the Services whose endpoints include one of `ips`.
pub fn services_of(slices: &[EndpointSlice], ips: &[IpAddr]) -> Vec<String> {
    let mut names: Vec<String> = slices
        .iter()
        .filter(|s| {
            s.endpoints.iter().any(|e| {
                e.addresses
                    .iter()
                    .filter_map(|a| a.parse::<IpAddr>().ok())
                    .any(|a| ips.contains(&a))
            })
        })
        .filter_map(|s| s.metadata.labels.as_ref()?.get(SERVICE_NAME).cloned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Reads what is known of Kortex itself and of the API server's endpoints into `egress`.
pub async fn refresh(
    client: &kube::Client,
    egress: &Egress,
    namespace: &str,
    cluster_domain: &str,
    base: &Own,
) -> Result<(), kube::Error> {
    let api_slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let lp = ListParams::default().labels(&format!("{SERVICE_NAME}=kubernetes"));
    for slice in api_slices.list(&lp).await?.items {
        let ports: Vec<u16> = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| p.port.and_then(|p| u16::try_from(p).ok()))
            .collect();
        for address in slice.endpoints.iter().flat_map(|e| &e.addresses) {
            for port in &ports {
                egress.add_api_server(address, *port);
            }
        }
    }
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let mut own = base.clone();
    for name in services_of(&slices.list(&ListParams::default()).await?.items, &base.ips) {
        if let Some(service) = services.get_opt(&name).await? {
            let spec = service.spec.unwrap_or_default();
            own.ips.extend(
                spec.cluster_ips
                    .unwrap_or_default()
                    .iter()
                    .chain(spec.cluster_ip.iter())
                    .filter_map(|ip| ip.parse::<IpAddr>().ok()),
            );
        }
        own.names
            .extend(service_names(&name, namespace, cluster_domain));
    }
    own.ips.sort();
    own.ips.dedup();
    own.names.sort();
    own.names.dedup();
    if egress.own() != own {
        tracing::info!(
            addresses = ?own.ips,
            services = ?own.names,
            "tools and providers may not reach Kortex itself at these addresses"
        );
    }
    egress.set_own(own);
    Ok(())
}

/// Refreshes every [`REFRESH`] until `stop`.
pub async fn run(
    client: kube::Client,
    egress: Arc<Egress>,
    namespace: String,
    cluster_domain: String,
    mut stop: watch::Receiver<bool>,
) {
    let base = egress.own();
    let mut warned = false;
    loop {
        let read = tokio::time::timeout(
            Duration::from_secs(30),
            refresh(&client, &egress, &namespace, &cluster_domain, &base),
        )
        .await;
        match read {
            Ok(Ok(())) => warned = false,
            Ok(Err(e)) if !warned => {
                warned = true;
                tracing::warn!(error = %e, "cannot read the Services in front of Kortex or the API server's endpoints; the egress guard knows only the pod's own addresses until the next try in a minute (Kortex's ClusterRole needs get and list on services and endpointslices: config/rbac/role.yaml, the chart's rbac.yaml)");
            }
            Err(_) if !warned => {
                warned = true;
                tracing::warn!(
                    "reading the Services in front of Kortex timed out; the egress guard keeps the addresses it knew and tries again in a minute"
                );
            }
            _ => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(REFRESH) => {}
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(service: &str, addresses: &[&str]) -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("{service}-x"), "labels": {SERVICE_NAME: service}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": addresses}],
        }))
        .unwrap()
    }

    #[test]
    fn the_services_in_front_of_kortex_are_found_by_its_pod_addresses() {
        let slices = [
            slice("kortex", &["10.244.0.7"]),
            slice("kortex-metrics", &["10.244.0.7", "10.244.0.8"]),
            slice("postgres", &["10.244.0.9"]),
        ];
        let own: Vec<IpAddr> = vec!["10.244.0.7".parse().unwrap()];
        assert_eq!(services_of(&slices, &own), ["kortex", "kortex-metrics"]);
        assert_eq!(
            service_names("kortex", "ops", "cluster.local."),
            [
                "kortex",
                "kortex.ops",
                "kortex.ops.svc",
                "kortex.ops.svc.cluster.local"
            ]
        );
    }

    #[test]
    fn every_replica_of_an_installation_carries_the_same_marker() {
        let a = marker("https://10.96.0.1:443", "kortex");
        assert_eq!(a, marker("https://10.96.0.1:443", "kortex"));
        assert_ne!(a, marker("https://10.96.0.1:443", "other"));
        assert_eq!(a.len(), 24);
    }
}
