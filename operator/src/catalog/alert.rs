//! Alertmanager's webhook payload (version 4) and the matchers of alert triggers. Pure:
//! parsing, validation (errors name the field), matching and the values a prompt template
//! is rendered with.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One webhook notification: the alerts of one group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Notification {
    /// `"4"`.
    pub version: String,
    /// Identifies the group (stable while it fires).
    pub group_key: String,
    /// Alerts Alertmanager left out (`max_alerts`).
    #[serde(default)]
    pub truncated_alerts: u64,
    /// `firing` while any alert fires, else `resolved`.
    pub status: String,
    /// The receiver's name.
    #[serde(default)]
    pub receiver: String,
    /// Labels the group is formed by.
    #[serde(default)]
    pub group_labels: BTreeMap<String, String>,
    /// Labels every alert has.
    #[serde(default)]
    pub common_labels: BTreeMap<String, String>,
    /// Annotations every alert has.
    #[serde(default)]
    pub common_annotations: BTreeMap<String, String>,
    /// Alertmanager's address.
    #[serde(default, rename = "externalURL")]
    pub external_url: String,
    /// The alerts.
    pub alerts: Vec<Alert>,
}

/// One alert.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    /// `firing` or `resolved`.
    pub status: String,
    /// Its labels (identify it).
    pub labels: BTreeMap<String, String>,
    /// Its annotations (summary, description, runbook_url, ...).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// RFC 3339.
    pub starts_at: String,
    /// RFC 3339 (`0001-01-01T00:00:00Z` while firing).
    #[serde(default)]
    pub ends_at: String,
    /// The rule that fired it.
    #[serde(default, rename = "generatorURL")]
    pub generator_url: String,
    /// Alertmanager's fingerprint of the labels.
    #[serde(default)]
    pub fingerprint: String,
}

/// Parses and checks a webhook body; the error names the field.
pub fn parse(body: &[u8]) -> Result<Notification, String> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    let n: Notification = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path.is_empty() {
            format!("the body is not an Alertmanager webhook payload: {inner}")
        } else {
            format!("{path}: {inner}")
        }
    })?;
    if n.version != "4" {
        return Err(format!(
            "version: {:?} is not supported; Kortex reads Alertmanager's webhook payload version \"4\"",
            n.version
        ));
    }
    if n.group_key.trim().is_empty() {
        return Err("groupKey: must not be empty".into());
    }
    let status = |s: &str| s == "firing" || s == "resolved";
    if !status(&n.status) {
        return Err(format!(
            "status: {:?} is neither firing nor resolved",
            n.status
        ));
    }
    if n.alerts.is_empty() {
        return Err("alerts: must hold at least one alert".into());
    }
    for (i, a) in n.alerts.iter().enumerate() {
        if !status(&a.status) {
            return Err(format!(
                "alerts[{i}].status: {:?} is neither firing nor resolved",
                a.status
            ));
        }
        if a.labels.is_empty() {
            return Err(format!("alerts[{i}].labels: an alert needs labels"));
        }
        if a.starts_at.parse::<jiff::Timestamp>().is_err() {
            return Err(format!(
                "alerts[{i}].startsAt: {:?} is not an RFC 3339 time",
                a.starts_at
            ));
        }
    }
    Ok(n)
}

impl Alert {
    /// Alertmanager's fingerprint, or one of the labels when it sent none.
    pub fn fingerprint(&self) -> String {
        if !self.fingerprint.is_empty() {
            return self.fingerprint.clone();
        }
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for (k, v) in &self.labels {
            h.update(k.as_bytes());
            h.update([0xff]);
            h.update(v.as_bytes());
            h.update([0xff]);
        }
        h.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// `alertname{label="value", ...} firing since TIME: summary` (one line).
    pub fn line(&self) -> String {
        let name = self.labels.get("alertname").map_or("alert", String::as_str);
        let labels: Vec<String> = self
            .labels
            .iter()
            .filter(|(k, _)| k.as_str() != "alertname")
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect();
        let mut line = format!(
            "{name}{{{}}} {} since {}",
            labels.join(", "),
            self.status,
            self.starts_at
        );
        if let Some(s) = self
            .annotations
            .get("summary")
            .or_else(|| self.annotations.get("description"))
        {
            line.push_str(": ");
            line.push_str(s);
        }
        line
    }
}

/// One label matcher.
#[derive(Clone, Debug)]
pub enum Matcher {
    /// The value, exactly.
    Exact(String),
    /// `~REGEX`: a full match.
    Regex(regex::Regex),
}

/// A trigger's matchers (every one must match; a missing label is the empty string, as in
/// Alertmanager).
#[derive(Clone, Debug, Default)]
pub struct Matchers(Vec<(String, Matcher)>);

impl Matchers {
    /// Parses `spec.triggers[].alerts.matchers`; a bad regex is an error naming the label.
    pub fn parse(spec: &BTreeMap<String, String>) -> Result<Self, String> {
        let mut out = Vec::new();
        for (label, value) in spec {
            let matcher = match value.strip_prefix('~') {
                Some(re) => Matcher::Regex(
                    regex::RegexBuilder::new(&format!("^(?:{re})$"))
                        .size_limit(1 << 20)
                        .build()
                        .map_err(|e| {
                            format!(
                                "matchers.{label}: {re:?} is not a valid regular expression: {e}"
                            )
                        })?,
                ),
                None => Matcher::Exact(value.clone()),
            };
            out.push((label.clone(), matcher));
        }
        Ok(Self(out))
    }

