//! Budget leases (SPEC §3 Budgets: "a replica may lease budget in chunks"): a replica
//! reserves a chunk of a limited counter in the database and serves calls' reservations
//! from it in memory, so most calls make no database round trip before the provider is
//! called. The database still holds every lease as a reservation, so replicas together
//! never reserve more than the limit; a lease is renewed while its replica lives and swept
//! like any expired reservation when it dies.
//!
//! For one replica the answers are those of reserving each call in the database: a call
//! fits when what is used, what other calls hold and this call's worst case fit under the
//! limit. With several replicas, each may hold up to one chunk it has not used yet (at most
//! a quarter of what was free when it was taken, and 5 % of the limit).

use crate::store::{LeaseAsk, LeaseDraw, LeaseKey, Store, StoreError};
use std::collections::HashMap;
use std::sync::Mutex;

/// How long a lease holds in the database unless renewed.
pub const LEASE_TTL_MS: i64 = 5 * 60_000;
/// A lease is used only while this much of its time is left (renewals come every minute).
const LEASE_MARGIN_MS: i64 = 2 * 60_000;
/// A lease unused this long gives its remainder back (to other replicas, or the next day).
const LEASE_IDLE_MS: i64 = 60_000;
/// The part of a limit one lease takes beyond what its call needs (1/20 = 5 %).
const CHUNK_DIVISOR: i64 = 20;

/// One hold a call asks for: `amount` on a counter with a limit.
#[derive(Clone, Debug)]
pub struct Want {
    /// The counter's scope.
    pub scope: String,
    /// Its window.
    pub window_start: i64,
    /// When the counter may be forgotten.
    pub counter_expires_at: i64,
    /// Its limit.
    pub limit: i64,
    /// How much.
    pub amount: i64,
}

#[derive(Debug)]
struct Lease {
    id: String,
    /// Leased and not drawn by a call yet.
    remaining: i64,
    /// Until when it may be drawn on (the database keeps it [`LEASE_MARGIN_MS`] longer).
    valid_until: i64,
    /// Calls that drew on it and have not settled.
    in_flight: u32,
    last_draw: i64,
}

/// This replica's leases, by counter.
#[derive(Debug)]
pub struct Leases {
    replica: String,
    leases: Mutex<HashMap<(String, i64), Lease>>,
    /// One extension at a time: callers that find a lease spent wait for the one refill.
    refill: tokio::sync::Mutex<()>,
}

/// Why a call did not fit: which hold, and what its counter has used and reserved
/// (without this replica's unused lease).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoRoom {
    /// Index of the hold.
    pub index: usize,
    /// Used and reserved by others.
    pub used: i64,
}

