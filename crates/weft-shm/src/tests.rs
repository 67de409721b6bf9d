//! Unit tests that need two endpoints.
