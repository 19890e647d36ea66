//! Leader election behind a slow API server, on a real one (issue 44): after an outage that
//! made it step down, the one replica gets the Lease back although every round trip now
//! takes longer than the 100 ms the old code left it; the Lease names it.

use k8s_openapi::api::coordination::v1::Lease;
use kortex::operator::lease::{self, LeaseConfig};
use kortex_e2e::{DelayingProxy, api_server_address, in_temp_namespace};
use kube::Api;
use std::time::{Duration, Instant};
use tokio::sync::watch;

async fn wait(what: &str, limit: Duration, check: impl Fn() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while !check() {
        anyhow::ensure!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_one_replica_leads_again_after_an_outage_behind_a_slow_api_server() -> anyhow::Result<()>
{
    in_temp_namespace("leader", run).await
}

async fn run(admin: &kube::Client, ns: &str) -> anyhow::Result<()> {
    let proxy = DelayingProxy::start(api_server_address().await?).await?;
    let config = LeaseConfig {
        duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(300),
        ..LeaseConfig::new(ns, "pod-a")
    };
    let (leader_tx, leader) = watch::channel(false);
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(lease::run(
        proxy.client().await?,
        config,
        leader_tx,
        stop_rx,
    ));
    let outcome = async {
        wait("pod-a to lead", Duration::from_secs(10), || {
            *leader.borrow()
        })
        .await?;
        proxy.set_down(true);
        wait("pod-a to step down", Duration::from_secs(6), || {
            !*leader.borrow()
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        // Back, each chunk 80 ms late each way: a read and a write take ~350 ms or more.
        proxy.set_latency(Duration::from_millis(80));
        proxy.set_down(false);
        wait("pod-a to lead again", Duration::from_secs(15), || {
            *leader.borrow()
        })
        .await?;
        let lease = Api::<Lease>::namespaced(admin.clone(), ns)
            .get("kortex-leader")
            .await?;
        let holder = lease.spec.and_then(|s| s.holder_identity);
        anyhow::ensure!(holder.as_deref() == Some("pod-a"), "holder: {holder:?}");
        // Renewals keep fitting in the deadline.
        let steady = Instant::now() + Duration::from_secs(3);
        while Instant::now() < steady {
            anyhow::ensure!(*leader.borrow(), "pod-a lost the lease while renewing");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
    .await;
    let _ = stop.send(true);
    let _ = task.await;
    outcome
}
