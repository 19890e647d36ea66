//! Tools that answer from a scenario's recordings: each keeps the real tool's name,
//! description and argument schema (the model is offered exactly what production offers,
//! and the router validates, caps, redacts and audits as it does there), but its result is
//! the first recording whose argument pattern matches the call. A call nothing answers is
//! refused — and counted against the scenario. Live scenarios reach the real tool.

use super::scenario::{Mode, Scenario};
use crate::llm::ToolSpec;
use crate::tools::{Tool, ToolContext, ToolError, ToolFuture};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What each eval session is answered from, and the calls refused in it.
#[derive(Default)]
pub struct Book {
    sessions: Mutex<HashMap<String, Entry>>,
}

struct Entry {
    scenario: Arc<Scenario>,
    refused: Vec<(String, Value)>,
}

impl Book {
    /// Session `id` is answered from `scenario`.
    pub fn open(&self, id: &str, scenario: Arc<Scenario>) {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                id.to_owned(),
                Entry {
                    scenario,
                    refused: Vec::new(),
                },
            );
    }

    /// Forgets session `id`, returning the calls refused in it.
    pub fn close(&self, id: &str) -> Vec<(String, Value)> {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id)
            .map(|e| e.refused)
            .unwrap_or_default()
    }

    fn scenario(&self, id: &str) -> Option<Arc<Scenario>> {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .map(|e| e.scenario.clone())
    }

    fn refuse(&self, id: &str, tool: &str, input: &Value) {
        if let Some(e) = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(id)
        {
            e.refused.push((tool.to_owned(), input.clone()));
        }
    }
}

/// A tool answered from recordings (or, for a live scenario, by `real`).
pub struct Recorded {
    spec: ToolSpec,
    kubernetes: bool,
    timeouts: (std::time::Duration, std::time::Duration),
    real: Option<Arc<dyn Tool>>,
    book: Arc<Book>,
}

impl Recorded {
    /// Stands in for `tool`; `live` says whether live scenarios may call it for real.
    pub fn new(tool: Arc<dyn Tool>, live: bool, book: Arc<Book>) -> Self {
        Self {
            spec: tool.spec(),
            kubernetes: tool.kubernetes(),
            timeouts: tool.timeouts(),
            real: live.then_some(tool),
            book,
        }
    }
}

impl Tool for Recorded {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn kubernetes(&self) -> bool {
        self.kubernetes
    }

    fn timeouts(&self) -> (std::time::Duration, std::time::Duration) {
        self.timeouts
    }

    fn call(&self, ctx: ToolContext, input: Value) -> ToolFuture {
        let name = self.spec.name.clone();
        let book = self.book.clone();
        let real = self.real.clone();
        Box::pin(async move {
            let Some(scenario) = book.scenario(&ctx.session.id) else {
                return Err(ToolError::Internal(format!(
                    "session {} belongs to no scenario",
                    ctx.session.id
                )));
            };
            if scenario.mode == Mode::Live {
                return match real {
                    Some(tool) => tool.call(ctx, input).await,
                    None => Err(ToolError::Upstream(format!(
                        "{name} has no cluster to read in this eval (set KUBECONFIG for live scenarios)"
                    ))),
                };
            }
            match scenario.answer(&name, &input) {
                Some(r) if r.is_error => Err(ToolError::Upstream(r.text())),
                Some(r) => Ok(r.text()),
                None => {
                    book.refuse(&ctx.session.id, &name, &input);
                    Err(ToolError::Denied(format!(
                        "{name} has no recorded result for these arguments in this eval scenario"
                    )))
                }
            }
        })
    }
}
