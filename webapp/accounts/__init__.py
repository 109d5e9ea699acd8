"""Accounts: login/logout, invite sign-up and per-user API keys (auth only, no business of calls)."""
