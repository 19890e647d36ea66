//! `read_result_chunk`: pages of a large tool result kept server-side.

use super::{Tool, ToolContext, ToolError, ToolFuture};
use crate::llm::ToolSpec;
use serde_json::{Value, json};

/// Bytes per chunk (cut at character boundaries).
pub const CHUNK_BYTES: usize = 32_768;
/// The tool's name.
pub const TOOL_NAME: &str = "read_result_chunk";

/// Chunks of `content` at `size` bytes.
pub fn count(content: &str, size: usize) -> usize {
    bounds(content, size).len()
}

/// Byte ranges of the chunks, on character boundaries.
fn bounds(content: &str, size: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < content.len() {
        let mut end = (start + size).min(content.len());
        while !content.is_char_boundary(end) {
            end -= 1;
        }
        out.push((start, end));
        start = end;
    }
    out
}

/// The tool.
pub struct ReadResultChunk;

impl Tool for ReadResultChunk {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: TOOL_NAME.into(),
            description: "Read one chunk of a tool result that was too large to return at once (the result told you its resultId and how many chunks it has).".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "resultId": {"type": "string"},
                    "chunk": {"type": "integer", "minimum": 0}
                },
                "required": ["resultId", "chunk"],
                "additionalProperties": false
            }),
        }
    }

    fn call(&self, ctx: ToolContext, input: Value) -> ToolFuture {
        Box::pin(async move {
            let id = input["resultId"].as_str().unwrap_or_default().to_owned();
            let chunk = input["chunk"].as_u64().unwrap_or(0) as usize;
            let content = ctx
                .store
                .get_tool_result(&ctx.session.id, &id)
                .await
                .map_err(|e| ToolError::Internal(e.to_string()))?
                .ok_or_else(|| {
                    ToolError::Validation(format!(
                        "no result {id} in this session (a stored result is kept for --retention-tool-results, 7 days by default); call the tool again"
                    ))
                })?;
            let ranges = bounds(&content, CHUNK_BYTES);
            let (start, end) = *ranges.get(chunk).ok_or_else(|| {
                ToolError::Validation(format!(
                    "chunk {chunk} does not exist; the result has {} chunks (0..{})",
                    ranges.len(),
                    ranges.len().saturating_sub(1)
                ))
            })?;
            Ok(json!({"resultId": id, "chunk": chunk, "chunks": ranges.len(), "content": &content[start..end]}).to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cut_at_character_boundaries() {
        let text = "é".repeat(10); // 20 bytes
        let b = bounds(&text, 3);
        assert!(
            b.iter()
                .all(|(s, e)| text.is_char_boundary(*s) && text.is_char_boundary(*e))
        );
        assert_eq!(
            b.iter().map(|(s, e)| &text[*s..*e]).collect::<String>(),
            text
        );
        assert_eq!(count("", 3), 0);
    }
}
