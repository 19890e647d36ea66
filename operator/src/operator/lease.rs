//! Leader election over a `coordination.k8s.io/v1` Lease, the way client-go does it: the
//! holder renews the Lease every few seconds; another replica takes it over only when the
//! record has not changed for a whole lease duration *by its own clock* (so clock skew
//! between nodes does not matter), and every write is conditioned on the resourceVersion
//! read, so two replicas can never both win.
//!
//! A leader that cannot renew within [`LeaseConfig::renew_deadline`] steps down at once,
//! before any other replica may take over, so leader duties (status writes, proposal
//! expiry and execution) never run on two replicas at a time.

use super::error::Error;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The election's settings.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Lease name.
    pub name: String,
    /// Lease namespace (Kortex's own).
    pub namespace: String,
    /// This replica (the pod name).
    pub identity: String,
    /// How long a Lease is valid without renewal.
    pub duration: Duration,
    /// A leader that could not renew for this long steps down (less than `duration`).
    pub renew_deadline: Duration,
    /// How often the Lease is renewed or checked.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// The defaults of Kubernetes' own controllers: 15 s / 10 s / 2 s.
    pub fn new(namespace: &str, identity: &str) -> Self {
        Self {
            name: "kortex-leader".into(),
            namespace: namespace.to_owned(),
            identity: identity.to_owned(),
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What to do about the Lease as last read.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// There is none: create it, held by us.
    Create(Lease),
    /// Ours, or free to take: write it back (conditioned on its resourceVersion).
    Write(Lease),
    /// Someone else holds it.
    Wait {
        /// The holder.
        holder: String,
    },
}

/// Decides from the Lease read (`None`: not found) and how long its record has been
/// unchanged by our clock.
pub fn decide(
    lease: Option<&Lease>,
    unchanged_for: Duration,
    config: &LeaseConfig,
    now: jiff::Timestamp,
) -> Step {
    let spec_for = |previous: Option<&LeaseSpec>| {
        let mine = previous.and_then(|s| s.holder_identity.as_deref()) == Some(&config.identity);
        LeaseSpec {
            holder_identity: Some(config.identity.clone()),
            lease_duration_seconds: Some(config.duration.as_secs() as i32),
            acquire_time: if mine {
                previous.and_then(|s| s.acquire_time.clone())
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(match previous {
                Some(s) if !mine => s.lease_transitions.unwrap_or(0) + 1,
                Some(s) => s.lease_transitions.unwrap_or(0),
                None => 0,
            }),
            ..Default::default()
        }
    };
    let Some(lease) = lease else {
        return Step::Create(Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some(config.namespace.clone()),
                ..Default::default()
            },
            spec: Some(spec_for(None)),
        });
    };
    let spec = lease.spec.as_ref();
    let holder = spec
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty());
    let duration = spec
        .and_then(|s| s.lease_duration_seconds)
        .map_or(config.duration, |s| Duration::from_secs(s.max(1) as u64));
    match holder {
        Some(h) if h != config.identity && unchanged_for < duration => Step::Wait { holder: h },
        _ => Step::Write(Lease {
            metadata: lease.metadata.clone(),
            spec: Some(spec_for(spec)),
        }),
    }
}

