//! The bottom layer: what describes API objects and time, with no knowledge of clients, caches
//! or controllers.

pub mod clock;
pub mod gocompat;
pub mod keys;
pub mod refs;
pub mod selector;
