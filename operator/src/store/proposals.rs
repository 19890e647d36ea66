//! Action proposals (the database copy: standalone proposals, and the mirror of the
//! cluster's `ActionProposal` objects for incident history) and the incident search over
//! past sessions and proposals.

use super::models::*;
use super::repo::{json_text, opt_json_col, opt_json_text};
use super::{Store, StoreError, now_ms};
use crate::crd::ProposalPhase;
use serde_json::Value;
use sqlx::Row;
use sqlx::any::AnyRow;

macro_rules! proposal_select {
    () => {
        "SELECT id, name, namespace, session_id, session_name, user_name, policy, action, target, params, \
         rationale, blast_radius, reversible, provider, model, phase, decision, message, preview, undo, git, expires_at, \
         created_at, updated_at, version FROM proposals"
    };
}

fn proposal_row(row: &AnyRow) -> Result<ProposalRecord, StoreError> {
    Ok(ProposalRecord {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        namespace: row.try_get("namespace")?,
        session_id: row.try_get("session_id")?,
        session_name: row.try_get("session_name")?,
        user: row.try_get("user_name")?,
        policy: row.try_get("policy")?,
        action: row.try_get("action")?,
        target: opt_json_col(row, "target")?,
        params: opt_json_col(row, "params")?,
        rationale: row.try_get("rationale")?,
        blast_radius: row.try_get("blast_radius")?,
        reversible: row.try_get::<Option<i64>, _>("reversible")?.map(|v| v != 0),
        provider: row.try_get("provider")?,
        model: row.try_get("model")?,
        phase: {
            let s: String = row.try_get("phase")?;
            ProposalPhase::parse(&s).ok_or_else(|| {
                StoreError::from(sqlx::Error::Decode(
                    format!("proposals.phase {s:?} is not a proposal phase").into(),
                ))
            })?
        },
        decision: opt_json_col(row, "decision")?,
        message: row.try_get("message")?,
        preview: opt_json_col(row, "preview")?,
        undo: opt_json_col(row, "undo")?,
        git: opt_json_col(row, "git")?,
        expires_at: row.try_get("expires_at")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        version: row.try_get("version")?,
    })
}

/// The notification a proposal in its current phase makes, written in `tx` (none without a
/// policy, or for a phase no event names).
async fn notify_proposal(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    p: &ProposalRecord,
) -> Result<(), StoreError> {
    let (Some(policy), Some(event)) = (
        p.policy.as_deref(),
        crate::crd::NotifyEvent::of_proposal_phase(p.phase),
    ) else {
        return Ok(());
    };
    let data = serde_json::to_value(p).unwrap_or_default();
    super::notify::add_event(tx, event.as_str(), policy, &p.id, &data).await
}

