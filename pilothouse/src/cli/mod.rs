//! The operator's subcommands. They live in the binary, not in the controller crates: each is a
//! one-shot command for a person, built on its controller crate's public types and pure helpers
//! and, where it talks to the API server, on `shared::api`'s client, writer and error helpers.
//!
//! - [`maintenance`]: `pilothouse maintenance start|status|end`, NodeMaintenance objects on the
//!   API server (node-maintenance-controller's types and conditions).
//! - [`schedule`]: `pilothouse schedule`, a CronJob schedule checked offline on
//!   cronjob-controller's own parser and evaluator.

pub mod maintenance;
pub mod schedule;
