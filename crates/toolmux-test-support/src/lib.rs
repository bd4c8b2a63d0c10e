//! Mocks, fixtures and the shared provider conformance suite.