/// Proposal `id`'s phase as `tx` sees it.
async fn phase_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    id: &str,
) -> Result<Option<String>, StoreError> {
    Ok(sqlx::query("SELECT phase FROM proposals WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?
        .map(|r| r.try_get("phase"))
        .transpose()?)
}

/// [`notify_proposal`] of proposal `id` as `tx` now sees it.
async fn notify_changed(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    id: &str,
) -> Result<(), StoreError> {
    let row = sqlx::query(concat!(proposal_select!(), " WHERE id = $1"))
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?;
    match row.as_ref().map(proposal_row).transpose()? {
        Some(p) => notify_proposal(tx, &p).await,
        None => Ok(()),
    }
}

/// Proposals.
impl Store {
    /// After a conditional update: the fresh row, or a conflict saying why nothing changed.
    async fn updated_proposal(
        &self,
        id: &str,
        affected: u64,
        why: &str,
    ) -> Result<ProposalRecord, StoreError> {
        if affected == 0 {
            return Err(StoreError::Conflict(format!(
                "proposal {id} {why}; reload it and try again"
            )));
        }
        self.get_proposal(id)
            .await?
            .ok_or_else(|| StoreError::Conflict(format!("proposal {id} disappeared")))
    }

    /// Stores a new proposal (its `version` is set to 1).
    pub async fn insert_proposal(&self, p: &ProposalRecord) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO proposals (id, name, namespace, session_id, session_name, user_name, policy, action, target, params, \
             rationale, blast_radius, reversible, provider, model, phase, decision, message, preview, undo, git, expires_at, \
             created_at, updated_at, version) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, 1)",
        )
        .bind(&p.id)
        .bind(&p.name)
        .bind(&p.namespace)
        .bind(&p.session_id)
        .bind(&p.session_name)
        .bind(&p.user)
        .bind(&p.policy)
        .bind(&p.action)
        .bind(opt_json_text(&p.target))
        .bind(opt_json_text(&p.params))
        .bind(&p.rationale)
        .bind(&p.blast_radius)
        .bind(p.reversible.map(i64::from))
        .bind(&p.provider)
        .bind(&p.model)
        .bind(p.phase.as_str())
        .bind(opt_json_text(&p.decision))
        .bind(&p.message)
        .bind(opt_json_text(&p.preview))
        .bind(opt_json_text(&p.undo))
        .bind(opt_json_text(&p.git))
        .bind(p.expires_at)
        .bind(p.created_at)
        .bind(p.updated_at)
        .execute(&mut *tx)
        .await?;
        notify_proposal(&mut tx, p).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Undecided proposals past their expiry, oldest first.
    pub async fn expired_pending_proposals(
        &self,
        now: i64,
        limit: i64,
    ) -> Result<Vec<ProposalRecord>, StoreError> {
        let rows = sqlx::query(concat!(
            proposal_select!(),
            " WHERE phase = 'Pending' AND expires_at <= $1 ORDER BY expires_at LIMIT $2"
        ))
        .bind(now)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(proposal_row).collect()
    }

    /// Proposals `Executing` since before `before` (their last change), oldest first.
    pub async fn executing_since_before(
        &self,
        before: i64,
        limit: i64,
    ) -> Result<Vec<ProposalRecord>, StoreError> {
        let rows = sqlx::query(concat!(
            proposal_select!(),
            " WHERE phase = 'Executing' AND updated_at < $1 ORDER BY updated_at LIMIT $2"
        ))
        .bind(before)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(proposal_row).collect()
    }

    /// The proposal with database id `id`.
    pub async fn get_proposal(&self, id: &str) -> Result<Option<ProposalRecord>, StoreError> {
        let row = sqlx::query(concat!(proposal_select!(), " WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(proposal_row).transpose()
    }

    /// Proposals, newest first, optionally only those in `phase`.
    pub async fn list_proposals(
        &self,
        phase: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ProposalRecord>, StoreError> {
        let rows = sqlx::query(concat!(
            proposal_select!(),
            " WHERE ($1 = '' OR phase = $1) ORDER BY created_at DESC, id DESC LIMIT $2"
        ))
        .bind(phase.unwrap_or(""))
        .bind(limit.clamp(1, 1000))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(proposal_row).collect()
    }

    /// Writes the decision once: only while `phase` is `Pending`, no decision is recorded and
    /// the row is still at `expected_version`. Returns the updated row.
    pub async fn decide_proposal(
        &self,
        id: &str,
        expected_version: i64,
        decision: &Value,
        phase: ProposalPhase,
        message: Option<&str>,
    ) -> Result<ProposalRecord, StoreError> {
        let mut tx = self.begin().await?;
        let done = sqlx::query(
            "UPDATE proposals SET decision = $1, phase = $2, message = $3, updated_at = $4, version = version + 1 \
             WHERE id = $5 AND version = $6 AND decision IS NULL AND phase = 'Pending' AND expires_at > $4",
        )
        .bind(json_text(decision))
        .bind(phase.as_str())
        .bind(message)
        .bind(now_ms())
        .bind(id)
        .bind(expected_version)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() > 0 {
            notify_changed(&mut tx, id).await?;
        }
        tx.commit().await?;
        self.updated_proposal(
            id,
            done.rows_affected(),
            "was already decided, expired or changed",
        )
        .await
    }

    /// The proposal mirrored from the cluster object `namespace/name`.
    pub async fn get_proposal_by_name(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ProposalRecord>, StoreError> {
        let row = sqlx::query(concat!(
            proposal_select!(),
            " WHERE namespace = $1 AND name = $2 ORDER BY created_at DESC LIMIT 1"
        ))
        .bind(namespace)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(proposal_row).transpose()
    }

    /// Mirrors the state of a cluster `ActionProposal` (the cluster is authoritative):
    /// phase, decision, message, and `preview`/`undo` when given. Returns the row, or
    /// `None` when no proposal of that name is mirrored.
    pub async fn mirror_proposal(
        &self,
        id: &str,
        phase: ProposalPhase,
        decision: Option<&Value>,
        message: Option<&str>,
        undo: Option<&Value>,
        git: Option<&Value>,
    ) -> Result<Option<ProposalRecord>, StoreError> {
        let mut tx = self.begin().await?;
        let before = phase_in(&mut tx, id).await?;
        sqlx::query(
            "UPDATE proposals SET phase = $1, decision = COALESCE($2, decision), message = $3, \
             undo = COALESCE($4, undo), git = COALESCE($7, git), updated_at = $5, version = version + 1 WHERE id = $6",
        )
        .bind(phase.as_str())
        .bind(decision.map(json_text))
        .bind(message)
        .bind(undo.map(json_text))
        .bind(now_ms())
        .bind(id)
        .bind(git.map(json_text))
        .execute(&mut *tx)
        .await?;
        if before.is_some_and(|b| b != phase.as_str()) {
            notify_changed(&mut tx, id).await?;
        }
        tx.commit().await?;
        self.get_proposal(id).await
    }

    /// Moves a proposal to `phase` if it is still at `expected_version` (so two replicas can
    /// never both execute it). `preview` and `undo` are replaced only when given.
    pub async fn update_proposal_phase(
        &self,
        id: &str,
        expected_version: i64,
        phase: ProposalPhase,
        message: Option<&str>,
        preview: Option<&Value>,
        undo: Option<&Value>,
    ) -> Result<ProposalRecord, StoreError> {
        let mut tx = self.begin().await?;
        let before = phase_in(&mut tx, id).await?;
        let done = sqlx::query(
            "UPDATE proposals SET phase = $1, message = $2, preview = COALESCE($3, preview), undo = COALESCE($4, undo), \
             updated_at = $5, version = version + 1 WHERE id = $6 AND version = $7",
        )
        .bind(phase.as_str())
        .bind(message)
        .bind(preview.map(json_text))
        .bind(undo.map(json_text))
        .bind(now_ms())
        .bind(id)
        .bind(expected_version)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() > 0 && before.is_some_and(|b| b != phase.as_str()) {
            notify_changed(&mut tx, id).await?;
        }
        tx.commit().await?;
        self.updated_proposal(id, done.rows_affected(), "changed concurrently")
            .await
    }
}

/// `LIKE` patterns of the words (escaped, lower-cased); unused slots match anything.
fn like_patterns(words: &[String]) -> [String; IncidentQuery::MAX_WORDS] {
    let mut out: [String; IncidentQuery::MAX_WORDS] = Default::default();
    for (slot, word) in out.iter_mut().zip(
        words
            .iter()
            .map(|w| w.trim())
            .filter(|w| !w.is_empty())
            .chain(std::iter::repeat(""))
            .take(IncidentQuery::MAX_WORDS),
    ) {
        let escaped: String = word
            .to_lowercase()
            .chars()
            .flat_map(|c| match c {
                '%' | '_' | '\\' => vec!['\\', c],
                c => vec![c],
            })
            .collect();
        *slot = format!("%{escaped}%");
    }
    out
}

/// Every one of the patterns `$1`..`$4` matches `$hay`.
macro_rules! all_words {
    ($hay:literal) => {
        concat!(
            "LOWER(",
            $hay,
            ") LIKE $1 ESCAPE '\\' AND LOWER(",
            $hay,
            ") LIKE $2 ESCAPE '\\' AND LOWER(",
            $hay,
            ") LIKE $3 ESCAPE '\\' AND LOWER(",
            $hay,
            ") LIKE $4 ESCAPE '\\'"
        )
    };
}

const SEARCH_SESSIONS: &str = concat!(
    "SELECT s.id, s.name, s.namespace, s.user_name, s.title, s.created_at, s.updated_at, \
     (SELECT m.content FROM chat_messages m WHERE m.session_id = s.id AND m.role = 'user' ORDER BY m.seq LIMIT 1) AS question, \
     (SELECT m.content FROM chat_messages m WHERE m.session_id = s.id AND m.role = 'assistant' AND m.content <> '' ORDER BY m.seq DESC LIMIT 1) AS last_answer \
     FROM chat_sessions s WHERE s.deleted_at IS NULL AND s.id <> $5 AND ($6 = '' OR s.namespace = $6) \
     AND ($10 = '' OR s.user_name = $10) AND s.updated_at >= $7 AND s.created_at < $8 AND ((",
    all_words!("s.name || ' ' || COALESCE(s.title, '')"),
    ") OR EXISTS (SELECT 1 FROM chat_messages m WHERE m.session_id = s.id AND m.role IN ('user', 'assistant') AND ",
    all_words!("m.content"),
    ")) ORDER BY s.updated_at DESC, s.id DESC LIMIT $9"
);

const SEARCH_PROPOSALS: &str = concat!(
    proposal_select!(),
    " WHERE COALESCE(session_id, '') <> $5 AND ($6 = '' OR namespace = $6) \
     AND ($11 = '' OR session_id IS NULL OR EXISTS (SELECT 1 FROM chat_sessions s WHERE s.id = proposals.session_id AND s.namespace = $11)) AND ($7 = '' OR LOWER(COALESCE(target, '')) LIKE $7 ESCAPE '\\') \
     AND created_at >= $8 AND created_at < $9 AND ",
    all_words!(
        "name || ' ' || action || ' ' || COALESCE(target, '') || ' ' || rationale || ' ' || COALESCE(message, '') || ' ' || phase"
    ),
    " ORDER BY created_at DESC, id DESC LIMIT $10"
);

impl Store {
    /// Past sessions (by name, title or any question or answer) and proposals (by action,
    /// target, rationale, outcome) that match every word of the query, newest first.
    pub async fn search_incidents(
        &self,
        q: &IncidentQuery,
    ) -> Result<(Vec<IncidentSession>, Vec<ProposalRecord>), StoreError> {
        let [p1, p2, p3, p4] = like_patterns(&q.words);
        let exclude = q.exclude_session.clone().unwrap_or_default();
        let namespace = q.namespace.clone().unwrap_or_default();
        let session_namespace = q.session_namespace.clone().unwrap_or_default();
        let user = q.user.clone().unwrap_or_default();
        let limit = q.limit.clamp(1, 100);
        let sessions = sqlx::query(SEARCH_SESSIONS)
            .bind(&p1)
            .bind(&p2)
            .bind(&p3)
            .bind(&p4)
            .bind(&exclude)
            .bind(&session_namespace)
            .bind(q.since)
            .bind(q.until)
            .bind(limit)
            .bind(&user)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|row| {
                Ok(IncidentSession {
                    id: row.try_get("id")?,
                    name: row.try_get("name")?,
                    namespace: row.try_get("namespace")?,
                    user: row.try_get("user_name")?,
                    title: row.try_get("title")?,
                    question: row.try_get("question")?,
                    last_answer: row.try_get("last_answer")?,
                    created_at: row.try_get("created_at")?,
                    updated_at: row.try_get("updated_at")?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let target = match &q.target {
            Some(t) if !t.trim().is_empty() => like_patterns(std::slice::from_ref(t))[0].clone(),
            _ => String::new(),
        };
        let proposals = sqlx::query(SEARCH_PROPOSALS)
            .bind(&p1)
            .bind(&p2)
            .bind(&p3)
            .bind(&p4)
            .bind(&exclude)
            .bind(&namespace)
            .bind(&target)
            .bind(q.since)
            .bind(q.until)
            .bind(limit)
            .bind(&session_namespace)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(proposal_row)
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok((sessions, proposals))
    }
}
