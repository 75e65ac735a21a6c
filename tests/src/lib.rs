//! End-to-end tests of the sidecar, under `tests/tests/`. The kit they use (Redis processes, the
//! sidecar in process and as its binary, the client) is `window-sidecar-harness`; see
//! `tests/README.md` for where a test goes.