/// Campaigns for the Lease until `stop` flips, publishing whether this replica leads.
/// On stop, a leader gives the Lease up so another replica takes over at once.
pub async fn run(
    client: kube::Client,
    config: LeaseConfig,
    leader: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    // The last record seen (resourceVersion) and when, by our clock.
    let mut seen: Option<(String, Instant)> = None;
    // When this replica, leading, last renewed; `None` while it does not lead.
    let mut last_renewal: Option<Instant> = None;
    // Whether the API server's last answer was a failure (one log line per outage).
    let mut failing = false;
    loop {
        let budget = budget(&config, last_renewal);
        let result = attempt(&api, &config, &mut seen, budget).await;
        match result {
            Ok(true) => {
                last_renewal = Some(Instant::now());
                if std::mem::take(&mut failing) {
                    tracing::info!(lease = %config.name, "the leader Lease can be read and renewed again");
                }
                if leader.send_if_modified(|l| !std::mem::replace(l, true)) {
                    tracing::info!(identity = %config.identity, lease = %config.name, "became the leader");
                }
            }
            Ok(false) => {
                last_renewal = None;
                if std::mem::take(&mut failing) {
                    tracing::info!(lease = %config.name, "the leader Lease can be read again");
                }
                if leader.send_if_modified(|l| std::mem::replace(l, false)) {
                    tracing::warn!(identity = %config.identity, "lost the leader Lease");
                }
            }
            Err(e) => {
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(error = %e, lease = %config.name, leading = last_renewal.is_some(), "cannot read or renew the leader Lease; retrying every {} s", config.retry_period.as_secs_f32());
                } else {
                    tracing::debug!(error = %e, lease = %config.name, "cannot read or renew the leader Lease");
                }
                // Stepped down (or never led): the next attempts get the whole deadline again.
                if last_renewal.is_none_or(|t| t.elapsed() >= config.renew_deadline) {
                    last_renewal = None;
                    if leader.send_if_modified(|l| std::mem::replace(l, false)) {
                        tracing::warn!(identity = %config.identity, "stepped down: the Lease could not be renewed in time");
                    }
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(config.retry_period) => {}
            _ = stop.changed() => break,
        }
    }
    if *leader.borrow() {
        leader.send_replace(false);
        release(&api, &config).await;
    }
}

/// How long one attempt (a read and a write) may take. kube's client has no read timeout:
/// a hung request must not keep a leader that can no longer renew in charge, so a leader's
/// attempt gets what is left of its renew deadline (it steps down when that passes, not
/// whenever the call returns). A replica that does not lead — never did, or stepped down —
/// gets the whole deadline: it has nothing to give up, and a slow API server (each round
/// trip ~100 ms) must not keep every attempt from finishing.
pub fn budget(config: &LeaseConfig, last_renewal: Option<Instant>) -> Duration {
    last_renewal.map_or(config.renew_deadline, |t| {
        config
            .renew_deadline
            .saturating_sub(t.elapsed())
            .max(Duration::from_millis(100))
    })
}

/// One read and, when due, one write, within `budget`. `Ok(true)`: we hold the Lease now.
/// A write whose outcome is unknown (no answer in time, a broken connection) may have
/// reached the API server: the Lease is read again to learn who holds it before anything
/// is decided.
async fn attempt(
    api: &Api<Lease>,
    config: &LeaseConfig,
    seen: &mut Option<(String, Instant)>,
    budget: Duration,
) -> Result<bool, Error> {
    let deadline = tokio::time::Instant::now() + budget;
    let no_answer = |doing| Error::NoAnswer {
        doing,
        within: budget,
    };
    let current = tokio::time::timeout_at(deadline, api.get_opt(&config.name))
        .await
        .map_err(|_| no_answer("reading the Lease"))?
        .map_err(Error::api("reading the Lease"))?;
    let version = current
        .as_ref()
        .and_then(|l| l.metadata.resource_version.clone())
        .unwrap_or_default();
    let unchanged_for = match seen {
        Some((v, at)) if *v == version => at.elapsed(),
        _ => {
            *seen = Some((version, Instant::now()));
            Duration::ZERO
        }
    };
    let post = PostParams::default();
    let (written, outcome) = match decide(
        current.as_ref(),
        unchanged_for,
        config,
        jiff::Timestamp::now(),
    ) {
        Step::Wait { .. } => return Ok(false),
        Step::Create(lease) => {
            let call = api.create(&post, &lease);
            (lease.clone(), tokio::time::timeout_at(deadline, call).await)
        }
        Step::Write(lease) => {
            let call = api.replace(&config.name, &post, &lease);
            (lease.clone(), tokio::time::timeout_at(deadline, call).await)
        }
    };
    let why = match outcome {
        Ok(Ok(_)) => return Ok(true),
        // Another replica wrote first.
        Ok(Err(kube::Error::Api(s))) if s.code == 409 => return Ok(false),
        // The API server refused it: the write did not happen. (A 5xx may come from a proxy
        // or a timeout after the write: unknown.)
        Ok(Err(kube::Error::Api(s))) if s.code < 500 => {
            return Err(Error::api("writing the Lease")(kube::Error::Api(s)));
        }
        Ok(Err(e)) => Error::api("writing the Lease")(e).to_string(),
        Err(_) => no_answer("writing the Lease").to_string(),
    };
    // Re-read within one retry period: the answer to "did it land?" is the Lease itself.
    let reread = tokio::time::timeout(config.retry_period, api.get_opt(&config.name)).await;
    match reread {
        Ok(Ok(lease)) => {
            if let Some(l) = &lease {
                *seen = Some((
                    l.metadata.resource_version.clone().unwrap_or_default(),
                    Instant::now(),
                ));
            }
            match landed(lease.as_ref(), &written, config) {
                Some(ours) => Ok(ours),
                None => Err(Error::Unsettled(format!(
                    "{why}; the Lease was not written"
                ))),
            }
        }
        Ok(Err(e)) => Err(Error::Unsettled(format!(
            "{why}; reading the Lease again failed: {}",
            super::error::describe(&e)
        ))),
        Err(_) => Err(Error::Unsettled(format!(
            "{why}; reading the Lease again got no answer either"
        ))),
    }
}

/// After a write whose outcome is unknown, what the Lease read again says: `Some(true)` it
/// is ours as written (the write landed), `Some(false)` someone else holds it, `None`
/// nothing changed (the write was lost).
pub fn landed(lease: Option<&Lease>, written: &Lease, config: &LeaseConfig) -> Option<bool> {
    let spec = lease.and_then(|l| l.spec.as_ref());
    let holder = spec
        .and_then(|s| s.holder_identity.as_deref())
        .unwrap_or("");
    let wrote = written.spec.as_ref();
    if holder == config.identity
        && spec.and_then(|s| s.renew_time.as_ref()) == wrote.and_then(|s| s.renew_time.as_ref())
    {
        Some(true)
    } else if !holder.is_empty() && holder != config.identity {
        Some(false)
    } else {
        None
    }
}

/// Gives the Lease up (holder cleared), so the next replica need not wait for it to expire.
async fn release(api: &Api<Lease>, config: &LeaseConfig) {
    let Ok(Some(mut lease)) = api.get_opt(&config.name).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
    match api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => tracing::info!(lease = %config.name, "released the leader Lease"),
        Err(e) => tracing::warn!(error = %e, "could not release the leader Lease"),
    }
}

