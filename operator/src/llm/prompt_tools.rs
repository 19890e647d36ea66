//! `toolMode: prompt` (placeholder module; filled in below).