impl Leases {
    /// No leases yet.
    pub fn new() -> Self {
        Self {
            replica: crate::store::new_id(),
            leases: Mutex::new(HashMap::new()),
            refill: tokio::sync::Mutex::new(()),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<(String, i64), Lease>> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Draws every hold of `wants` from this replica's leases, all or none; what is
    /// missing from each is first leased from the database. `Err` names the hold that
    /// does not fit.
    pub async fn draw(
        &self,
        store: &Store,
        wants: &[Want],
        now: i64,
    ) -> Result<Result<Vec<LeaseDraw>, NoRoom>, StoreError> {
        if wants.is_empty() {
            return Ok(Ok(Vec::new()));
        }
        if let Ok(draws) = self.try_draw(wants, now) {
            return Ok(Ok(draws));
        }
        let _refill = self.refill.lock().await;
        // Others drew (or refilled) while this call waited: look again, then extend what
        // is missing. Concurrent draws can take what was leased before this call's draw,
        // so a few rounds may be needed; each round that extends takes at least `need`.
        for _ in 0..8 {
            let missing = match self.try_draw(wants, now) {
                Ok(draws) => return Ok(Ok(draws)),
                Err(missing) => missing,
            };
            for (index, need) in missing {
                let want = &wants[index];
                let key = self.key(want, now);
                let ask = LeaseAsk {
                    need,
                    chunk: want.limit / CHUNK_DIVISOR,
                    limit: want.limit,
                    counter_expires_at: want.counter_expires_at,
                    lease_expires_at: now + LEASE_TTL_MS,
                };
                match store.extend_lease(&key, ask).await? {
                    Ok(added) => {
                        let mut map = self.map();
                        let lease = map
                            .entry((want.scope.clone(), want.window_start))
                            .or_insert_with(|| Lease {
                                id: key.id.clone(),
                                remaining: 0,
                                valid_until: 0,
                                in_flight: 0,
                                last_draw: now,
                            });
                        if lease.id != key.id {
                            // The lapsed lease was replaced by `key` (see `key`).
                            lease.id = key.id.clone();
                            lease.remaining = 0;
                        }
                        lease.remaining += added;
                        lease.valid_until = now + LEASE_TTL_MS - LEASE_MARGIN_MS;
                    }
                    Err((used, reserved)) => {
                        let unused = self.unused(want, now);
                        return Ok(Err(NoRoom {
                            index,
                            used: used + reserved - unused,
                        }));
                    }
                }
            }
        }
        // Eight rounds in which concurrent draws emptied each fresh extension: the budget
        // is contended right at its limit. Refused like a full budget.
        Ok(Err(NoRoom {
            index: 0,
            used: wants[0].limit,
        }))
    }

    /// Draws every hold from valid leases, or says how much each short one misses.
    fn try_draw(&self, wants: &[Want], now: i64) -> Result<Vec<LeaseDraw>, Vec<(usize, i64)>> {
        let mut map = self.map();
        let mut missing = Vec::new();
        for (i, want) in wants.iter().enumerate() {
            let have = map
                .get(&(want.scope.clone(), want.window_start))
                .filter(|l| l.valid_until > now)
                .map_or(0, |l| l.remaining);
            if have < want.amount {
                missing.push((i, want.amount - have));
            }
        }
        if !missing.is_empty() {
            return Err(missing);
        }
        let mut draws = Vec::with_capacity(wants.len());
        for want in wants {
            if let Some(lease) = map.get_mut(&(want.scope.clone(), want.window_start)) {
                lease.remaining -= want.amount;
                lease.in_flight += 1;
                lease.last_draw = now;
                draws.push(LeaseDraw {
                    id: lease.id.clone(),
                    drawn: want.amount,
                });
            }
        }
        Ok(draws)
    }

    /// The lease to extend for `want`: the current one while it is valid, else a new one
    /// (a lapsed lease may have been swept; its in-flight calls settle against it anyway).
    fn key(&self, want: &Want, now: i64) -> LeaseKey {
        let map = self.map();
        let id = match map.get(&(want.scope.clone(), want.window_start)) {
            Some(l) if l.valid_until > now => l.id.clone(),
            _ => format!("lease/{}/{}", self.replica, crate::store::new_id()),
        };
        LeaseKey {
            id,
            scope: want.scope.clone(),
            window_start: want.window_start,
        }
    }

    fn unused(&self, want: &Want, now: i64) -> i64 {
        self.map()
            .get(&(want.scope.clone(), want.window_start))
            .filter(|l| l.valid_until > now)
            .map_or(0, |l| l.remaining)
    }

    /// A call that drew on the lease of `scope`/`window_start` has settled.
    pub fn settled(&self, scope: &str, window_start: i64) {
        if let Some(l) = self.map().get_mut(&(scope.to_owned(), window_start)) {
            l.in_flight = l.in_flight.saturating_sub(1);
        }
    }

    /// The lease duties of the sweep: renews leases in use, gives back the remainder of
    /// idle ones (`all`: every one, when the process stops) and forgets those with nothing
    /// left in flight.
    pub async fn maintain(&self, store: &Store, now: i64, all: bool) {
        let (renew, release): (Vec<_>, Vec<_>) = {
            let mut map = self.map();
            let mut renew = Vec::new();
            let mut release = Vec::new();
            map.retain(|(scope, window_start), l| {
                let key = LeaseKey {
                    id: l.id.clone(),
                    scope: scope.clone(),
                    window_start: *window_start,
                };
                let idle = all || now - l.last_draw > LEASE_IDLE_MS || l.valid_until <= now;
                if idle && l.remaining > 0 && l.valid_until > now {
                    release.push((key.clone(), l.remaining));
                    l.remaining = 0;
                }
                if idle && l.in_flight == 0 {
                    return false;
                }
                if l.valid_until > now {
                    renew.push(key);
                }
                true
            });
            (renew, release)
        };
        for (key, unused) in release {
            if let Err(e) = store.release_lease(&key, unused).await {
                tracing::warn!(error = %e, scope = %key.scope, "cannot give back an unused budget lease; it expires on its own");
            }
        }
        for key in renew {
            match store.renew_lease(&key, now + LEASE_TTL_MS).await {
                Ok(true) => {
                    if let Some(l) = self.map().get_mut(&(key.scope.clone(), key.window_start))
                        && l.id == key.id
                    {
                        l.valid_until = now + LEASE_TTL_MS - LEASE_MARGIN_MS;
                    }
                }
                Ok(false) => {
                    // Swept (this replica could not renew it in time): never draw on it again.
                    if let Some(l) = self.map().get_mut(&(key.scope.clone(), key.window_start))
                        && l.id == key.id
                    {
                        l.remaining = 0;
                        l.valid_until = 0;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, scope = %key.scope, "cannot renew a budget lease")
                }
            }
        }
    }
}

impl Default for Leases {
    fn default() -> Self {
        Self::new()
    }
}
