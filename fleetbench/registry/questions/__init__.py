"""The questions the registry answers: pure functions over plain rows (no session, HTTP or
clock), so each can be tested with small literal tables."""
