//! A webhook receiver on 127.0.0.1 (what notifications are delivered to).

use crate::support::net::serve;
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A webhook receiver on 127.0.0.1 that records what it is sent (headers and body) and
/// answers 503 to its first `fail_first` requests; each answer takes `delay`.
pub struct Receiver {
    pub url: String,
    seen: Arc<Mutex<Vec<(axum::http::HeaderMap, String)>>>,
    pub refused: Arc<AtomicUsize>,
}

pub async fn receiver(fail_first: usize) -> Receiver {
    slow_receiver(fail_first, std::time::Duration::ZERO).await
}

pub async fn slow_receiver(fail_first: usize, delay: std::time::Duration) -> Receiver {
    let seen: Arc<Mutex<Vec<(axum::http::HeaderMap, String)>>> = Arc::default();
    let refused = Arc::new(AtomicUsize::new(0));
    let (s, r) = (seen.clone(), refused.clone());
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
            let (s, r) = (s.clone(), r.clone());
            async move {
                tokio::time::sleep(delay).await;
                if r.load(Ordering::SeqCst) < fail_first {
                    r.fetch_add(1, Ordering::SeqCst);
                    return axum::http::StatusCode::SERVICE_UNAVAILABLE;
                }
                s.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((headers, body));
                axum::http::StatusCode::OK
            }
        }),
    );
    let base = serve(app).await;
    Receiver {
        url: format!("{base}/hook"),
        seen,
        refused,
    }
}

impl Receiver {
    pub fn got(&self) -> Vec<(axum::http::HeaderMap, Value)> {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(h, b)| (h.clone(), serde_json::from_str(b).unwrap_or(Value::Null)))
            .collect()
    }

    /// The bodies of the events of `kind` (their `type`) it has received, in order.
    pub fn events(&self, kind: &str) -> Vec<Value> {
        self.got()
            .into_iter()
            .map(|(_, b)| b)
            .filter(|b| b["type"] == kind)
            .collect()
    }

    pub fn raw(&self, i: usize) -> String {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())[i]
            .1
            .clone()
    }
}
