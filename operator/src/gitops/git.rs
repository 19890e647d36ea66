//! See the room's documentation (`gitops`).
