//! Retries with jittered exponential backoff, only while nothing has been streamed: the
//! first event of a stream is peeked, so an error before any output is retried (honouring
//! `Retry-After`) or returned as a plain error, never as a broken stream.

use super::{ChatStream, LlmError};
use futures_util::StreamExt;
use std::time::Duration;

/// How many attempts and how long between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all (1 = no retry).
    pub attempts: u32,
    /// First backoff; doubles each time, with ±50 % jitter.
    pub base: Duration,
    /// Ceiling of any wait, `Retry-After` included.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 3,
            base: Duration::from_millis(250),
            max_delay: Duration::from_secs(20),
        }
    }
}

impl RetryPolicy {
    /// The wait before attempt `attempt + 1`.
    pub fn delay(&self, attempt: u32, error: &LlmError) -> Duration {
        if let Some(after) = error.retry_after {
            return after.min(self.max_delay);
        }
        let exp = self.base.saturating_mul(1u32 << attempt.min(16));
        // Jitter without a random-number dependency: the clock's nanoseconds are noise enough
        // to de-synchronise replicas.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let factor = 0.5 + f64::from(nanos % 1000) / 1000.0;
        exp.mul_f64(factor).min(self.max_delay)
    }
}

/// Whether attempt `n` failing with `error` is the last: not retryable, out of attempts,
/// or a second 500 in a row (`internal` counts them: the server failing on this request,
/// not a passing fault).
fn gives_up(policy: RetryPolicy, error: &LlmError, n: u32, internal: &mut u32) -> bool {
    *internal = if error.status == Some(500) {
        *internal + 1
    } else {
        0
    };
    !error.is_retryable() || n >= policy.attempts || *internal >= 2
}

/// Runs `attempt` until it yields a stream whose first event is not a retryable error.
pub async fn stream_with_retry<F, Fut>(
    policy: RetryPolicy,
    mut attempt: F,
) -> Result<ChatStream, LlmError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<ChatStream, LlmError>>,
{
    // A stream whose first event is an error counts as a failed call.
    call_with_retry(policy, || {
        let started = attempt();
        async move {
            let mut stream = started.await?;
            match stream.next().await {
                Some(Ok(first)) => Ok(futures_util::stream::once(async { Ok(first) })
                    .chain(stream)
                    .boxed()),
                Some(Err(e)) => Err(e),
                None => Ok(stream),
            }
        }
    })
    .await
}

/// Runs a non-streamed call with the same retry rules.
pub async fn call_with_retry<T, F, Fut>(policy: RetryPolicy, mut attempt: F) -> Result<T, LlmError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LlmError>>,
{
    let mut n = 0;
    let mut internal = 0u32;
    loop {
        let error = match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        n += 1;
        if gives_up(policy, &error, n, &mut internal) {
            return Err(error);
        }
        let wait = policy.delay(n - 1, &error);
        tracing::warn!(provider = %error.provider, error = %error, attempt = n, wait_ms = wait.as_millis() as u64, "retrying provider call");
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ErrorKind;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn status(code: u16) -> LlmError {
        LlmError::from_status("p", code, String::new(), None)
    }

    /// How many attempts a call failing with `codes` (then succeeding) takes, and its result.
    async fn run(codes: &[u16]) -> (u32, Result<(), LlmError>) {
        let policy = RetryPolicy {
            attempts: 3,
            base: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
        };
        let calls = AtomicU32::new(0);
        let result = call_with_retry(policy, || {
            let i = calls.fetch_add(1, Ordering::Relaxed) as usize;
            let code = codes.get(i).copied();
            async move { code.map_or(Ok(()), |c| Err(status(c))) }
        })
        .await;
        (calls.load(Ordering::Relaxed), result)
    }

    #[tokio::test]
    async fn only_what_can_succeed_is_retried() {
        // Passing faults: retried up to three attempts.
        assert_eq!(run(&[503, 502]).await.0, 3);
        assert!(run(&[503, 502]).await.1.is_ok());
        assert_eq!(run(&[429, 500]).await.0, 3);
        // A 500 twice in a row is the server failing on this request: no third attempt.
        let (calls, result) = run(&[500, 500]).await;
        assert_eq!(calls, 2);
        assert_eq!(result.map_err(|e| e.status), Err(Some(500)));
        // Never retried.
        for code in [400, 401, 404, 413, 501] {
            assert_eq!(run(&[code]).await.0, 1, "{code}");
        }
        assert_eq!(status(501).kind, ErrorKind::Upstream);
    }
}
