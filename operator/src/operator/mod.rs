//! Cluster mode (`kortex run`): the operator side of Kortex. The custom resources and the
//! Secrets they reference are watched and compiled into the live configuration the chat
//! server runs on; statuses and Events are written by the leader.

pub mod admission_guard;
pub mod auth;
pub mod executor;
pub mod lease;
pub mod own_addresses;
pub mod proposals;
pub mod status;
pub mod watch;

/// The API server refuses Event notes over 1 KiB: `text` cut to fit, on a character
/// boundary.
pub fn event_note(text: &str) -> String {
    const MAX: usize = 1024;
    if text.len() <= MAX {
        return text.to_owned();
    }
    let mut cut = MAX - '…'.len_utf8();
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}

#[cfg(test)]
mod tests {
    #[test]
    fn event_notes_fit_in_a_kibibyte() {
        let long = "é".repeat(900);
        let note = super::event_note(&long);
        assert!(note.len() <= 1024 && note.ends_with('…'), "{}", note.len());
        assert_eq!(super::event_note("short"), "short");
    }
}
