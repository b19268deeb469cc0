//! The bottom layer: what describes API objects and time, with no knowledge of clients, caches
//! or controllers.

pub mod clock;
pub mod gocompat;
pub mod gojson;
pub mod keys;
pub mod late;
pub mod quantity;
pub mod refs;
pub mod selector;