/// Resolves when this replica's leadership changes; never without a leader election
/// (`None`: the one process of `kortex serve` always leads), or once the election ended.
pub async fn leadership_changes(leader: &mut Option<watch::Receiver<bool>>) {
    if let Some(l) = leader
        && l.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(identity: &str) -> LeaseConfig {
        LeaseConfig::new("kortex", identity)
    }

    fn held_by(holder: &str, transitions: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("kortex-leader".into()),
                namespace: Some("kortex".into()),
                resource_version: Some("42".into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                acquire_time: Some(MicroTime(jiff::Timestamp::UNIX_EPOCH)),
                renew_time: Some(MicroTime(jiff::Timestamp::UNIX_EPOCH)),
                lease_transitions: Some(transitions),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_missing_lease_is_created_held_by_us() {
        let now = jiff::Timestamp::now();
        let Step::Create(lease) = decide(None, Duration::ZERO, &config("pod-a"), now) else {
            panic!("expected a create");
        };
        let spec = lease.spec.unwrap_or_default();
        assert_eq!(spec.holder_identity.as_deref(), Some("pod-a"));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(spec.renew_time, Some(MicroTime(now)));
    }

    #[test]
    fn another_holder_is_respected_until_its_record_is_stale_by_our_clock() {
        let lease = held_by("pod-b", 3);
        let now = jiff::Timestamp::now();
        // The renewTime is decades old, but what counts is how long *we* saw it unchanged.
        assert_eq!(
            decide(Some(&lease), Duration::from_secs(14), &config("pod-a"), now),
            Step::Wait {
                holder: "pod-b".into()
            }
        );
        let Step::Write(taken) =
            decide(Some(&lease), Duration::from_secs(15), &config("pod-a"), now)
        else {
            panic!("expected a takeover");
        };
        // Conditioned on the version read; a transition counted; acquired now.
        assert_eq!(taken.metadata.resource_version.as_deref(), Some("42"));
        let spec = taken.spec.unwrap_or_default();
        assert_eq!(spec.holder_identity.as_deref(), Some("pod-a"));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.acquire_time, Some(MicroTime(now)));
    }

    #[test]
    fn our_own_lease_is_renewed_without_a_transition() {
        let lease = held_by("pod-a", 3);
        let now = jiff::Timestamp::now();
        let Step::Write(renewed) = decide(Some(&lease), Duration::ZERO, &config("pod-a"), now)
        else {
            panic!("expected a renewal");
        };
        let spec = renewed.spec.unwrap_or_default();
        assert_eq!(spec.lease_transitions, Some(3));
        assert_eq!(
            spec.acquire_time,
            Some(MicroTime(jiff::Timestamp::UNIX_EPOCH))
        );
        assert_eq!(spec.renew_time, Some(MicroTime(now)));
    }

    #[test]
    fn a_replica_that_does_not_lead_gets_the_whole_deadline() {
        let config = config("pod-a");
        // Issue 44: after stepping down, each attempt got max(10 s - elapsed, 100 ms) =
        // 100 ms, too little for a read and a write behind a slow API server.
        assert_eq!(budget(&config, None), config.renew_deadline);
        let long_ago = Instant::now()
            .checked_sub(Duration::from_secs(30))
            .unwrap_or_else(Instant::now);
        assert_eq!(
            budget(&config, Some(long_ago)),
            Duration::from_millis(100),
            "a leader past its deadline gets only the floor"
        );
        let just_now = Instant::now();
        assert!(budget(&config, Some(just_now)) > Duration::from_secs(9));
    }

    #[test]
    fn an_unknown_write_is_settled_by_what_the_lease_says() {
        let config = config("pod-a");
        let now = jiff::Timestamp::now();
        let Step::Write(written) = decide(Some(&held_by("pod-a", 1)), Duration::ZERO, &config, now)
        else {
            panic!("expected a renewal");
        };
        // It landed: the Lease is ours with the renewTime we wrote.
        assert_eq!(landed(Some(&written), &written, &config), Some(true));
        // It was lost: the old record, still naming us.
        assert_eq!(landed(Some(&held_by("pod-a", 1)), &written, &config), None);
        // Someone else took it meanwhile.
        assert_eq!(
            landed(Some(&held_by("pod-b", 2)), &written, &config),
            Some(false)
        );
        assert_eq!(landed(None, &written, &config), None);
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        let mut lease = held_by("pod-b", 1);
        if let Some(s) = lease.spec.as_mut() {
            s.holder_identity = None;
        }
        assert!(matches!(
            decide(
                Some(&lease),
                Duration::ZERO,
                &config("pod-a"),
                jiff::Timestamp::now()
            ),
            Step::Write(_)
        ));
    }
}
