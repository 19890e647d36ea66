//! Leader election behind a slow API server (issue 44): a replica that stepped down during
//! an outage must get the Lease back once the API server answers again, even when each
//! round trip takes longer than the 100 ms a leader at its deadline is left; and two
//! replicas never lead at once meanwhile.

use crate::support::fake_api::FakeApi;
use kortex::operator::lease::{self, LeaseConfig};
use std::time::{Duration, Instant};
use tokio::sync::watch;

fn client(url: &str) -> kube::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let uri = url.parse().unwrap();
    kube::Client::try_from(kube::Config::new(uri)).unwrap()
}

/// Short timings (15 s / 10 s / 2 s scaled down), so the test takes seconds.
fn config(identity: &str) -> LeaseConfig {
    LeaseConfig {
        duration: Duration::from_millis(3000),
        renew_deadline: Duration::from_millis(2000),
        retry_period: Duration::from_millis(300),
        ..LeaseConfig::new("kortex", identity)
    }
}

struct Replica {
    leader: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn replica(fake: &FakeApi, identity: &str) -> Replica {
    let (leader_tx, leader) = watch::channel(false);
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(lease::run(
        client(&fake.url),
        config(identity),
        leader_tx,
        stop_rx,
    ));
    Replica { leader, stop, task }
}

/// Waits up to `limit` for `check`, failing the test with `what` otherwise; checks on the
/// way that the two replicas never lead at once.
async fn until(
    what: &str,
    limit: Duration,
    a: &Replica,
    b: Option<&Replica>,
    check: impl Fn() -> bool,
) {
    let deadline = Instant::now() + limit;
    loop {
        assert!(
            !(*a.leader.borrow() && b.is_some_and(|b| *b.leader.borrow())),
            "two leaders while waiting for {what}"
        );
        if check() {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn holder(fake: &FakeApi) -> String {
    fake.get("leases", "kortex", "kortex-leader")
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_stepped_down_gets_the_lease_back_behind_a_slow_api_server() {
    let fake = FakeApi::start().await;
    // One replica, the chart's default.
    let a = replica(&fake, "pod-a");
    until("pod-a to lead", Duration::from_secs(5), &a, None, || {
        *a.leader.borrow()
    })
    .await;

    // A 4 s outage (more than the renew deadline): pod-a steps down.
    fake.outage(true);
    until(
        "pod-a to step down",
        Duration::from_secs(5),
        &a,
        None,
        || !*a.leader.borrow(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Back, but slow: each answer takes 150 ms, a read and a write 300 ms — more than the
    // 100 ms the old code left a replica that had stepped down, so it never led again and
    // the cluster had no leader (no status writes, no executions) until a restart.
    fake.latency(Duration::from_millis(150));
    fake.outage(false);
    until(
        "pod-a to lead again",
        Duration::from_secs(10),
        &a,
        None,
        || *a.leader.borrow(),
    )
    .await;
    until(
        "the Lease to name pod-a",
        Duration::from_secs(3),
        &a,
        None,
        || holder(&fake) == "pod-a",
    )
    .await;
    // It keeps leading (renewals fit in the deadline), and a second replica does not take
    // over meanwhile.
    let b = replica(&fake, "pod-b");
    let steady = Instant::now() + Duration::from_secs(4);
    while Instant::now() < steady {
        let (la, lb) = (*a.leader.borrow(), *b.leader.borrow());
        assert!(la && !lb, "pod-a alone leads: pod-a {la}, pod-b {lb}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for r in [a, b] {
        let _ = r.stop.send(true);
        let _ = r.task.await;
    }
}
