//! Tool guides: Markdown the model reads on demand (`list_tool_guides`, `get_tool_guide`)
//! instead of carrying every tool's know-how in each prompt. One built-in guide per
//! built-in tool family, and a `KortexTool`'s `spec.guide` for its tools. A session sees
//! only the guides of tools it may use; MCP clients read the same guides as resources.

pub use super::plugins::PluginGuide;
use super::plugins::PluginSet;
use super::{Tool, ToolContext, ToolError, ToolFuture};
use crate::llm::ToolSpec;
use serde_json::{Value, json};
use std::sync::Arc;

/// The tool listing the guides.
pub const LIST: &str = "list_tool_guides";
/// The tool reading one guide.
pub const GET: &str = "get_tool_guide";
/// The most a guide may hold (the CRD's schema and the catalog say so for `KortexTool`s).
pub const MAX_GUIDE_BYTES: usize = crate::catalog::GUIDE_MAX_BYTES;
/// The URI prefix of guides as MCP resources.
pub const RESOURCE_PREFIX: &str = "kortex://guides/";

/// A guide a session may read.
#[derive(Clone, Debug, PartialEq)]
pub struct Guide {
    /// What `get_tool_guide` takes. Built-in guides are `kortex.<family>` (a `.` no tool
    /// name may hold), a `KortexTool`'s is its tool name.
    pub name: String,
    /// One line: what it helps with.
    pub summary: String,
    /// The Markdown.
    pub body: Arc<str>,
    /// The tools it covers, of those the session may use.
    pub tools: Vec<String>,
}

struct Builtin {
    name: &'static str,
    tools: &'static [&'static str],
    body: &'static str,
}

/// A built-in guide: `kortex.NAME`, its Markdown in `guides/NAME.md`, and the tools it covers.
macro_rules! builtin {
    ($name:literal, [$($tool:literal),* $(,)?]) => {
        Builtin {
            name: concat!("kortex.", $name),
            tools: &[$($tool),*],
            body: include_str!(concat!("guides/", $name, ".md")),
        }
    };
}

const BUILTIN: &[Builtin] = &[
    builtin!(
        "kubernetes",
        [
            "get_resource",
            "list_resources",
            "get_events",
            "get_recent_deploys",
            "get_gitops_source",
            "get_admin_info"
        ]
    ),
    builtin!("logs", ["get_logs"]),
    builtin!("prometheus", ["get_metrics", "compare_to_baseline"]),
    builtin!("incident-history", ["get_incident_history"]),
    builtin!("proposals", ["propose_action"]),
    builtin!("large-results", ["read_result_chunk"]),
];

/// Whether `name` is one of the two guide tools.
pub fn is_guide_tool(name: &str) -> bool {
    name == LIST || name == GET
}

/// The first line of a guide that is not a heading, as its one-line summary.
pub fn summary(body: &str) -> String {
    let line = body
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .unwrap_or_default();
    if line.chars().count() > 200 {
        let cut: String = line.chars().take(199).collect();
        format!("{cut}…")
    } else {
        line.to_owned()
    }
}

/// The guides of the tools in `offered` (what a session of `namespace` may use): a built-in
/// guide when any tool of its family is offered, a `KortexTool`'s when any of its tools is.
pub fn usable(offered: &[ToolSpec], plugins: &PluginSet, namespace: &str) -> Vec<Guide> {
    let offered_names: Vec<&str> = offered.iter().map(|s| s.name.as_str()).collect();
    let mut guides: Vec<Guide> = BUILTIN
        .iter()
        .filter_map(|b| {
            let tools: Vec<String> = b
                .tools
                .iter()
                .filter(|t| offered_names.contains(t))
                .map(|t| (*t).to_owned())
                .collect();
            (!tools.is_empty()).then(|| Guide {
                name: b.name.to_owned(),
                summary: summary(b.body),
                body: Arc::from(b.body),
                tools,
            })
        })
        .collect();
    for name in &offered_names {
        let Some(plugin) = plugins.get(namespace, name) else {
            continue;
        };
        let Some(guide) = &plugin.guide else { continue };
        match guides.iter_mut().find(|g| g.name == guide.name) {
            Some(g) => g.tools.push((*name).to_owned()),
            None => guides.push(Guide {
                name: guide.name.clone(),
                summary: summary(&guide.body),
                body: guide.body.clone(),
                tools: vec![(*name).to_owned()],
            }),
        }
    }
    guides
}

/// `list_tool_guides`.
pub struct ListToolGuides;

impl Tool for ListToolGuides {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: LIST.into(),
            description: "List the usage guides of the tools you may use: name, what it helps with, and the tools it covers. Read one with get_tool_guide before using a tool family for the first time.".into(),
            parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        }
    }

    fn call(&self, ctx: ToolContext, _: Value) -> ToolFuture {
        let list: Vec<Value> = ctx
            .guides
            .iter()
            .map(|g| json!({"name": g.name, "summary": g.summary, "tools": g.tools}))
            .collect();
        Box::pin(async move { Ok(json!({"guides": list}).to_string()) })
    }
}

/// `get_tool_guide`.
pub struct GetToolGuide;

impl Tool for GetToolGuide {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: GET.into(),
            description: "Read a tool guide (Markdown) by the name list_tool_guides gives: how to use those tools well, their arguments' formats and pitfalls.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 100, "description": "e.g. kortex.logs"}},
                "required": ["name"],
                "additionalProperties": false
            }),
        }
    }

    fn call(&self, ctx: ToolContext, input: Value) -> ToolFuture {
        let name = input["name"].as_str().unwrap_or_default().to_owned();
        let found = ctx.guides.iter().find(|g| g.name == name).cloned();
        Box::pin(async move {
            match found {
                Some(g) => Ok(g.body.to_string()),
                None => {
                    let names: Vec<&str> = ctx.guides.iter().map(|g| g.name.as_str()).collect();
                    Err(ToolError::Validation(format!(
                        "no guide named {name:?} for the tools you may use; available: {}",
                        if names.is_empty() {
                            "none".to_owned()
                        } else {
                            names.join(", ")
                        }
                    )))
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: json!({"type": "object"}),
        }
    }

    #[test]
    fn every_builtin_guide_has_a_title_a_summary_and_known_tools() {
        for b in BUILTIN {
            assert!(b.body.starts_with("# "), "{} has no title", b.name);
            let s = summary(b.body);
            assert!(!s.is_empty() && s.len() <= 200, "{}: {s:?}", b.name);
            assert!(b.body.len() <= MAX_GUIDE_BYTES, "{}", b.name);
            for t in b.tools {
                assert!(
                    crate::catalog::BUILTIN_TOOLS.contains(t),
                    "{} covers unknown tool {t}",
                    b.name
                );
                // Each guide mentions the tools it covers by name.
                assert!(b.body.contains(t), "{} never names {t}", b.name);
            }
        }
    }

    #[test]
    fn only_guides_of_offered_tools_are_usable() {
        let plugins = PluginSet::default();
        let guides = usable(
            &[spec("get_logs"), spec("get_incident_history")],
            &plugins,
            "default",
        );
        let names: Vec<&str> = guides.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["kortex.logs", "kortex.incident-history"]);
        assert_eq!(guides[0].tools, ["get_logs"]);
        assert!(usable(&[], &plugins, "default").is_empty());
    }

    #[test]
    fn summaries_skip_headings_and_are_bounded() {
        assert_eq!(summary("# Title\n\nDoes this.\n\nMore."), "Does this.");
        assert_eq!(summary(""), "");
        let long = format!("# T\n{}", "x".repeat(500));
        assert_eq!(summary(&long).chars().count(), 200);
    }
}
