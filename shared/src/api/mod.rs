//! Talking to the API server: the token bucket, clients with their fence and metrics,
//! per-controller credentials, the writer every action goes through, conflict retries.

pub mod apierr;
pub mod client;
pub mod credentials;
pub mod ratelimit;
pub mod retry;
pub mod writer;