    /// Whether `labels` satisfy every matcher.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|(label, m)| {
            let value = labels.get(label).map_or("", String::as_str);
            match m {
                Matcher::Exact(v) => v == value,
                Matcher::Regex(re) => re.is_match(value),
            }
        })
    }
}

/// What a template gets from a notification's alerts (those its trigger took).
pub fn values(n: &Notification, trigger: &str) -> super::template::Values {
    let common = |pick: fn(&Alert) -> &BTreeMap<String, String>| {
        let mut out = n.alerts.first().map(pick).cloned().unwrap_or_default();
        for a in n.alerts.iter().skip(1) {
            out.retain(|k, v| pick(a).get(k) == Some(v));
        }
        out
    };
    super::template::Values {
        labels: common(|a| &a.labels),
        annotations: common(|a| &a.annotations),
        status: n.status.clone(),
        starts_at: n
            .alerts
            .iter()
            .map(|a| a.starts_at.as_str())
            .min()
            .unwrap_or_default()
            .to_owned(),
        generator_url: n
            .alerts
            .first()
            .map(|a| a.generator_url.clone())
            .unwrap_or_default(),
        alerts: n.alerts.iter().map(Alert::line).collect(),
        trigger: trigger.to_owned(),
        slot: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn payload() -> serde_json::Value {
        json!({
            "version": "4", "groupKey": "{}:{alertname=\"KubePodCrashLooping\"}", "truncatedAlerts": 0,
            "status": "firing", "receiver": "kortex",
            "groupLabels": {"alertname": "KubePodCrashLooping"},
            "commonLabels": {"alertname": "KubePodCrashLooping", "severity": "critical"},
            "commonAnnotations": {}, "externalURL": "http://127.0.0.1:9093",
            "alerts": [{
                "status": "firing",
                "labels": {"alertname": "KubePodCrashLooping", "severity": "critical", "namespace": "shop", "pod": "web-1"},
                "annotations": {"summary": "web-1 restarts"},
                "startsAt": "2026-11-27T02:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus/graph", "fingerprint": "a1b2"
            }]
        })
    }

    #[test]
    fn a_real_payload_parses_and_matches() {
        let n = parse(payload().to_string().as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        let m = Matchers::parse(&BTreeMap::from([
            ("severity".to_owned(), "~critical|page".to_owned()),
            ("namespace".to_owned(), "shop".to_owned()),
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(m.matches(&n.alerts[0].labels));
        let partial = Matchers::parse(&BTreeMap::from([(
            "severity".to_owned(),
            "~crit".to_owned(),
        )]))
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            !partial.matches(&n.alerts[0].labels),
            "a regex matches in full"
        );
        let missing = Matchers::parse(&BTreeMap::from([("team".to_owned(), "".to_owned())]))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            missing.matches(&n.alerts[0].labels),
            "a missing label is empty"
        );
        let v = values(&n, "crashloops");
        assert_eq!(v.labels.get("pod").map(String::as_str), Some("web-1"));
        assert_eq!(
            v.alerts,
            vec![
                "KubePodCrashLooping{namespace=\"shop\", pod=\"web-1\", severity=\"critical\"} firing since 2026-11-27T02:00:00Z: web-1 restarts"
            ]
        );
        assert_eq!(n.alerts[0].fingerprint(), "a1b2");
    }

    #[test]
    fn bad_payloads_name_the_field() {
        let err = |v: serde_json::Value| parse(v.to_string().as_bytes()).err().unwrap_or_default();
        let mut p = payload();
        p["version"] = json!("3");
        assert!(err(p).starts_with("version:"));
        let mut p = payload();
        p["alerts"][0]["labels"] = json!("x");
        assert!(err(p).starts_with("alerts[0].labels:"), "{}", {
            let mut p = payload();
            p["alerts"][0]["labels"] = json!("x");
            err(p)
        });
        let mut p = payload();
        p["alerts"][0]["startsAt"] = json!("yesterday");
        assert!(err(p).starts_with("alerts[0].startsAt:"));
        let mut p = payload();
        p.as_object_mut().map(|o| o.remove("groupKey"));
        assert!(err(p).contains("groupKey"));
        assert!(parse(b"not json").is_err());
        assert!(Matchers::parse(&BTreeMap::from([("a".to_owned(), "~(".to_owned())])).is_err());
    }
}
