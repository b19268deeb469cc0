//! What the process shows outside: health and readiness, the HTTP and secure ports, logs.

pub mod connections;
pub mod health;
pub mod http;
pub mod logging;
