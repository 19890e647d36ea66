//! The context budget: before each step the conversation is fitted into the model's
//! context window, dropping the oldest turns first. A turn runs from a user message to the
//! next, so a tool call is never separated from its result.

use crate::llm::Message;

/// Drops whole turns from the front until the rest fits `budget` tokens; the last turn is
/// always kept (if even that does not fit, the provider says so). Returns the kept
/// messages and how many were dropped.
pub fn fit(messages: Vec<Message>, budget: u64) -> (Vec<Message>, usize) {
    let starts: Vec<usize> = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| matches!(m, Message::User { .. }))
        .map(|(i, _)| i)
        .collect();
    for start in std::iter::once(0).chain(starts.iter().copied().filter(|s| *s > 0)) {
        let is_last_turn = starts.last().is_none_or(|last| start >= *last);
        if is_last_turn || crate::llm::estimate_messages(&messages[start..]) <= budget {
            let dropped = start;
            return (messages.into_iter().skip(start).collect(), dropped);
        }
    }
    (messages, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ToolCall;

    fn turn(n: usize, size: usize) -> Vec<Message> {
        vec![
            Message::User {
                content: format!("question {n} {}", "x".repeat(size)),
            },
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: format!("c{n}"),
                    name: "get_logs".into(),
                    input: serde_json::json!({}),
                }],
            },
            Message::Tool {
                tool_call_id: format!("c{n}"),
                content: "y".repeat(size),
                is_error: false,
            },
            Message::Assistant {
                content: format!("answer {n}"),
                tool_calls: Vec::new(),
            },
        ]
    }

    #[test]
    fn oldest_turns_go_first_and_calls_stay_with_results() {
        let messages: Vec<Message> = (0..3).flat_map(|n| turn(n, 400)).collect();
        let one_turn = crate::llm::estimate_messages(&turn(0, 400));
        let (kept, dropped) = fit(messages.clone(), one_turn * 2 + 10);
        assert_eq!(dropped, 4);
        assert!(matches!(&kept[0], Message::User { content } if content.starts_with("question 1")));
        assert_eq!(kept.len(), 8);
        let (all, none) = fit(messages.clone(), u64::MAX);
        assert_eq!((all.len(), none), (12, 0));
        let (last, _) = fit(messages, 1);
        assert!(
            matches!(&last[0], Message::User { content } if content.starts_with("question 2")),
            "the last turn stays"
        );
    }
}
